"""Synthetic target-distribution streams for the simulator.

A `TargetStream` is a sequence of ``rounds`` rounds; round t has a context
c_t in [0, num_contexts) and a target next-token distribution p_t = p_t(. | c_t)
over a vocabulary of ``vocab_size`` tokens. Targets are softmax(z_t(c) / temperature)
of logits built as follows.

* Zipf-like shape. Each context has its own token ranking rank_c (a noisy
  version of one global ranking, noise scale ``context_noise``); its base logits are
  ``-zipf_exponent * log(1 + rank_c(x))``, so p(x) is proportional to
  (1 + rank)^(-zipf_exponent / temperature): a heavy Zipf tail whose peakedness
  the temperature controls.
* Scenarios (how z_t moves with t):

  - ``"stationary"``: z_t(c) = B(c).
  - ``"piecewise"``: ``num_domains`` independent bases (another global ranking
    each, like a prompt stream switching between code and chat); the domain
    changes every ``segment_length`` rounds (cyclically).
  - ``"smooth"``: z_t(c) = B(c) + s((cos th_t - 1) D1(c) + sin th_t D2(c)),
    th_t = 2 pi t / ``drift_period`` with a slow period (default ``rounds``).
  - ``"fast"``: the same with a short period (default 20 rounds).
  - ``"trained-target"``: the target is a policy being trained by on-policy RL
    (OnlineSpec Appendix C.4). With a tabular softmax policy, natural policy
    gradient on a reward R has the closed form
    z_t(c) = B(c) + ``rl_step_size`` * u_t * R(c), u_t = floor(t / rounds_per_update)
    policy updates so far (Kakade 2001; Agarwal et al. 2021, Lemma 15), so the
    target sharpens onto rewarded tokens and drifts away from a static draft.

* Correlation along a chain: the next position's context is a deterministic hash
  of the current context and the drafted token, ``next_context(c, x)``, so the
  next position's p depends on the drafted token and acceptances along a chain are
  not i.i.d. With ``iid=True`` every position of a round keeps the round's context
  (Assumption 1 of OnlineSpec: p and q position-independent within a round).

Randomness: everything is a deterministic function of ``seed`` (numpy
``SeedSequence``); contexts c_t are drawn once at construction with weights
proportional to (c + 1)^(-context_exponent).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SCENARIOS", "TargetStream", "make_stream", "next_context", "StreamOptions"]

SCENARIOS = ("stationary", "piecewise", "smooth", "fast", "trained-target")
MAX_VOCAB = 65536

# multiplicative hash constants of `next_context` (shared with the Numba kernels)
HASH_CONTEXT = 1_000_003
HASH_TOKEN = 7_919
HASH_OFFSET = 12_345


def next_context(context: int, token: int, num_contexts: int, iid: bool = False) -> int:
    """Context of the next chain position after drafting ``token`` in ``context``.

    ``(context * 1000003 + token * 7919 + 12345) mod num_contexts``; with
    ``iid=True`` the context is unchanged (position-independent targets).
    """
    if iid:
        return int(context)
    return int((int(context) * HASH_CONTEXT + int(token) * HASH_TOKEN + HASH_OFFSET) % num_contexts)


@dataclass(frozen=True)
class StreamOptions:
    """Shape and drift options of a stream (see the module docstring).

    Attributes:
        zipf_exponent: s > 0 of the Zipf base logits -s log(1 + rank).
        temperature: > 0; p = softmax(z / temperature). Lower = more peaked.
        context_noise: >= 0, scale of the per-context perturbation of the ranking.
        context_exponent: >= 0, contexts are drawn with weights (c + 1)^-exponent.
        iid: keep the round's context at every chain position (Assumption 1).
        num_domains: >= 1 domains of the "piecewise" scenario.
        segment_length: rounds per domain segment (default rounds // (2 num_domains)).
        drift_scale: >= 0, amplitude of "smooth"/"fast" drift in logit units.
        drift_period: rounds per drift cycle (default rounds for "smooth", 20 for "fast").
        rl_step_size: >= 0, natural-policy-gradient step of "trained-target".
        rounds_per_update: rounds between two policy updates of "trained-target".
        reward_fraction: fraction of tokens with reward 1 (others 0) per context.
    """

    zipf_exponent: float = 1.1
    temperature: float = 1.0
    context_noise: float = 1.0
    context_exponent: float = 1.0
    iid: bool = False
    num_domains: int = 4
    segment_length: int | None = None
    drift_scale: float = 2.0
    drift_period: float | None = None
    rl_step_size: float = 0.05
    rounds_per_update: int = 10
    reward_fraction: float = 0.05

    def validate(self) -> None:
        checks = [
            (self.zipf_exponent > 0, "zipf_exponent must be > 0"),
            (self.temperature > 0, "temperature must be > 0"),
            (self.context_noise >= 0, "context_noise must be >= 0"),
            (self.context_exponent >= 0, "context_exponent must be >= 0"),
            (self.num_domains >= 1, "num_domains must be >= 1"),
            (self.segment_length is None or self.segment_length >= 1, "segment_length must be >= 1"),
            (self.drift_scale >= 0, "drift_scale must be >= 0"),
            (self.drift_period is None or self.drift_period > 0, "drift_period must be > 0"),
            (self.rl_step_size >= 0, "rl_step_size must be >= 0"),
            (self.rounds_per_update >= 1, "rounds_per_update must be >= 1"),
            (0 < self.reward_fraction <= 1, "reward_fraction must be in (0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"stream option: {message} (got {self})")


def _softmax_rows(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits / temperature
    z = z - z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def _zipf_base(rng: np.random.Generator, num_contexts: int, vocab_size: int,
               options: StreamOptions) -> np.ndarray:
    """(C, V) float64 base logits: per-context noisy Zipf rankings."""
    global_score = rng.permutation(vocab_size).astype(np.float64)  # lower = more likely
    scale = options.context_noise * max(vocab_size / 50.0, 1.0)
    base = np.empty((num_contexts, vocab_size))
    ranks = np.empty(vocab_size)
    for c in range(num_contexts):
        score = global_score + scale * rng.standard_normal(vocab_size)
        ranks[np.argsort(score, kind="stable")] = np.arange(vocab_size)
        base[c] = -options.zipf_exponent * np.log1p(ranks)
    return base


class TargetStream:
    """A stream of target distributions p_t (build it with `make_stream`).

    Attributes:
        scenario: one of `SCENARIOS`.
        vocab_size: V (tokens), 2..65536.
        rounds: number of rounds T.
        num_contexts: number of contexts C.
        options: the `StreamOptions`.
        contexts: int64 array (rounds,), the context c_t of each round.
    """

    def __init__(self, scenario: str, vocab_size: int, rounds: int, seed: int,
                 num_contexts: int, options: StreamOptions):
        self.scenario = scenario
        self.vocab_size = int(vocab_size)
        self.rounds = int(rounds)
        self.num_contexts = int(num_contexts)
        self.options = options
        self.seed = int(seed)
        seeds = np.random.SeedSequence(self.seed).spawn(4)
        weights = (np.arange(1, self.num_contexts + 1, dtype=np.float64)) ** (-options.context_exponent)
        self.contexts = np.random.default_rng(seeds[0]).choice(
            self.num_contexts, size=self.rounds, p=weights / weights.sum()).astype(np.int64)
        self._domain_seed = seeds[1]
        self._domain_bases: dict[int, np.ndarray] = {}
        drift_rng = np.random.default_rng(seeds[2])
        self._drift = None
        self._reward = None
        if scenario in ("smooth", "fast"):
            shape = (2, self.num_contexts, self.vocab_size)
            self._drift = drift_rng.standard_normal(shape)
        elif scenario == "trained-target":
            self._reward = (drift_rng.random((self.num_contexts, self.vocab_size))
                            < options.reward_fraction).astype(np.float64)
        self._cache_key: tuple | None = None
        self._cache_table: np.ndarray | None = None

    # -- time structure --------------------------------------------------------
    @property
    def iid(self) -> bool:
        """True when targets are position-independent within a round."""
        return self.options.iid

    @property
    def segment_length(self) -> int:
        opt = self.options
        return opt.segment_length or max(1, self.rounds // (2 * opt.num_domains))

    @property
    def drift_period(self) -> float:
        if self.options.drift_period is not None:
            return float(self.options.drift_period)
        return float(max(self.rounds, 1)) if self.scenario == "smooth" else 20.0

    def domain(self, t: int) -> int:
        """Domain index of round t (always 0 except for "piecewise")."""
        self._check_round(t)
        if self.scenario != "piecewise":
            return 0
        return (t // self.segment_length) % self.options.num_domains

    def _check_round(self, t: int) -> None:
        if not 0 <= int(t) < self.rounds:
            raise ValueError(f"round index {t} outside [0, {self.rounds})")

    def state_key(self, t: int) -> tuple:
        """A hashable key of round t's targets: rounds with equal keys have identical
        target tables (used to reuse tables across rounds)."""
        if self.scenario == "stationary":
            return (0,)
        if self.scenario == "piecewise":
            return (self.domain(t),)
        if self.scenario == "trained-target":
            return (t // self.options.rounds_per_update,)
        return (t,)

    # -- logits and tables -----------------------------------------------------
    def _base(self, domain: int) -> np.ndarray:
        if domain not in self._domain_bases:
            seq = np.random.SeedSequence(self._domain_seed.entropy,
                                         spawn_key=self._domain_seed.spawn_key + (domain,))
            self._domain_bases[domain] = _zipf_base(
                np.random.default_rng(seq), self.num_contexts, self.vocab_size, self.options)
        return self._domain_bases[domain]

    def logits_table(self, t: int) -> np.ndarray:
        """float64 (C, V): logits z_t(c) of every context at round t (before temperature)."""
        self._check_round(t)
        opt = self.options
        z = self._base(self.domain(t))
        if self._drift is not None:
            theta = 2.0 * np.pi * t / self.drift_period
            z = z + opt.drift_scale * ((np.cos(theta) - 1.0) * self._drift[0]
                                       + np.sin(theta) * self._drift[1])
        elif self._reward is not None:
            updates = t // opt.rounds_per_update
            z = z + opt.rl_step_size * updates * self._reward
        return z

    def target_table(self, t: int) -> np.ndarray:
        """float64 (C, V): p_t(. | c) for every context c at round t (rows sum to 1).

        The last table is cached; do not modify the returned array.
        """
        key = self.state_key(t)
        if key != self._cache_key:
            self._cache_table = _softmax_rows(self.logits_table(t), self.options.temperature)
            self._cache_key = key
        return self._cache_table

    def context(self, t: int) -> int:
        """Context c_t of round t's first position (int in [0, num_contexts))."""
        self._check_round(t)
        return int(self.contexts[t])

    def target(self, t: int) -> np.ndarray:
        """float64 (V,): p_t for round t's context (the first chain position)."""
        return self.target_table(t)[self.context(t)]

    def target_for(self, t: int, context: int) -> np.ndarray:
        """float64 (V,): p_t(. | context) at round t for any context."""
        if not 0 <= int(context) < self.num_contexts:
            raise ValueError(f"context {context} outside [0, {self.num_contexts})")
        return self.target_table(t)[int(context)]

    def next_context(self, context: int, token: int) -> int:
        """Context after drafting ``token`` in ``context`` (see `next_context`)."""
        if not 0 <= int(token) < self.vocab_size:
            raise ValueError(f"token {token} outside the vocabulary [0, {self.vocab_size})")
        return next_context(context, token, self.num_contexts, self.iid)

    def context_at(self, t: int, prefix_tokens) -> int:
        """Context of chain position len(prefix_tokens) of round t, after the
        drafted ``prefix_tokens`` (a sequence of ints)."""
        c = self.context(t)
        for token in prefix_tokens:
            c = self.next_context(c, int(token))
        return c

    def target_at(self, t: int, prefix_tokens) -> np.ndarray:
        """float64 (V,): p at the chain position after ``prefix_tokens`` in round t.

        With ``iid=True`` this equals ``target(t)`` for every prefix.
        """
        return self.target_for(t, self.context_at(t, prefix_tokens))


def make_stream(scenario: str, vocab_size: int, rounds: int, seed: int,
                num_contexts: int = 16, **options) -> TargetStream:
    """Build a `TargetStream`.

    Args:
        scenario: "stationary", "piecewise", "smooth", "fast" or "trained-target".
        vocab_size: V, 2..65536 tokens.
        rounds: T >= 1 rounds.
        seed: integer seed (all randomness of the stream derives from it).
        num_contexts: C >= 1 contexts.
        **options: fields of `StreamOptions` (zipf_exponent, temperature, iid, ...).

    Raises:
        ValueError: unknown scenario or option, or an out-of-range size / option.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    if not 2 <= int(vocab_size) <= MAX_VOCAB:
        raise ValueError(f"vocab_size must be in [2, {MAX_VOCAB}], got {vocab_size}")
    if int(rounds) < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if int(num_contexts) < 1:
        raise ValueError(f"num_contexts must be >= 1, got {num_contexts}")
    known = set(StreamOptions.__dataclass_fields__)
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown stream options {sorted(unknown)}; known: {sorted(known)}")
    opts = StreamOptions(**options)
    opts.validate()
    return TargetStream(scenario, vocab_size, rounds, seed, num_contexts, opts)
