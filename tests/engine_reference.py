"""The engine reference of the round-loop refactor (one driver, `drive_round`, for every
engine): records of every engine for
fixed seeds, computed through the public entry points only, so the same code runs on the
code before and after the change.

    python tests/engine_reference.py sim  OUT.json    # simulator engines (seconds)
    python tests/engine_reference.py real OUT.json    # real decoder, SmolLM2 float32 (minutes)

`tests/test_engine_reference.py` recomputes both and compares them with the JSON files
in ``tests/fixtures/`` written from commit 83a6567 (timing fields aside); the cases of a
drafter whose shipped head later changed are re-recorded with ``rerecord`` (their head
fingerprints are in ``engine_reference_real_heads.json``). The real-decoder part
compares the committed tokens and n_t (tokens_per_round) of every round; the recorded
``accepted_tokens`` of a round that stops inside an accepted block changed on purpose
(it now counts only committed draft tokens) and is compared only for rounds that did not stop.
"""
from __future__ import annotations

import json
import math
import sys

from pathlib import Path

import numpy as np

#: record fields compared (timing fields aside)
FIELDS = ("round_index", "stream_index", "num_draft_tokens", "tree_depth", "verified_tokens",
          "accepted_tokens", "tokens_per_round")


def _rows(trace) -> list[list]:
    out = []
    for r in trace:
        loss = None if r.loss is None or (isinstance(r.loss, float) and math.isnan(r.loss)) else round(float(r.loss), 9)
        out.append([int(getattr(r, f)) for f in FIELDS] + [loss])
    return out


def sim_reference() -> dict:
    """Chain, tree, online and LTD (sim + synthetic replay) records for fixed seeds."""
    from specloop.sim.drafts import NoisyDraft, ParametricDraft
    from specloop.sim.engine import run_chain
    from specloop.sim.streams import make_stream
    from specloop.strategies.base import DraftPlan, TreePlan
    from specloop.strategies.ogd import OGD
    from specloop.strategies.policies import FixedK, HeuristicK
    from specloop.strategies.trees import DynamicTree, StaticTree

    out: dict = {}
    for mode in ("sampling", "greedy"):
        stream = make_stream("piecewise", 40, 120, seed=3, num_contexts=6)
        draft = NoisyDraft(stream, noise=0.8, seed=1)
        out[f"chain-fixed-{mode}"] = _rows(run_chain(stream, draft, FixedK(3), rng=5, mode=mode))
        out[f"chain-heuristic-{mode}"] = _rows(run_chain(stream, draft, HeuristicK(initial_k=2), rng=6, mode=mode))
        out[f"tree-static-{mode}"] = _rows(run_chain(stream, draft, StaticTree((2, 2, 1)), rng=7, mode=mode))
        out[f"tree-dynamic-{mode}"] = _rows(run_chain(stream, draft, DynamicTree(top_k=2, max_depth=3, verify_size=5),
                                                     rng=8, mode=mode))
    stream = make_stream("stationary", 30, 80, seed=4, num_contexts=5)
    pdraft = ParametricDraft(30, 5, rank=3)
    params = pdraft.init_params(np.random.default_rng(0))
    out["chain-online-ogd"] = _rows(run_chain(stream, pdraft, FixedK(2), rng=9, params=params,
                                              learner=OGD(lr=0.3, radius=5.0)))

    from specloop.sim.online import OnlineSetup, build_problem, run_online
    problem = build_problem(OnlineSetup(scenario="piecewise", rounds=60, seed=2))
    for name in ("fixed", "ogd", "optimistic", "ensemble", "optimistic-ensemble", "osd"):
        result = run_online(problem, name)
        out[f"online-{name}"] = _rows(result.trace)

    from specloop.ltd.env_sim import TreeWorld, TreeWorldOptions, run_policy
    from specloop.ltd.policy import LTDConfig
    config = LTDConfig(top_k=3, max_depth=4, verify_sizes=(2, 4, 8), size_obs_probs=16)
    world = TreeWorld(TreeWorldOptions(rounds_per_episode=12), config)
    for label, policy in (("dynamic", DynamicTree(top_k=3, max_depth=4, verify_size=6)),
                          ("dynamic-deep", DynamicTree(top_k=3, max_depth=2, verify_size=3))):
        out[f"ltd-sim-{label}"] = _rows(run_policy(policy, world, episodes=2, seed=4).trace)
    return out


def replay_reference(directory) -> dict:
    """LTD replay records on a synthetic recording in ``directory``."""
    from specloop.ltd.env_replay import load_replay, run_replay_policy
    from specloop.ltd.policy import LTDConfig
    from specloop.strategies.trees import DynamicTree
    config = LTDConfig(top_k=3, max_depth=4, verify_sizes=(2, 4, 8), size_obs_probs=16)
    data = load_replay(directory)
    out = {}
    for depth, size in ((2, 4), (4, 8), (3, 2)):
        trace, _, _ = run_replay_policy(DynamicTree(top_k=3, max_depth=depth, verify_size=size), data, config)
        out[f"ltd-replay-D{depth}-V{size}"] = _rows(trace)
    return out


