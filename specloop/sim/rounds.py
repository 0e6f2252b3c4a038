"""Chain rounds: one-round Python API and batched APIs over the Numba kernels.

Verification (Leviathan et al. 2023 Algorithm 1; Chen et al. 2023; OnlineSpec
Algorithm 1): draft x_j ~ q_j, accept while u_j < p_j(x_j)/q_j(x_j); at the first
rejection commit a correction token from the normalised residual max(0, p_j - q_j);
after k acceptances commit a bonus token from p_{k+1}. ``mode="greedy"`` drafts
argmax q_j and accepts while x_j == argmax p_j (correction / bonus = argmax p).

Counting: ``accepted`` = accepted draft tokens; ``tokens_per_round`` n_t =
accepted + 1 (the committed reading of `specloop.record`).

All randomness comes from the ``np.random.Generator`` passed in: the wrappers draw
every uniform and hand them to the kernels (`specloop.sim._kernels`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specloop.record import Trace
from specloop.sim import _kernels as K
from specloop.sim.costs import round_record  # noqa: F401  (re-exported: rounds priced by a cost model)

__all__ = ["MODES", "ChainTables", "ChainBatch", "validate_table", "prepare_tables",
           "chain_round", "simulate_iid_chain", "simulate_chain_tables", "round_record"]

MODES = ("sampling", "greedy")


def _check_mode(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    return mode == "greedy"


def validate_table(table, name: str, vocab_size: int | None = None, atol: float = 1e-6) -> np.ndarray:
    """Return ``table`` as a C-contiguous float64 (rows, V) array of probability rows.

    A 1-D (V,) vector is returned as one row.

    Raises:
        ValueError: not 1-D/2-D, empty, vocabulary size != ``vocab_size``, NaN/inf,
            negative entries or a row not summing to 1 within ``atol`` (the message
            names the first bad row).
    """
    arr = np.asarray(table, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a (V,) vector or (rows, V) table, got shape {np.shape(table)}")
    if vocab_size is not None and arr.shape[1] != vocab_size:
        raise ValueError(f"{name} has vocabulary size {arr.shape[1]}, expected {vocab_size} "
                         "(mismatched vocabularies)")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} row {int(np.argwhere(bad)[0][0])} contains NaN or infinite entries")
    if (arr < 0).any():
        raise ValueError(f"{name} row {int(np.argwhere(arr < 0)[0][0])} has negative entries")
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0) > atol
    if off.any():
        row = int(np.argmax(off))
        raise ValueError(f"{name} row {row} sums to {sums[row]!r}, not 1 (atol {atol})")
    return np.ascontiguousarray(arr)


def _check_k(k) -> np.ndarray:
    arr = np.asarray(k)
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or np.any(np.mod(arr, 1) != 0):
            raise ValueError(f"num_draft_tokens (k) must be integers, got {k!r}")
    arr = arr.astype(np.int64)
    if (arr < 0).any():
        raise ValueError(f"num_draft_tokens (k) must be >= 0, got {int(arr.min())}")
    return arr


@dataclass(frozen=True)
class ChainTables:
    """Per-context tables the full-vocabulary chain kernel needs (O(C V) setup).

    Attributes: float64 (C, V) ``p_table``, ``q_table``, their row CDFs ``p_cdf``,
    ``q_cdf``; ``res_prob`` = max(0, p - q) and its CDF ``res_cdf``; ``row_acc``
    (C,) = Acc(c) = sum_x min(p, q); ``p_argmax``, ``q_argmax`` int64 (C,);
    ``blocks`` float64 (3, C, 16 G) and ``guide`` int32 (3, C, V + 1), the
    line-blocked CDFs with acceptance ratios and their guide table
    (`specloop.sim._kernels.build_sampling_tables`; 60 bytes per context and token).
    Build once per set of distributions (`prepare_tables`) and reuse across rounds.
    """

    p_table: np.ndarray
    q_table: np.ndarray
    p_cdf: np.ndarray
    q_cdf: np.ndarray
    res_prob: np.ndarray
    res_cdf: np.ndarray
    row_acc: np.ndarray
    p_argmax: np.ndarray
    q_argmax: np.ndarray
    blocks: np.ndarray
    guide: np.ndarray

    @property
    def num_contexts(self) -> int:
        return self.p_table.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.p_table.shape[1]

    def kernel_tables(self) -> tuple:
        """The first 11 arguments of `specloop.sim._kernels.chain_table_kernel` (and of
        its NumPy reference), in order."""
        return (self.p_table, self.q_table, self.p_cdf, self.q_cdf, self.res_cdf,
                self.res_prob, self.row_acc, self.p_argmax, self.q_argmax, self.blocks,
                self.guide)


def _aligned_empty(shape, align: int = 128) -> np.ndarray:
    """Uninitialised float64 array whose data starts on an ``align``-byte boundary
    (so each 16-entry block of the sampling tables is one 128-byte line pair)."""
    n = int(np.prod(shape))
    buf = np.empty(n + align // 8, dtype=np.float64)
    start = (-buf.ctypes.data % align) // 8
    return buf[start:start + n].reshape(shape)


def prepare_tables(p_table, q_table) -> ChainTables:
    """Validate p and q tables ((C, V) or (V,)) and build the CDF / residual / sampling
    tables in one pass per context (`specloop.sim._kernels.build_sampling_tables`).

    Raises:
        ValueError: invalid probability rows, mismatched shapes or vocabularies.
    """
    p = validate_table(p_table, "p_target")
    q = validate_table(q_table, "q_draft", vocab_size=p.shape[1])
    if q.shape[0] != p.shape[0]:
        raise ValueError(f"p_target has {p.shape[0]} context rows but q_draft has {q.shape[0]}")
    num_contexts, vocab = p.shape
    blocks_shape, guide_shape = K.sampling_table_shapes(num_contexts, vocab)
    p_cdf, q_cdf, res, res_cdf = (np.empty_like(p) for _ in range(4))
    blocks = _aligned_empty(blocks_shape)
    guide = np.empty(guide_shape, dtype=np.int32)
    K.build_sampling_tables(p, q, p_cdf, q_cdf, res, res_cdf, blocks, guide)
    return ChainTables(p, q, p_cdf, q_cdf, res, res_cdf, np.minimum(p, q).sum(axis=1),
                       np.argmax(p, axis=1).astype(np.int64),
                       np.argmax(q, axis=1).astype(np.int64), blocks, guide)


class _BatchSummaries:
    """Summaries shared by the batched results (`ChainBatch`, `trees.TreeBatch`):
    both hold ``accepted`` (int64 (R,)) accepted draft tokens per round."""

    accepted: np.ndarray

    @property
    def rounds(self) -> int:
        return int(self.accepted.shape[0])

    @property
    def tokens_per_round(self) -> np.ndarray:
        """int64 (R,) committed tokens n_t = accepted + 1."""
        return self.accepted + 1

    def mean_tokens_per_round(self) -> float:
        return float(self.tokens_per_round.mean())

    def standard_error(self) -> float:
        """Standard error of the mean of n_t (sample std / sqrt(R); 0 for R = 1)."""
        if self.rounds < 2:
            return 0.0
        return float(self.tokens_per_round.std(ddof=1) / np.sqrt(self.rounds))


@dataclass
class ChainBatch(_BatchSummaries):
    """Many simulated chain rounds.

    Attributes:
        accepted: int64 (R,) accepted draft tokens per round.
        num_draft_tokens: int64 (R,) k per round.
        tokens: int64 (R, kmax + 1) committed tokens (-1 padded), or None (i.i.d. path).
        position_acceptance: float64 (R, kmax) Acc of each verified position (NaN
            after the first rejection), or None.
        contexts: int64 (R,) first-position contexts, or None.
    """

    accepted: np.ndarray
    num_draft_tokens: np.ndarray
    tokens: np.ndarray | None = None
    position_acceptance: np.ndarray | None = None
    contexts: np.ndarray | None = None

    def acceptance_rate(self) -> float:
        """accepted / (accepted + rejections): the MLE of Acc under Assumption 1."""
        rejections = np.count_nonzero(self.accepted < self.num_draft_tokens)
        denom = self.accepted.sum() + rejections
        return float(self.accepted.sum() / denom) if denom else 1.0

    def to_trace(self, cost_model, stream_index: int = 0, meta: dict | None = None) -> Trace:
        """A `Trace` with one `RoundRecord` per round, times from ``cost_model``."""
        records = []
        for r in range(self.rounds):
            k = int(self.num_draft_tokens[r])
            acc = ()
            if self.position_acceptance is not None:
                row = self.position_acceptance[r, :k]
                acc = tuple(float(a) for a in row[~np.isnan(row)])
            records.append(round_record(r, stream_index, k, k, k + 1, int(self.accepted[r]),
                                        cost_model, acc))
        return Trace(records, meta)


def _rows(table, name: str, rows: int, vocab_size: int | None) -> np.ndarray:
    arr = validate_table(table, name, vocab_size)
    if arr.shape[0] == 1 and rows > 1:
        arr = np.repeat(arr, rows, axis=0)
    if arr.shape[0] != rows:
        raise ValueError(f"{name} must have 1 or {rows} rows (one per chain position), "
                         f"got {arr.shape[0]}")
    return arr


def _draw_from_rows(q_rows: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws, one per row (NumPy; O(V) per row for the cumsum)."""
    out = np.empty(q_rows.shape[0], dtype=np.int64)
    for j, row in enumerate(q_rows):
        cdf = np.cumsum(row)
        i = min(int(np.searchsorted(cdf, uniforms[j] * cdf[-1], side="right")), row.size - 1)
        while i > 0 and row[i] <= 0:
            i -= 1
        out[j] = i
    return out


