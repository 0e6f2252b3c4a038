"""Hybrid draft: prompt lookup where it finds a match, the trained head otherwise.

Prompt lookup (n-gram matching against the context, Saxena 2023) is nearly free and
very accurate when the output copies the prompt (code edits, quoting, lists); a
trained EAGLE head generalises elsewhere. Each round the hybrid asks the n-gram
drafter first, with a minimum match length of ``min_ngram`` tokens (a 1-token match
is mostly noise), and falls back to the head when it finds nothing. The head sees
every round's target features either way (its cache stays in sync), so switching
costs nothing. Lossless: each round's proposal is exactly one sub-drafter's, with its
own ``q_draft`` (None for n-gram nodes).
"""
from __future__ import annotations

import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest, VerifyFeedback
from specloop.realmodels.drafters.ngram import NGramDrafter

__all__ = ["HybridDrafter"]


class HybridDrafter(BaseDrafter):
    """Prompt lookup, else a head drafter.

    Args:
        head: a head `Drafter` (e.g. `EagleDrafter`).
        min_ngram: shortest n-gram match that counts (tokens, >= 1).
        max_ngram: longest n-gram tried first (tokens, >= min_ngram).

    Attributes:
        lookup_rounds / head_rounds: how many proposals came from each source.
    """

    def __init__(self, head, *, min_ngram: int = 2, max_ngram: int = 4, max_matches: int = 4) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.head = head
        self.lookup = NGramDrafter(max_ngram=max_ngram, min_ngram=min_ngram, max_matches=max_matches)
        self.name = f"hybrid-{getattr(head, 'name', 'head')}"
        self.needs_target_hidden = tuple(head.needs_target_hidden)
        self.lookup_rounds = 0
        self.head_rounds = 0

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        self.lookup.reset(prompt_ids, target_hidden=None)
        self.head.reset(prompt_ids, target_hidden=target_hidden)

    def propose(self, request: DraftRequest) -> DraftProposal:
        proposal = self.lookup.propose(request)
        if proposal.size > 0:
            self.lookup_rounds += 1
            return proposal
        self.head_rounds += 1
        return self.head.propose(request)

    def observe(self, feedback: VerifyFeedback):
        """Both drafts see the feedback; the head's observation (its loss, or None) is
        the hybrid's, so a head that reports a loss keeps it in the round record."""
        self.lookup.observe(feedback)
        return self.head.observe(feedback)

    def parameters(self) -> list[torch.Tensor]:
        return self.head.parameters()
