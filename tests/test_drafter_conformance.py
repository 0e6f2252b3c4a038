"""The drafter conformance suite: every registered drafter (`drafter_names()`: ngram,
ngram-datastore, small-lm, suffix, eagle, eagle3, hybrid, medusa, hydra) and the
``hedge:suffix,ngram`` ensemble, each built for a tiny float32 Llama target made here
(nothing is downloaded; the heads and both small-LM drafts -- a separate tiny LM and the
distilled small-LM head -- are built from their classes, the others by the registry),
honours the `specloop.realmodels.drafters.base.Drafter` contract the same way.

Per drafter, under a chain plan and three tree plans (static branching, an EAGLE-2
top-k tree with a verification budget, and a top-k tree whose plan k is below its
``max_depth``), driven by real greedy and sampled decodes:

* proposal contract: int64 1-D tokens and parents of one length, parents -1 or earlier
  (closed under ancestors), ids in the target's vocabulary, a chain for a chain plan,
  depth within the plan's k (and the tree's ``max_depth``), at most ``max_tokens``
  nodes (also when a round asks for fewer than the session would), no repeated
  greedy siblings; ``q_draft`` None or (n, V_draft <= V) rows that are probability
  distributions giving the node's token positive mass; ``node_probs`` cumulative;
* ``observe`` returns the protocol's observation (None, a float or a mapping with
  "loss") once per round, the session writes it into `RoundRecord.loss`, and the
  feedback carries the target's hidden states exactly for the drafters that ask;
* stateful drafters (``state_dict`` / ``load_state_dict`` / ``keeps_stream_state``)
  round-trip through the stream runner's checkpoint file: a fresh drafter loaded
  from it makes the same next proposals as the original (and unlike a fresh one);
* lossless greedy: `SpeculativeDecoder.generate` equals plain greedy token for token.

Peer cases: vLLM's n-gram proposer cases (``tests/v1/spec_decode/test_ngram.py``) on
specloop's prompt-lookup drafter, with specloop's own tie-break among equal-length
matches (the most recent match; vLLM takes the earliest), and SuffixDecoding's learning
over repetition (one `SuffixDrafter` serving the same prompts 10 times: accepted
tokens per round and acceptance rate rise, above 0.8 on the last pass).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.drafters.base import DraftRequest, Drafter
from specloop.realmodels.drafters.hedge import STREAM_DRAFT_SECONDS
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.registry.drafters import drafter_names, make_drafter
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan, TreePlan
from tests.realmodels.decoder_util import as_loaded, one_thread, plain_greedy, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

V = 64
MAX_NEW = 24
PROMPTS = {
    "repetitive": [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7],
    "random": [23, 41, 3, 58, 17, 30, 9, 44, 12],
    "one-token": [7],
    "repetitive-again": [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7],   # served twice: a repeat request
}

#: suite case -> the registered drafter name it stands for
KINDS = {
    "ngram": "ngram",
    "ngram-datastore": "ngram-datastore",
    "small-lm": "small-lm",                      # a separate tiny LM (SmallLMDrafter)
    "small-lm-distilled": "small-lm",            # the distilled small-LM head, built from its classes
    "suffix": "suffix",
    "eagle": "eagle",
    "eagle3": "eagle3",
    "hybrid": "hybrid",
    "hybrid-suffix-hydra": "hybrid",             # the suffix tree where confident, else Hydra (+suffix methods)
    "medusa": "medusa",
    "hydra": "hydra",
    "hedge:suffix,ngram": "hedge:suffix,ngram",
}

PLANS = {
    "chain": DraftPlan(4),
    "static-tree": DraftPlan(3, TreePlan(branching=(3, 2, 1))),
    "eagle2-tree": DraftPlan(4, TreePlan(top_k=3, max_depth=4, verify_size=10)),
    # the plan's k (2) below the tree's max_depth (4): k is the depth cap of a tree
    # (`DraftRequest.plan`, `DraftPlan.num_draft_tokens`)
    "k-capped-tree": DraftPlan(2, TreePlan(top_k=2, max_depth=4)),
}
SAMPLINGS = {"greedy": SamplingConfig(0.0), "sampled": SamplingConfig(1.0)}

#: max_tokens the recorder asks for in rounds 1, 2 (mod 4): fewer than the session's cap
SHRUNK_MAX_TOKENS = {1: 1, 2: 3}

#: drafters with state across requests (state_dict / load_state_dict / keeps_stream_state)
STATEFUL = ("suffix", "hedge:suffix,ngram", "hybrid-suffix-hydra")

#: fixed per-proposal drafting seconds of the hedge's sources (the stream method's
#: constants), so its choices and the round trip do not depend on the machine's load
HEDGE_SECONDS = [STREAM_DRAFT_SECONDS["suffix"], STREAM_DRAFT_SECONDS["ngram"]]



# -- the target and the drafters ------------------------------------------------------------
@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=V, hidden=32, layers=2, max_positions=256, scale=2.0)


@pytest.fixture(scope="module")
def reference(target):
    """Plain greedy continuation of each prompt."""
    return {name: plain_greedy(target, prompt, MAX_NEW) for name, prompt in PROMPTS.items()}


def build(kind: str, model):
    """A fresh drafter of suite case ``kind`` for the tiny ``model`` (the approach of
    `tests.realmodels.test_device_readiness._drafter`: heads and drafts from their
    classes; registry factories where they need no shipped head)."""
    d2t = torch.arange(0, V, 2)                          # a reduced draft vocabulary of 32 ids
    loaded = as_loaded(model)
    if kind in ("ngram", "suffix"):
        return make_drafter(kind, loaded)
    if kind == "hedge:suffix,ngram":
        return make_drafter(kind, loaded, hedge_draft_seconds=HEDGE_SECONDS)
    if kind == "ngram-datastore":
        from specloop.realmodels.drafters.datastore import NGramIndex
        # a datastore over the target's own greedy outputs (what its warm-up corpus would hold)
        stream = []
        for prompt in PROMPTS.values():
            stream += prompt + plain_greedy(model, prompt, MAX_NEW)
        return make_drafter(kind, loaded, index=NGramIndex.build(np.asarray(stream)))
    if kind in ("eagle", "eagle3", "hybrid"):
        from specloop.realmodels.heads.common import ReducedVocab
        from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
        from specloop.realmodels.heads.eagle_drafter import EagleDrafter
        head_kind = "eagle" if kind == "hybrid" else kind
        cfg = EagleConfig.from_target(model.config, head_kind, int(d2t.numel()))
        head = EagleHead(cfg, model.get_input_embeddings().weight.detach(),
                         model.get_output_embeddings().weight.detach()[d2t])
        drafter = EagleDrafter(head, ReducedVocab(d2t, V), name=head_kind)
        if kind == "hybrid":
            from specloop.realmodels.heads.hybrid import HybridDrafter
            return HybridDrafter(drafter)
        return drafter
    if kind == "hybrid-suffix-hydra":
        from specloop.realmodels.heads.hybrid import HybridDrafter
        return HybridDrafter(build("hydra", model), lookup_drafter=make_drafter("suffix", loaded), min_score=1.0)
    if kind == "hydra":
        from specloop.realmodels.heads.head_drafting import HydraDrafter
        from specloop.realmodels.heads.hydra import build_hydra
        return HydraDrafter(build_hydra(model, d2t, num_heads=4))
    if kind == "medusa":
        from specloop.realmodels.heads.head_drafting import MedusaDrafter
        from specloop.realmodels.heads.medusa import build_medusa
        return MedusaDrafter(build_medusa(model, d2t, num_heads=4))
    if kind == "small-lm":
        from specloop.realmodels.drafters.small_lm import SmallLMDrafter
        # a second tiny Llama close to the target (its weights scaled by 0.97): drafts
        # are often accepted, so the accepted-path cache surgery is exercised
        return SmallLMDrafter(tiny_llama(vocab=V, hidden=32, layers=2, max_positions=256, scale=2.0 * 0.97))
    if kind == "small-lm-distilled":
        from specloop.realmodels.heads.small_lm import SmallLMDraft, SmallLMDraftDrafter
        return SmallLMDraftDrafter(SmallLMDraft.from_target(model, d2t, num_layers=1))
    raise AssertionError(kind)


class Recorder:
    """Wraps a drafter: records every (request, proposal) before the session clips it
    and every observation ``observe`` returned; asks for fewer nodes than the session
    allows in some rounds (`SHRUNK_MAX_TOKENS`), so the ``max_tokens`` cap is exercised."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.needs_target_hidden = tuple(inner.needs_target_hidden)
        self.proposals: list[tuple[DraftRequest, object]] = []
        self.feedback: list = []
        self.observations: list = []

    def reset(self, prompt_ids, *, target_hidden=None):
        self.inner.reset(prompt_ids, target_hidden=target_hidden)

    def propose(self, request: DraftRequest):
        shrunk = SHRUNK_MAX_TOKENS.get(request.round_index % 4)
        if shrunk is not None and shrunk < request.max_tokens:
            request = dataclasses.replace(request, max_tokens=shrunk)
        proposal = self.inner.propose(request)
        self.proposals.append((request, proposal))
        return proposal

    def observe(self, feedback):
        observation = self.inner.observe(feedback)
        self.feedback.append(feedback)
        self.observations.append(observation)
        return observation

    def parameters(self):
        return self.inner.parameters()


