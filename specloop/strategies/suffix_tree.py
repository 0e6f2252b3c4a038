"""Bounded-depth suffix tries over token sequences, the data structure of SuffixDecoding.

SuffixDecoding (Oliaro, Jia, Campos, Qiao; NeurIPS 2025; the reference
implementation is Arctic Inference's ``arctic_inference/suffix_decoding``) drafts
from two suffix trees: a *global* one over the outputs of earlier requests and a
*per-request* one over the current prompt and output. Each node is a token path
(a substring of some stored sequence) with the number of its occurrences; the
empirical probability of continuing path s with token c is
count(s + c) / sum_c' count(s + c').

This module holds the pure structure (no torch, no models):

* `SuffixTrie`: a trie of every substring of length <= ``depth`` of the stored
  sequences, node count = number of occurrences (start positions). A sequence is
  added token by token in O(depth) per token (the "active" nodes are the suffixes of
  the sequence so far), and removed in O(length * depth).
* `GlobalSuffixCache`: a `SuffixTrie` over whole requests with FIFO eviction by
  request (``max_requests`` / ``max_tokens`` bound the memory), ``state_dict`` /
  ``load_state_dict`` that round-trip exactly (the retained sequences in order).
* `expand_candidates`: match the context's longest suffix in several tries and
  expand one merged candidate tree best-first by empirical path probability.
* `cost_optimal_size`: how many best-first nodes to verify, maximising the expected
  committed tokens per second of verification (the rule of
  `specloop.strategies.lookup_length.LookupLength`, applied per node).
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Iterable, Sequence

import numpy as np

__all__ = ["SuffixTrie", "GlobalSuffixCache", "longest_match", "expand_candidates",
           "cost_optimal_size", "monotone_cost", "AcceptanceCalibration"]


class _Node:
    """One trie node: ``count`` occurrences of its path; ``children`` token -> node."""

    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] | None = None


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class SuffixTrie:
    """Every substring of length <= ``depth`` of the stored sequences, with counts.

    Args:
        depth: longest stored path in tokens (>= 1): the longest matched suffix plus
            the longest continuation drafted from it.

    Raises:
        ValueError: depth < 1.
    """

    def __init__(self, depth: int = 32):
        self.depth = _check_int("depth", depth, 1)
        self.root = _Node()
        self.num_nodes = 1

    # -- building ------------------------------------------------------------------
    def start(self) -> list[_Node]:
        """The active-node list of an empty sequence (pass it to `append`)."""
        return [self.root]

    def append(self, active: list[_Node], token: int) -> list[_Node]:
        """Add one token to a sequence being stored: every suffix ending at the new
        token gains one occurrence. O(depth).

        Args:
            active: the nodes of the sequence's suffixes of lengths 0..depth-1 (root
                first), from `start` or the previous `append`.
            token: int token id.

        Returns:
            The new active list (use it for the next token).
        """
        token = int(token)
        new = [self.root]
        depth = self.depth
        for level, node in enumerate(active):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(token)
            if child is None:
                child = children[token] = _Node()
                self.num_nodes += 1
            child.count += 1
            if level + 1 < depth:
                new.append(child)
        self.root.count += 1
        return new

    def extend(self, active: list[_Node], tokens: Iterable[int]) -> list[_Node]:
        """`append` each of ``tokens`` in order; returns the final active list."""
        for token in tokens:
            active = self.append(active, token)
        return active

    def remove(self, tokens: Sequence[int]) -> None:
        """Remove one stored occurrence of the whole sequence ``tokens`` (added earlier
        with `extend`): every substring's count drops by one, empty nodes are freed.
        O(len(tokens) * depth).

        Raises:
            KeyError: ``tokens`` was not stored.
        """
        tokens = [int(t) for t in tokens]
        length = len(tokens)
        for start in range(length):
            node = self.root
            for token in tokens[start: min(length, start + self.depth)]:
                child = node.children[token] if node.children is not None else None
                if child is None:
                    raise KeyError("SuffixTrie.remove: sequence was not stored")
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                    self.num_nodes -= self._size(child)
                    break
                node = child
        self.root.count -= length

    @staticmethod
    def _size(node: _Node) -> int:
        total, stack = 0, [node]
        while stack:
            cur = stack.pop()
            total += 1
            if cur.children:
                stack.extend(cur.children.values())
        return total

    # -- reading -------------------------------------------------------------------
    def find(self, path: Sequence[int]) -> _Node | None:
        """The node of ``path`` (token ids), or None when it never occurred."""
        node = self.root
        for token in path:
            if node.children is None:
                return None
            node = node.children.get(int(token))
            if node is None:
                return None
        return node

    def count(self, path: Sequence[int]) -> int:
        """Occurrences of ``path`` in the stored sequences (0 if absent or too long)."""
        node = self.find(path)
        return 0 if node is None else node.count

    def items(self) -> dict[tuple[int, ...], int]:
        """Every stored path (length 1..depth) with its count (for tests and reports)."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[tuple[int, ...], _Node]] = [((), self.root)]
        while stack:
            path, node = stack.pop()
            if path:
                out[path] = node.count
            if node.children:
                stack.extend((path + (tok,), child) for tok, child in node.children.items())
        return out


