"""LTD environment that replays rounds recorded on the real decoder.

`specloop.ltd.record` stores, for every position of a greedy
generation, the real drafter's full EAGLE-2 tree (tokens, parents, depths,
cumulative draft probabilities) and the target's greedy token after every node a
policy could verify, plus measured cost tables. Greedy output does not depend on
the drafts, so the replay is exact in everything but time: a round at position t
drafted to depth D and verified with the best V nodes accepts the path that
follows the target's tokens through the kept children, commits a + 1 tokens and
moves to t + a + 1 -- the same tokens and accepted lengths the real decoder gives.
Times come from the recording's tables: draft seconds per depth, verify seconds
per verified tokens (V + 1), and a per-round overhead (update time). The sim layer
reads these as plain arrays (it never imports ``realmodels``).

Use it to train LTD policies on the real drafter's own confidence signals and
costs (``specloop ltd train --env replay``), and to price any tree policy or
static tree in milliseconds instead of minutes of wall clock (static grids:
`specloop.ltd.evaluate.grid_search_static` over `run_replay_policy`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specloop.record import RoundRecord, Trace
from specloop.strategies.base import DraftPlan, DraftStep, TreeCandidates
from specloop.strategies.engine import StepwiseRound, drive_round
from specloop.ltd.policy import LTDConfig, layer_step
from specloop.strategies.subtree import select_subtree

__all__ = ["ReplayData", "ReplayPrompt", "ReplayTreeEngine", "load_replay", "run_replay_policy",
           "oracle_tokens_per_second"]

_KEYS = ("node_offsets", "tokens", "parents", "depths", "probs", "target_next", "root_next", "context_length")


@dataclass(frozen=True)
class ReplayPrompt:
    """One recorded prompt (arrays as written by ``ltd.record.record_prompt``)."""

    node_offsets: np.ndarray   # int64 (T + 1,)
    tokens: np.ndarray         # int64 (N,)
    parents: np.ndarray        # int64 (N,), within the position's tree
    depths: np.ndarray         # int64 (N,)
    probs: np.ndarray          # float64 (N,)
    target_next: np.ndarray    # int64 (N,), -1 = not verified
    root_next: np.ndarray      # int64 (T,)
    context_length: np.ndarray  # int64 (T,)

    @property
    def positions(self) -> int:
        return int(self.root_next.shape[0])

    def tree(self, t: int) -> tuple[np.ndarray, ...]:
        """(tokens, parents, depths, probs, target_next) of position t's tree."""
        a, b = int(self.node_offsets[t]), int(self.node_offsets[t + 1])
        return (self.tokens[a:b], self.parents[a:b], self.depths[a:b], self.probs[a:b], self.target_next[a:b])


@dataclass(frozen=True)
class ReplayData:
    """Recorded prompts and the cost tables of one recording directory.

    Attributes:
        prompts: `ReplayPrompt` per prompt.
        verify_seconds: float64 (n_max + 1,), seconds of a verification forward of n tokens.
        layer_seconds: float64 (D_max + 1,), seconds of drafting to depth D.
        round_overhead_s: seconds per round outside draft and verify (update time).
        autoregressive_step_s: seconds per token of plain decoding (the speedup baseline).
        max_depth: D_max recorded (tokens). max_verify: largest replayable V (nodes).
        meta: the rest of ``costs.json``.
    """

    prompts: list
    verify_seconds: np.ndarray
    layer_seconds: np.ndarray
    round_overhead_s: float
    autoregressive_step_s: float
    max_depth: int
    max_verify: int
    meta: dict


def _check_prompt(p: ReplayPrompt, path: Path) -> None:
    n, t = p.tokens.shape[0], p.root_next.shape[0]
    if p.node_offsets.shape != (t + 1,) or int(p.node_offsets[-1]) != n or p.context_length.shape != (t,):
        raise ValueError(f"{path}: inconsistent replay arrays (offsets / positions)")
    if any(getattr(p, k).shape != (n,) for k in ("parents", "depths", "probs", "target_next")):
        raise ValueError(f"{path}: per-node arrays of different lengths")
    if n and (not np.all(np.isfinite(p.probs)) or (p.probs < 0).any() or (p.probs > 1 + 1e-9).any()):
        raise ValueError(f"{path}: node probabilities outside [0, 1]")