def chain_round(p_target, q_draft, num_draft_tokens: int, rng: np.random.Generator,
                mode: str = "sampling", cost_model=None, draft_tokens=None,
                round_index: int = 0, stream_index: int = 0, loss: float = float("nan"),
                return_tokens: bool = False):
    """Simulate one chain round and return its `RoundRecord`.

    Args:
        p_target: float64 (V,) (the same p at every position, Assumption 1) or
            (k + 1, V) (row j = p at position j + 1, after the first j draft tokens).
        q_draft: float64 (V,) or (k, V): the distributions the draft tokens are drawn
            from (after any temperature / top-k).
        num_draft_tokens: k >= 0 tokens.
        rng: the generator all uniforms come from.
        mode: "sampling" (speculative sampling) or "greedy".
        cost_model: `LinearCost` / `TableCost` or None (zero times).
        draft_tokens: optional int (k,) already drafted tokens (must have q > 0);
            None = draw them here from q (greedy: argmax q).
        round_index, stream_index, loss: copied into the record.
        return_tokens: also return the committed tokens (int64 array of n_t tokens).

    Returns:
        `RoundRecord` (acceptance_probs = Acc_j = sum min(p_j, q_j) of each verified
        position), or (record, tokens) with ``return_tokens``.

    Raises:
        ValueError: k < 0, invalid or mismatched probability rows, unknown mode,
            draft tokens outside the vocabulary or with q = 0.
    """
    greedy = _check_mode(mode)
    k = int(_check_k(num_draft_tokens))
    p_rows = _rows(p_target, "p_target", k + 1, None)
    q_rows = _rows(q_draft, "q_draft", k, p_rows.shape[1]) if k else np.zeros((0, p_rows.shape[1]))
    u_draft, u_accept, u_final = rng.random(k), rng.random(k), rng.random(1)
    if draft_tokens is None:
        draft = np.argmax(q_rows, axis=1).astype(np.int64) if greedy else _draw_from_rows(q_rows, u_draft)
    else:
        draft = np.asarray(draft_tokens, dtype=np.int64).reshape(-1)
        if draft.shape != (k,):
            raise ValueError(f"draft_tokens must have {k} tokens, got {draft.shape[0]}")
        if ((draft < 0) | (draft >= p_rows.shape[1])).any():
            raise ValueError("draft_tokens outside the vocabulary")
        if k and (q_rows[np.arange(k), draft] <= 0).any():
            raise ValueError("a draft token has q_draft = 0: it cannot have been drawn from q")
    tokens = np.empty(k + 1, dtype=np.int64)
    work = np.empty(p_rows.shape[1])
    accepted = int(K.chain_rows_kernel(p_rows, q_rows, draft, greedy, u_accept, u_final,
                                       work, tokens))
    verified = min(accepted + 1, k)
    acc = np.minimum(p_rows[:verified], q_rows[:verified]).sum(axis=1)
    record = round_record(round_index, stream_index, k, k, k + 1, accepted, cost_model,
                          acc, loss=loss)
    return (record, tokens[: accepted + 1]) if return_tokens else record


