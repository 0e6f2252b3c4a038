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
deterministic), ``<method>/timing.jsonl`` (batch-1 timings of lockstep runs, below),
``<method>/pairs.jsonl`` (an updating method's feedback pairs per prompt, token ids
and texts) and ``<method>/state.pt`` (settings, prompts done, per-chunk update
reports: a few kB), written atomically after every prompt or lockstep group. A killed
run restarted with the same arguments drops records of unfinished prompts and
continues: its records equal an uninterrupted run's (greedy decoding). An updating
method's draft is never saved (a 135M draft with its AdamW moments is about 1.6 GB):
it is rebuilt on resume by replaying the recorded pairs through the same chunk-end
updates from the initial draft (deterministic on a CPU), and each replayed update's
first-epoch loss is checked against the recorded one (``replay_max_rel_diff`` in
the summary). So the small files alone -- committed, or copied to another machine --
continue a long run. Settings or stream changes are refused.

Quality in lockstep (``batch_prompts`` > 1): groups of up to ``GROUP_WIDTHS`` x
that many consecutive prompts of one chunk are served with ``batch_prompts`` of them
in flight at a time (`lockstep.run_many` with a width: one batched forward per kind
of work across them, a finished prompt's slot refilled at once; the draft is the
same for all of them, since updates happen at chunk ends only); records and state
are written after each group. Their records carry ``"batch"`` > 1 and no usable timing; the
prompts of ``timing_prompts`` among them are served again alone, with the same draft,
into ``timing.jsonl`` (seconds, tokens and ``same_as_lockstep``: whether its text,
steps, judged pairs and score equal the lockstep record's, the check that batching
changed nothing).

Speed: ``tokens_per_s`` = committed target tokens / decoding seconds (draft + target
+ judge; chunk-end updates excluded, reported as ``update_seconds`` and in
``tokens_per_s_with_training``) over the batch-1 prompts (``timed_prompts``);
``speedup`` = that ÷ the target row's, and `add_speedups` adds the paired
``speedup_paired`` (geometric mean of per-prompt tokens/s ratios over the prompts
timed in both rows, Student-t interval on the log ratios). LR is lossy: ``accuracy``
(arith / GSM8K exact answer, HumanEval pass@1; MT-bench none) comes with it, with its
Wilson interval, and ``finished`` counts answers that ended (EOS) within the budget.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from specloop.realmodels.online import load_checkpoint, save_checkpoint
from specloop.realmodels.reasoning.dpo import DraftUpdater
from specloop.realmodels.reasoning.lockstep import run_many, run_one
from specloop.realmodels.reasoning.lookahead import (FeedbackPair, LookaheadConfig, Participant, alone_process,
                                                     lookahead_process)
from specloop.realmodels.reasoning.steps import rule_for_task
from specloop.realmodels.reasoning.tasks import TaskItem, format_prompt, score

__all__ = ["METHODS", "ReasonConfig", "ReasonRunner", "summarise_records", "resolve_methods", "timed_rows",
           "fitting_group"]

METHODS = ("target", "draft", "lr", "osd-lr", "online-lr")
#: the largest relative difference of a replayed update's loss from the recorded one
REPLAY_TOLERANCE = 1e-3
#: what a prompt served alone must repeat of its lockstep record (texts, steps, judgements)
_SAME_KEYS = ("text", "steps", "committed_per_round", "accepted_per_round", "judged", "correct")
#: a lockstep group holds this many times batch_prompts prompts (state is saved per group)
GROUP_WIDTHS = 3
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