def load_replay(directory: str | Path) -> ReplayData:
    """Load a recording directory (``prompt-*.npz`` + ``costs.json``).

    Raises:
        FileNotFoundError: no such directory, no prompts, or no ``costs.json``.
        ValueError: malformed arrays or cost tables.
    """
    root = Path(directory)
    files = sorted(root.glob("prompt-*.npz")) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no recorded prompts (prompt-*.npz) in {root}; record them with "
                                "`specloop ltd record`")
    costs_path = root / "costs.json"
    if not costs_path.is_file():
        raise FileNotFoundError(f"{costs_path} is missing (the recording did not finish; rerun it to resume)")
    costs = json.loads(costs_path.read_text())
    prompts = []
    for path in files:
        with np.load(path) as data:
            missing = [k for k in _KEYS if k not in data]
            if missing:
                raise ValueError(f"{path}: missing arrays {missing}")
            prompt = ReplayPrompt(**{k: np.array(data[k]) for k in _KEYS})
        _check_prompt(prompt, path)
        prompts.append(prompt)
    verify = np.asarray(costs["verify_seconds"], dtype=np.float64)
    layer = np.asarray(costs["layer_seconds"], dtype=np.float64)
    if verify.ndim != 1 or verify.size < 2 or (verify[1:] <= 0).any() or layer.ndim != 1 or (layer < 0).any():
        raise ValueError(f"{costs_path}: verify_seconds must be > 0 from 1 token on and layer_seconds >= 0")
    max_verify = min(int(costs["max_verify"]), verify.size - 2)
    return ReplayData(prompts, verify, layer, float(costs["round_overhead_s"]), float(costs["autoregressive_step_s"]),
                      min(int(costs["max_depth"]), layer.size - 1), max_verify, costs)


def accepted_path(parents: np.ndarray, tokens: np.ndarray, target_next: np.ndarray, root_next: int,
                  keep: np.ndarray) -> int:
    """Accepted draft tokens of greedy verification of the kept nodes: from the
    root, step to the kept child whose token is the target's greedy token.

    Raises:
        ValueError: a kept node on the path was not verified in the recording.
    """
    kept = np.zeros(parents.shape[0], dtype=bool)
    kept[keep] = True
    cur, want, accepted = -1, int(root_next), 0
    while True:
        hit = np.flatnonzero(kept & (parents == cur) & (tokens == want))
        if hit.size == 0:
            return accepted
        cur = int(hit[0])
        want = int(target_next[cur])
        if want < 0:
            raise ValueError("the replay reached a node the recording did not verify (V above max_verify?)")
        accepted += 1


class ReplayTreeEngine(StepwiseRound):
    """`specloop.ltd.train.LTDEngine` over recorded real rounds, stepped by
    gymnasium or run by `drive_round` (`specloop.strategies.engine.StepwiseRound`).

    Args:
        data: `ReplayData`. config: `LTDConfig` (its max_depth is capped at the
            recording's; its verify sizes above ``data.max_verify`` are refused).
        prompts: indices of the prompts episodes draw from (default all).
        rounds_per_episode: cap on cycles per prompt (None = to the recording's end).

    Raises:
        ValueError: a config whose verify sizes exceed what was recorded.
    """

    def __init__(self, data: ReplayData, config: LTDConfig, prompts: list[int] | None = None,
                 rounds_per_episode: int | None = None):
        if config.verify_sizes[-1] > data.max_verify:
            raise ValueError(f"verify size {config.verify_sizes[-1]} exceeds the recording's max_verify "
                             f"{data.max_verify}")
        self.data, self.config = data, config
        self.max_depth = min(config.max_depth, data.max_depth)
        self.target_time = data.autoregressive_step_s
        self.prompt_ids = list(range(len(data.prompts))) if prompts is None else [int(i) for i in prompts]
        self.rounds_per_episode = rounds_per_episode
        self.rounds_done, self.position, self.episode = 0, 0, 0
        self._prompt = data.prompts[self.prompt_ids[0]]

    @property
    def episode_done(self) -> bool:
        if self.position >= self._prompt.positions:
            return True
        return self.rounds_per_episode is not None and self.rounds_done >= self.rounds_per_episode

    @property
    def context_length(self) -> int:
        """L: tokens in the context at the current position (pending token included)."""
        prompt = self._prompt
        if self.position < prompt.positions:
            return int(prompt.context_length[self.position])
        return int(prompt.context_length[-1]) + 1 if prompt.positions else 0

    def reset(self, rng: np.random.Generator, episode: int = 0, prompt: int | None = None) -> None:
        """Start a prompt (``prompt`` = index into ``prompts``, else drawn from ``rng``)."""
        index = int(rng.integers(len(self.prompt_ids))) if prompt is None else int(prompt)
        self._prompt = self.data.prompts[self.prompt_ids[index]]
        self.rounds_done, self.position, self.episode = 0, 0, int(episode)

    def _step(self) -> DraftStep:
        _, parents, depths, probs, _ = self._tree
        return layer_step(depths, parents, probs, self.depth, self.context_length, self.config.top_k)

    def start_round(self, plan: DraftPlan) -> int:
        """The depth cap of an EAGLE-2 ``plan`` (ValueError for any other plan)."""
        from specloop.ltd.env_sim import _plan_depth
        return min(_plan_depth(plan, self.config), self.max_depth)

    def begin_round(self) -> DraftStep:
        if self.episode_done:
            raise ValueError("the prompt is finished; reset the environment")
        self._tree = self._prompt.tree(self.position)
        self.depth = 1
        return self._step()

    def deepen(self) -> DraftStep:
        if self.depth >= self.max_depth:
            raise ValueError(f"cannot draft past max_depth={self.max_depth}")
        self.depth += 1
        return self._step()

    def candidates(self) -> TreeCandidates:
        _, _, depths, probs, _ = self._tree
        return TreeCandidates(self.depth, self.context_length, probs[depths <= self.depth].copy())

    def finish(self, verify_size: int, extra_draft_seconds: float = 0.0) -> RoundRecord:
        """Verify the best ``verify_size`` nodes of the depth-D tree (greedy) and
        advance; times from the recording's tables (+ ``extra_draft_seconds``).
        As in the decoder, D is capped at the positions left minus one (0: a plain
        one-token round)."""
        if not 1 <= int(verify_size) <= self.data.max_verify:
            raise ValueError(f"verify_size must be in [1, {self.data.max_verify}], got {verify_size}")
        tokens, parents, depths, probs, target_next = self._tree
        remaining = self._prompt.positions - self.position
        depth = min(self.depth, remaining - 1)     # the decoder never drafts past max_new_tokens
        keep = select_subtree(depths, parents, probs, depth, int(verify_size)) if depth > 0 else \
            np.zeros(0, dtype=np.int64)
        accepted = accepted_path(parents, tokens, target_next, int(self._prompt.root_next[self.position]), keep)
        committed = min(accepted + 1, remaining)
        record = RoundRecord(
            round_index=self.rounds_done, stream_index=self.episode, num_draft_tokens=int(keep.size),
            tree_depth=depth, verified_tokens=int(keep.size) + 1,
            accepted_tokens=min(accepted, committed), tokens_per_round=committed,
            draft_time=float(self.data.layer_seconds[depth]) + float(extra_draft_seconds),
            verify_time=float(self.data.verify_seconds[int(keep.size) + 1]),
            update_time=self.data.round_overhead_s, target_time=self.target_time)
        self.position += committed
        self.rounds_done += 1
        return record


