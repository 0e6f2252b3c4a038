"""The REST-style n-gram datastore drafter (`drafters.datastore`): the index against
brute-force counts (longest-suffix match, continuations, the counted trie), the node
budget, save/load, held-out prompts never in the index, greedy losslessness on tiny
Llama models and on the real SmolLM2-135M (float32), and the greedy verification
fast path against `verify_tree`."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.drafters.datastore import (DatastoreDrafter, NGramIndex, SourceWeights,
                                                    context_suffix_matches, count_trie, select_nodes)
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
from specloop.realmodels.sampling import SamplingConfig
from specloop.realmodels.verify import verify_greedy, verify_tree
from specloop.strategies.base import DraftPlan, TreePlan
from tests.realmodels.decoder_util import one_thread, as_loaded, plain_greedy, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def _brute_count(stream: np.ndarray, ngram) -> int:
    n = len(ngram)
    if n > stream.size:
        return 0
    return int((np.lib.stride_tricks.sliding_window_view(stream, n) == np.asarray(ngram)).all(axis=1).sum())


@pytest.fixture(scope="module")
def stream():
    rng = np.random.default_rng(1)
    # a low-entropy stream (repeats are common) over a large id range (16-bit keys)
    base = rng.integers(0, 6, size=4000)
    return (base * 9000 + (base % 3)).astype(np.int64)


@pytest.fixture(scope="module")
def index(stream):
    return NGramIndex.build(stream)


# -- the index ---------------------------------------------------------------------------------
def test_count_matches_brute_force(stream, index):
    rng = np.random.default_rng(2)
    assert index.bits == 16 and index.max_ngram == 8
    for n in list(range(1, 13)):
        for _ in range(6):
            start = int(rng.integers(0, stream.size - n))
            gram = stream[start: start + n]
            assert index.count(gram) == _brute_count(stream, gram) >= 1
    assert index.count([123]) == 0                      # an id that is not in the stream
    assert index.count([1 << 20]) == 0                   # beyond the key range: no match, no error
    assert index.count(stream[-3:]) == _brute_count(stream, stream[-3:])  # the stream's end


def test_longest_suffix_match(stream, index):
    rng = np.random.default_rng(3)
    for _ in range(40):
        ctx = rng.choice(np.unique(stream), size=int(rng.integers(1, 15)))
        n, start, stop = index.longest_suffix_match(ctx, max_ngram=6)
        assert n >= 1  # every single id of the context occurs in the stream
        assert stop - start == _brute_count(stream, ctx[len(ctx) - n:])
        if n < min(6, len(ctx)):
            assert _brute_count(stream, ctx[len(ctx) - n - 1:]) == 0
        for pos in np.asarray(index.order[start:stop]).tolist():
            assert stream[pos: pos + n].tolist() == ctx[len(ctx) - n:].tolist()
    assert index.longest_suffix_match([5, 7], max_ngram=4) == (0, 0, 0)


def test_continuations_follow_each_occurrence(stream, index):
    ctx = stream[100:103]
    n, start, stop = index.longest_suffix_match(ctx, 3)
    conts = index.continuations(start, stop, n, depth=5, max_matches=10 ** 6)
    expected = sorted(tuple(stream[p + n: p + n + 5].tolist() + [-1] * max(0, p + n + 5 - stream.size))
                      for p in np.asarray(index.order[start:stop]).tolist())
    assert sorted(map(tuple, conts.tolist())) == expected
    few = index.continuations(start, stop, n, depth=5, max_matches=4)
    assert few.shape == (4, 5) and set(map(tuple, few.tolist())) <= set(expected)


def test_count_trie_counts_prefixes():
    rng = np.random.default_rng(4)
    conts = rng.integers(0, 3, size=(60, 4))
    conts[rng.random(60) < 0.3, 2:] = -1                 # some continuations end early
    parents, tokens, counts, depths = count_trie(conts)
    paths = []
    for i in range(tokens.size):
        assert parents[i] < i
        paths.append((paths[parents[i]] if parents[i] >= 0 else ()) + (int(tokens[i]),))
        assert depths[i] == len(paths[i])
    assert len(set(paths)) == len(paths)
    for path, count in zip(paths, counts.tolist()):
        assert count == sum(tuple(row[: len(path)]) == path for row in conts.tolist())
    rows = {tuple(r[: d]) for r in conts.tolist() for d in range(1, 5) if -1 not in r[:d]}
    assert set(paths) == rows


def test_context_suffix_matches_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(50):
        ids = rng.integers(0, 4, size=int(rng.integers(1, 30))).astype(np.int64)
        n, conts = context_suffix_matches(ids, depth=3, max_ngram=4)
        L = ids.size
        best = 0
        for m in range(1, min(4, L - 1) + 1):
            if any((ids[s: s + m] == ids[L - m:]).all() for s in range(0, L - m)):
                best = m
        assert n == best
        if n:
            starts = [s for s in range(0, L - n) if (ids[s: s + n] == ids[L - n:]).all()][::-1]
            expect = [[int(ids[s + n + j]) if s + n + j < L else -1 for j in range(3)] for s in starts]
            assert conts.tolist() == expect


def test_select_nodes_budget_and_closure():
    scored = {(1,): 0.9, (1, 2): 0.5, (1, 2, 3): 0.45, (4,): 0.6, (4, 5): 0.1, (1, 7): 0.3, (1, 2, 9): 0.45}
    for budget in range(1, 9):
        tokens, parents = select_nodes(scored, budget)
        assert len(tokens) == min(budget, len(scored))
        assert all(p < i for i, p in enumerate(parents))
    tokens, parents = select_nodes(scored, 3)
    assert tokens == [1, 4, 2] and parents == [-1, -1, 0]
    tokens, parents = select_nodes(scored, 10, min_score=0.4)
    assert len(tokens) == 5 and 7 not in tokens and 5 not in tokens
    tokens, parents = select_nodes(scored, 10, chain=True)
    assert tokens == [1, 2, 3] and parents == [-1, 0, 1]     # ties keep the first-seen child
    assert select_nodes(scored, 10, max_depth=1)[0] == [1, 4]


def test_drafter_respects_plan_budget(index, stream):
    drafter = DatastoreDrafter(index, context_weights=SourceWeights((0.5,)))
    gen = torch.Generator()
    ids = torch.tensor(stream[:50])
    for verify_size, depth in ((1, 3), (5, 4), (12, 6), (40, 8)):
        plan = DraftPlan(depth, TreePlan(branching=(4,) + (1,) * (depth - 1), verify_size=verify_size))
        for max_tokens in (3, 100):
            prop = drafter.propose(DraftRequest(ids, plan, max_tokens, SamplingConfig(), gen))
            assert 1 <= prop.size <= min(verify_size, max_tokens)
            assert prop.depth <= depth and prop.q_draft is None
    prop = drafter.propose(DraftRequest(ids, DraftPlan(5), 100, SamplingConfig(), gen))
    assert prop.is_chain and 1 <= prop.size <= 5


def test_save_load_roundtrip_and_errors(tmp_path, index, stream):
    index.save(tmp_path / "idx")
    loaded = NGramIndex.load(tmp_path / "idx")
    assert loaded.size == index.size and loaded.count(stream[10:16]) == index.count(stream[10:16])
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    meta["version"] = -1
    (tmp_path / "idx" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="version"):
        NGramIndex.load(tmp_path / "idx")
    with pytest.raises(FileNotFoundError):
        NGramIndex.load(tmp_path / "missing")
    with pytest.raises(ValueError, match="empty"):
        NGramIndex.build([])
    with pytest.raises(ValueError, match="negative"):
        NGramIndex.build([3, -1])
    with pytest.raises(ValueError):
        DatastoreDrafter(index, max_ngram=9)
    with pytest.raises(ValueError):
        SourceWeights((1.5,))


# -- greedy verification fast path -------------------------------------------------------------
def test_verify_greedy_equals_verify_tree():
    rng = np.random.default_rng(6)
    vocab = 7
    for _ in range(200):
        n = int(rng.integers(0, 8))
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)] if n else []
        tokens = rng.integers(0, vocab, size=n).tolist()
        argmax = rng.integers(0, vocab, size=n + 1).tolist()
        p = torch.zeros(n + 1, vocab).scatter_(1, torch.tensor(argmax).reshape(-1, 1), 1.0)
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        ref = verify_tree(p, torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), None, g1)
        fast = verify_greedy(argmax, tokens, parents, g2)
        assert fast == ref
        assert torch.rand((), generator=g1).item() == torch.rand((), generator=g2).item()  # same uniforms used
    with pytest.raises(ValueError):
        verify_greedy([1], [2], [-1], torch.Generator())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_indices_break_ties_like_argmax(dtype):
    """The decoder's greedy path takes ``max(-1).indices`` (cheaper) where
    `processed_probs` takes ``argmax``: both must pick the first maximal id."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randint(0, 4, (9, 49152), generator=gen).to(dtype)  # many ties
        assert torch.equal(logits.float().max(-1).indices, logits.float().argmax(-1))


