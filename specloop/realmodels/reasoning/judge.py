"""Step judges for Lookahead Reasoning: does a draft step mean what the target's
step means? (Fu et al. 2025, semantic verifier; OnlineSpec App. B.9, Table 10: a
Qwen2.5-7B-Instruct judge with the alignment prompt below, temperature 0.)

* `ModelJudge` -- any causal LM (by default the target itself) prompted with the
  Table 10 template; its score is P(yes) = P("aligned") / (P("aligned") +
  P("unaligned")), the two verdicts' first tokens after the opening "[" of the
  answer, and a pair is accepted when the score >= threshold. The prompt's text up
  to s1 is identical for every pair: its KV cache is computed once and reused.
* `ExactMatchJudge` -- cheap: the two steps are equal after normalisation
  (lower case, whitespace collapsed, punctuation other than digits / operators
  dropped); score 1.0 or 0.0.
* `HiddenStateJudge` -- cheap: cosine similarity of the mean last-layer hidden
  states of the target over each step's tokens (each step encoded alone).
* `ConstantJudge` -- accepts everything or nothing (tests, ablations).

`judge_agreement` compares a cheap judge's verdicts with a reference judge's.
Every judge maps a list of (draft_step, target_step) text pairs to scores in [0, 1]
(`scores`) and to verdicts (`verdicts`: score >= threshold).
"""
from __future__ import annotations

import re

import torch

from specloop.realmodels.reasoning.expansion import last_logits_after, padded_forward

__all__ = ["ALIGNMENT_SYSTEM", "ALIGNMENT_TEMPLATE", "alignment_prompt", "ModelJudge", "ExactMatchJudge",
           "HiddenStateJudge", "ConstantJudge", "judge_agreement", "make_judge", "normalise_step"]

#: OnlineSpec Table 10, system prompt
ALIGNMENT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#: OnlineSpec Table 10, user prompt ({draft_output} = s1, {target_output} = s2)
ALIGNMENT_TEMPLATE = (
    "Evaluate whether the following two reasoning steps (s1 and s2) convey exactly the same meaning. "
    "Focus on semantic similarity rather than exact wording. Compare the main ideas, key points, overall "
    "message, logical structure, and numerical calculations/results of both reasoning steps. If the "
    "reasoning steps convey essentially the same meaning and generate same calculation results, respond "
    "with [aligned]. If the reasoning steps express different meanings, respond with [unaligned]. If it is "
    "too hard to determine, respond with [unaligned] Please directly provide the final result in [aligned] "
    "or [unaligned]. Reasoning step 1 (s1):\n<start_s1>\n{draft_output}\n<end_s1>\n"
    "Reasoning step 2 (s2):\n<start_s2>\n{target_output}\n<end_s2>")


_MARK = "\x00S1\x00"


def alignment_prompt_parts(tokenizer) -> tuple[str, str]:
    """The judge prompt split around s1: (text before the draft step, the template's
    text between the draft and the target step, with "{target_output}" left in it,
    and the end)."""
    whole = alignment_prompt(tokenizer, _MARK, "{target_output}")
    head, rest = whole.split(_MARK)
    return head, rest