def longest_match(trie: SuffixTrie, context: Sequence[int], max_match: int) -> tuple[_Node | None, int]:
    """The longest suffix of ``context`` (<= ``max_match`` tokens, < trie depth) whose
    trie node has a continuation.

    Having a continuation is monotone in the suffix length (a longer suffix's
    occurrence contains a shorter one's), so the length is found by bisection:
    O(max_match log max_match) dictionary look-ups.

    Returns:
        (node, matched length m >= 1), or (None, 0) when not even the last token
        was ever followed by anything.
    """
    top = min(int(max_match), len(context), trie.depth - 1)
    def ok(m: int) -> _Node | None:
        node = trie.find(context[len(context) - m:])
        return node if node is not None and node.children else None
    low, best = 0, None                      # invariant: suffix of length low has children (low=0: none yet)
    high = top
    while low < high:
        mid = (low + high + 1) // 2
        node = ok(mid)
        if node is None:
            high = mid - 1
        else:
            low, best = mid, node
    return best, low


def expand_candidates(sources: Sequence[tuple[_Node | None, int]], depth_cap: int, max_nodes: int,
                      prior_count: float = 1.0, min_prob: float = 0.0,
                      chain: bool = False, stats: list | None = None,
                      matched: Sequence[int] | None = None) -> tuple[list[int], list[int], list[float]]:
    """One candidate tree merged from several matched tries, best-first.

    A candidate node is a token path below the matched suffixes. Its probability
    under source j is the product of the empirical conditional probabilities
    count(s + c) / (sum_c' count(s + c') + prior_count) along the path (0 where
    source j never saw it); the merged probability is the maximum over sources,
    which is non-increasing along every path, so best-first order is topological
    (parents first) and every prefix of it is a subtree.

    Args:
        sources: (matched node or None, remaining depth) per source; remaining depth
            = trie depth - matched length (how far below the node paths exist).
        depth_cap: deepest candidate in tokens (>= 0).
        max_nodes: most nodes returned (>= 0).
        prior_count: pseudo-count added to each denominator (>= 0), shrinking
            rarely seen continuations (1 continuation seen once: 1 / (1 + prior)).
        min_prob: candidates below this path probability are not expanded.
        chain: only the most probable child of each node (a chain).
        stats: optional list; receives per returned node the (continuation count,
            total continuations of its parent, suffix length the conditional was
            estimated on = matched length + node depth - 1) of the source that gave
            its probability (what `AcceptanceCalibration` keys on).
        matched: matched suffix length per source (for ``stats``; default 0).

    Returns:
        (tokens, parents, probs): lists in best-first order; parents index into
        them (-1 = child of the pending token); probs = path probabilities.
    """
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    if max_nodes <= 0 or depth_cap <= 0:
        return tokens, parents, probs
    lengths = list(matched) if matched is not None else [0] * len(sources)
    live = [(node, rem, m) for (node, rem), m in zip(sources, lengths) if node is not None and rem > 0]
    lengths = [m for _, _, m in live]
    if not live:
        return tokens, parents, probs
    heap: list = []
    order = 0
    # heap item: (-prob, order, token, parent index, depth, per-source (node, prob, remaining), stat)
    def push_children(states, parent: int, depth: int) -> None:
        nonlocal order
        merged: dict[int, list] = {}
        for j, (node, prob, rem) in enumerate(states):
            if node is None or rem <= 0 or not node.children:
                continue
            total = sum(c.count for c in node.children.values()) + prior_count
            for tok, child in node.children.items():
                entry = merged.setdefault(tok, [0.0, [(None, 0.0, 0)] * len(states), None])
                p = prob * child.count / total
                entry[1][j] = (child, p, rem - 1)
                if p > entry[0]:
                    entry[0], entry[2] = p, (child.count, total - prior_count, lengths[j] + depth - 1)
        items = sorted(merged.items(), key=lambda kv: (-kv[1][0], kv[0]))
        if chain:
            items = items[:1]
        for tok, (prob, child_states, stat) in items:
            if prob > min_prob:
                heapq.heappush(heap, (-prob, order, tok, parent, depth, child_states, stat))
                order += 1
    push_children([(node, 1.0, rem) for node, rem, _ in live], -1, 1)
    while heap and len(tokens) < max_nodes:
        neg, _, tok, parent, depth, states, stat = heapq.heappop(heap)
        if stats is not None:
            stats.append(stat)
        index = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        probs.append(-neg)
        if depth < depth_cap:
            push_children(states, index, depth + 1)
    return tokens, parents, probs


