"""The reasoning stream runner: the rows of OnlineSpec Table 2 (Target, Draft, LR,
OSD-LR, Online-LR) over a task stream, chunked and resumable (OnlineSpec Sec. 3.1,
Eq. 2; App. B.10: chunks of 25 prompts, one draft update per chunk).

=============  ==========================================================
method         what runs
=============  ==========================================================
target         the target alone, greedy, step by step (`generate_alone`)
draft          the draft alone (budget counted in target tokens)
lr             Lookahead Reasoning with a frozen draft (`lookahead_generate`)
osd-lr         LR, draft updated by token-level distillation on the feedback
online-lr      LR, draft updated by DPO on the preference pairs (Online-LR)
=============  ==========================================================

Results folder: ``<out>/<method>/records.jsonl`` (one JSON object per prompt,
appended as each prompt finishes; timings under ``"timing"``, everything else is
deterministic), ``<method>/state.pt`` (prompts done, per-chunk update reports, the
updater's draft parameters, optimiser state and queued pairs), written atomically
after every prompt. A killed run restarted with the same arguments drops records of
unfinished prompts, restores the state and continues: its records equal an
uninterrupted run's (greedy decoding). Settings or stream changes are refused.

Speed: ``tokens_per_s`` = committed target tokens / decoding seconds (draft + target
+ judge; chunk-end updates excluded, reported as ``update_seconds`` and in
``tokens_per_s_with_training``); ``speedup`` = that ÷ the target row's. LR is lossy:
``accuracy`` (arith exact answer, HumanEval pass@1; MT-bench none) comes with it.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from specloop.realmodels.online import load_checkpoint, save_checkpoint
from specloop.realmodels.reasoning.dpo import DraftUpdater
from specloop.realmodels.reasoning.lookahead import (LookaheadConfig, Participant, generate_alone,
                                                     lookahead_generate)
from specloop.realmodels.reasoning.steps import rule_for_task
from specloop.realmodels.reasoning.tasks import TaskItem, format_prompt, score

__all__ = ["METHODS", "ReasonConfig", "ReasonRunner", "summarise_records", "resolve_methods"]

METHODS = ("target", "draft", "lr", "osd-lr", "online-lr")
_LABELS = {"target": "Target", "draft": "Draft", "lr": "LR", "osd-lr": "OSD-LR", "online-lr": "Online-LR"}
_OBJECTIVE = {"osd-lr": "distill", "online-lr": "dpo"}


def resolve_methods(text: str) -> list[str]:
    """Comma list of method names -> list (ValueError naming an unknown one)."""
    names = [m.strip().lower() for m in str(text).split(",") if m.strip()]
    for name in names:
        if name not in METHODS:
            raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    if not names:
        raise ValueError("no method given")
    return names


#: ReasonConfig fields added after runs were written, with the value those runs used
_LATER_DEFAULTS = {"step_delimiter": None}


@dataclass(frozen=True)
class ReasonConfig:
    """Settings of one run (all methods).

    Attributes:
        chunk: prompts per chunk (25 in App. B.10).
        num_draft_steps: gamma.
        max_new_tokens: thinking budget per prompt, target tokens.
        max_step_tokens: token cap per step (None: the task rule's).
        step_delimiter: step boundary for every task, a name of `steps.DELIMITERS`
            ("blank-line", "newline"); None: each task's rule (`steps.rule_for_task`).
        repetition_penalty: greedy repetition penalty (1.2 in App. B.10).
        token_spec: n-gram token-level speculation inside the target's steps.
        lr, beta, epochs, batch_size, clip: `DraftUpdater` settings.
    """

    chunk: int = 25
    num_draft_steps: int = 3
    max_new_tokens: int = 256
    max_step_tokens: int | None = None
    step_delimiter: str | None = None
    repetition_penalty: float = 1.0
    token_spec: bool = False
    lr: float = 5e-7
    beta: float = 0.1
    epochs: int = 3
    batch_size: int = 16
    clip: float = 1.0

    def __post_init__(self) -> None:
        if int(self.chunk) < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")
        self.lookahead("arith")     # validates the LR settings

    def lookahead(self, task: str) -> LookaheadConfig:
        rule = rule_for_task(task, self.max_step_tokens, self.step_delimiter)
        return LookaheadConfig(self.num_draft_steps, self.max_new_tokens, rule, self.repetition_penalty,
                               self.token_spec)


class ReasonRunner:
    """Serve ``items`` with each method, resumably.

    Args:
        target, draft: `LoadedModel` (model + tokenizer); the draft is copied for
            methods that update it.
        items: the task stream (`tasks.TaskItem`), in order.
        out: results folder.
        config: `ReasonConfig`.
        judge: the LR judge (`judge` module); required by the LR methods.
        scorer: ``scorer(item, text) -> float | None`` (default `tasks.score`).

    Raises:
        ValueError: empty stream.
    """

    def __init__(self, target, draft, items: list[TaskItem], out: str | os.PathLike, config: ReasonConfig, *,
                 judge=None, scorer: Callable = score):
        if not items:
            raise ValueError("empty task stream")
        self.target, self.draft, self.items = target, draft, list(items)
        self.out, self.config, self.judge, self.scorer = Path(out), config, judge, scorer

    def _participant(self, loaded, item: TaskItem) -> Participant:
        from specloop.realmodels.decoder import eos_ids_of
        text = format_prompt(loaded.tokenizer, item.text)
        ids = list(loaded.tokenizer.encode(text, add_special_tokens=False))
        return Participant(loaded.model, loaded.tokenizer, ids, eos_ids_of(loaded.model, loaded.tokenizer))

    def _stream_hash(self) -> str:
        rows = [[i.task, i.id, i.text, i.answer] for i in self.items]
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()

    def _load_state(self, folder: Path, method: str, updater) -> dict:
        fresh = {"method": method, "config": asdict(self.config), "stream_hash": self._stream_hash(),
                 "judge": getattr(self.judge, "name", None) if method not in ("target", "draft") else None,
                 "prompts_done": 0, "updates": [], "updater": None}
        path = folder / "state.pt"
        if not path.is_file():
            return fresh
        state = load_checkpoint(path)
        if isinstance(state.get("config"), dict):     # settings added later take their defaults
            state["config"] = {**_LATER_DEFAULTS, **state["config"]}
        if any(state.get(k) != fresh[k] for k in ("method", "config", "stream_hash", "judge")):
            raise ValueError(f"{path} was written with other settings or another task stream; "
                             "use another --out folder or delete it")
        if updater is not None and state.get("updater") is not None:
            updater.load_state_dict(state["updater"])
        return state

    def run_method(self, method: str, *, stop_after: int | None = None,
                   progress: Callable[[int], None] | None = None) -> dict:
        """Serve the stream with one method, resuming from its folder.

        Args:
            method: a name of `METHODS`.
            stop_after: stop once this many prompts are done in total (a simulated kill).
            progress: called with 1 after each prompt.

        Returns:
            `summarise_records` of the method's records.

        Raises:
            ValueError: unknown method, LR without a judge, mismatching saved state.
        """
        method = resolve_methods(method)[0]
        if method not in ("target", "draft") and self.judge is None:
            raise ValueError(f"method {method!r} needs a judge")
        folder = self.out / method
        folder.mkdir(parents=True, exist_ok=True)
        draft = self.draft
        updater = None
        if method in _OBJECTIVE:
            model = copy.deepcopy(self.draft.model)
            draft = dataclasses.replace(self.draft, model=model)
            updater = DraftUpdater(model, _OBJECTIVE[method], lr=self.config.lr, beta=self.config.beta,
                                   epochs=self.config.epochs, batch_size=self.config.batch_size, clip=self.config.clip)
        state = self._load_state(folder, method, updater)
        records_path = folder / "records.jsonl"
        _keep_records(records_path, state["prompts_done"])
        limit = len(self.items) if stop_after is None else min(len(self.items), int(stop_after))
        for index in range(state["prompts_done"], limit):
            record, result = self._serve(method, draft, index)
            with open(records_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
            state["prompts_done"] = index + 1
            if updater is not None:
                updater.add(result.feedback)
                if (index + 1) % self.config.chunk == 0:
                    state["updates"].append({"chunk": index // self.config.chunk, **updater.update()})
                state["updater"] = updater.state_dict()
            save_checkpoint(folder / "state.pt", state)
            if progress is not None:
                progress(1)
        return summarise_records(read_records(records_path), self.config.chunk, state.get("updates", []),
                                 label=_LABELS[method])

    def _serve(self, method: str, draft, index: int):
        item = self.items[index]
        lookahead = self.config.lookahead(item.task)
        tgt = self._participant(self.target, item)
        if method == "target":
            result = generate_alone(tgt, lookahead)
        elif method == "draft":
            result = generate_alone(self._participant(draft, item), lookahead, count_with=tgt)
        else:
            result = lookahead_generate(tgt, self._participant(draft, item), self.judge, lookahead)
        return _record(index, item, method, result, self.scorer(item, result.text)), result


def _record(index: int, item: TaskItem, method: str, result, correct) -> dict:
    rounds = result.rounds
    return {"index": index, "task": item.task, "id": item.id, "method": method, "text": result.text,
            "steps": len(result.steps), "target_tokens": result.target_tokens, "stop_reason": result.stop_reason,
            "rounds": len(rounds), "committed_per_round": [r.committed for r in rounds],
            "accepted_per_round": [r.accepted for r in rounds], "drafted_per_round": [r.drafted for r in rounds],
            "spec_tokens": sum(r.spec_tokens for r in rounds), "spec_rounds": sum(r.spec_rounds for r in rounds),
            "judge_scores": [[round(s, 6) for s in r.scores] for r in rounds],
            "judged": [list(p) for p in result.judged], "feedback_pairs": len(result.feedback),
            "correct": correct,
            "timing": {"seconds": result.seconds, "draft": sum(r.draft_time for r in rounds),
                       "target": sum(r.target_time for r in rounds), "judge": sum(r.judge_time for r in rounds)}}


def read_records(path: str | os.PathLike) -> list[dict]:
    """The complete JSON lines of a records file (a torn last line is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _keep_records(path: Path, done: int) -> None:
    """Rewrite the records file with the first ``done`` prompts' records only."""
    if not path.is_file():
        return
    kept = [r for r in read_records(path) if r["index"] < done]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")


def _block(records: list[dict]) -> dict:
    rounds = sum(r["rounds"] for r in records)
    committed = sum(sum(r["committed_per_round"]) for r in records)
    accepted = sum(sum(r["accepted_per_round"]) for r in records)
    tokens = sum(r["target_tokens"] for r in records)
    seconds = sum(r["timing"]["seconds"] for r in records)
    scored = [r["correct"] for r in records if r["correct"] is not None]
    spec_rounds = sum(r["spec_rounds"] for r in records)
    return {"prompts": len(records), "rounds": rounds, "tokens": tokens, "seconds": seconds,
            "avg_accepted_steps": committed / rounds if rounds else math.nan,
            "mean_accepted_draft_steps": accepted / rounds if rounds else math.nan,
            "mean_accepted_length": (sum(r["spec_tokens"] for r in records) / spec_rounds
                                     if spec_rounds else None),
            "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
            "accuracy": 100.0 * sum(scored) / len(scored) if scored else None}


def summarise_records(records: list[dict], chunk: int, updates: list[dict] | None = None, *,
                      label: str = "") -> dict:
    """Headline numbers of one method: `_block` fields over all prompts, per task
    (``tasks``), per chunk (``per_chunk``, with the chunk's update report), and
    ``update_seconds`` / ``tokens_per_s_with_training``. ``speedup`` is filled by
    `add_speedups` (it needs the target row)."""
    updates = list(updates or [])
    summary = {"label": label, **_block(records), "tasks": {}, "per_chunk": []}
    for task in sorted({r["task"] for r in records}):
        summary["tasks"][task] = _block([r for r in records if r["task"] == task])
    for c in range(math.ceil(len(records) / chunk) if records else 0):
        rows = [r for r in records if c * chunk <= r["index"] < (c + 1) * chunk]
        upd = next((u for u in updates if u["chunk"] == c), None)
        summary["per_chunk"].append({"chunk": c, **_block(rows), "update": upd})
    update_seconds = sum(u["seconds"] for u in updates)
    summary["update_seconds"] = update_seconds
    total = summary["seconds"] + update_seconds
    summary["tokens_per_s_with_training"] = summary["tokens"] / total if total > 0 else math.nan
    return summary


def add_speedups(summaries: dict[str, dict]) -> dict[str, dict]:
    """Fill ``speedup`` (overall, per task, per chunk) = tokens/s ÷ the target's
    (nan without a target row)."""
    base = summaries.get("target")
    for summary in summaries.values():
        def ratio(block, ref):
            return block["tokens_per_s"] / ref["tokens_per_s"] if ref and ref.get("tokens_per_s") else math.nan
        summary["speedup"] = ratio(summary, base)
        for task, block in summary["tasks"].items():
            block["speedup"] = ratio(block, base["tasks"].get(task) if base else None)
        for block in summary["per_chunk"]:
            ref = next((b for b in base["per_chunk"] if b["chunk"] == block["chunk"]), None) if base else None
            block["speedup"] = ratio(block, ref)
    return summaries
