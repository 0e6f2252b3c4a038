"""Retrieval datastore drafter: REST (He et al. 2023, "REST: Retrieval-Based
Speculative Decoding", Sec. 3) merged with prompt lookup (Saxena 2023).

Two sources of draft continuations, one trie:

* **datastore** -- an n-gram index over a token corpus (by default the target's
  warm-up corpus, `specloop.realmodels.training.corpus`, whose held-out prompts
  never enter it). As in REST, the longest suffix of the context (up to
  ``max_ngram`` tokens) that occurs in the corpus is located by binary search over
  suffix-sorted positions (`NGramIndex`), and the continuations that follow its
  occurrences are counted into a trie (REST Sec. 3.2: "the most frequent prefixes").
* **context** -- the same longest-suffix search over the context itself (prompt +
  generated tokens), i.e. prompt lookup decoding with counts instead of the most
  recent match only.

Each trie node gets a score that estimates the probability that the target accepts
the node's whole path: ``prior_source * count(path) / (matches + smoothing) *
decay_source ** (depth - 1)``, i.e. the empirical continuation frequency
(REST's ranking) discounted per source. A node's score never exceeds its parent's,
so the best ``verify_size`` nodes by score form a trie closed under ancestors
(the selection rule of EAGLE-2 / Sequoia, applied to retrieval counts). Sources are
merged by path (a path found by both keeps the larger score). A chain plan takes
the path of best-scored children from the root.

Deterministic: ``q_draft`` is None (every node is verified as a point mass, which is
lossless for greedy decoding and for sampling; see `drafters.base`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest

__all__ = ["NGramIndex", "SourceWeights", "DatastoreDrafter", "count_trie", "context_suffix_matches",
           "select_nodes"]

INDEX_VERSION = 1
_TOKEN_BITS_MAX = 20          # ids of up to 20 bits: 3 tokens per uint64 key word


# ---------------------------------------------------------------------------------------------
# the n-gram index
# ---------------------------------------------------------------------------------------------
def _pack(values: np.ndarray, bits: int, per: int, count: int) -> np.ndarray:
    """Pack ``count`` (<= per) shifted token columns into uint64 keys, most
    significant first, zero-padded on the right to ``per`` tokens."""
    key = np.zeros(values.shape[0], dtype=np.uint64)
    for j in range(count):
        key |= values[:, j].astype(np.uint64) << np.uint64(bits * (per - 1 - j))
    return key


class NGramIndex:
    """Suffix-sorted n-gram index over one token stream (the REST datastore).

    Every position i of the stream is keyed by the (shifted, +1) tokens
    ``stream[i : i + 2 * per]`` packed into two uint64 words (``per`` = 64 // bits
    tokens each; bits = bit length of the largest id + 1, 16 for SmolLM2's 49152
    tokens, so n-grams of up to 8 tokens are matched by two binary searches);
    positions are sorted by (word 0, word 1). Shifting ids by one and padding the
    end of the stream with 0 keeps the end of the stream from matching anything.

    Attributes:
        tokens: int32 (N,) the stream.
        order: int32 (N,) positions sorted by their keys.
        key_hi, key_lo: uint64 (N,) sorted keys (words 0 and 1).
        bits: bits per token in a key; ``per``: tokens per word.
        meta: provenance (corpus fingerprint, sources, build time).

    Raises:
        ValueError: an empty stream, negative ids, or ids needing more than 20 bits.
    """

    def __init__(self, tokens: np.ndarray, order: np.ndarray, key_hi: np.ndarray, key_lo: np.ndarray,
                 bits: int, meta: dict | None = None):
        self.tokens, self.order, self.key_hi, self.key_lo = tokens, order, key_hi, key_lo
        self.bits = int(bits)
        self.per = 64 // self.bits
        self.meta = dict(meta or {})

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def build(cls, stream, meta: dict | None = None) -> "NGramIndex":
        """Index ``stream`` (int array-like (N,), N >= 1, ids >= 0)."""
        tokens = np.ascontiguousarray(np.asarray(stream).reshape(-1), dtype=np.int64)
        if tokens.size == 0:
            raise ValueError("NGramIndex.build: empty token stream")
        if int(tokens.min()) < 0:
            raise ValueError(f"NGramIndex.build: negative token id {int(tokens.min())}")
        bits = max(1, (int(tokens.max()) + 1).bit_length())
        if bits > _TOKEN_BITS_MAX:
            raise ValueError(f"NGramIndex.build: token ids up to {int(tokens.max())} need {bits} bits "
                             f"(> {_TOKEN_BITS_MAX})")
        per = 64 // bits
        n = tokens.size
        shifted = np.zeros(n + 2 * per, dtype=np.uint64)
        shifted[:n] = tokens.astype(np.uint64) + np.uint64(1)
        windows = np.lib.stride_tricks.sliding_window_view(shifted, 2 * per)[:n]
        hi = _pack(windows[:, :per], bits, per, per)
        lo = _pack(windows[:, per:], bits, per, per)
        order = np.lexsort((lo, hi)).astype(np.int32)
        return cls(tokens.astype(np.int32), order, hi[order], lo[order], bits, meta)

    def save(self, folder: str | Path) -> Path:
        """Write ``tokens.npy``, ``order.npy``, ``key_hi.npy``, ``key_lo.npy`` and
        ``index.json`` into ``folder`` (written last: its presence marks a complete index)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("tokens", "order", "key_hi", "key_lo"):
            np.save(folder / f"{name}.npy", getattr(self, name))
        meta = dict(self.meta, version=INDEX_VERSION, bits=self.bits, size=int(self.tokens.size))
        tmp = folder / "index.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        tmp.replace(folder / "index.json")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "NGramIndex":
        """Read an index written by `save` (plain reads: about 10 ms for a 1M-token
        corpus; memory-mapped arrays would make every binary search slower).

        Raises:
            FileNotFoundError: no complete index in ``folder``.
            ValueError: an index of another format version.
        """
        folder = Path(folder)
        meta_path = folder / "index.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"no n-gram index at {folder} (index.json missing)")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("version") != INDEX_VERSION:
            raise ValueError(f"n-gram index at {folder} has version {meta.get('version')}, "
                             f"expected {INDEX_VERSION}; delete it to rebuild")
        arrays = {name: np.load(folder / f"{name}.npy")
                  for name in ("tokens", "order", "key_hi", "key_lo")}
        return cls(arrays["tokens"], arrays["order"], arrays["key_hi"], arrays["key_lo"], meta["bits"], meta)

    @property
    def size(self) -> int:
        """Tokens N in the indexed stream."""
        return int(self.tokens.shape[0])

    @property
    def max_ngram(self) -> int:
        """Longest n-gram a single lookup can match (2 * per tokens)."""
        return 2 * self.per

    # -- lookups -----------------------------------------------------------------------------
    def _word(self, ngram: np.ndarray) -> tuple[int, int]:
        """(lowest, highest) uint64 key of words starting with the <= per tokens."""
        n = ngram.shape[0]
        free = self.bits * (self.per - n)
        value = 0
        for tok in ngram.tolist():
            value = (value << self.bits) | (int(tok) + 1)
        low = value << free
        return low, low | ((1 << free) - 1)

    def range_of(self, ngram) -> tuple[int, int]:
        """[start, stop) of the sorted positions whose next tokens equal ``ngram``
        (1 <= len <= `max_ngram`). Ids outside the index's range match nothing."""
        ngram = np.asarray(ngram, dtype=np.int64).reshape(-1)
        n = int(ngram.shape[0])
        if not 1 <= n <= self.max_ngram:
            raise ValueError(f"range_of: n-gram length must be in [1, {self.max_ngram}], got {n}")
        if int(ngram.min()) < 0 or int(ngram.max()) + 1 >= (1 << self.bits):
            return 0, 0
        low, high = self._word(ngram[: self.per])
        start = int(np.searchsorted(self.key_hi, np.uint64(low), "left"))
        stop = int(np.searchsorted(self.key_hi, np.uint64(high), "right"))
        if n > self.per and stop > start:
            low, high = self._word(ngram[self.per:])
            sub = self.key_lo[start:stop]
            start, stop = (start + int(np.searchsorted(sub, np.uint64(low), "left")),
                           start + int(np.searchsorted(sub, np.uint64(high), "right")))
        return start, stop

    def count(self, ngram) -> int:
        """Occurrences of ``ngram`` (any length >= 1) in the stream."""
        ngram = np.asarray(ngram, dtype=np.int64).reshape(-1)
        n = int(ngram.shape[0])
        if n == 0:
            raise ValueError("count: empty n-gram")
        start, stop = self.range_of(ngram[: self.max_ngram])
        if n <= self.max_ngram or stop == start:
            return stop - start
        pos = np.asarray(self.order[start:stop], dtype=np.int64)
        pos = pos[pos + n <= self.size]
        if pos.size == 0:
            return 0
        window = np.asarray(self.tokens)[pos[:, None] + np.arange(n)]
        return int((window == ngram).all(axis=1).sum())

    def longest_suffix_match(self, context, max_ngram: int, min_ngram: int = 1) -> tuple[int, int, int]:
        """REST's lookup: the longest suffix of ``context`` (at most ``max_ngram``
        tokens, at least ``min_ngram``) that occurs in the stream.

        Returns:
            (n, start, stop): its length and [start, stop) range into ``order``;
            (0, 0, 0) when not even ``min_ngram`` tokens match.
        """
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)
        top = min(int(max_ngram), self.max_ngram, int(ctx.shape[0]))
        for n in range(top, max(1, int(min_ngram)) - 1, -1):
            start, stop = self.range_of(ctx[ctx.shape[0] - n:])
            if stop > start:
                return n, start, stop
        return 0, 0, 0

    def continuations(self, start: int, stop: int, n: int, depth: int, max_matches: int) -> np.ndarray:
        """int64 (m, depth) tokens following the occurrences ``order[start:stop]`` of
        an n-gram of length ``n`` (-1 past the end of the stream). When there are
        more than ``max_matches`` occurrences, an evenly strided subset of the
        sorted range is taken (the range is sorted by the following tokens, so the
        subset keeps the continuation frequencies up to rounding)."""
        total = stop - start
        if total <= 0 or depth < 1:
            return np.zeros((0, max(depth, 0)), dtype=np.int64)
        if total > max_matches:
            picks = start + (np.arange(max_matches, dtype=np.int64) * total) // max_matches
            pos = np.asarray(self.order)[picks].astype(np.int64)
        else:
            pos = np.asarray(self.order[start:stop], dtype=np.int64)
        idx = pos[:, None] + n + np.arange(depth)
        inside = idx < self.size
        out = np.asarray(self.tokens)[np.minimum(idx, self.size - 1)].astype(np.int64)
        out[~inside] = -1
        return out


