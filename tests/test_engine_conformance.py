"""The engine conformance suite: every engine runs through
`specloop.strategies.engine.drive_round` and honours the strategy contract the same way.

Engines: the simulator's chain and tree rounds (`SimChainEngine`), the online simulator
(`OnlineChainEngine`), the simulated and replayed LTD engines (`SimTreeEngine`,
`ReplayTreeEngine`), the real decoder's `DecodeSession` (chain and tree, a small-LM draft
that does not ask the hooks itself, and a tree draft that does), and the real LTD engine
(`RealTreeEngine`) on tiny models built here. For each: the same policy objects run;
seeded runs repeat exactly; a scripted stop policy and a `ConfidenceStop` are asked and
obeyed by one rule (never at the depth cap; the first False ends drafting; V clipped to
the drafted nodes); every record is complete when the policy observes it (loss where the
engine has one, non-negative seconds in every time field) and no input is mutated.
"""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.strategies.engine import drive_round
from specloop.strategies.policies import ConfidenceStop
from specloop.ltd.policy import LTDConfig

LTD_CFG = LTDConfig(top_k=3, max_depth=4, verify_sizes=(2, 4, 8), size_obs_probs=16)
ROUNDS = 6


class Scripted:
    """A policy with a fixed plan, a scripted stop depth per round and a scripted V; it
    logs every step it is asked about and every record it observes."""

    def __init__(self, plan: DraftPlan, stops=(2, 1, 3, 9, 2, 1), sizes=(3, 1, 5, 2, 8, 4)):
        self._plan, self.stops, self.sizes = plan, stops, sizes
        self.asked: list[list[int]] = []
        self.answers: list[list[bool]] = []
        self.records: list[RoundRecord] = []
        self.sizes_asked: list[int] = []
        self.candidates: list[int] = []

    def plan(self, state):
        self.asked.append([])
        self.answers.append([])
        return self._plan

    def continue_drafting(self, step) -> bool:
        go = step.depth < self.stops[len(self.records) % len(self.stops)]
        self.asked[-1].append(int(step.depth))
        self.answers[-1].append(go)
        return go

    def verify_size(self, candidates) -> int:
        size = self.sizes[len(self.records) % len(self.sizes)]
        self.sizes_asked.append(size)
        self.candidates.append(int(np.asarray(candidates.node_probs).size))
        return size

    def observe(self, record: RoundRecord) -> None:
        self.records.append(record)


class Confident(ConfidenceStop):
    """ConfidenceStop with the engine's plan (chains and trees) and a log of its answers."""

    def __init__(self, plan: DraftPlan, threshold: float):
        super().__init__(threshold=threshold, max_draft_tokens=16)
        self._plan = plan
        self.log: list[list[tuple[int, bool]]] = []
        self.records: list[RoundRecord] = []

    def plan(self, state):
        self.log.append([])
        return self._plan

    def continue_drafting(self, step):
        go = super().continue_drafting(step)
        self.log[-1].append((int(step.depth), go))
        return go

    def observe(self, record):
        self.records.append(record)


# -- engine factories -------------------------------------------------------------------
def _sim_stream():
    from specloop.sim.drafts import NoisyDraft
    from specloop.sim.streams import make_stream
    stream = make_stream("piecewise", 24, 40, seed=3, num_contexts=5)
    return stream, NoisyDraft(stream, noise=0.6, seed=1)


def _cost():
    from specloop.sim.costs import LinearCost
    return LinearCost(draft_time=0.002, target_time=0.033)


def sim_chain(seed=0):
    from specloop.sim.drafts import ParametricDraft
    from specloop.sim.engine import SimChainEngine
    from specloop.sim.streams import make_stream
    stream = make_stream("stationary", 24, 40, seed=3, num_contexts=5)
    draft = ParametricDraft(24, 5, rank=2)
    params = draft.init_params(np.random.default_rng(0))
    inputs = {"table": stream.target_table(0), "params": params}
    return SimChainEngine(stream, draft, rng=seed, cost_model=_cost(), params=params), inputs