#: a synthetic LTD recording (tests/sim/test_ltd_replay.py ``write_replay``, seed 0), saved
REPLAY_DIR = Path(__file__).resolve().parent / "fixtures" / "engine_reference_replay"

#: (drafter, plan label) pairs of the real-decoder reference
REAL_CASES = (("ngram", "chain"), ("ngram", "tree"), ("small-lm", "chain"), ("small-lm", "tree"),
              ("eagle", "chain"), ("eagle", "tree"), ("eagle3", "chain"), ("eagle3", "tree"),
              ("medusa", "chain"), ("medusa", "tree"), ("hydra", "chain"), ("hydra", "tree"),
              ("hybrid", "chain"), ("hybrid", "tree"), ("ngram-datastore", "chain"),
              ("ngram-datastore", "tree"))


def real_prompts(target, count: int = 10) -> list[list[int]]:
    from specloop.data.prompts import load_prompts
    prompts = load_prompts("humaneval", "heldout", limit=count // 2) + \
        load_prompts("mt-bench", "heldout", limit=count - count // 2)
    return [target.tokenizer.apply_chat_template([{"role": "user", "content": p.text}],
                                                 add_generation_prompt=True, tokenize=True,
                                                 return_dict=False) for p in prompts]


def real_plan(drafter: str, label: str):
    from specloop.strategies.base import DraftPlan, TreePlan
    if label == "chain":
        return DraftPlan(4)
    if drafter in ("eagle", "eagle3", "hybrid"):
        return DraftPlan(4, TreePlan(top_k=3, max_depth=4, verify_size=10))
    return DraftPlan(3, TreePlan(branching=(2, 2, 1)))


class _Plan:
    """A fixed-plan policy (plan / observe only)."""

    def __init__(self, plan):
        self._plan = plan

    def plan(self, state):
        return self._plan

    def observe(self, record):
        pass


#: new tokens per prompt of the real-decoder reference
MAX_NEW_TOKENS = 24


def real_reference(cases=REAL_CASES, prompts: int = 10, max_new_tokens: int = MAX_NEW_TOKENS, indices=None,
                   target=None) -> dict:
    """Committed tokens and per-round counts of the real decoder on SmolLM2 float32, for
    the prompts ``indices`` (default all) of the ``prompts`` reference prompts; entries
    of skipped prompts are None."""
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import load_model
    target = target or load_model("smollm2-135m", dtype="float32")
    ids = real_prompts(target, prompts)
    chosen = set(range(prompts) if indices is None else indices)
    out: dict = {}
    drafters: dict = {}
    for name, label in cases:
        if name not in drafters:
            drafters[name] = make_drafter(name, target, train_if_missing=False, progress=False)
        decoder = SpeculativeDecoder(target, drafters[name], policy=_Plan(real_plan(name, label)))
        rows = []
        for i, prompt in enumerate(ids):
            if i not in chosen:
                rows.append(None)
                continue
            result = decoder.generate(prompt, max_new_tokens, stream_index=i)
            rows.append({"tokens": list(map(int, result.new_tokens)), "stop": result.stop_reason,
                         "rounds": _rows(result.trace)})
        out[f"{name}-{label}"] = rows
    return out


#: the shipped draft file each real case's drafter reads (the hybrid drafts with EAGLE)
CASE_HEADS = {"small-lm": "small-lm", "eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "hydra": "hydra",
              "hybrid": "eagle"}


def head_fingerprints(target: str = "smollm2-135m") -> dict:
    """sha256 of the shipped draft file behind each real case's drafter (`CASE_HEADS`):
    a case's reference rounds hold only for the head they were recorded with."""
    import hashlib

    from specloop.realmodels.heads.common import pretrained_path
    return {name: hashlib.sha256(pretrained_path(target, kind).read_bytes()).hexdigest()
            for name, kind in CASE_HEADS.items()}


def rerecord(path, names) -> None:
    """Re-record the real cases of drafters ``names`` into ``path`` (after a shipped head
    changed), and their head fingerprints into ``path``'s ``_heads.json`` sibling."""
    path = Path(path)
    data = json.loads(path.read_text())
    data.update(real_reference(cases=[c for c in REAL_CASES if c[0] in names]))
    path.write_text(json.dumps(data))
    heads_file = path.with_name(path.stem + "_heads.json")
    heads = json.loads(heads_file.read_text()) if heads_file.is_file() else {}
    heads.update({n: v for n, v in head_fingerprints().items() if n in names or n not in heads})
    heads_file.write_text(json.dumps(heads, indent=1, sort_keys=True))


if __name__ == "__main__":
    kind, path = sys.argv[1], sys.argv[2]
    if kind == "sim":
        data = sim_reference()
        data.update(replay_reference(REPLAY_DIR))
    elif kind == "rerecord":       # python tests/engine_reference.py rerecord OUT.json eagle3,hydra
        rerecord(path, sys.argv[3].split(","))
        sys.exit(0)
    else:
        data = real_reference()
    Path(path).write_text(json.dumps(data))
    print(f"wrote {len(data)} cases to {path}")
