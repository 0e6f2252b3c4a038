"""A parametric draft q_w with a capacity gap and analytic gradients.

``ParametricDraft`` models q_w(. | c) = softmax(logits(w, c) / temperature) with a
low-rank logit table

    logits(w, c) = U[c] @ W + b,     w = [U (C, r), W (r, V), b (V,)],

so the draft has C r + r V + V parameters against the C V entries of an arbitrary
target table: with r + 1 < C it cannot represent every stream (the capacity gap
that makes online learning matter, OnlineSpec Section 2).

The loss of round t is OnlineSpec's cross-entropy (Assumption 1)
f_t(w) = -sum_x p_t(x) log q_w(x | c_t), whose gradient with respect to the logits
is (q_w - p_t) / temperature; f_t(w) - f_t(w*) = KL(p_t || q_w) when q_{w*} = p_t
(OnlineSpec Eq. (4)).
"""
from __future__ import annotations

import numpy as np

__all__ = ["ParametricDraft", "NoisyDraft", "check_probability_vector"]


def check_probability_vector(p: np.ndarray, vocab_size: int, name: str = "p_target",
                             atol: float = 1e-6) -> np.ndarray:
    """Return ``p`` as float64 (V,) after checking it is a probability vector.

    Raises:
        ValueError: wrong shape / vocabulary size, NaN or negative entries, or a
            sum farther than ``atol`` from 1.
    """
    arr = np.asarray(p, dtype=np.float64)
    if arr.shape != (vocab_size,):
        raise ValueError(f"{name} must have shape ({vocab_size},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if np.any(arr < 0):
        raise ValueError(f"{name} has negative entries (min {arr.min()})")
    total = arr.sum()
    if abs(total - 1.0) > atol:
        raise ValueError(f"{name} sums to {total}, not 1 (atol {atol})")
    return arr


class ParametricDraft:
    """Low-rank softmax draft q_w(. | c) over C contexts and V tokens.

    Args:
        vocab_size: V >= 2 tokens.
        num_contexts: C >= 1 contexts (the stream's contexts).
        rank: r >= 0, rank of the context-dependent part of the logits.
        init_scale: standard deviation of the Gaussian initial U and W (b starts at 0).
        temperature: > 0, q = softmax(logits / temperature).

    Raises:
        ValueError: out-of-range sizes.
    """

    def __init__(self, vocab_size: int, num_contexts: int, rank: int = 4,
                 init_scale: float = 0.1, temperature: float = 1.0):
        if int(vocab_size) < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if int(num_contexts) < 1:
            raise ValueError(f"num_contexts must be >= 1, got {num_contexts}")
        if int(rank) < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if not init_scale >= 0:
            raise ValueError(f"init_scale must be >= 0, got {init_scale}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.vocab_size = int(vocab_size)
        self.num_contexts = int(num_contexts)
        self.rank = int(rank)
        self.init_scale = float(init_scale)
        self.temperature = float(temperature)

    @property
    def param_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of [U, W, b]."""
        return [(self.num_contexts, self.rank), (self.rank, self.vocab_size), (self.vocab_size,)]

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(s)) for s in self.param_shapes)

    @property
    def has_capacity_gap(self) -> bool:
        """True when the logit table's rank r + 1 is below the number of contexts C
        (the draft cannot match every target table)."""
        return self.rank + 1 < self.num_contexts

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Fresh parameters [U (C, r), W (r, V), b (V,)], float64, Gaussian(0, init_scale)."""
        u_shape, w_shape, b_shape = self.param_shapes
        return [self.init_scale * rng.standard_normal(u_shape),
                self.init_scale * rng.standard_normal(w_shape),
                np.zeros(b_shape)]

    def _check_params(self, params) -> list[np.ndarray]:
        if len(params) != 3:
            raise ValueError(f"params must be [U, W, b], got {len(params)} arrays")
        arrays = [np.asarray(a, dtype=np.float64) for a in params]
        for arr, shape, name in zip(arrays, self.param_shapes, "UWb"):
            if arr.shape != shape:
                raise ValueError(f"param {name} must have shape {shape}, got {arr.shape}")
        return arrays

    def _check_context(self, context: int) -> int:
        if not 0 <= int(context) < self.num_contexts:
            raise ValueError(f"context {context} outside [0, {self.num_contexts})")
        return int(context)

    def logits(self, params, context: int) -> np.ndarray:
        """float64 (V,): logits(w, c) = U[c] @ W + b (before temperature)."""
        u, w, b = self._check_params(params)
        return u[self._check_context(context)] @ w + b

    def q_draft(self, params, context: int) -> np.ndarray:
        """float64 (V,): q_w(. | context), a probability vector."""
        z = self.logits(params, context) / self.temperature
        z -= z.max()
        np.exp(z, out=z)
        return z / z.sum()

    def q_table(self, params) -> np.ndarray:
        """float64 (C, V): q_w(. | c) for every context (rows sum to 1)."""
        u, w, b = self._check_params(params)
        z = (u @ w + b) / self.temperature
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        return z

    def loss_and_grad(self, params, context: int, p_target) -> tuple[float, list[np.ndarray]]:
        """Cross-entropy f_t(w) = -sum_x p(x) log q_w(x | c) and its gradient.

        Args:
            params: [U, W, b] as returned by `init_params`.
            context: c in [0, C).
            p_target: float64 (V,) target distribution p_t.

        Returns:
            (loss in nats, [dU (C, r), dW (r, V), db (V,)]) with
            g = (q - p) / temperature, dU[c] = W @ g (other rows 0), dW = outer(U[c], g),
            db = g.

        Raises:
            ValueError: bad shapes, context or probability vector.
        """
        u, w, b = self._check_params(params)
        c = self._check_context(context)
        p = check_probability_vector(p_target, self.vocab_size)
        z = (u[c] @ w + b) / self.temperature
        z = z - z.max()
        log_q = z - np.log(np.exp(z).sum())
        support = p > 0
        loss = float(-(p[support] * log_q[support]).sum())
        g = (np.exp(log_q) - p) / self.temperature
        grad_u = np.zeros_like(u)
        grad_u[c] = w @ g
        return loss, [grad_u, np.outer(u[c], g), g]

    def kl(self, params, context: int, p_target) -> float:
        """KL(p || q_w(. | c)) in nats (= f_t(w) - f_t(w*) of OnlineSpec Eq. (4)).

        Infinite when q_w is 0 where p > 0 (cannot happen for finite logits).
        """
        p = check_probability_vector(p_target, self.vocab_size)
        z = self.logits(params, context) / self.temperature
        z = z - z.max()
        log_q = z - np.log(np.exp(z).sum())
        support = p > 0
        return float((p[support] * (np.log(p[support]) - log_q[support])).sum())


class NoisyDraft:
    """A fixed-error draft of a stream: q_t(. | c) = softmax((z_s(c) + noise * eps_c)
    / (T_stream * temperature)) with z_s the stream's logits and eps_c fixed Gaussian
    noise, s = t (``frozen=False``: the draft tracks the target with a constant error)
    or s = 0 (``frozen=True``: a static draft that a drifting target leaves behind).

    Args:
        stream: a `specloop.sim.streams.TargetStream`.
        noise: >= 0 logit-noise scale (0 and temperature 1 give q = p).
        temperature: > 0 extra draft temperature.
        seed: seed of eps.
        frozen: see above.

    Raises:
        ValueError: noise < 0 or temperature <= 0.
    """

    def __init__(self, stream, noise: float = 1.0, temperature: float = 1.0, seed: int = 0,
                 frozen: bool = False):
        if not noise >= 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.stream = stream
        self.noise = float(noise)
        self.temperature = float(temperature)
        self.frozen = bool(frozen)
        self.vocab_size = stream.vocab_size
        self.num_contexts = stream.num_contexts
        self._eps = np.random.default_rng(seed).standard_normal((stream.num_contexts, stream.vocab_size))
        self._key = None
        self._table = None

    def q_table(self, t: int) -> np.ndarray:
        """float64 (C, V): q_t(. | c) for every context (cached; do not modify)."""
        s = 0 if self.frozen else int(t)
        key = self.stream.state_key(s)
        if key != self._key:
            z = (self.stream.logits_table(s) + self.noise * self._eps) / (
                self.stream.options.temperature * self.temperature)
            z -= z.max(axis=1, keepdims=True)
            np.exp(z, out=z)
            z /= z.sum(axis=1, keepdims=True)
            self._table, self._key = z, key
        return self._table

    def q_draft(self, t: int, context: int) -> np.ndarray:
        """float64 (V,): q_t(. | context)."""
        if not 0 <= int(context) < self.num_contexts:
            raise ValueError(f"context {context} outside [0, {self.num_contexts})")
        return self.q_table(t)[int(context)]