# ---------------------------------------------------------------------------------------------
# counting and selection
# ---------------------------------------------------------------------------------------------
def context_suffix_matches(ids: np.ndarray, depth: int, max_ngram: int, min_ngram: int = 1,
                           max_matches: int = 64) -> tuple[int, np.ndarray]:
    """Prompt lookup with all occurrences: the longest suffix of ``ids`` (<=
    ``max_ngram`` tokens) found earlier in ``ids``, and the tokens that followed
    each earlier occurrence.

    Args:
        ids: int64 (L,) the context.
        depth: continuation length (tokens).
        max_ngram, min_ngram: suffix lengths tried; the longest that occurs wins.
        max_matches: keep the most recent occurrences only.

    Returns:
        (n, conts): the matched length (0 = none, or shorter than ``min_ngram``)
        and int64 (m, depth) continuations, most recent first, -1 past the end of
        the context.
    """
    length = int(ids.shape[0])
    # ends[j]: an earlier position whose token equals the last one; extend the
    # match leftwards one token at a time, keeping the candidates that still agree
    ends = np.flatnonzero(ids[: length - 1] == ids[length - 1])
    n = 1 if ends.size else 0
    top = min(int(max_ngram), length - 1)
    while n and n < top:
        ok = ends >= n
        nxt = ends[ok][ids[ends[ok] - n] == ids[length - 1 - n]]
        if nxt.size == 0:
            break
        ends, n = nxt, n + 1
    if n < max(1, int(min_ngram)):
        return 0, np.zeros((0, depth), dtype=np.int64)
    begin = ends[::-1][:max_matches] + 1
    idx = begin[:, None] + np.arange(depth)
    out = ids[np.minimum(idx, length - 1)].astype(np.int64)
    out[idx >= length] = -1
    return n, out