def sim_tree(seed=0):
    from specloop.sim.engine import SimChainEngine
    stream, draft = _sim_stream()
    return SimChainEngine(stream, draft, rng=seed, cost_model=_cost(), mode="greedy"), {"table": stream.target_table(0)}


def sim_online(seed=0):
    from specloop.sim.costs import LinearCost
    from specloop.sim.online import OnlineChainEngine, OnlineSetup, build_problem
    problem = build_problem(OnlineSetup(scenario="piecewise", rounds=40, seed=2))
    engine = OnlineChainEngine(problem, np.random.default_rng(seed), LinearCost(0.05 * 0.033, 0.033))
    return engine, {"init": problem.init_params}


def sim_ltd(seed=0):
    from specloop.ltd.env_sim import SimTreeEngine, TreeWorld, TreeWorldOptions
    engine = SimTreeEngine(TreeWorld(TreeWorldOptions(rounds_per_episode=64), LTD_CFG))
    engine.reset(np.random.default_rng(seed), 0)
    return engine, {}


def ltd_replay(seed=0):
    from pathlib import Path
    from specloop.ltd.env_replay import ReplayTreeEngine, load_replay
    data = load_replay(Path(__file__).parent / "fixtures" / "engine_reference_replay")
    engine = ReplayTreeEngine(data, LTD_CFG)
    engine.reset(np.random.default_rng(seed), 0, prompt=0)
    return engine, {"tokens": data.prompts[0].tokens}


def _tiny_decoder(drafter_kind: str, seed: int):
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.drafters.small_lm import SmallLMDrafter
    from tests.realmodels.decoder_util import as_loaded, tiny_llama
    target = tiny_llama(vocab=16, seed=0)
    if drafter_kind == "small-lm":
        drafter = SmallLMDrafter(tiny_llama(vocab=16, seed=0, scale=0.97))
    else:
        from tests.realmodels.test_ltd_env import BigramTreeDrafter
        from tests.realmodels.heads_b_util import tiny_target
        target = tiny_target()
        drafter = BigramTreeDrafter()
    return SpeculativeDecoder(as_loaded(target), drafter, eos_token_id=[], seed=seed), target


def real_session(kind):
    def factory(seed=0):
        decoder, target = _tiny_decoder("bigram" if kind == "tree-asks" else "small-lm", seed)
        prompt = torch.tensor([1, 4, 7, 2, 9, 3])
        session = decoder.session(prompt, 40)
        return session, {"prompt": prompt, "weights": next(target.parameters())}
    return factory


_RECORDINGS: dict = {}


def _recording(target, prompt):
    """A recording of ``prompt`` on ``target`` (40 new tokens), made once per target."""
    import tempfile
    from specloop.data.streams import StreamItem
    from specloop.realmodels.recording import RecordSettings, open_recording
    from specloop.realmodels.streams.record import record_stream
    key = id(type(target)), tuple(prompt.tolist()), int(target.config.vocab_size)
    if key not in _RECORDINGS:
        folder = tempfile.mkdtemp(prefix="conformance-rec-")
        settings = RecordSettings(target="tiny", dtype="float32", datasets=("t",), split="heldout", order="shift",
                                  prompts=1, max_new_tokens=40, max_prompt_tokens=None, chat_template=False,
                                  top_m=8, layers=(-1,), batch_size=1, shard_size=1)
        record_stream(target, [StreamItem(0, "t", "p0", "", tuple(prompt.tolist()))], folder, settings,
                      check_prompts=0)
        _RECORDINGS[key] = open_recording(folder)
    return _RECORDINGS[key]