def alignment_prompt(tokenizer, draft_step: str, target_step: str) -> str:
    """The Table 10 prompt for one pair, in the judge's chat template when it has
    one (system + user turn + generation prompt), followed by "[" so that the next
    token is the verdict's first token."""
    user = ALIGNMENT_TEMPLATE.format(draft_output=draft_step.strip(), target_output=target_step.strip())
    messages = [{"role": "system", "content": ALIGNMENT_SYSTEM}, {"role": "user", "content": user}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = f"System: {ALIGNMENT_SYSTEM}\nUser: {user}\nAssistant: "
    return text + "["


class _Judge:
    threshold: float = 0.5
    name = "judge"

    def scores(self, pairs: list[tuple[str, str]]) -> list[float]:
        raise NotImplementedError

    def verdicts(self, pairs: list[tuple[str, str]]) -> list[bool]:
        """True where ``scores >= threshold``."""
        return [s >= self.threshold for s in self.scores(pairs)] if pairs else []


class ModelJudge(_Judge):
    """An LM judge with the alignment prompt of OnlineSpec Table 10.

    Args:
        loaded: `LoadedModel` (model + tokenizer), e.g. the target.
        threshold: accept when P(yes) >= threshold (in (0, 1]).

    Raises:
        ValueError: threshold outside (0, 1], or the tokenizer gives "aligned" and
            "unaligned" the same first token.
    """

    name = "model"

    def __init__(self, loaded, threshold: float = 0.5):
        if not 0.0 < float(threshold) <= 1.0:
            raise ValueError(f"judge threshold must be in (0, 1], got {threshold}")
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.threshold = float(threshold)
        yes = self.tokenizer.encode("aligned", add_special_tokens=False)
        no = self.tokenizer.encode("unaligned", add_special_tokens=False)
        if not yes or not no or yes[0] == no[0]:
            raise ValueError("the judge's tokenizer gives 'aligned' and 'unaligned' the same first token")
        self.yes_id, self.no_id = int(yes[0]), int(no[0])
        # the prompt up to s1 is the same for every pair: its KV cache is computed once
        self._head_text, self._rest = alignment_prompt_parts(self.tokenizer)
        self._head = None

    def scores(self, pairs):
        if not pairs:
            return []
        if self._head is None:
            from specloop.realmodels.reasoning.expansion import CommittedCache
            self._head = CommittedCache(self.model, self.tokenizer.encode(self._head_text, add_special_tokens=False))
        tails = [self.tokenizer.encode(d.strip() + self._rest.replace("{target_output}", t.strip()),
                                       add_special_tokens=False) for d, t in pairs]
        logits = last_logits_after(self._head, tails)
        two = torch.stack([logits[:, self.yes_id], logits[:, self.no_id]], dim=-1)
        return torch.softmax(two, dim=-1)[:, 0].tolist()


_KEEP = re.compile(r"[^a-z0-9+\-*/=.%()<>\[\]{}_:]+")


def normalise_step(text: str) -> str:
    """Lower case, every run of other characters (spaces, commas, quotes, ...) to
    one space, a final full stop dropped, stripped."""
    out = _KEEP.sub(" ", text.lower()).strip()
    return out[:-1].rstrip() if out.endswith(".") else out


class ExactMatchJudge(_Judge):
    """Accepts a pair iff the two steps are equal after `normalise_step` (score 1/0)."""

    name = "exact"
    threshold = 0.5

    def scores(self, pairs):
        return [1.0 if normalise_step(d) == normalise_step(t) else 0.0 for d, t in pairs]


class HiddenStateJudge(_Judge):
    """Cosine similarity of the target's mean-pooled last hidden states of the two
    steps (each encoded alone, without context), mapped to [0, 1] by max(0, cos).

    Args:
        loaded: `LoadedModel` (the target).
        threshold: accept when the similarity >= threshold (default 0.9).
    """

    name = "hidden"

    def __init__(self, loaded, threshold: float = 0.9):
        if not 0.0 < float(threshold) <= 1.0:
            raise ValueError(f"judge threshold must be in (0, 1], got {threshold}")
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.threshold = float(threshold)

    def _embed(self, texts: list[str]) -> torch.Tensor:
        sequences = [self.tokenizer.encode(t if t.strip() else " ", add_special_tokens=False) or [0]
                     for t in texts]
        _, states, valid = padded_forward(self.model, sequences, hidden=True)
        weights = valid[:, -states.shape[1]:].to(states.dtype)[..., None]
        return (states * weights).sum(1) / weights.sum(1)

    def scores(self, pairs):
        if not pairs:
            return []
        embedded = self._embed([d for d, _ in pairs] + [t for _, t in pairs])
        draft, target = embedded[: len(pairs)], embedded[len(pairs):]
        cos = torch.nn.functional.cosine_similarity(draft, target, dim=-1)
        return cos.clamp(min=0.0).tolist()


class ConstantJudge(_Judge):
    """Accepts every pair (``accept=True``) or none."""

    def __init__(self, accept: bool):
        self.accept = bool(accept)
        self.name = "always" if accept else "never"

    def scores(self, pairs):
        return [1.0 if self.accept else 0.0 for _ in pairs]


def judge_agreement(cheap: _Judge, reference: _Judge, pairs: list[tuple[str, str]]) -> dict:
    """How often a cheap judge's verdict equals the reference (model) judge's.

    Returns:
        {"pairs": n, "agreement": fraction of equal verdicts, "cheap_accept_rate",
        "reference_accept_rate", "cheap_precision": P(reference accepts | cheap
        accepts) (nan if the cheap judge accepts nothing)}.

    Raises:
        ValueError: no pairs.
    """
    if not pairs:
        raise ValueError("judge_agreement needs at least one pair")
    a, b = cheap.verdicts(pairs), reference.verdicts(pairs)
    both = sum(x and y for x, y in zip(a, b))
    return {"pairs": len(pairs), "agreement": sum(x == y for x, y in zip(a, b)) / len(pairs),
            "cheap_accept_rate": sum(a) / len(pairs), "reference_accept_rate": sum(b) / len(pairs),
            "cheap_precision": both / sum(a) if sum(a) else float("nan")}


def make_judge(kind: str, target, *, judge_model=None, threshold: float | None = None) -> _Judge:
    """A judge by name: "model" (``judge_model`` or the target), "exact", "hidden",
    "always", "never".

    Raises:
        ValueError: unknown kind.
    """
    if kind == "model":
        return ModelJudge(judge_model or target, 0.5 if threshold is None else threshold)
    if kind == "exact":
        return ExactMatchJudge()
    if kind == "hidden":
        return HiddenStateJudge(target, 0.9 if threshold is None else threshold)
    if kind in ("always", "never"):
        return ConstantJudge(kind == "always")
    raise ValueError(f"unknown judge {kind!r}; choose from model, exact, hidden, always, never")