# -- lossless greedy on tiny models ------------------------------------------------------------
VOCAB = 12


@pytest.fixture(scope="module")
def tiny_target():
    return tiny_llama(VOCAB, seed=0)


def _tiny_prompts(n: int = 20) -> list[list[int]]:
    rng = np.random.default_rng(0)
    prompts = [[5]]
    while len(prompts) < n:
        prompts.append(rng.integers(0, VOCAB - 1, size=int(rng.integers(2, 12))).tolist())
    return prompts


@pytest.fixture(scope="module")
def tiny_index(tiny_target):
    """A datastore of the tiny target's own greedy text (so long matches occur) and noise."""
    rng = np.random.default_rng(7)
    parts = []
    for i in range(6):
        prompt = rng.integers(0, VOCAB - 1, size=4).tolist()
        parts += prompt + plain_greedy(tiny_target, prompt, 12)
    parts += rng.integers(0, VOCAB, size=300).tolist()
    return NGramIndex.build(parts)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_tiny_greedy_identical(tiny_target, tiny_index, shape):
    policy = FixedDraftPolicy(4) if shape == "chain" else FixedDraftPolicy(5, parse_tree_shape("4x1x1x1x1,v=10"))
    dec = SpeculativeDecoder(as_loaded(tiny_target), DatastoreDrafter(tiny_index), policy=policy, eos_token_id=[])
    accepted = 0
    for prompt in _tiny_prompts():
        result = dec.generate(prompt, 10)
        assert result.new_tokens == plain_greedy(tiny_target, prompt, 10), prompt
        accepted += sum(r.accepted_tokens for r in result.trace)
    assert accepted > 0  # the datastore's drafts were actually accepted sometimes


