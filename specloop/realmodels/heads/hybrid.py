"""Hybrid draft: a model-free lookup where it is confident, the trained head otherwise.

Two lookups:

* prompt lookup (n-gram matching against the context, Saxena 2023; the default) is
  nearly free and very accurate when the output copies the prompt (code edits,
  quoting, lists);
* the suffix tree (`specloop.realmodels.drafters.suffix.SuffixDrafter`, SuffixDecoding,
  Oliaro et al. 2024) learns from every committed token of the stream without a
  gradient, and with ``min_score`` is the SuffixDecoding hybrid: its proposal is used
  when its score -- the sum of its nodes' empirical path probabilities, i.e. the
  expected number of accepted tokens under the tries' counts -- reaches ``min_score``,
  else the head drafts (Arctic Inference's suffix + model-draft fallback).

A trained head generalises where the lookup has nothing. The head sees every round's
target features either way (its cache stays in sync), so switching costs nothing; the
lookup observes its own proposal's outcome when the head's was verified (the feedback
a greedy verifier would have given it, as Hedge's sources do). Lossless: each round's
proposal is exactly one sub-drafter's, with its own ``q_draft`` (None for lookup
nodes). Online learning trains the head alone (``trainable``); a suffix lookup's tries
are stream state (``keeps_stream_state``, ``state_dict``).
"""
from __future__ import annotations

import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.drafters.hedge import greedy_feedback
from specloop.realmodels.drafters.ngram import NGramDrafter

__all__ = ["HybridDrafter"]


class HybridDrafter(BaseDrafter):
    """A lookup drafter where it proposes (and scores ``min_score``), else a head drafter.

    Args:
        head: a head `Drafter` (e.g. `EagleDrafter`, `HydraDrafter`).
        min_ngram: shortest n-gram match that counts (tokens, >= 1; prompt lookup).
        max_ngram: longest n-gram tried first (tokens, >= min_ngram; prompt lookup).
        max_matches: as `NGramDrafter` (prompt lookup).
        lookup_drafter: the lookup drafter; None = prompt lookup with the n-gram sizes
            above.
        min_score: expected accepted tokens a lookup proposal needs (>= 0; the sum of
            its ``node_probs``; a proposal without ``node_probs`` counts as reaching
            it); 0 = every non-empty lookup proposal is used.

    Attributes:
        lookup_rounds / head_rounds: how many proposals came from each source.
        trainable: the drafter whose parameters online learning updates (the head).

    Raises:
        ValueError: bad n-gram sizes; ``min_score`` negative or not finite.
    """

    def __init__(self, head, *, min_ngram: int = 2, max_ngram: int = 4, max_matches: int = 4,
                 lookup_drafter=None, min_score: float = 0.0) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if not (float(min_score) >= 0 and float(min_score) != float("inf")):
            raise ValueError(f"min_score must be a finite number >= 0, got {min_score!r}")
        self.head = head
        self.lookup = lookup_drafter if lookup_drafter is not None else \
            NGramDrafter(max_ngram=max_ngram, min_ngram=min_ngram, max_matches=max_matches)
        self.min_score = float(min_score)
        lookup_name = "" if lookup_drafter is None else f"{getattr(lookup_drafter, 'name', 'lookup')}-"
        self.name = f"hybrid-{lookup_name}{getattr(head, 'name', 'head')}"
        self.needs_target_hidden = tuple(head.needs_target_hidden)
        self.lookup_rounds = 0
        self.head_rounds = 0
        self._unused: DraftProposal | None = None    # the lookup's proposal when the head's was played

    @property
    def trainable(self):
        return self.head

    @property
    def keeps_stream_state(self) -> bool:
        return bool(getattr(self.lookup, "keeps_stream_state", False))

    @property
    def train_report(self):
        return getattr(self.head, "train_report", None)

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        self._unused = None
        self.lookup.reset(prompt_ids, target_hidden=None)
        self.head.reset(prompt_ids, target_hidden=target_hidden)

    def _confident(self, proposal: DraftProposal) -> bool:
        if proposal.size == 0:
            return False
        if self.min_score <= 0 or proposal.node_probs is None:
            return True
        return float(proposal.node_probs.sum()) >= self.min_score

    def propose(self, request: DraftRequest) -> DraftProposal:
        proposal = self.lookup.propose(request)
        if self._confident(proposal):
            self._unused = None
            self.lookup_rounds += 1
            return proposal
        self._unused = proposal if proposal.size > 0 else None
        self.head_rounds += 1
        return self.head.propose(request)

    def observe(self, feedback: VerifyFeedback):
        """Both drafts see the round (the lookup its own unplayed proposal's outcome,
        `greedy_feedback`); the head's observation (its loss, or None) is the hybrid's,
        so a head that reports a loss keeps it in the round record."""
        unused, self._unused = self._unused, None
        self.lookup.observe(feedback if unused is None or feedback is None else greedy_feedback(unused, feedback))
        return self.head.observe(feedback)

    def parameters(self) -> list[torch.Tensor]:
        return self.head.parameters()

    def state_dict(self) -> dict:
        """The lookup's stream state (`SuffixDrafter.state_dict`).

        Raises:
            TypeError: a lookup without stream state (prompt lookup)."""
        if not self.keeps_stream_state:
            raise TypeError(f"{self.name}: its lookup keeps no stream state")
        return self.lookup.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` into the lookup (errors as the lookup's)."""
        if not self.keeps_stream_state:
            raise TypeError(f"{self.name}: its lookup keeps no stream state")
        self.lookup.load_state_dict(state)