class PlanPolicy:
    """Always ``plan`` as given (FixedDraftPolicy would raise a tree plan's k to its depth)."""

    def __init__(self, plan: DraftPlan):
        self._plan = plan

    def plan(self, state) -> DraftPlan:
        return self._plan

    def observe(self, record) -> None:
        return None


@dataclasses.dataclass
class Run:
    recorder: Recorder
    results: dict        # prompt name -> GenerationResult


_RUNS: dict = {}


def decode(target, kind: str, plan: str, sampling: str) -> Run:
    """One decoder over every prompt with a fresh ``kind`` drafter (cached per case)."""
    key = (id(target), kind, plan, sampling)
    if key not in _RUNS:
        recorder = Recorder(build(kind, target))
        decoder = SpeculativeDecoder(as_loaded(target), recorder, policy=PlanPolicy(PLANS[plan]),
                                     sampling=SAMPLINGS[sampling], seed=0, eos_token_id=[])
        results = {name: decoder.generate(prompt, MAX_NEW) for name, prompt in PROMPTS.items()}
        _RUNS[key] = Run(recorder, results)
    return _RUNS[key]


def _cases(plans=PLANS, kinds=KINDS):
    out = []
    for kind in kinds:
        for plan in plans:
            out.append(pytest.param(kind, plan, id=f"{kind}-{plan}"))
    return out