def simulate_iid_chain(acceptance_rate, num_draft_tokens, rounds: int,
                       rng: np.random.Generator) -> ChainBatch:
    """Assumption-1 fast path: per round, k Bernoulli(Acc) trials until the first failure.

    Args:
        acceptance_rate: Acc in [0, 1], a scalar or float (R,) array (one per round).
        num_draft_tokens: k >= 0, scalar or int (R,).
        rounds: R >= 1.
        rng: generator (one uniform per round is drawn; the accepted count is
            min(k, floor(log u / log Acc)), whose law equals that of the trials).

    Raises:
        ValueError: Acc outside [0, 1] or NaN, k < 0, R < 1, wrong array lengths.
    """
    if int(rounds) < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    acc = np.broadcast_to(np.asarray(acceptance_rate, dtype=np.float64), (rounds,))
    if np.isnan(acc).any() or (acc < 0).any() or (acc > 1).any():
        raise ValueError("acceptance_rate must be in [0, 1] (no NaN)")
    k = np.broadcast_to(_check_k(num_draft_tokens), (rounds,))
    uniforms = 1.0 - rng.random(rounds)  # (0, 1]
    accepted = np.empty(rounds, dtype=np.int64)
    K.iid_chain_kernel(np.ascontiguousarray(acc), np.ascontiguousarray(k), uniforms, accepted)
    return ChainBatch(accepted, np.array(k))


