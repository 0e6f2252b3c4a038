"""The real SmolLM2-135M-Instruct target (embedded GGUF, converted once and cached
under the default cache dir by the session fixture): greedy speculative output
equals HF greedy token for token in float32 on 20+ prompts, chain and tree, for the
n-gram and small-LM drafters; EOS inside an accepted block; the CLI's JSON."""
from __future__ import annotations

import json

import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.ngram import NGramDrafter
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.drafters.small_lm import SmallLMDrafter
from tests.realmodels.decoder_util import one_thread  # noqa: F401
from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape

TEXTS = [
    "def add(a, b):", "Hi", "Write a haiku about the sea.", "List three colors.",
    "What is 2 + 2?", "def fib(n):\n    if n < 2:\n        return n", "Translate 'cat' to French.",
    "Name a prime number.", "import numpy as np\nx = np.", "The capital of France is",
    "Explain recursion in one sentence.", "for i in range(10):", "Say hello to Bob.",
    "class Stack:\n    def __init__(self):", "Write a SQL query selecting all rows.",
    "1, 2, 3, 4,", "Repeat after me: red blue red blue", "What does CPU stand for?",
    "print('hello')", "Give an example of a noun.",
]
MAX_NEW = 8
NEVER = 49151  # an EOS id that never comes up, so HF does not stop early

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def smollm2():
    from specloop.realmodels.loading import load_model
    return load_model("smollm2-135m")  # converts the GGUF once into the default cache


@pytest.fixture(scope="module")
def prompts(smollm2):
    from specloop.cli.generate_cmd import encode_prompt
    out = [[smollm2.tokenizer.encode("Hello")[0]]]  # a one-token prompt
    for i, text in enumerate(TEXTS):
        out.append(encode_prompt(smollm2.tokenizer, text, raw=i % 2 == 0))
    return out


@pytest.fixture(scope="module")
def references(smollm2, prompts):
    refs = []
    for ids in prompts:
        with torch.inference_mode():
            out = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                         eos_token_id=NEVER, pad_token_id=0, temperature=None, top_p=None,
                                         top_k=None)
        refs.append(out[0, len(ids):].tolist())
    return refs


@pytest.mark.parametrize("config", ["ngram-chain", "ngram-tree", "self-chain", "self-tree", "ngramlearned-chain"])
def test_greedy_identical_to_hf(smollm2, prompts, references, config):
    from specloop.strategies.lookup_length import LookupLength
    drafter_kind, shape = config.split("-")
    policy = FixedDraftPolicy(4) if shape == "chain" else FixedDraftPolicy(4, parse_tree_shape("3x2x1x1"))
    drafter = {"ngram": lambda: NGramDrafter(), "self": lambda: SmallLMDrafter(smollm2.model),
               "ngramlearned": lambda: NGramDrafter(length_model=LookupLength([1.0, 1.3, 1.5, 1.6, 1.7]))}[drafter_kind]()
    dec = SpeculativeDecoder(smollm2, drafter, policy=policy, eos_token_id=[])
    chosen = range(len(prompts)) if drafter_kind.startswith("ngram") else range(0, len(prompts), 4)
    for i in chosen:
        result = dec.generate(prompts[i], MAX_NEW)
        assert result.new_tokens == references[i], (config, i)
    if drafter_kind == "self":
        assert result.trace.acceptance_rate() > 0.95


def test_eos_inside_accepted_block_real(smollm2, prompts, references):
    ids, ref = prompts[5], references[5]
    eos = ref[3]
    stop = ref.index(eos)
    dec = SpeculativeDecoder(smollm2, SmallLMDrafter(smollm2.model), policy=FixedDraftPolicy(6), eos_token_id=eos)
    result = dec.generate(ids, MAX_NEW)
    assert result.new_tokens == ref[: stop + 1] and result.stop_reason == "eos"


def test_registry_builds_drafters(smollm2):
    assert isinstance(make_drafter("ngram", smollm2), NGramDrafter)
    drafter = make_drafter("smollm2-135m", smollm2)
    assert isinstance(drafter, SmallLMDrafter)


def test_cli_generate_json_check_greedy(capsys):
    from specloop.cli import main
    code = main(["generate", "--prompt", "def square(x):", "--raw", "--max-new-tokens", "10",
                 "--tree", "3x1x1", "--check-greedy", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["identical_to_greedy"] is True
    assert out["new_tokens"] == 10
    for key in ("text", "mean_accepted_length", "tokens_per_s", "baseline_tokens_per_s", "speedup"):
        assert out[key] is not None
    assert out["speedup"] == pytest.approx(out["tokens_per_s"] / out["baseline_tokens_per_s"])


def test_cli_bad_input_exit_code(capsys):
    from specloop.cli import main
    assert main(["generate", "--prompt", "   ", "--json"]) == 2
    assert "empty prompt" in capsys.readouterr().err