def test_tiny_eos_inside_accepted_block(tiny_target):
    prompt = [3, 1, 4]
    ref = plain_greedy(tiny_target, prompt, 8)
    # the datastore holds exactly the target's continuation, so a whole block is accepted
    index = NGramIndex.build(prompt + ref)
    eos = ref[2]
    stop = ref.index(eos)
    dec = SpeculativeDecoder(as_loaded(tiny_target), DatastoreDrafter(index), policy=FixedDraftPolicy(6),
                             eos_token_id=eos)
    result = dec.generate(prompt, 8)
    assert result.new_tokens == ref[: stop + 1] and result.stop_reason == "eos"
    assert result.trace[0].accepted_tokens >= stop  # EOS came inside the first accepted block


# -- the real SmolLM2-135M target (float32) ----------------------------------------------------
TEXTS = [
    "def add(a, b):", "Hi", "Write a haiku about the sea.", "List three colors.",
    "What is 2 + 2?", "def fib(n):\n    if n < 2:\n        return n", "Translate 'cat' to French.",
    "import numpy as np\nx = np.", "The capital of France is", "for i in range(10):",
    "class Stack:\n    def __init__(self):", "Write a SQL query selecting all rows.",
    "1, 2, 3, 4,", "Repeat after me: red blue red blue", "What does CPU stand for?",
    "import os\nfor name in os.listdir('.'):", "print('hello')", "Give an example of a noun.",
    "def is_prime(n):", "Explain recursion in one sentence.",
]
MAX_NEW = 8
NEVER = 49151