def replay_session(kind):
    def factory(seed=0):
        from specloop.realmodels.streams.replay import ReplayDecoder
        from specloop.theory.speedup import VerifyCostTable
        from tests.realmodels.decoder_util import as_loaded
        decoder, target = _tiny_decoder("bigram" if kind == "tree-asks" else "small-lm", seed)
        prompt = torch.tensor([1, 4, 7, 2, 9, 3])
        replay = ReplayDecoder(_recording(target, prompt), as_loaded(target), decoder.drafter, seed=seed,
                               verify_cost=VerifyCostTable([1, 8], [0.01, 0.02]))
        session = replay.session(prompt, 40)
        return session, {"prompt": prompt, "weights": next(target.parameters())}
    return factory


def real_ltd(seed=0):
    from specloop.ltd.env_real import RealHarness, RealTreeEngine
    from tests.realmodels.heads_b_util import tiny_target
    from tests.realmodels.test_ltd_env import BigramTreeDrafter
    torch.manual_seed(0)
    prompts = [torch.randint(3, 96, (n,)) for n in (5, 9)]
    harness = RealHarness(SimpleNamespace(model=tiny_target(), tokenizer=None), BigramTreeDrafter(), prompts,
                          LTD_CFG, max_new_tokens=40)
    engine = RealTreeEngine(harness)
    engine.start_prompt(prompts[0])
    return engine, {"prompt": prompts[0]}


CHAIN = DraftPlan(4)
STATIC_TREE = DraftPlan(3, TreePlan(branching=(2, 2, 1)))
TOPK_TREE = DraftPlan(4, TreePlan(top_k=3, max_depth=4, verify_size=8))   # the replay records V <= 8

# name -> (factory, plan, cost model engine?, engine has a loss, the policy's V is asked)
ENGINES = {
    "sim-chain": (sim_chain, CHAIN, True, True, False),
    "sim-tree": (sim_tree, DraftPlan(3, TreePlan(top_k=2, max_depth=3)), True, False, True),
    "sim-online": (sim_online, CHAIN, True, True, False),
    "sim-ltd": (sim_ltd, TOPK_TREE, True, False, True),
    "ltd-replay": (ltd_replay, TOPK_TREE, True, False, True),
    "real-chain": (real_session("chain"), CHAIN, False, False, False),
    "real-tree": (real_session("tree"), STATIC_TREE, False, False, True),
    "real-tree-asks": (real_session("tree-asks"), TOPK_TREE, False, False, True),
    "real-ltd": (real_ltd, TOPK_TREE, False, False, True),
    "replay-chain": (replay_session("chain"), CHAIN, False, False, False),
    "replay-tree-asks": (replay_session("tree-asks"), TOPK_TREE, False, False, True),
}

_TIMING = ("draft_time", "verify_time", "update_time", "target_time")


def _run(name, policy, rounds=ROUNDS, seed=0):
    factory = ENGINES[name][0]
    engine, inputs = factory(seed)
    before = copy.deepcopy(inputs)
    records = []
    for _ in range(rounds):
        done = getattr(engine, "done", False) or getattr(engine, "episode_done", False)
        if done:
            break
        learner = None
        if name == "sim-chain":
            from specloop.strategies.ogd import OGD
            learner = OGD(lr=0.2, radius=5.0)
        records.append(drive_round(policy, engine, learner))
    return records, inputs, before


def _untimed(record: RoundRecord) -> dict:
    out = record.to_dict()
    for key in _TIMING:
        out.pop(key)
    return out


def _cap(plan: DraftPlan) -> int:
    return plan.num_draft_tokens if plan.tree is None else min(plan.num_draft_tokens, plan.tree.max_depth)


