"""Serving several prompts' step-level generations in lockstep: one batched forward
loop per kind of work across all of them.

A generation (`lookahead.lookahead_process`, `lookahead.alone_process`) is written as
a Python generator that *yields* what it needs computed and receives the answer:

* `ExpandRequest` -- one greedy step after each of some prefixes of a committed
  context (a model's `expansion.CommittedCache`), answered with the `StepOutput` list;
* `JudgeRequest` -- judge scores of some (draft step, target step) pairs, answered
  with the float list.

`run_one` answers one generation's requests one by one (exactly the batch-1
computation: `expansion.expand_steps` on its own cache, ``judge.scores`` on its own
pairs). `run_many` advances P generations together: at each turn every pending
request is grouped with those of the same model, step rule and repetition penalty
(expansions, `expansion.expand_steps_many` over the stacked caches) or sent with all
other pairs to the judge in one call, and each generation receives its own part; with a
``width`` a finished generation's slot goes to the next one at once. In
float32 a row of a stacked batch computes what it computes alone up to rounding
(left padding is masked, positions count real tokens), so the steps, judgements and
answers of `run_many` equal those of `run_one` except where rounding flips a
near-tie (checked on real models by the runner's batch-1 timing prompts). Timings of
a lockstep generation are shared with the others and say nothing about speed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

from specloop.realmodels.reasoning.expansion import CommittedCache, StepOutput, expand_steps, expand_steps_many
from specloop.realmodels.reasoning.steps import StepRule

__all__ = ["ExpandRequest", "JudgeRequest", "run_one", "run_many"]


@dataclass(frozen=True)
class ExpandRequest:
    """One greedy step after each prefix (`expansion.expand_steps` with ``base``).

    Attributes:
        model, tokenizer: the generating model and its tokenizer.
        eos_ids: ids that end generation.
        base: the committed context's cache (a strict head of every prefix).
        prefixes: token-id prefixes (>= 1).
        caps: token cap per prefix (>= 1 each), e.g. the budget left.
        rule: the step rule. penalty: greedy repetition penalty (>= 1).
    """

    model: object
    tokenizer: object
    eos_ids: frozenset
    base: CommittedCache
    prefixes: tuple
    caps: tuple
    rule: StepRule
    penalty: float

    def group_key(self) -> tuple:
        return ("expand", id(self.model), id(self.tokenizer), self.eos_ids, self.rule, float(self.penalty))

    def alone(self) -> list[StepOutput]:
        return expand_steps(self.model, self.tokenizer, [list(p) for p in self.prefixes], self.rule,
                            eos_ids=set(self.eos_ids), base=self.base, repetition_penalty=self.penalty,
                            max_tokens=list(self.caps))


@dataclass(frozen=True)
class JudgeRequest:
    """Judge scores of (draft step, target step) text pairs (>= 1)."""

    pairs: tuple

    def group_key(self) -> tuple:
        return ("judge",)


def _answer_alone(request, judge):
    if isinstance(request, ExpandRequest):
        return request.alone()
    if isinstance(request, JudgeRequest):
        if judge is None:
            raise ValueError("a generation asked for judge scores but no judge was given")
        return [float(s) for s in judge.scores(list(request.pairs))]
    raise TypeError(f"unknown request {type(request).__name__}")


def run_one(process: Generator, judge=None):
    """Drive one generation to its end, each request answered alone.

    Args:
        process: a generator yielding `ExpandRequest` / `JudgeRequest` and returning
            its result.
        judge: object with ``scores(pairs)`` (needed by `JudgeRequest`).

    Returns:
        the generator's return value.

    Raises:
        ValueError: a `JudgeRequest` without a judge. TypeError: an unknown request.
    """
    try:
        request = next(process)
        while True:
            request = process.send(_answer_alone(request, judge))
    except StopIteration as stop:
        return stop.value


def _answer_group(requests: list, judge) -> list:
    """Answers of requests sharing one `group_key`, in order."""
    first = requests[0]
    if len(requests) == 1:
        return [_answer_alone(first, judge)]
    if isinstance(first, ExpandRequest):
        groups = [(r.base, [list(p) for p in r.prefixes], list(r.caps)) for r in requests]
        return expand_steps_many(first.model, first.tokenizer, groups, first.rule, eos_ids=set(first.eos_ids),
                                 repetition_penalty=first.penalty)
    if judge is None:
        raise ValueError("a generation asked for judge scores but no judge was given")
    pairs = [pair for r in requests for pair in r.pairs]
    scores = [float(s) for s in judge.scores(pairs)]
    out, start = [], 0
    for r in requests:
        out.append(scores[start: start + len(r.pairs)])
        start += len(r.pairs)
    return out


def run_many(processes: list[Generator], judge=None, *, width: int | None = None) -> list:
    """Drive P generations together, their like requests answered in one batch.

    Args:
        processes: generators as for `run_one` (P >= 1).
        judge: as for `run_one` (one judge for all).
        width: at most this many generations in flight (>= 1; None: all); when one
            ends, the next not yet started takes its place (prompt-level continuous
            batching: a long generation does not hold the others' slots idle).

    Returns:
        the generators' return values, in order.

    Raises:
        ValueError: no processes, width < 1; a `JudgeRequest` without a judge.
        TypeError: an unknown request.
    """
    if not processes:
        raise ValueError("run_many needs >= 1 generation")
    width = len(processes) if width is None else int(width)
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    results: list = [None] * len(processes)
    pending: dict[int, object] = {}
    waiting = iter(range(len(processes)))

    def start_next() -> None:
        while len(pending) < width:
            index = next(waiting, None)
            if index is None:
                return
            try:
                pending[index] = next(processes[index])
            except StopIteration as stop:
                results[index] = stop.value

    start_next()
    while pending:
        groups: dict[tuple, list[int]] = {}
        for index, request in pending.items():
            if not isinstance(request, (ExpandRequest, JudgeRequest)):
                raise TypeError(f"unknown request {type(request).__name__}")
            groups.setdefault(request.group_key(), []).append(index)
        for members in groups.values():
            answers = _answer_group([pending[i] for i in members], judge)
            for index, answer in zip(members, answers):
                try:
                    pending[index] = processes[index].send(answer)
                except StopIteration as stop:
                    results[index] = stop.value
                    del pending[index]
        start_next()
    return results