#: rounds per kernel call of `simulate_chain_tables`: the uniforms of one chunk (9
#: float64 per round at k = 4, ~300 kB) are drawn just before the kernel reads them,
#: so they come from cache and do not evict the sampling tables from it.
UNIFORM_CHUNK_ROUNDS = 4096


def simulate_chain_tables(p_table, q_table, contexts, num_draft_tokens,
                          rng: np.random.Generator, mode: str = "sampling", iid: bool = False,
                          tables: ChainTables | None = None) -> ChainBatch:
    """Many full-vocabulary chain rounds over per-context tables (Numba; expected O(1),
    at most O(log V) per token after the O(C V) `prepare_tables` setup).

    Args:
        p_table, q_table: float64 (C, V) target / draft rows per context (or (V,) for
            one context). Ignored when ``tables`` (from `prepare_tables`) is given.
        contexts: int (R,) first-position context of each round.
        num_draft_tokens: k >= 0, scalar or int (R,).
        rng: generator for the uniforms (drawn `UNIFORM_CHUNK_ROUNDS` rounds at a time:
            per chunk u_draft (n, kmax), u_accept (n, kmax), then u_final (n,)).
        mode: "sampling" or "greedy".
        iid: keep each round's context along the chain (else the next context is
            `specloop.sim.streams.next_context` of the drafted token).

    Raises:
        ValueError: invalid tables, contexts out of range, k < 0, unknown mode.
    """
    greedy = _check_mode(mode)
    t = tables if tables is not None else prepare_tables(p_table, q_table)
    ctx = np.ascontiguousarray(np.asarray(contexts, dtype=np.int64).reshape(-1))
    if ctx.size == 0:
        raise ValueError("contexts must hold at least one round")
    if (ctx < 0).any() or (ctx >= t.num_contexts).any():
        raise ValueError(f"contexts must be in [0, {t.num_contexts})")
    rounds = ctx.size
    k = np.ascontiguousarray(np.broadcast_to(_check_k(num_draft_tokens), (rounds,)))
    kmax = int(k.max())
    accepted = np.empty(rounds, dtype=np.int64)
    tokens = np.empty((rounds, kmax + 1), dtype=np.int64)
    acc = np.empty((rounds, kmax))
    chunk = min(rounds, UNIFORM_CHUNK_ROUNDS)
    u_draft, u_accept, u_final = np.empty((chunk, kmax)), np.empty((chunk, kmax)), np.empty(chunk)
    for start in range(0, rounds, chunk):
        stop = min(start + chunk, rounds)
        n = stop - start
        rng.random(out=u_draft[:n])
        rng.random(out=u_accept[:n])
        rng.random(out=u_final[:n])
        K.chain_table_kernel(*t.kernel_tables(), ctx[start:stop], k[start:stop], bool(iid),
                             greedy, u_draft[:n], u_accept[:n], u_final[:n],
                             accepted[start:stop], tokens[start:stop], acc[start:stop])
    return ChainBatch(accepted, k, tokens, acc, ctx)