def count_trie(conts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge continuations into a counted trie (REST Sec. 3.2).

    The rows are sorted lexicographically; a trie node at depth d starts wherever
    the first d tokens change from the previous row, and its count is the number
    of rows until the next such change.

    Args:
        conts: int64 (m, D) continuation tokens, -1 after a continuation's end.

    Returns:
        (parents, tokens, counts, depths): int64 (n,) arrays, nodes depth by depth
        (parents before children, parent -1 = root); ``counts`` = number of
        continuations that start with the node's path.
    """
    m, depth = conts.shape
    z = np.zeros(0, dtype=np.int64)
    if m == 0 or depth == 0:
        return z, z, z, z
    rows_sorted = conts[np.lexsort(conts.T[::-1])] if m > 1 else conts
    change = np.ones((m, depth), dtype=bool)
    change[1:] = rows_sorted[1:] != rows_sorted[:-1]
    np.logical_or.accumulate(change, axis=1, out=change)
    local = np.cumsum(change, axis=0) - 1             # node number within its depth, per row
    dep, row = np.nonzero(change.T)                   # every node start, depth by depth
    per_depth = change.sum(axis=0)
    first = np.zeros(depth, dtype=np.int64)
    first[1:] = np.cumsum(per_depth)[:-1]             # index of each depth's first node
    nxt = np.empty_like(row)
    nxt[:-1] = row[1:]
    nxt[-1] = m
    nxt[:-1][dep[1:] != dep[:-1]] = m                 # the last node of a depth runs to the end
    counts = nxt - row
    tokens = rows_sorted[row, dep]
    parents = np.full(row.shape[0], -1, dtype=np.int64)
    deeper = dep > 0
    parents[deeper] = first[dep[deeper] - 1] + local[row[deeper], dep[deeper] - 1]
    keep = tokens >= 0                                # ended continuations (-1) are no nodes
    if not keep.all():
        renum = np.cumsum(keep) - 1
        parents = np.where(parents >= 0, renum[np.maximum(parents, 0)], -1)[keep]
        tokens, counts, dep = tokens[keep], counts[keep], dep[keep]
    return parents, tokens.astype(np.int64, copy=False), counts.astype(np.int64, copy=False), dep + 1


@dataclass(frozen=True)
class SourceWeights:
    """Score of a trie node from one source: ``prior * count / (matches +
    smoothing) * decay ** (depth - 1)``, with ``prior`` depending on the matched
    suffix length n (``priors[min(n, len) - 1]``).

    Attributes:
        priors: per matched suffix length 1, 2, ... (the last entry covers longer ones).
        decay: per-token discount along a path (in (0, 1]).
        smoothing: pseudo-count added to the number of matches (>= 0).
    """

    priors: tuple[float, ...]
    decay: float = 1.0
    smoothing: float = 1.0

    def __post_init__(self) -> None:
        if not self.priors or any(not 0.0 <= p <= 1.0 for p in self.priors):
            raise ValueError(f"SourceWeights.priors must be non-empty, in [0, 1]; got {self.priors}")
        if not 0.0 < self.decay <= 1.0 or self.smoothing < 0:
            raise ValueError(f"SourceWeights: decay must be in (0, 1] and smoothing >= 0; "
                             f"got {self.decay}, {self.smoothing}")

    def prior(self, n: int) -> float:
        return self.priors[min(n, len(self.priors)) - 1]


def _scored_paths(conts: np.ndarray, n: int, weights: SourceWeights, budget: int,
                  into: dict[tuple[int, ...], float]) -> None:
    """Count ``conts`` into a trie, score its nodes and merge the best ``budget``
    into ``into`` (path -> score, keeping the larger score)."""
    if conts.shape[0] == 0 or n == 0:
        return
    parents, tokens, counts, depths = count_trie(conts)
    if parents.size == 0:
        return
    scale = weights.prior(n) / (conts.shape[0] + weights.smoothing)
    scores = counts * scale
    if weights.decay != 1.0:
        scores = scores * weights.decay ** (depths - 1)
    order = np.lexsort((depths, -scores))[:budget]
    # ancestors rank before descendants (score never increases along a path, ties
    # go to the shallower node), so each parent's path is known when a child comes
    paths: dict[int, tuple[int, ...]] = {}
    par_l, tok_l, sc_l = parents.tolist(), tokens.tolist(), scores.tolist()
    for node in order.tolist():
        par = par_l[node]
        path = (paths[par] if par >= 0 else ()) + (tok_l[node],)
        paths[node] = path
        score = sc_l[node]
        if into.get(path, -1.0) < score:
            into[path] = score


def select_nodes(scored: dict[tuple[int, ...], float], max_nodes: int, chain: bool = False,
                 max_depth: int | None = None, min_score: float = 0.0) -> tuple[list[int], list[int]]:
    """The best ``max_nodes`` paths of a scored trie as (tokens, parents).

    Tree: the top ``max_nodes`` paths by score (ties to the shorter path), which
    is closed under ancestors because no path scores above its prefix. Chain: from
    the root, repeatedly the best-scored child. Paths longer than ``max_depth``
    are dropped, and so are paths scoring below ``min_score`` (the expected gain
    of a node in accepted tokens is its acceptance probability, so a node is worth
    verifying only while that exceeds its share of the verification cost).
    Parents precede children in the output.
    """
    if max_depth is not None or min_score > 0:
        top = max_depth if max_depth is not None else 1 << 30
        scored = {p: s for p, s in scored.items() if len(p) <= top and s >= min_score}
    if chain:
        tokens: list[int] = []
        path: tuple[int, ...] = ()
        by_len: dict[tuple[int, ...], tuple[float, int]] = {}
        for p, s in scored.items():
            head = p[:-1]
            best = by_len.get(head)
            if best is None or s > best[0]:
                by_len[head] = (s, p[-1])
        while len(tokens) < max_nodes and path in by_len:
            tok = by_len[path][1]
            tokens.append(tok)
            path = path + (tok,)
        return tokens, list(range(-1, len(tokens) - 1))
    ranked = sorted(scored.items(), key=lambda kv: (-kv[1], len(kv[0])))
    index: dict[tuple[int, ...], int] = {}
    tokens, parents = [], []
    for path, _ in ranked:
        if len(tokens) >= max_nodes:
            break
        head = path[:-1]
        if head and head not in index:  # cannot happen for a consistent scoring; guard anyway
            continue
        index[path] = len(tokens)
        tokens.append(path[-1])
        parents.append(index[head] if head else -1)
    return tokens, parents


# ---------------------------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------------------------
DEFAULT_CONTEXT = SourceWeights(priors=(0.35, 0.55, 0.7, 0.8), decay=0.95, smoothing=0.5)
DEFAULT_DATASTORE = SourceWeights(priors=(0.1, 0.25, 0.4, 0.5, 0.6), decay=0.9, smoothing=1.0)


class DatastoreDrafter(BaseDrafter):
    """REST datastore + prompt lookup, merged into one trie per round.

    Args:
        index: the `NGramIndex` (None = prompt lookup only, with counts).
        max_ngram: longest context suffix matched in the datastore (tokens, 1..8).
        min_ngram: shortest suffix accepted from the datastore.
        context_max_ngram, context_min_ngram: the same for the context's own lookup.
        max_matches: occurrences counted per source and round (REST caps this too).
        context_weights, datastore_weights: `SourceWeights` of the two sources.
        default_nodes: node budget when a tree plan gives no ``verify_size``
            (default 24).
        min_score: nodes scoring below it are not verified (a tree plan's
            ``verify_size`` is then an upper bound; 0 = always fill the budget).

    Tree plans: ``max_depth`` is the continuation length and ``verify_size`` the
    node budget; chain plans take ``num_draft_tokens`` tokens along the best path.

    Raises:
        ValueError: sizes out of range.
    """

    name = "ngram-datastore"

    def __init__(self, index: NGramIndex | None, *, max_ngram: int = 6, min_ngram: int = 1,
                 context_max_ngram: int = 4, context_min_ngram: int = 1, max_matches: int = 128,
                 context_weights: SourceWeights = DEFAULT_CONTEXT,
                 datastore_weights: SourceWeights = DEFAULT_DATASTORE, default_nodes: int = 24,
                 min_score: float = 0.0):
        if not 1 <= min_ngram <= max_ngram or not 1 <= context_min_ngram <= context_max_ngram:
            raise ValueError("DatastoreDrafter needs 1 <= min_ngram <= max_ngram for both sources; got "
                             f"{min_ngram}..{max_ngram} and {context_min_ngram}..{context_max_ngram}")
        if index is not None and max_ngram > index.max_ngram:
            raise ValueError(f"max_ngram {max_ngram} exceeds the index's {index.max_ngram}")
        if max_matches < 1 or default_nodes < 1:
            raise ValueError(f"max_matches and default_nodes must be >= 1; got {max_matches}, {default_nodes}")
        self.index = index
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)
        self.context_max_ngram, self.context_min_ngram = int(context_max_ngram), int(context_min_ngram)
        self.max_matches = int(max_matches)
        self.context_weights, self.datastore_weights = context_weights, datastore_weights
        self.default_nodes = int(default_nodes)
        if not 0.0 <= min_score < 1.0:
            raise ValueError(f"min_score must be in [0, 1), got {min_score}")
        self.min_score = float(min_score)

    def scored_paths(self, ids: np.ndarray, depth: int, budget: int) -> dict[tuple[int, ...], float]:
        """path (token tuple, length <= depth) -> score, from both sources, each
        contributing at most ``budget`` paths. ``ids``: int64 (L,) the context."""
        scored: dict[tuple[int, ...], float] = {}
        n, conts = context_suffix_matches(ids, depth, self.context_max_ngram, self.context_min_ngram,
                                          self.max_matches)
        _scored_paths(conts, n, self.context_weights, budget, scored)
        if self.index is not None:
            n, start, stop = self.index.longest_suffix_match(ids, self.max_ngram, self.min_ngram)
            if n:
                conts = self.index.continuations(start, stop, n, depth, self.max_matches)
                _scored_paths(conts, n, self.datastore_weights, budget, scored)
        return scored

    def propose(self, request: DraftRequest) -> DraftProposal:
        plan = request.plan
        ids = request.ids.cpu().numpy().astype(np.int64, copy=False)
        if plan.tree is None:
            depth = max_nodes = min(int(plan.num_draft_tokens), int(request.max_tokens))
            chain = True
        else:
            depth = min(int(plan.tree.max_depth), int(plan.num_draft_tokens))
            max_nodes = min(int(request.max_tokens), int(plan.tree.verify_size or self.default_nodes))
            chain = False
        if depth < 1 or max_nodes < 1:
            return DraftProposal.empty()
        scored = self.scored_paths(ids, depth, max_nodes if not chain else max_nodes * 4)
        tokens, parents = select_nodes(scored, max_nodes, chain=chain, min_score=self.min_score)
        if not tokens:
            return DraftProposal.empty()
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