# -- the registry is covered ------------------------------------------------------------
def test_every_registered_drafter_is_in_the_suite(target):
    names = drafter_names()
    assert {"ngram", "suffix", "eagle", "medusa", "hydra", "small-lm"} <= set(names)
    missing = set(names) - set(KINDS.values())
    assert not missing, f"registered drafters without conformance cases: {sorted(missing)}"
    for kind in KINDS:
        drafter = build(kind, target)
        assert isinstance(drafter, Drafter), kind
        if kind in ("ngram", "ngram-datastore", "suffix", "hedge:suffix,ngram"):
            assert drafter.name == kind, (kind, drafter.name)       # built by the registry


def test_stateful_drafters_are_the_round_tripped_ones(target):
    """A drafter that gains state across requests must join the round-trip cases."""
    def stateful(d):                 # a declared keeps_stream_state decides (a hybrid's lookup may keep none)
        declared = getattr(d, "keeps_stream_state", None)
        if declared is not None:
            return bool(declared)
        return hasattr(d, "state_dict") and hasattr(d, "load_state_dict")
    assert {kind for kind in KINDS if stateful(build(kind, target))} == set(STATEFUL)


# -- the proposal contract ----------------------------------------------------------------
def check_proposal(request: DraftRequest, proposal, where: str) -> None:
    plan = request.plan
    tokens, parents, n = proposal.tokens, proposal.parents, proposal.size
    assert tokens.dtype == torch.int64 and parents.dtype == torch.int64, (where, tokens.dtype, parents.dtype)
    assert tokens.ndim == 1 and parents.shape == tokens.shape, (where, tokens.shape, parents.shape)
    if n == 0:
        return
    par = parents.cpu().tolist()
    toks = tokens.cpu().tolist()
    assert all(-1 <= p < i for i, p in enumerate(par)), (where, "parents", par)
    assert all(0 <= t < V for t in toks), (where, "ids outside the target vocabulary", toks)
    assert n <= request.max_tokens, (where, f"{n} nodes > max_tokens {request.max_tokens}")
    cap = plan.num_draft_tokens if plan.tree is None else min(plan.num_draft_tokens, plan.tree.max_depth)
    assert proposal.depth <= cap, (where, f"depth {proposal.depth} > the plan's cap {cap}", toks, par)
    if plan.tree is None:
        assert proposal.is_chain, (where, "a chain plan got a tree", par)
    elif plan.tree.verify_size is not None:
        assert n <= plan.tree.verify_size, (where, f"{n} nodes > verify_size {plan.tree.verify_size}")
    if request.sampling.greedy:          # deterministic siblings: a repeated one wastes a slot
        pairs = list(zip(par, toks))
        assert len(set(pairs)) == len(pairs), (where, "repeated sibling", pairs)
    q = proposal.q_draft
    if q is not None:
        assert q.ndim == 2 and q.shape[0] == n and 1 <= q.shape[1] <= V, (where, tuple(q.shape))
        assert q.dtype.is_floating_point, (where, q.dtype)
        rows = q.detach().double().cpu()
        assert torch.isfinite(rows).all() and (rows >= 0).all(), (where, "q_draft not a distribution")
        np.testing.assert_allclose(rows.sum(-1).numpy(), 1.0, atol=1e-4, err_msg=where)
        for i, tok in enumerate(toks):   # each node was drawn from its row
            assert tok < q.shape[1] and rows[i, tok] > 0, (where, f"node {i} token {tok} has q = 0")
    if proposal.node_probs is not None:
        probs = proposal.node_probs.detach().double().cpu().tolist()
        assert len(probs) == n, (where, "node_probs length")
        for i, p in enumerate(probs):    # cumulative: in [0, 1], never above the parent's
            assert 0.0 <= p <= 1.0 + 1e-9, (where, "node_probs", probs)
            assert par[i] < 0 or p <= probs[par[i]] + 1e-9, (where, "node_probs not cumulative", probs, par)
    if proposal.source_index is not None:
        assert len(proposal.source_index) == n, where