@pytest.fixture(scope="module")
def smollm2():
    from specloop.realmodels.loading import load_model
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def prompt_corpus(smollm2):
    """The warm-up corpus restricted to the prompt source (fast to tokenise)."""
    from specloop.realmodels.training.corpus import SOURCES, build_corpus
    docs = list(SOURCES["prompts"]())
    return build_corpus(smollm2.tokenizer, 10 ** 7, mix={"prompts": 1.0}, documents={"prompts": docs})


def test_heldout_prompts_never_in_index(smollm2, prompt_corpus):
    from specloop.data.prompts import load_prompts
    index = NGramIndex.build(prompt_corpus.train_ids)
    for dataset in ("humaneval", "mt-bench"):
        held = load_prompts(dataset, "heldout")
        warm = load_prompts(dataset, "warmup")
        for prompt in held:
            ids = smollm2.tokenizer(prompt.text, add_special_tokens=False)["input_ids"][:-1]
            assert index.count(ids) == 0, (dataset, prompt.id)
        found = 0
        for prompt in warm[:10]:
            ids = smollm2.tokenizer(prompt.text, add_special_tokens=False)["input_ids"][:-1]
            found += index.count(ids) >= 1
        assert found >= 8  # positive control: warm-up prompts are in the index


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_smollm2_greedy_identical(smollm2, prompt_corpus, shape):
    from specloop.cli.generate_cmd import encode_prompt
    index = NGramIndex.build(prompt_corpus.train_ids)
    policy = FixedDraftPolicy(5) if shape == "chain" else FixedDraftPolicy(6, parse_tree_shape("4x1x1x1x1x1,v=16"))
    dec = SpeculativeDecoder(smollm2, DatastoreDrafter(index), policy=policy, eos_token_id=[])
    prompts = [[smollm2.tokenizer.encode("Hello")[0]]] + [
        encode_prompt(smollm2.tokenizer, text, raw=i % 2 == 0) for i, text in enumerate(TEXTS)]
    accepted = 0
    for ids in prompts:
        with torch.inference_mode():
            ref = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                         eos_token_id=NEVER, pad_token_id=0, temperature=None, top_p=None,
                                         top_k=None)[0, len(ids):].tolist()
        result = dec.generate(ids, MAX_NEW)
        assert result.new_tokens == ref, (shape, ids)
        accepted += sum(r.accepted_tokens for r in result.trace)
    assert accepted > 0


def test_registry_builds_datastore_drafter(smollm2, index):
    from specloop.realmodels.registry.drafters import drafter_names, make_drafter
    assert "ngram-datastore" in drafter_names()
    drafter = make_drafter("ngram-datastore", smollm2, index=index, max_ngram=4, dtype="float32")
    assert isinstance(drafter, DatastoreDrafter) and drafter.index is index and drafter.max_ngram == 4
    assert make_drafter("ngram-datastore", smollm2, index=None).index is None


def test_a_missing_index_is_not_built_when_asked_not_to_and_the_command_exists(tmp_path, monkeypatch, capsys):
    from specloop.cli import build_parser, main
    from specloop.cli.draft_cmd import _datastore
    from specloop.realmodels.registry.datastore import load_or_build_index
    monkeypatch.setenv("SPECLOOP_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="build it with: specloop draft datastore --target tiny-x$"):
        load_or_build_index(None, "tiny-x", build_if_missing=False)
    with pytest.raises(ValueError, match="needs the target's tokenizer"):
        load_or_build_index(None, "tiny-x")
    assert not (tmp_path / "datastore").exists()
    args = build_parser().parse_args(["draft", "datastore", "--target", "tiny-x"])
    assert args.func is _datastore and args.tokens == 1_200_000
    assert main(["draft", "datastore", "--tokens", "0"]) == 2 and "--tokens" in capsys.readouterr().err