def run_replay_policy(policy, data: ReplayData, config: LTDConfig, prompts: list[int] | None = None,
                      charge_policy_time: bool = False) -> tuple[Trace, np.ndarray, np.ndarray]:
    """Replay every prompt (in order) under a tree `DraftPolicy` (its hooks when
    present; see `specloop.ltd.env_sim.run_policy`).

    Returns:
        (trace, depth per round, V per round).
    """
    engine = ReplayTreeEngine(data, config, prompts)
    engine.charge_policy_time = bool(charge_policy_time)
    records = []
    for episode in range(len(engine.prompt_ids)):
        engine.reset(np.random.default_rng(0), episode, prompt=episode)
        while not engine.episode_done:
            records.append(drive_round(policy, engine))
    trace = Trace(records, {"source": "replay"})
    return trace, trace.column("tree_depth"), trace.column("num_draft_tokens")


def oracle_tokens_per_second(data: ReplayData, config: LTDConfig, prompts: list[int] | None = None) -> float:
    """Tokens/s of a clairvoyant per-round policy: each round picks the (D, V) with
    the best committed tokens per second *for that round*, knowing the outcome.
    Not a strict bound (a round-greedy choice need not maximise the total), but a
    measure of how much a per-round policy could gain over the best static tree."""
    engine = ReplayTreeEngine(data, config, prompts)
    tokens = seconds = 0.0
    for episode in range(len(engine.prompt_ids)):
        engine.reset(np.random.default_rng(0), episode, prompt=episode)
        while not engine.episode_done:
            best = None
            for depth in range(1, engine.max_depth + 1):
                for size in config.verify_sizes:
                    record = _probe(engine, depth, size)
                    rate = record.tokens_per_round / record.round_time
                    if best is None or rate > best[0]:
                        best = (rate, depth, size, record)
            _, _, _, record = best
            engine.position += record.tokens_per_round
            engine.rounds_done += 1
            tokens += record.tokens_per_round
            seconds += record.round_time
    return tokens / seconds


def _probe(engine: ReplayTreeEngine, depth: int, size: int) -> RoundRecord:
    """The record of one (D, V) round at the engine's position, without advancing."""
    position, rounds = engine.position, engine.rounds_done
    engine.begin_round()
    engine.depth = depth
    record = engine.finish(size)
    engine.position, engine.rounds_done = position, rounds
    return record