def test_contract_check_can_fail():
    """`check_proposal` accepts a valid tree and rejects each kind of violation."""
    from specloop.realmodels.drafters.base import DraftProposal

    def request(plan=DraftPlan(3, TreePlan(top_k=2, max_depth=3, verify_size=4)), max_tokens=4):
        return DraftRequest(torch.tensor([1, 2, 3]), plan, max_tokens, SamplingConfig(0.0), torch.Generator())

    def proposal(tokens=(4, 5, 6), parents=(-1, 0, -1), q="onehot", node_probs=(0.6, 0.3, 0.2), dtype=torch.long):
        toks = torch.tensor(tokens, dtype=dtype)
        rows = None
        if isinstance(q, str):
            rows = torch.nn.functional.one_hot(toks.long(), V).float() if q == "onehot" else None
        elif q is not None:
            rows = q
        probs = None if node_probs is None else torch.tensor(node_probs, dtype=torch.float64)
        return DraftProposal(toks, torch.tensor(parents, dtype=torch.long), rows, probs)

    check_proposal(request(), proposal(), "valid")
    check_proposal(request(DraftPlan(3)), proposal(parents=(-1, 0, 1), node_probs=(0.6, 0.3, 0.2)), "chain")
    bad = {
        "int32 tokens": (request(), proposal(dtype=torch.int32, q=None)),
        "id outside the vocabulary": (request(), proposal(tokens=(4, V, 6), q=None)),
        "over max_tokens": (request(max_tokens=2), proposal()),
        "over verify_size": (request(max_tokens=9), proposal((1, 2, 3, 4, 5), (-1, -1, -1, 0, 1), None, None)),
        "deeper than k": (request(DraftPlan(2, TreePlan(top_k=2, max_depth=4))),
                          proposal((1, 2, 3), (-1, 0, 1), None, None)),
        "a tree for a chain plan": (request(DraftPlan(3)), proposal()),
        "repeated greedy sibling": (request(), proposal((4, 4, 6), (-1, -1, 0), None, None)),
        "q rows not distributions": (request(), proposal(q=torch.full((3, V), 0.5 / V))),
        "more q columns than V": (request(), proposal(q=torch.full((3, V + 1), 1.0 / (V + 1)))),
        "token outside its q row's support": (request(), proposal(
            q=torch.nn.functional.one_hot(torch.tensor([4, 6, 6]), V).float())),
        "node_probs not cumulative": (request(), proposal(node_probs=(0.3, 0.6, 0.2))),
    }
    for what, (req, prop) in bad.items():
        with pytest.raises(AssertionError):
            check_proposal(req, prop, what)
            pytest.fail(f"check_proposal accepted a proposal with {what}")   # not an AssertionError


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind, plan", _cases())
def test_proposal_contract(target, kind, plan, sampling):
    run = decode(target, kind, plan, sampling)
    proposals = run.recorder.proposals
    assert len(proposals) >= 6
    for t, (request, proposal) in enumerate(proposals):
        check_proposal(request, proposal, f"{kind} {plan} {sampling} proposal {t}")
    drafted = [p for _, p in proposals if p.size]
    assert drafted, f"{kind} never drafted under {plan}"
    assert any(r.max_tokens in SHRUNK_MAX_TOKENS.values() and p.size for r, p in proposals), \
        "no drafted round had a shrunk max_tokens"
    if PLANS[plan].tree is not None and sampling == "greedy":
        assert any(not p.is_chain for p in drafted), f"{kind} drafted no branching tree under {plan}"


