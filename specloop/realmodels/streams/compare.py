"""Paired comparisons of stream methods: an online draft against its frozen
counterpart on the same prompts.

Every method of one ``specloop stream`` run serves the same prompts, so the fair
comparison is paired per prompt: ratio_i = tau_online,i / tau_frozen,i of the mean
accepted lengths (tokens per round) on prompt i. Prompt-to-prompt spread in tau is
large (code vs chat, repetition), so a paired test sees gains that a comparison of
two pooled means would miss, and does not mistake a prompt mix for a gain. This module
counts the per-prompt rounds and tokens; the paired statistics on them
(`paired_gain`, `log_ratio_t_interval`) live in `specloop.stats`.
"""
from __future__ import annotations

from typing import Iterable, Sequence

__all__ = ["per_prompt_counts", "domain_accepted_length"]


def per_prompt_counts(records: Iterable) -> list[dict]:
    """Rounds and emitted tokens per prompt.

    Args:
        records: `specloop.record.RoundRecord` s (any order) with ``stream_index``
            and ``tokens_per_round``.

    Returns:
        ``[{"index", "rounds", "tokens"}]`` sorted by prompt index; the prompt's mean
        accepted length is tokens / rounds (tokens per target forward).
    """
    counts: dict[int, list[int]] = {}
    for r in records:
        row = counts.setdefault(int(r.stream_index), [0, 0])
        row[0] += 1
        row[1] += int(r.tokens_per_round)
    return [{"index": i, "rounds": n, "tokens": t} for i, (n, t) in sorted(counts.items())]


def domain_accepted_length(prompts: Sequence[dict], domains: Sequence[str]) -> dict[str, float]:
    """Round-weighted mean accepted length per domain (tokens / rounds over its prompts).

    Args:
        prompts: `per_prompt_counts` rows.
        domains: dataset name of each stream position (``domains[index]``).

    Raises:
        IndexError: a prompt index outside ``domains``.
    """
    totals: dict[str, list[int]] = {}
    for p in prompts:
        row = totals.setdefault(domains[p["index"]], [0, 0])
        row[0] += p["rounds"]
        row[1] += p["tokens"]
    return {d: t / n for d, (n, t) in totals.items() if n}