#: ReasonConfig fields that only the updating methods (osd-lr, online-lr) read
_UPDATE_SETTINGS = ("lr", "beta", "epochs", "batch_size", "clip")
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
                 "prompts_done": 0, "updates": []}
        path = folder / "state.pt"
        if not path.is_file():
            return fresh
        state = load_checkpoint(path)
        if isinstance(state.get("config"), dict):     # settings added later take their defaults
            state["config"] = {**_LATER_DEFAULTS, **state["config"]}
        if method not in _OBJECTIVE:    # a frozen draft's records do not depend on the update settings
            state["config"] = {**state["config"], **{k: fresh["config"][k] for k in _UPDATE_SETTINGS}}
        if any(state.get(k) != fresh[k] for k in ("method", "config", "stream_hash", "judge")):
            raise ValueError(f"{path} was written with other settings or another task stream; "
                             "use another --out folder or delete it")
        if updater is not None and state.get("updater") is not None:
            # written before pairs.jsonl existed: its pairs start later, so keep saving the draft
            updater.load_state_dict(state["updater"])
            state["saves_draft"] = True
        elif updater is not None and state["prompts_done"]:
            state["replay_max_rel_diff"] = self._replay(folder, updater, state)
        return state

    def _replay(self, folder: Path, updater, state: dict) -> float:
        """Rebuild ``updater``'s draft after ``state["prompts_done"]`` prompts from
        ``pairs.jsonl``; returns the largest relative difference between a replayed
        update's first-epoch loss and the recorded one.

        Raises:
            ValueError: a prompt's pairs are missing, or a replayed update saw another
                number of pairs or a first-epoch loss off by more than `REPLAY_TOLERANCE`
                (relative) from the recorded one: the rebuilt draft would not be the
                one that served the recorded prompts.
        """
        rows = {r["index"]: r["pairs"] for r in read_records(folder / "pairs.jsonl")}
        recorded = {u["chunk"]: u for u in state["updates"]}
        worst = 0.0
        for index in range(state["prompts_done"]):
            if index not in rows:
                raise ValueError(f"{folder / 'pairs.jsonl'} has no pairs of prompt {index}: the draft cannot be "
                                 "rebuilt; delete the method's folder to start it again")
            updater.add([FeedbackPair(tuple(x), tuple(c), tuple(r), ct, rt) for x, c, r, ct, rt in rows[index]])
            if (index + 1) % self.config.chunk == 0:
                report, old = updater.update(), recorded.get(index // self.config.chunk)
                if old is None or report["pairs"] != old["pairs"]:
                    raise ValueError(f"replaying {folder}: chunk {index // self.config.chunk} updated on "
                                     f"{report['pairs']} pairs, the record says {None if old is None else old['pairs']}")
                if report["pairs"] and math.isfinite(old["loss_first"]):
                    worst = max(worst, abs(report["loss_first"] - old["loss_first"])
                                / max(abs(old["loss_first"]), 1e-12))
                if worst > REPLAY_TOLERANCE:
                    raise ValueError(f"replaying {folder}: chunk {index // self.config.chunk}'s update loss differs "
                                     f"from the recorded one by {worst:.2e} (relative), above {REPLAY_TOLERANCE:g}: "
                                     "another machine, thread count or library version; resume where it ran")
        return worst

    def run_method(self, method: str, *, stop_after: int | None = None,
                   progress: Callable[[int], None] | None = None, batch_prompts: int = 1,
                   timing_prompts=None, deadline: float | None = None) -> dict:
        """Serve the stream with one method, resuming from its folder.

        Args:
            method: a name of `METHODS`.
            stop_after: stop once this many prompts are done in total (a simulated kill).
            progress: called with the number of prompts after each prompt or group.
            batch_prompts: prompts served in lockstep (>= 1; 1: each alone, timed).
            timing_prompts: stream indices served again alone when served in lockstep
                (None: none).
            deadline: ``time.time()`` by which the call should have stopped, with its
                state saved (the summary has fewer ``prompts``): a group starts only
                when it is predicted to end by then (`fitting_group`, from this
                call's seconds a prompt; the first group of a lockstep call is one
                wave of ``batch_prompts`` prompts, to measure them).

        Returns:
            `summarise_records` of the method's records.

        Raises:
            ValueError: unknown method, LR without a judge, mismatching saved state,
                batch_prompts < 1, lockstep with token-level speculation.
        """
        method = resolve_methods(method)[0]
        if method not in ("target", "draft") and self.judge is None:
            raise ValueError(f"method {method!r} needs a judge")
        if int(batch_prompts) < 1:
            raise ValueError(f"batch_prompts must be >= 1, got {batch_prompts}")
        if batch_prompts > 1 and self.config.token_spec:
            raise ValueError("token-level speculation decodes each step alone: use batch_prompts 1 with it")
        timed = set() if timing_prompts is None else {int(i) for i in timing_prompts}
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
        records_path, timing_path = folder / "records.jsonl", folder / "timing.jsonl"
        for path in (records_path, timing_path, folder / "pairs.jsonl"):
            _keep_records(path, state["prompts_done"])
        limit = len(self.items) if stop_after is None else min(len(self.items), int(stop_after))
        index = state["prompts_done"]
        started, served_here = time.time(), 0
        while index < limit:
            size = 1 if batch_prompts == 1 else GROUP_WIDTHS * int(batch_prompts)
            size = min(limit - index, size, (index // self.config.chunk + 1) * self.config.chunk - index)
            if deadline is not None:
                per_prompt = (time.time() - started) / served_here if served_here else None
                size = fitting_group(size, int(batch_prompts), per_prompt, deadline - time.time())
                if size < 1:
                    break
            end = index + size
            served = self._serve_group(method, draft, list(range(index, end)), int(batch_prompts))
            _append(records_path, [record for record, _ in served])
            _append(timing_path, [self._timing_row(method, draft, record) for record, _ in served
                                  if record["batch"] > 1 and record["index"] in timed])
            if updater is not None:
                _append(folder / "pairs.jsonl", [{"index": i, "pairs": [_pair_row(p) for p in result.feedback]}
                                                 for i, (_, result) in zip(range(index, end), served)])
                for i, (_, result) in zip(range(index, end), served):
                    updater.add(result.feedback)
                    if (i + 1) % self.config.chunk == 0:
                        state["updates"].append({"chunk": i // self.config.chunk, **updater.update()})
            state["prompts_done"] = index = end
            served_here += len(served)
            if updater is not None and state.get("saves_draft"):
                state["updater"] = updater.state_dict()
            save_checkpoint(folder / "state.pt", state)
            if progress is not None:
                progress(len(served))
        summary = summarise_records(read_records(records_path), self.config.chunk, state.get("updates", []),
                                    label=_LABELS[method], timing=read_records(timing_path))
        summary["replay_max_rel_diff"] = state.get("replay_max_rel_diff")
        return summary

    def _process(self, method: str, draft, index: int):
        item = self.items[index]
        lookahead = self.config.lookahead(item.task)
        tgt = self._participant(self.target, item)
        if method == "target":
            return alone_process(tgt, lookahead)
        if method == "draft":
            return alone_process(self._participant(draft, item), lookahead, count_with=tgt)
        return lookahead_process(tgt, self._participant(draft, item), self.judge, lookahead)

    def _serve_group(self, method: str, draft, indices: list[int], width: int = 1) -> list[tuple[dict, object]]:
        """(record, result) per prompt: alone for one prompt, else in lockstep, at most
        ``width`` in flight (a record's ``batch`` is that width)."""
        if len(indices) == 1:
            results = [run_one(self._process(method, draft, indices[0]), self.judge)]
        else:
            results = run_many([self._process(method, draft, i) for i in indices], self.judge, width=width)
        batch = 1 if len(indices) == 1 else min(width, len(indices))
        return [(_record(i, self.items[i], method, result, self.scorer(self.items[i], result.text), batch),
                 result) for i, result in zip(indices, results)]

    def _timing_row(self, method: str, draft, lockstep_record: dict) -> dict:
        """Serve one prompt of a lockstep group again alone: its batch-1 timing row."""
        (record, _), = self._serve_group(method, draft, [lockstep_record["index"]])
        keys = ("index", "task", "id", "method", "target_tokens", "rounds", "committed_per_round",
                "accepted_per_round", "drafted_per_round", "stop_reason", "timing")
        return {**{k: record[k] for k in keys}, "judged_pairs": len(record["judged"]),
                "same_as_lockstep": all(record[k] == lockstep_record[k] for k in _SAME_KEYS)}


def fitting_group(size: int, width: int, per_prompt: float | None, remaining: float) -> int:
    """How many prompts the next group may hold so that it ends within ``remaining``
    seconds: the largest n <= ``size`` whose predicted time fits, or 0 (stop).

    A lockstep wave of up to ``width`` prompts in flight takes about as long as a full
    one (one batched forward a step, bounded by its longest prompt), so n prompts are
    predicted to take ``per_prompt * max(n, width)`` seconds (``per_prompt``: seconds a
    prompt measured in this call, timing rows included). Without a measurement yet
    (``per_prompt`` None) the group is one wave, ``min(size, width)``, if any time is left.

    Args:
        size: prompts the group would hold without a deadline (>= 0).
        width: prompts in flight (``batch_prompts``, >= 1; 1 serves each prompt alone).
        per_prompt: seconds a prompt so far, or None.
        remaining: seconds to the deadline.

    Returns:
        int in [0, size].
    """
    if remaining <= 0 or size < 1:
        return 0
    width = max(1, int(width))
    if per_prompt is None:
        return min(size, width)
    if per_prompt * width > remaining:
        return 0
    return min(size, int(remaining // per_prompt))


def _pair_row(pair: FeedbackPair) -> list:
    return [list(pair.prompt_ids), list(pair.chosen_ids), list(pair.rejected_ids), pair.chosen_text,
            pair.rejected_text]


def _append(path: Path, rows: list[dict]) -> None:
    if rows:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rows))


def _record(index: int, item: TaskItem, method: str, result, correct, batch: int = 1) -> dict:
    rounds = result.rounds
    return {"index": index, "task": item.task, "id": item.id, "method": method, "batch": int(batch),
            "text": result.text,
            "steps": len(result.steps), "target_tokens": result.target_tokens, "stop_reason": result.stop_reason,
            "rounds": len(rounds), "committed_per_round": [r.committed for r in rounds],
            "accepted_per_round": [r.accepted for r in rounds], "drafted_per_round": [r.drafted for r in rounds],
            "spec_tokens": sum(r.spec_tokens for r in rounds), "spec_rounds": sum(r.spec_rounds for r in rounds),
            "judge_scores": [[round(s, 6) for s in r.scores] for r in rounds],
            "judged": [list(p) for p in result.judged], "feedback_pairs": len(result.feedback),
            "correct": correct,
            "timing": {"seconds": result.seconds, "draft": sum(r.draft_time for r in rounds),
                       "target": sum(r.target_time for r in rounds), "judge": sum(r.judge_time for r in rounds),
                       "commit": sum(r.commit_time for r in rounds)}}


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


def timed_rows(records: list[dict], timing: list[dict]) -> list[dict]:
    """The batch-1 rows of a method: records served alone plus the timing rows."""
    return [r for r in records if r.get("batch", 1) == 1] + list(timing)


def _block(records: list[dict], timing: list[dict] | None = None) -> dict:
    """Quality over ``records``; speed over their batch-1 rows and ``timing``."""
    rounds = sum(r["rounds"] for r in records)
    committed = sum(sum(r["committed_per_round"]) for r in records)
    accepted = sum(sum(r["accepted_per_round"]) for r in records)
    timed = timed_rows(records, timing or [])
    tokens = sum(r["target_tokens"] for r in timed)
    seconds = sum(r["timing"]["seconds"] for r in timed)
    scored = [r["correct"] for r in records if r["correct"] is not None]
    spec_rounds = sum(r["spec_rounds"] for r in records)
    return {"prompts": len(records), "rounds": rounds, "tokens": sum(r["target_tokens"] for r in records),
            "timed_prompts": len(timed), "timed_tokens": tokens, "seconds": seconds,
            "avg_accepted_steps": committed / rounds if rounds else math.nan,
            "mean_accepted_draft_steps": accepted / rounds if rounds else math.nan,
            "mean_accepted_length": (sum(r["spec_tokens"] for r in records) / spec_rounds
                                     if spec_rounds else None),
            "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
            "accuracy": 100.0 * sum(scored) / len(scored) if scored else None,
            "accuracy_ci": _wilson(sum(scored), len(scored)),
            "finished": sum(r["stop_reason"] == "eos" for r in records)}


def _wilson(successes: float, n: int, confidence: float = 0.95) -> list[float] | None:
    """95 % Wilson score interval of a proportion, in percent (None for n = 0)."""
    if n == 0:
        return None
    from scipy import stats
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [100.0 * (centre - half), 100.0 * (centre + half)]


def summarise_records(records: list[dict], chunk: int, updates: list[dict] | None = None, *,
                      label: str = "", timing: list[dict] | None = None) -> dict:
    """Headline numbers of one method: `_block` fields over all prompts, per task
    (``tasks``), per chunk (``per_chunk``, with the chunk's update report), and
    ``update_seconds`` / ``tokens_per_s_with_training`` (the timed rows' tokens over their
    seconds plus the updates' seconds times their share of all tokens); ``per_prompt_tokens_per_s``
    ({stream index: tokens/s} of the batch-1 rows) and ``lockstep_mismatches`` (timing
    rows that differ from their lockstep record). ``speedup`` is filled by
    `add_speedups` (it needs the target row)."""
    updates, timing = list(updates or []), list(timing or [])
    summary = {"label": label, **_block(records, timing), "tasks": {}, "per_chunk": []}
    for task in sorted({r["task"] for r in records}):
        summary["tasks"][task] = _block([r for r in records if r["task"] == task],
                                        [t for t in timing if t["task"] == task])
    for c in range(math.ceil(len(records) / chunk) if records else 0):
        rows = [r for r in records if c * chunk <= r["index"] < (c + 1) * chunk]
        upd = next((u for u in updates if u["chunk"] == c), None)
        summary["per_chunk"].append({"chunk": c, **_block(rows, [t for t in timing
                                                                 if c * chunk <= t["index"] < (c + 1) * chunk]),
                                     "update": upd})
    update_seconds = sum(u["seconds"] for u in updates)
    summary["update_seconds"] = update_seconds
    # the updates serve every prompt; charge the timed rows their share, by tokens
    share = summary["timed_tokens"] / summary["tokens"] if summary["tokens"] else 0.0
    total = summary["seconds"] + update_seconds * share
    summary["tokens_per_s_with_training"] = summary["timed_tokens"] / total if total > 0 else math.nan
    summary["per_prompt_tokens_per_s"] = {str(r["index"]): r["target_tokens"] / r["timing"]["seconds"]
                                          for r in timed_rows(records, timing) if r["timing"]["seconds"] > 0}
    summary["lockstep_mismatches"] = sum(not t["same_as_lockstep"] for t in timing)
    return summary


def add_speedups(summaries: dict[str, dict]) -> dict[str, dict]:
    """Fill ``speedup`` (overall, per task, per chunk) = tokens/s ÷ the target's
    (nan without a target row), and ``speedup_paired`` / ``speedup_paired_ci`` /
    ``speedup_paired_n``: the geometric mean of per-prompt tokens/s ratios to the
    target row over the prompts timed in both, with its 95 % Student-t interval
    (`specloop.stats.ratio_estimate`; None with fewer than 2 such prompts)."""
    from specloop.stats import ratio_estimate
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
        mine, ref = summary.get("per_prompt_tokens_per_s", {}), (base or {}).get("per_prompt_tokens_per_s", {})
        ratios = [mine[i] / ref[i] for i in sorted(set(mine) & set(ref), key=int) if mine[i] > 0 and ref[i] > 0]
        estimate = ratio_estimate(ratios, "per-prompt tokens/s ratio to the target") if len(ratios) >= 2 else None
        summary["speedup_paired"] = estimate.effect if estimate else None
        summary["speedup_paired_ci"] = list(estimate.interval) if estimate else None
        summary["speedup_paired_n"] = len(ratios)
    return summaries
