"""Acceptance profile of a draft: the mean accepted length and each draft position's share.

The regression guard of the shipped heads (as vLLM's acceptance-length test for its
EAGLE / MTP drafts): decode fixed prompts greedily with a fixed chain length k and
record, over all rounds,

* ``mean_accepted_length`` — tokens committed per round, tau = 1 + E[accepted drafts]
  (the bonus / correction token included), tokens;
* ``per_position`` — for draft position i = 1..k the fraction of rounds in which the
  first i drafted tokens were all accepted, P(a >= i); they sum to tau - 1, so each is
  the position's contribution to the accepted length.

Greedy decoding in float32 is deterministic, so a profile measured on the same
prompts and head is reproducible; a drop says the head (or the decoder) changed.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["acceptance_profile"]


def acceptance_profile(target, drafter, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 64,
                       draft_length: int = 4) -> dict:
    """Greedy chain decoding of ``prompts`` with ``drafter``; the profile over all rounds.

    Args:
        target: the loaded target (`specloop.realmodels.loading.LoadedModel`).
        drafter: any drafter (`specloop.realmodels.drafters.base`).
        prompts: prompt token ids, one int sequence per prompt (each non-empty).
        max_new_tokens: new tokens per prompt (int >= 1).
        draft_length: chain length k (int >= 1): tokens drafted per round.

    Returns:
        dict with ``mean_accepted_length`` (float, tokens per round: 1 + the mean
        accepted draft tokens a, = 1 + sum(per_position)), ``per_position`` (list of k
        floats in [0, 1], P(a >= i)), ``rounds`` (int), ``new_tokens`` (int, the tokens
        kept: an EOS inside an accepted block drops the tokens after it), ``prompts``
        (int), ``draft_length`` and ``max_new_tokens``.

    Raises:
        ValueError: no prompts, an empty prompt, or a non-positive length.
    """
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.policy import FixedDraftPolicy

    if not prompts:
        raise ValueError("acceptance_profile needs at least one prompt")
    if max_new_tokens < 1 or draft_length < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) and draft_length ({draft_length}) must be >= 1")
    accepted: list[int] = []
    committed = 0
    for index, ids in enumerate(prompts):
        if len(ids) == 0:
            raise ValueError(f"prompt {index} is empty")
        decoder = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(draft_length))
        result = decoder.generate(list(ids), max_new_tokens, stream_index=index)
        for record in result.trace:
            accepted.append(int(record.accepted_tokens))
            committed += int(record.tokens_per_round)
    rounds = len(accepted)
    per_position = [sum(a >= i for a in accepted) / rounds for i in range(1, draft_length + 1)]
    # tau counts what verification accepted (+ the bonus token), so it equals 1 + the sum
    # of the shares; new_tokens counts what was kept (tokens after an EOS inside an
    # accepted block, or past max_new_tokens, are dropped)
    return {"mean_accepted_length": (sum(accepted) + rounds) / rounds, "per_position": per_position, "rounds": rounds,
            "new_tokens": committed, "prompts": len(prompts), "draft_length": draft_length,
            "max_new_tokens": max_new_tokens}