def monotone_cost(verify_cost: Sequence[float]) -> np.ndarray:
    """A verify-cost table made non-decreasing: c'(n) = min_{m >= n} c(m).

    Verifying n tokens never costs more than verifying m > n (the extra ones could
    be padding), so a noisy measured dip is read as the price of the smaller sizes.

    Args:
        verify_cost: seconds to verify 1..M tokens (entry n-1 = n tokens), finite > 0.

    Raises:
        ValueError: not a non-empty 1-D array of finite positive seconds.
    """
    cost = np.asarray(verify_cost, dtype=np.float64)
    if cost.ndim != 1 or cost.size == 0 or not np.all(np.isfinite(cost)) or np.any(cost <= 0):
        raise ValueError("verify_cost must be a non-empty 1-D array of finite seconds > 0 "
                         "(entry n-1 = time to verify n tokens)")
    return np.minimum.accumulate(cost[::-1])[::-1].copy()


def cost_optimal_size(probs: Sequence[float], verify_cost: np.ndarray) -> int:
    """Number n of best-first candidates to verify:

        n* = argmax_{0 <= n <= N} (1 + sum_{i <= n} p_i) / c(n + 1),

    where p_i is candidate i's path probability (the probability it is accepted, if
    calibrated: the expected accepted length of a tree is the sum of its nodes'
    acceptance probabilities, plus 1 for the bonus / correction token) and c(n + 1)
    the time to verify the pending token and n candidates (sizes past the table
    cost its last entry). Ties go to the smaller n.

    Args:
        probs: float path probabilities in best-first order (N,).
        verify_cost: `monotone_cost` table (seconds for 1..M tokens).

    Returns:
        int n* in [0, N].
    """
    count = len(probs)
    if count == 0:
        return 0
    expected = 1.0 + np.concatenate(([0.0], np.cumsum(np.asarray(probs, dtype=np.float64))))
    sizes = np.minimum(np.arange(1, count + 2), verify_cost.size) - 1
    return int(np.argmax(expected / verify_cost[sizes]))