# -- observe -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, plan", _cases(plans=("chain", "eagle2-tree")))
def test_observe_returns_the_observation(target, kind, plan):
    """Once per round, a real decode's feedback; the return value is the protocol's
    (None, a float, or a mapping with "loss") and is what the round record holds."""
    run = decode(target, kind, plan, "greedy")
    recorder = run.recorder
    records = [r for result in run.results.values() for r in result.trace]
    assert len(recorder.observations) == len(records) == len(recorder.feedback) >= len(PROMPTS)
    for observation, record in zip(recorder.observations, records):
        if observation is None:
            assert math.isnan(record.loss), (kind, record.loss)
        elif isinstance(observation, dict):
            assert "loss" in observation and record.loss == pytest.approx(float(observation["loss"]), nan_ok=True)
        else:
            assert isinstance(observation, (float, int)) and not isinstance(observation, bool), \
                (kind, type(observation))
            assert record.loss == pytest.approx(float(observation), nan_ok=True)
    # the feedback is the decode's: committed tokens spell the output, hidden states
    # exactly for the drafters that ask for them
    fed = iter(recorder.feedback)
    layers = recorder.needs_target_hidden
    for name, result in run.results.items():
        committed = []
        for record in result.trace:
            feedback = next(fed)
            committed += feedback.committed_tokens.tolist()
            assert feedback.num_accepted == record.accepted_tokens
            if layers:
                assert feedback.target_hidden is not None and len(feedback.target_hidden) == len(layers)
                assert all(h.shape[0] == feedback.num_accepted + 1 for h in feedback.target_hidden)
            else:
                assert feedback.target_hidden is None
        assert committed == result.new_tokens, (kind, name)
        assert feedback.finished