@pytest.mark.parametrize("name", list(ENGINES))
def test_scripted_hooks_are_honoured_by_one_rule(name):
    _, plan, _, _, sizes_asked = ENGINES[name]
    policy = Scripted(plan)
    records, _, _ = _run(name, policy)
    assert len(records) == len(policy.records) >= 3
    stopped = 0
    for t, record in enumerate(records):
        asked, answers = policy.asked[t], policy.answers[t]
        # asked after each drafted depth below the cap, in order, never at the cap,
        # never again after the first False
        assert asked == list(range(1, len(asked) + 1)), asked
        assert all(answers[:-1]) and all(d < _cap(plan) for d in asked)
        # drafted depth: where the first False ended drafting, else one level past the
        # last question (the cap, or the engine's own limit this round)
        drafted = asked[-1] if answers and not answers[-1] else len(asked) + 1
        stopped += bool(answers and not answers[-1])
        if not record.num_draft_tokens:
            continue
        pruned = sizes_asked and record.num_draft_tokens < policy.candidates[t]
        if pruned:      # the best V nodes of the drafted tree may be shallower than it
            assert record.tree_depth <= drafted, (t, asked, record)
        else:
            assert record.tree_depth == drafted, (t, asked, record)
    assert stopped >= 2, "the script must stop some rounds early"
    if sizes_asked:
        assert len(policy.sizes_asked) == len(records)
        for size, n, record in zip(policy.sizes_asked, policy.candidates, records):
            assert record.num_draft_tokens == min(size, n), (size, n, record)


@pytest.mark.parametrize("name", list(ENGINES))
def test_confidence_stop_decides_by_its_own_rule(name):
    """The engine's DraftSteps are valid probabilities (ConfidenceStop checks them), and
    its answer decides the depth: the first False ends drafting there."""
    plan = ENGINES[name][1]
    policy = Confident(plan, threshold=0.55)
    records, _, _ = _run(name, policy)
    assert len(records) >= 3
    for t, record in enumerate(records):
        log = policy.log[t]
        assert [d for d, _ in log] == list(range(1, len(log) + 1))
        assert all(go for _, go in log[:-1])
        if log and not log[-1][1]:
            assert record.tree_depth == log[-1][0]


@pytest.mark.parametrize("name", list(ENGINES))
def test_seeded_runs_repeat(name):
    plan = ENGINES[name][1]
    first, _, _ = _run(name, Scripted(plan), seed=4)
    second, _, _ = _run(name, Scripted(plan), seed=4)
    assert [_untimed(r) for r in first] == [_untimed(r) for r in second]


@pytest.mark.parametrize("name", list(ENGINES))
def test_record_is_complete_when_observed_and_inputs_untouched(name):
    _, plan, cost_engine, has_loss, _ = ENGINES[name]
    policy = Scripted(plan)
    records, inputs, before = _run(name, policy)
    for record in policy.records:              # what observe saw
        assert isinstance(record, RoundRecord)
        for key in ("draft_time", "verify_time", "update_time"):
            value = getattr(record, key)
            assert isinstance(value, float) and value >= 0.0 and math.isfinite(value)
        assert 0 < record.verify_time < 30.0                              # seconds
        if cost_engine:       # priced from tables of seconds (~0.03-0.1 s a forward), not units of A
            assert 0.01 < record.verify_time < 0.5, record
        if has_loss:
            assert math.isfinite(record.loss)
        assert record.tokens_per_round >= 1
        assert record.accepted_tokens <= record.tokens_per_round
    for key, value in before.items():          # nothing the engine was given changed
        now = inputs[key]
        if isinstance(value, list):
            for a, b in zip(value, now):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, now)
        else:
            np.testing.assert_array_equal(np.asarray(value), np.asarray(now))


def test_the_drafters_observation_is_in_the_record_before_observe():
    """A real drafter whose observe returns a loss: the policy sees it in the record."""
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from tests.realmodels.decoder_util import as_loaded, tiny_llama

    class Lossy(NGramDrafter):
        def __init__(self):
            super().__init__()
            self.t = 0

        def observe(self, feedback):
            super().observe(feedback)
            self.t += 1
            return 0.5 * self.t

    policy = Scripted(CHAIN)
    decoder = SpeculativeDecoder(as_loaded(tiny_llama(vocab=16)), Lossy(), policy=policy, eos_token_id=[])
    decoder.generate([1, 2, 3, 1, 2, 3, 1, 2], 12)
    assert [r.loss for r in policy.records] == [0.5 * (t + 1) for t in range(len(policy.records))]