class GlobalSuffixCache:
    """A `SuffixTrie` over whole requests (earlier outputs), FIFO-evicted by request.

    Args:
        depth: trie depth (tokens, >= 1).
        max_requests: most requests kept (>= 1); the oldest goes first.
        max_tokens: most tokens kept over all requests (>= 1), or None; a request
            longer than this is kept truncated to its first ``max_tokens`` tokens.

    Memory: at most ``min(max_tokens, sum of kept lengths) * depth`` trie nodes plus
    the kept sequences.

    Raises:
        ValueError: bad sizes.
    """

    def __init__(self, depth: int = 32, max_requests: int = 1000, max_tokens: int | None = None):
        self.trie = SuffixTrie(depth)
        self.max_requests = _check_int("max_requests", max_requests, 1)
        self.max_tokens = None if max_tokens is None else _check_int("max_tokens", max_tokens, 1)
        self.sequences: deque[tuple[int, ...]] = deque()
        self.num_tokens = 0

    @property
    def depth(self) -> int:
        return self.trie.depth

    def add(self, tokens: Iterable[int]) -> None:
        """Store one finished request's tokens, then evict the oldest requests until
        both bounds hold. O(len * depth) plus the evictions."""
        seq = tuple(int(t) for t in tokens)
        if self.max_tokens is not None:
            seq = seq[: self.max_tokens]
        if not seq:
            return
        self.trie.extend(self.trie.start(), seq)
        self.sequences.append(seq)
        self.num_tokens += len(seq)
        while len(self.sequences) > self.max_requests or \
                (self.max_tokens is not None and self.num_tokens > self.max_tokens):
            old = self.sequences.popleft()
            self.trie.remove(old)
            self.num_tokens -= len(old)

    def state_dict(self) -> dict:
        """JSON-able state: the configuration and the kept sequences, oldest first."""
        return {"depth": self.depth, "max_requests": self.max_requests, "max_tokens": self.max_tokens,
                "sequences": [list(s) for s in self.sequences]}

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents by ``state`` (from `state_dict`): the trie is rebuilt
        from the sequences, so counts and eviction order are exactly the saved ones.

        Raises:
            ValueError: malformed state.
        """
        try:
            depth, seqs = int(state["depth"]), state["sequences"]
            max_requests, max_tokens = int(state["max_requests"]), state["max_tokens"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a GlobalSuffixCache state ({exc})") from exc
        fresh = GlobalSuffixCache(depth, max_requests, max_tokens)
        for seq in seqs:
            fresh.add(seq)
        self.__dict__.update(fresh.__dict__)


class AcceptanceCalibration:
    """How often a drafted continuation is accepted, learned from the verifier.

    An empirical continuation probability from few occurrences is overconfident (a
    pattern seen once gives 1.0), and how much it can be trusted depends most on
    how long a suffix it was estimated on. The verifier reveals, for every node whose
    parent was accepted (or that hangs from the pending token), whether it was
    accepted; those outcomes update a Beta posterior per bucket of (suffix length,
    number of continuations seen, empirical conditional probability). Its prior mean
    is the smoothed empirical probability count / (total + prior_count), with weight
    ``prior_strength``.

    `estimate` is optimistic (UCB1, Auer et al. 2002): the posterior mean plus
    sqrt(log(1 + N) / (2 (n_b + prior_strength))), N = outcomes seen, n_b = the
    bucket's; a bucket that looked bad early is tried again as N grows, instead of
    never being drafted (and so never corrected) again. `mean` is without the bonus.

    Args:
        prior_count: pseudo-count of the smoothed prior mean (>= 0).
        prior_strength: weight of the prior in pseudo-observations (> 0).
        exploration: multiplier of the UCB bonus (>= 0; 0 = the posterior mean).

    Buckets: suffix lengths {<=1, 2, 3-4, 5-8, 9+} x totals {1, 2, 3-4, 5-8, 9+}
    x probabilities in 5 equal bins.
    """

    EDGES = (1, 2, 4, 8)
    PROB_BINS = 5

    def __init__(self, prior_count: float = 1.0, prior_strength: float = 2.0, exploration: float = 1.0):
        if not (np.isfinite(prior_count) and prior_count >= 0 and np.isfinite(prior_strength)
                and prior_strength > 0 and np.isfinite(exploration) and exploration >= 0):
            raise ValueError(f"AcceptanceCalibration needs prior_count >= 0, prior_strength > 0 and "
                             f"exploration >= 0, got {prior_count!r}, {prior_strength!r}, {exploration!r}")
        self.prior_count, self.prior_strength = float(prior_count), float(prior_strength)
        self.exploration = float(exploration)
        shape = (len(self.EDGES) + 1, len(self.EDGES) + 1, self.PROB_BINS)
        self.accepted = np.zeros(shape)
        self.trials = np.zeros(shape)
        self.total_trials = 0.0

    @staticmethod
    def _bin(value: float) -> int:
        return 0 if value <= 1 else 1 if value <= 2 else 2 if value <= 4 else 3 if value <= 8 else 4

    def bucket(self, count: int, total: int, length: int = 1) -> tuple[int, int, int]:
        """Bucket of a continuation seen ``count`` times out of ``total`` (1 <= count
        <= total) after a suffix of ``length`` tokens."""
        col = min(int(count / total * self.PROB_BINS), self.PROB_BINS - 1)
        return self._bin(length), self._bin(total), col

    def mean(self, count: int, total: int, length: int = 1) -> float:
        """Posterior-mean conditional acceptance probability of such a continuation."""
        at = self.bucket(count, total, length)
        prior = count / (total + self.prior_count)
        return (float(self.accepted[at]) + self.prior_strength * prior) / (float(self.trials[at]) + self.prior_strength)

    def estimate(self, count: int, total: int, length: int = 1) -> float:
        """`mean` plus the UCB bonus, capped at 1."""
        at = self.bucket(count, total, length)
        bonus = self.exploration * math.sqrt(math.log1p(self.total_trials)
                                             / (2.0 * (float(self.trials[at]) + self.prior_strength)))
        return min(1.0, self.mean(count, total, length) + bonus)

    def update(self, count: int, total: int, length: int, accepted: bool) -> None:
        """One tested node: its (count, total, suffix length) and the verifier's verdict."""
        at = self.bucket(count, total, length)
        self.trials[at] += 1
        self.accepted[at] += bool(accepted)
        self.total_trials += 1

    def state_dict(self) -> dict:
        return {"prior_count": self.prior_count, "prior_strength": self.prior_strength,
                "exploration": self.exploration, "accepted": self.accepted.tolist(),
                "trials": self.trials.tolist(), "total_trials": self.total_trials}

    def load_state_dict(self, state: dict) -> None:
        """Raises ValueError on a malformed state."""
        try:
            fresh = AcceptanceCalibration(float(state["prior_count"]), float(state["prior_strength"]),
                                          float(state["exploration"]))
            accepted, trials = np.asarray(state["accepted"], float), np.asarray(state["trials"], float)
            total = float(state["total_trials"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an AcceptanceCalibration state ({exc})") from exc
        if accepted.shape != fresh.accepted.shape or trials.shape != fresh.trials.shape:
            raise ValueError("AcceptanceCalibration state has the wrong shape")
        fresh.accepted, fresh.trials, fresh.total_trials = accepted, trials, total
        self.__dict__.update(fresh.__dict__)