# -- lossless greedy -----------------------------------------------------------------------
@pytest.mark.parametrize("kind, plan", [pytest.param(k, p, id=f"{k}-{p}") for k in KINDS for p in PLANS])
def test_lossless_greedy(target, reference, kind, plan):
    run = decode(target, kind, plan, "greedy")
    for name, result in run.results.items():
        assert result.new_tokens == reference[name], (kind, plan, name)
        assert result.stop_reason == "length"
    trace = [r for result in run.results.values() for r in result.trace]
    assert sum(r.num_draft_tokens for r in trace) > 0, "nothing was verified: the test would be vacuous"


@pytest.mark.parametrize("kind", list(KINDS))
def test_lossless_runs_accept_drafts(target, kind):
    """The lossless runs exercise acceptance (and the caches' accepted-path surgery),
    not only rejections: every drafter gets draft tokens accepted under some plan, and
    a drafter that reads earlier requests (suffix, hedge, the datastore) accepts
    several tokens of a round of the repeated request."""
    accepted = {plan: [record.accepted_tokens for result in decode(target, kind, plan, "greedy").results.values()
                       for record in result.trace] for plan in PLANS}
    assert sum(sum(a) for a in accepted.values()) > 0, (kind, accepted)
    if kind in ("suffix", "hedge:suffix,ngram", "ngram-datastore"):
        again = [max(record.accepted_tokens
                     for record in decode(target, kind, plan, "greedy").results["repetitive-again"].trace)
                 for plan in PLANS]
        assert min(again) >= 2, (kind, again)


# -- save / load -----------------------------------------------------------------------------
def _signature(recorder: Recorder) -> list:
    return [(p.tokens.tolist(), p.parents.tolist(),
             None if p.node_probs is None else p.node_probs.tolist()) for _, p in recorder.proposals]


@pytest.mark.parametrize("plan", ["chain", "eagle2-tree"])
@pytest.mark.parametrize("kind", STATEFUL)
def test_state_round_trip(target, kind, plan, tmp_path):
    from specloop.realmodels.online.checkpoint import load_checkpoint, save_checkpoint
    warm = [PROMPTS["random"], [30, 31, 2, 45, 19], PROMPTS["repetitive"]]
    probe = [[30, 31, 2, 45, 19], PROMPTS["random"], [40, 8, 33]]

    def decoder(drafter):
        return SpeculativeDecoder(as_loaded(target), drafter, policy=PlanPolicy(PLANS[plan]), eos_token_id=[])

    original = build(kind, target)
    warm_dec = decoder(original)
    for prompt in warm:
        warm_dec.generate(prompt, 16)
    path = tmp_path / "state.pt"                            # as the stream runner saves it
    save_checkpoint(path, {"drafter": original.state_dict()})
    loaded = build(kind, target)
    loaded.load_state_dict(load_checkpoint(path)["drafter"])
    runs = {}
    for name, drafter in (("original", original), ("loaded", loaded), ("fresh", build(kind, target))):
        recorder = Recorder(drafter)
        dec = decoder(recorder)
        runs[name] = ([dec.generate(prompt, 16).new_tokens for prompt in probe], _signature(recorder))
    assert runs["loaded"][1] == runs["original"][1]
    assert runs["loaded"][0] == runs["original"][0]
    assert runs["fresh"][1] != runs["original"][1], "the saved state made no difference: a vacuous round trip"


# -- peer: vLLM's n-gram proposer cases ---------------------------------------------------------
def _lookup(context, min_n, max_n, k, tree: TreePlan | None = None):
    from specloop.realmodels.drafters.ngram import NGramDrafter
    drafter = NGramDrafter(max_ngram=max_n, min_ngram=min_n)
    ids = torch.tensor(context, dtype=torch.long)
    drafter.reset(ids)
    plan = DraftPlan(k if tree is None else tree.max_depth, tree)
    proposal = drafter.propose(DraftRequest(ids, plan, 64, SamplingConfig(0.0), torch.Generator()))
    return proposal


