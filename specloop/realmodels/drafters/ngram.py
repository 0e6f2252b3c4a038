"""N-gram prompt-lookup drafter (Saxena 2023, "prompt lookup decoding"; the
``prompt_lookup_num_tokens`` candidate generator of transformers), extended to a
tree: several earlier matches of the context's last n-gram give several
continuations, merged into a trie and verified in one target forward.

Deterministic: ``q_draft`` is None (each node is verified as a point mass, which is
lossless for greedy and sampling alike; see `drafters.base`).

With a ``length_model`` (`specloop.strategies.lookup_length.LookupLength`) a chain
draft verifies only the cost-optimal prefix of the best continuation, learned from
the verifier's accepted lengths per matched n-gram size.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest
from specloop.realmodels.drafters.options import ContextOptions

__all__ = ["NGramDrafter", "find_continuations", "best_continuation", "build_trie", "NGramOptions",
           "make_ngram_drafter"]


def find_continuations(ids: np.ndarray, depth: int, width: int, max_ngram: int = 3,
                       min_ngram: int = 1) -> list[list[int]]:
    """Continuations of the context's suffix found earlier in the context.

    For n from ``max_ngram`` down to ``min_ngram``: every earlier occurrence of the
    last n tokens (most recent first) yields the up to ``depth`` tokens that
    followed it. Distinct continuations are collected until ``width`` are found.

    Args:
        ids: int64 (L,) the context.
        depth: maximum continuation length in tokens (>= 1).
        width: maximum number of continuations (>= 1).
        max_ngram, min_ngram: n-gram sizes tried, longest first.

    Returns:
        list of token lists (possibly empty), best (longest n-gram, most recent) first.
    """
    length = int(ids.shape[0])
    found: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        if n < 1:
            break
        windows = np.lib.stride_tricks.sliding_window_view(ids[: length - 1], n)
        hits = np.nonzero((windows == ids[length - n:]).all(axis=1))[0]
        for start in hits[::-1]:
            begin = int(start) + n
            if begin >= length:
                continue
            cont = ids[begin: begin + depth].tolist()
            key = tuple(cont)
            if not cont or key in seen or any(f[: len(cont)] == cont for f in found):
                continue
            seen.add(key)
            found.append(cont)
            if len(found) >= width:
                return found
    return found


def best_continuation(ids: np.ndarray, depth: int, max_ngram: int = 3, min_ngram: int = 1) -> tuple[list[int], int]:
    """The first continuation `find_continuations` would give (longest matched
    n-gram, most recent occurrence) and that n-gram's length n; ``([], 0)`` when
    the context's suffix occurs nowhere earlier."""
    for n in range(min(max_ngram, int(ids.shape[0]) - 1), min_ngram - 1, -1):
        if n < 1:
            break
        found = find_continuations(ids, depth, 1, n, n)
        if found:
            return found[0], n
    return [], 0


def build_trie(continuations: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """Merge token lists into a trie: (tokens, parents), parents before children,
    at most ``max_nodes`` nodes (later continuations are truncated first)."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    for cont in continuations:
        parent = -1
        for tok in cont:
            key = (parent, tok)
            if key not in children:
                if len(tokens) >= max_nodes:
                    break
                children[key] = len(tokens)
                tokens.append(tok)
                parents.append(parent)
            parent = children[key]
    return tokens, parents


class NGramDrafter(BaseDrafter):
    """Prompt-lookup drafts: a chain from the best match, or a trie of several.

    Args:
        max_ngram: longest suffix n-gram matched (tokens, >= 1).
        min_ngram: shortest (>= 1).
        max_matches: continuations merged into a tree plan's trie, when the plan
            does not say (default 4). A tree plan's ``branching[0]`` (or
            ``top_k``) overrides it; its ``max_depth`` is the continuation length
            and ``verify_size`` caps the node count.
        length_model: optional `LookupLength`; chain plans then propose its
            cost-optimal prefix (keyed by the matched n-gram size) of the best
            continuation (the plan's k is the cap), and ``observe`` feeds it the
            accepted length. Tree plans ignore it.

    Raises:
        ValueError: sizes < 1 or min_ngram > max_ngram.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_matches: int = 4, length_model=None):
        if min_ngram < 1 or max_ngram < min_ngram or max_matches < 1:
            raise ValueError(f"NGramDrafter needs 1 <= min_ngram <= max_ngram and max_matches >= 1; "
                             f"got {min_ngram}, {max_ngram}, {max_matches}")
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches
        self.length_model = length_model
        self._pending: tuple[int, int] | None = None     # (matched n, drafted length) of the last chain

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        self._pending = None

    def observe(self, feedback) -> None:
        if self.length_model is not None and self._pending is not None:
            n, drafted = self._pending
            self.length_model.update(n, drafted, min(feedback.num_accepted, drafted))
        self._pending = None

    def _learned_chain(self, ids: np.ndarray, depth: int) -> DraftProposal:
        cont, n = best_continuation(ids, depth, self.max_ngram, self.min_ngram)
        length = self.length_model.choose(n, len(cont)) if cont else 0
        self._pending = (n, length) if length else None
        if not length:
            return DraftProposal.empty()
        return DraftProposal(torch.tensor(cont[:length], dtype=torch.long), torch.arange(-1, length - 1))

    def propose(self, request: DraftRequest) -> DraftProposal:
        plan = request.plan
        ids = request.ids.cpu().numpy()
        if plan.tree is None:
            depth, width, max_nodes = plan.num_draft_tokens, 1, request.max_tokens
        else:
            tree = plan.tree
            # the plan's k caps a tree's depth too (0 = the tree's own depth), as for every drafter
            depth = min(int(tree.max_depth), int(plan.num_draft_tokens) or int(tree.max_depth))
            width = int(tree.branching[0] if tree.branching is not None else tree.top_k)
            max_nodes = min(request.max_tokens, tree.verify_size or request.max_tokens)
        self._pending = None
        if depth < 1 or max_nodes < 1:
            return DraftProposal.empty()
        if self.length_model is not None and plan.tree is None:
            return self._learned_chain(ids, min(depth, max_nodes))
        conts = find_continuations(ids, depth, width, self.max_ngram, self.min_ngram)
        tokens, parents = build_trie(conts, max_nodes)
        if not tokens:
            return DraftProposal.empty()
        return DraftProposal(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))


@dataclasses.dataclass(frozen=True)
class NGramOptions(ContextOptions):
    """Options of ``--draft ngram`` (`make_ngram_drafter`): the `ContextOptions` (all
    ignored) and `NGramDrafter`'s sizes, with its defaults.

    Attributes:
        max_ngram (int, 3), min_ngram (int, 1), max_matches (int, 4): as `NGramDrafter`.
    """
    kind = "ngram"

    max_ngram: int = 3
    min_ngram: int = 1
    max_matches: int = 4


def make_ngram_drafter(target, **options) -> NGramDrafter:
    """Registry factory (``--draft ngram``): prompt lookup; ``target`` is unused.

    Args:
        **options: the fields of `NGramOptions` (None = the default).

    Raises:
        ValueError: an option `NGramOptions` does not declare, a wrong type, or bad
            sizes (`NGramDrafter`).
    """
    opts = NGramOptions.from_options(options)
    return NGramDrafter(max_ngram=opts.max_ngram, min_ngram=opts.min_ngram, max_matches=opts.max_matches)
