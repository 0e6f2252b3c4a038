"""Lookahead Reasoning (LR) decoding: step-level speculation (Fu et al. 2025,
"Scaling Speculative Decoding with Lookahead Reasoning"; the LR rows of OnlineSpec
Table 2, with Online-LR's feedback of Sec. 3.1, Eq. 2).

One round, on a committed context c (text, held as token ids by each model):

1. the draft proposes gamma steps d_1..d_gamma greedily, one after the other
   (`expansion.expand_steps` on its own ids, a step ending at the rule's delimiter);
2. the draft's steps are re-tokenised as text for the target (draft and target have
   different tokenizers): r_i = target_tokenizer.encode(d_i);
3. the target expands every proposed prefix c, c+r_1, ..., c+r_1..r_{gamma-1} by one
   step t_0..t_{gamma-1} in ONE batched forward loop over the ragged prefixes
   (optionally each prefix's step by token-level speculative decoding instead:
   `specloop.realmodels.decoder.SpeculativeDecoder` with an n-gram drafter, lossless);
4. a judge compares d_{i+1} with t_i, in order until the first mismatch (a judge
   with ``batch_all`` scores all pairs at once); the leading matched steps are accepted,
   and after the first mismatch at i the target's own step t_i is appended (if all
   gamma match, the round commits the gamma draft steps only);
5. the first mismatch gives Online-LR's preference pair (context, preferred = t_i,
   dispreferred = d_{i+1}) in the draft's tokens (`FeedbackPair`).

Each model keeps its own ids: its own steps as it generated them, the other model's
steps re-tokenised, so with a judge that accepts everything LR reproduces the
draft's step-by-step greedy output and with one that accepts nothing the target's
(`generate_alone`, which equals plain greedy decoding cut at a step end). The token
budget (``max_new_tokens``, OnlineSpec's thinking budget, 1024 there) counts target
tokens of the committed steps for every method. LR is lossy: accuracy is reported next
to speed (`runner`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from specloop.realmodels.reasoning.expansion import CommittedCache, StepOutput
from specloop.realmodels.reasoning.lockstep import ExpandRequest, JudgeRequest, run_one
from specloop.realmodels.reasoning.steps import REASONING, StepRule

__all__ = ["Participant", "LookaheadConfig", "FeedbackPair", "StepRound", "ReasoningResult",
           "lookahead_generate", "lookahead_process", "generate_alone", "alone_process"]


@dataclass
class Participant:
    """A model with its tokenizer, its own prompt ids and EOS ids.

    Attributes:
        model: causal LM (eval mode).
        tokenizer: ``encode(text, add_special_tokens=False)`` / ``decode(ids)``.
        prompt_ids: the prompt in this model's tokens (its chat format), >= 2 tokens.
        eos_ids: ids that end generation.
    """

    model: object
    tokenizer: object
    prompt_ids: list[int]
    eos_ids: set[int]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []


@dataclass(frozen=True)
class LookaheadConfig:
    """LR settings.

    Attributes:
        num_draft_steps: gamma, draft steps proposed per round (>= 1).
        max_new_tokens: budget in target tokens of committed steps (>= 1).
        rule: `StepRule` of the task.
        repetition_penalty: greedy repetition penalty of every model (>= 1).
        token_spec: run each target step through the token-level speculative decoder
            with an n-gram drafter (batch 1 per prefix) instead of the batched loop.
        spec_draft_tokens: k of that inner decoder.
    """

    num_draft_steps: int = 3
    max_new_tokens: int = 256
    rule: StepRule = REASONING
    repetition_penalty: float = 1.0
    token_spec: bool = False
    spec_draft_tokens: int = 4

    def __post_init__(self) -> None:
        if int(self.num_draft_steps) < 1 or int(self.max_new_tokens) < 1 or int(self.spec_draft_tokens) < 1:
            raise ValueError("LookaheadConfig needs num_draft_steps, max_new_tokens, spec_draft_tokens >= 1")
        if self.repetition_penalty < 1.0:
            raise ValueError(f"repetition_penalty must be >= 1, got {self.repetition_penalty}")
        if self.token_spec and self.repetition_penalty != 1.0:
            raise ValueError("token_spec decodes plain greedy: use repetition_penalty 1.0 with it")


@dataclass(frozen=True)
class FeedbackPair:
    """One Online-LR preference pair in the draft's tokens: x = ``prompt_ids``
    (draft prompt + committed context), y_w = ``chosen_ids`` (the target's step
    re-tokenised), y_l = ``rejected_ids`` (the draft's rejected step)."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    chosen_text: str
    rejected_text: str


@dataclass
class StepRound:
    """One LR round: steps drafted / accepted, whether a target step was appended,
    judge scores, seconds per phase (``commit_time``: prefilling the committed steps
    into both models' caches), and inner token-speculation counts."""

    drafted: int
    accepted: int
    target_step: bool
    scores: list[float]
    draft_time: float
    target_time: float
    judge_time: float
    spec_tokens: int = 0
    spec_rounds: int = 0
    commit_time: float = 0.0

    @property
    def committed(self) -> int:
        """Steps committed this round (accepted draft steps + the target's step)."""
        return self.accepted + int(self.target_step)


@dataclass
class ReasoningResult:
    """One prompt's generation.

    Attributes:
        text: the committed text (concatenated steps).
        steps: (step text, "draft" | "target") in order.
        rounds: `StepRound` per round (LR) or one per step (single model).
        target_tokens: committed length in target tokens.
        stop_reason: "eos", "length" (budget) or "steps" (step cap).
        feedback: Online-LR pairs (LR only).
        judged: (draft step, target step) pairs the judge saw (for agreement studies).
    """

    text: str
    steps: list[tuple[str, str]]
    rounds: list[StepRound]
    target_tokens: int
    stop_reason: str
    feedback: list[FeedbackPair] = field(default_factory=list)
    judged: list[tuple[str, str]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(r.draft_time + r.target_time + r.judge_time + r.commit_time for r in self.rounds)


class _Side:
    """A participant's committed ids and cache during one generation."""

    def __init__(self, who: Participant):
        self.who = who
        self.cache = CommittedCache(who.model, list(who.prompt_ids))

    @property
    def ids(self) -> list[int]:
        return self.cache.ids

    def commit(self, ids) -> None:
        self.cache.extend(list(ids))


def _steps_alone(side: _Side, config: LookaheadConfig, count: int, budget_left: int,
                 counter: Participant):
    """Up to ``count`` greedy steps of one model, one after the other, from its cache,
    each capped at the budget left (``budget_left`` target tokens, the steps before
    it counted in ``counter``'s tokens). A generator (`lockstep`) returning (steps,
    their ids in ``counter``'s tokens)."""
    out: list[StepOutput] = []
    counted: list[list[int]] = []
    for _ in range(count):
        tail = [t for s in out for t in s.ids]
        left = budget_left - sum(len(c) for c in counted)
        if left < 1:
            break
        step = (yield _expand_request(side, [side.ids + tail], [left], config))[0]
        out.append(step)
        counted.append(list(step.ids) if counter is side.who else counter.encode(step.text))
        if step.eos:
            break
    return out, counted


def _expand_request(side: _Side, prefixes, caps, config: LookaheadConfig) -> ExpandRequest:
    who = side.who
    return ExpandRequest(who.model, who.tokenizer, frozenset(who.eos_ids), side.cache,
                         tuple(tuple(p) for p in prefixes), tuple(int(c) for c in caps), config.rule,
                         float(config.repetition_penalty))


def _target_expand(side: _Side, prefixes, config: LookaheadConfig, caps: list[int]):
    """Target steps after each prefix, each at most its cap. A generator returning
    (outputs, spec tokens, spec rounds); with ``token_spec`` the steps are decoded
    here, batch 1 per prefix, without a request."""
    if not config.token_spec:
        return (yield _expand_request(side, prefixes, caps, config)), 0, 0
    outputs, tokens, rounds = [], 0, 0
    for prefix, cap in zip(prefixes, caps):
        step, n_tok, n_round = _spec_step(side.who, prefix, config, cap)
        outputs.append(step)
        tokens, rounds = tokens + n_tok, rounds + n_round
    return outputs, tokens, rounds


def _spec_step(who: Participant, prefix: list[int], config: LookaheadConfig, cap: int):
    """One target step by lossless token-level speculative decoding (n-gram drafter),
    cut at the step's end: (StepOutput, committed tokens, rounds)."""
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.loading import LoadedModel
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.strategies.engine import drive_round
    # the decoder reads ``.model`` of what it is given: wrap the causal LM (its own ``.model`` is the trunk)
    decoder = SpeculativeDecoder(LoadedModel(who.model, who.tokenizer, "target", ""), NGramDrafter(), policy=FixedDraftPolicy(config.spec_draft_tokens),
                                 eos_token_id=sorted(who.eos_ids))
    cap = min(int(cap), config.rule.max_step_tokens)
    session = decoder.session(prefix, cap)
    while not session.done:
        drive_round(decoder.policy, session)
        if config.rule.step_complete(who.tokenizer.decode(session.new_tokens)):
            break
    new = list(session.new_tokens)
    tokens, rounds = len(new), len(session.trace)
    ids: list[int] = []
    for token in new:
        if token in who.eos_ids:
            return StepOutput(tuple(ids), who.tokenizer.decode(ids), True), tokens, rounds
        ids.append(token)
        if config.rule.step_complete(who.tokenizer.decode(ids)):
            break
    return StepOutput(tuple(ids), who.tokenizer.decode(ids), False), tokens, rounds


class _Budget:
    """Committed steps and the target-token budget of one generation."""

    def __init__(self, config: LookaheadConfig, max_steps: int):
        self.config, self.max_steps = config, max_steps
        self.steps: list[tuple[str, str]] = []
        self.tokens = 0
        self.stop: str | None = None

    def add(self, text: str, source: str, target_count: int, eos: bool) -> None:
        self.steps.append((text, source))
        self.tokens += target_count
        if eos:
            self.stop = "eos"
        elif self.tokens >= self.config.max_new_tokens:
            self.stop = "length"
        elif len(self.steps) >= self.max_steps:
            self.stop = "steps"


def lookahead_generate(target: Participant, draft: Participant, judge, config: LookaheadConfig, *,
                       max_steps: int = 10_000) -> ReasoningResult:
    """LR decoding of one prompt (module docstring), batch 1.

    Args:
        target, draft: `Participant` (their own prompt ids of the same prompt text).
        judge: object with ``scores(pairs)`` / ``threshold`` (`judge`).
        config: `LookaheadConfig`.
        max_steps: cap on committed steps.

    Returns:
        `ReasoningResult` (feedback pairs included).
    """
    return run_one(lookahead_process(target, draft, judge, config, max_steps=max_steps), judge)


def lookahead_process(target: Participant, draft: Participant, judge, config: LookaheadConfig, *,
                      max_steps: int = 10_000):
    """`lookahead_generate` as a `lockstep` generation: yields its expansions and
    judgements, returns the `ReasoningResult`; drive it with `lockstep.run_one` (batch 1)
    or with others in `lockstep.run_many` (``judge`` gives only the threshold here)."""
    t_side, d_side = _Side(target), _Side(draft)
    budget = _Budget(config, max_steps)
    rounds, feedback, judged = [], [], []
    while budget.stop is None:
        start = time.perf_counter()
        left = config.max_new_tokens - budget.tokens
        proposals, retok = yield from _steps_alone(d_side, config, config.num_draft_steps, left, target)
        mid = time.perf_counter()
        prefixes = [t_side.ids + [t for r in retok[:i] for t in r] for i in range(len(proposals))]
        caps = [left - sum(len(r) for r in retok[:i]) for i in range(len(proposals))]
        expansions, spec_tokens, spec_rounds = yield from _target_expand(t_side, prefixes, config, caps)
        after = time.perf_counter()
        pairs = [(p.text, e.text) for p, e in zip(proposals, expansions)]
        scores = yield from _judge_leading(judge, pairs)
        accepted = 0
        while accepted < len(scores) and scores[accepted] >= judge.threshold:
            accepted += 1
        pairs = pairs[:len(scores)]
        end = time.perf_counter()
        judged.extend(pairs)
        committed_before = len(d_side.ids)
        appended = _commit_round(t_side, d_side, proposals, retok, expansions, accepted, budget)
        committed = time.perf_counter()
        if appended:
            e, p = expansions[accepted], proposals[accepted]
            feedback.append(FeedbackPair(tuple(d_side.ids[:committed_before] + _draft_ids_of(proposals, accepted)),
                                         tuple(draft.encode(e.text)), p.ids, e.text, p.text))
        rounds.append(StepRound(len(proposals), min(accepted, len(proposals)), appended, scores,
                                mid - start, after - mid, end - after, spec_tokens, spec_rounds, committed - end))
    return ReasoningResult("".join(s for s, _ in budget.steps), budget.steps, rounds, budget.tokens,
                           budget.stop, feedback, judged)


def _judge_leading(judge, pairs):
    """Scores of the pairs in order up to and including the first rejected one (only
    the leading matches count, so later pairs need no judging). A judge with
    ``batch_all = True`` scores every pair in one call instead (one batched forward
    where that is cheaper than the saved ones, e.g. on a GPU). A generator (`lockstep`)
    returning the scores."""
    if not pairs:
        return []
    if getattr(judge, "batch_all", False):
        return list((yield JudgeRequest(tuple(pairs))))
    scores: list[float] = []
    for pair in pairs:
        scores.append(float((yield JudgeRequest((pair,)))[0]))
        if scores[-1] < judge.threshold:
            break
    return scores


def _draft_ids_of(proposals: list[StepOutput], count: int) -> list[int]:
    return [t for p in proposals[:count] for t in p.ids]


def _commit_round(t_side: _Side, d_side: _Side, proposals, retok, expansions, accepted: int,
                  budget: _Budget) -> bool:
    """Commit the accepted draft steps, then the target's step after the first
    mismatch; stops at the budget. Returns whether the target's step was appended."""
    t_new: list[int] = []
    d_new: list[int] = []
    for p, r in zip(proposals[:accepted], retok[:accepted]):
        t_new += r
        d_new += list(p.ids)
        budget.add(p.text, "draft", len(r), p.eos)
        if budget.stop is not None:
            break
    appended = False
    if budget.stop is None and accepted < len(proposals):
        step = expansions[accepted]
        t_new += list(step.ids)
        d_new += d_side.who.encode(step.text)
        budget.add(step.text, "target", len(step.ids), step.eos)
        appended = True
    t_side.commit(t_new)
    d_side.commit(d_new)
    return appended


def generate_alone(who: Participant, config: LookaheadConfig, *, count_with: Participant | None = None,
                   max_steps: int = 10_000) -> ReasoningResult:
    """One model alone, step after step (the Target and Draft rows): greedy, cut at
    step ends, the budget counted in ``count_with``'s tokens (the target; default
    ``who``). For the target this is plain greedy decoding of ``max_new_tokens``
    tokens (or up to EOS), the last step cut at the budget since every step is capped
    at the tokens left. Batch 1 (`alone_process` is the lockstep form).

    Returns:
        `ReasoningResult` with one `StepRound` per step (its time in
        ``target_time`` for the target, ``draft_time`` otherwise).
    """
    return run_one(alone_process(who, config, count_with=count_with, max_steps=max_steps))


def alone_process(who: Participant, config: LookaheadConfig, *, count_with: Participant | None = None,
                  max_steps: int = 10_000):
    """`generate_alone` as a `lockstep` generation. A model counting its own tokens
    (the Target row) yields ONE request, its whole greedy continuation of
    ``max_new_tokens`` tokens (no step delimiter), and cuts it into steps afterwards
    (`_cut_steps`): greedy decoding does not depend on where steps end, so the steps
    equal step-by-step generation, at the cost of plain greedy decoding (one cache, no
    copy or re-prefill per step). A model counted in another's tokens (the Draft row)
    yields one request per step, since its budget depends on the re-tokenised text."""
    if count_with is None or count_with is who:
        return (yield from _whole_alone(who, config, max_steps))
    counter = count_with
    side = _Side(who)
    budget = _Budget(config, max_steps)
    rounds = []
    while budget.stop is None:
        start = time.perf_counter()
        step = (yield from _steps_alone(side, config, 1, config.max_new_tokens - budget.tokens, counter))[0][0]
        side.commit(list(step.ids))
        seconds = time.perf_counter() - start
        count = len(step.ids) if counter is who else len(counter.encode(step.text))
        budget.add(step.text, "target" if counter is who else "draft", count, step.eos)
        own = counter is who      # the target's own step, or a draft step taken as it is
        rounds.append(StepRound(0 if own else 1, 0 if own else 1, own, [], 0.0 if own else seconds,
                                seconds if own else 0.0, 0.0))
    return ReasoningResult("".join(s for s, _ in budget.steps), budget.steps, rounds, budget.tokens,
                           budget.stop)


#: a rule whose delimiter never occurs in text (the NUL character): whole continuations
_NO_DELIMITER = "\x00"


def _whole_alone(who: Participant, config: LookaheadConfig, max_steps: int):
    """The Target row in one request (`alone_process`)."""
    side = _Side(who)
    start = time.perf_counter()
    whole = StepRule(_NO_DELIMITER, int(config.max_new_tokens), "whole")
    request = ExpandRequest(who.model, who.tokenizer, frozenset(who.eos_ids), side.cache, (tuple(side.ids),),
                            (int(config.max_new_tokens),), whole, float(config.repetition_penalty))
    output = (yield request)[0]
    seconds = time.perf_counter() - start
    budget = _Budget(config, max_steps)
    rounds = []
    for ids, eos in _cut_steps(who, list(output.ids), output.eos, config):
        budget.add(who.tokenizer.decode(ids), "target", len(ids), eos)
        share = seconds * len(ids) / max(1, len(output.ids))
        rounds.append(StepRound(0, 0, True, [], 0.0, share, 0.0))
        if budget.stop is not None:
            break
    return ReasoningResult("".join(s for s, _ in budget.steps), budget.steps, rounds, budget.tokens,
                           budget.stop)


def _cut_steps(who: Participant, ids: list[int], eos: bool, config: LookaheadConfig):
    """(step ids, ends with EOS) of a greedy continuation cut as `expand_steps` cuts
    steps: a step ends once its decoded text holds a finished step or it reaches
    min(max_step_tokens, budget left); an EOS after the last token ends the last one
    (an EOS at a step start gives an empty step, as step-by-step generation does)."""
    left, current = int(config.max_new_tokens), []
    for token in ids:
        current.append(token)
        cap = min(config.rule.max_step_tokens, left)
        if config.rule.step_complete(who.tokenizer.decode(current)) or len(current) >= cap:
            yield current, False
            left -= len(current)
            current = []
    if current or eos:
        yield current, eos