@pytest.mark.parametrize("context, min_n, max_n, k, expected", [
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),                       # vLLM: n = 2, k = 3
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),                         # no match
    ([1, 2, 3, 4, 5], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),                               # no 4-gram
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),                           # no 4-gram, a 3-gram
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),            # vLLM: the 4-gram, not [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),                  # vLLM: the 3-gram, not [5, 2]
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    # the longest match wins over a shorter, more recent one: [1, 2, 3] at 0 -> [9, 7];
    # the 1-gram [3] last occurred at 5 -> [8, 1]
    ([1, 2, 3, 9, 7, 3, 8, 1, 2, 3], 1, 3, 2, [9, 7]),
    ([1, 2, 3, 9, 7, 3, 8, 1, 2, 3], 1, 1, 2, [8, 1]),
])
def test_ngram_matches_vllm_proposer(context, min_n, max_n, k, expected):
    proposal = _lookup(context, min_n, max_n, k)
    assert proposal.tokens.tolist() == expected
    assert proposal.is_chain and proposal.q_draft is None


@pytest.mark.parametrize("context, n, expected_vllm, expected_specloop", [
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, [100, 1], [300, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, [6, 2], [4, 1]),
])
def test_ngram_tie_break_among_equal_length_matches(context, n, expected_vllm, expected_specloop):
    """Among matches of the same length vLLM takes the earliest occurrence; specloop's
    `find_continuations` documents "every earlier occurrence ... (most recent first)",
    so its chain follows the MOST RECENT match, and a tree lists the other matches'
    continuations as later root children, most recent first."""
    chain = _lookup(context, n, n, 2)
    assert chain.tokens.tolist() == expected_specloop != expected_vllm
    tree = _lookup(context, n, n, 2, TreePlan(top_k=3, max_depth=2))
    roots = [int(tree.tokens[i]) for i in range(tree.size) if int(tree.parents[i]) == -1]
    assert roots[0] == expected_specloop[0] and expected_vllm[0] in roots[1:]
    assert tree.tokens[: len(expected_specloop)].tolist() == expected_specloop


# -- peer: SuffixDecoding learns over repetition -----------------------------------------------
def test_suffix_drafter_learns_over_repetition(target):
    """One `SuffixDrafter` kept across requests serves the same prompts 10 times: the
    global structure (earlier outputs) drafts the repeats, so the accepted tokens per
    round and the acceptance rate rise from the first pass to the last (the
    per-request structure alone -- ``use_global=False`` -- does not learn)."""
    from specloop.realmodels.drafters.suffix import SuffixDrafter
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, V - 1, size=8).tolist() for _ in range(3)]

    def passes(drafter, count=10):
        dec = SpeculativeDecoder(as_loaded(target), drafter, policy=FixedDraftPolicy(6), eos_token_id=[])
        stats = []
        for _ in range(count):
            trace = [r for p in prompts for r in dec.generate(p, 32).trace]
            accepted = sum(r.accepted_tokens for r in trace)
            drafted = sum(r.num_draft_tokens for r in trace)
            stats.append((accepted / len(trace), accepted / max(drafted, 1)))
        return stats

    drafter = make_drafter("suffix", as_loaded(target))
    assert isinstance(drafter, SuffixDrafter)
    learned = passes(drafter)
    (first_tau, first_rate), (last_tau, last_rate) = learned[0], learned[-1]
    assert last_tau > first_tau + 2.0, learned
    assert last_rate > first_rate and last_rate > 0.8, learned
    assert drafter.cache.num_tokens > 0
    local = passes(make_drafter("suffix", as_loaded(target), use_global=False), count=2)
    assert local[-1][0] < last_tau - 2.0, (local, learned)
