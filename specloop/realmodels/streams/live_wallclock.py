"""Does learning from the verifier pay in wall-clock? The live decoder (not a replay)
serving one prompt stream with a frozen draft and with online variants whose updates are
priced by the clock: serial (decoding waits for every update), in the background on a
worker thread that trains a private copy of the draft (`online.workspace`), with the
trained weights published to the decoder every update or every N updates.

Rows (`WallclockRow`) run on the same prompts in the same order, interleaved per chunk
(each chunk's rows in a rotated order, so a load drift hits them alike); each online row
keeps its own learner across chunks. A background row's worker is waited for at the end
of its chunk and that wait is charged to the row (spread over the chunk's prompts in
proportion to their time), so no row's updates spill into another row's timing.

Threads: torch's intra-op thread count is one setting per process, applied to every
Python thread that runs torch work. ``threads=1`` with a background worker therefore
puts decoding on one core and updates on the other (the explicit split of a 2-core
machine); ``threads=2`` lets both use both (oversubscribed); the frozen and serial rows
decode with ``threads`` cores.

Per row: tokens/s (tokens over wall seconds of the row's prompts), tau, and for online
rows the paired per-prompt tokens/s ratio to the frozen row (`stats.ratio_estimate`:
geometric mean, Student-t interval on the log ratios) as ``wallclock_vs_frozen`` /
``wallclock_vs_frozen_ci``, the **update-cost fraction** ``update_cost_fraction`` (share
of the row's wall time the decoder spent in online work: sample collection, the round's
loss, queueing or running updates, publishing (`OnlineDrafter.online_seconds`), and the
chunk-end waits) and ``update_cpu_fraction`` (CPU seconds of the update
steps, worker included, over the process CPU seconds of the row). Every row's output
must equal the frozen row's (greedy decoding is lossless); ``outputs_equal`` says so.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["WallclockRow", "default_rows", "run_live_wallclock", "cost_model_check"]


@dataclass(frozen=True)
class WallclockRow:
    """One way of serving the stream.

    Attributes:
        name: row label (unique).
        method: None for the frozen draft, else an online method of
            `streams.runner.METHODS` (e.g. "opt-hydra").
        threads: torch intra-op threads while the row decodes (>= 1).
        background: updates on the worker thread (App. B.2).
        publish_every: background: learner steps between publications (>= 1).
    """

    name: str
    method: str | None
    threads: int
    background: bool = False
    publish_every: int = 1

    def __post_init__(self) -> None:
        if int(self.threads) < 1 or int(self.publish_every) < 1:
            raise ValueError(f"row {self.name!r}: threads and publish_every must be >= 1")
        if self.background and self.method is None:
            raise ValueError(f"row {self.name!r}: a frozen draft has no updates to run in the background")


def default_rows(method: str, cores: int = 2, publish_every: int = 4) -> list[WallclockRow]:
    """The rows of the live measurement for one online method on ``cores`` cores: frozen
    (all cores), serial, background split (1 decode thread + the worker), background
    oversubscribed (all cores for both), background publishing every ``publish_every``."""
    return [WallclockRow("frozen", None, cores),
            WallclockRow("serial", method, cores),
            WallclockRow("background-split", method, 1, background=True),
            WallclockRow(f"background-{cores}threads", method, cores, background=True),
            WallclockRow(f"background-split-publish{publish_every}", method, 1, background=True,
                         publish_every=publish_every)]


@dataclass
class _State:
    row: WallclockRow
    drafter: object
    adapter: object | None
    prompts: list[dict] = field(default_factory=list)


def _build(row: WallclockRow, make_drafter: Callable, online: dict, seed: int) -> _State:
    from specloop.realmodels.streams.runner import online_drafter, resolve_method
    if row.method is None:
        return _State(row, make_drafter(None), None)
    spec = resolve_method(row.method)
    fields = {**online, "background": row.background, "publish_every": row.publish_every}
    drafter, adapter = online_drafter(make_drafter(spec.drafter), spec, fields, seed)
    return _State(row, drafter, adapter)


def _serve_chunk(state: _State, target, chunk: Sequence[tuple[int, list[int]]], max_new_tokens: int,
                 k: int, seed: int) -> None:
    import torch

    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.policy import FixedDraftPolicy
    torch.set_num_threads(state.row.threads)
    rows = []
    for index, ids in chunk:
        before = _update_counters(state.adapter)
        online0 = getattr(state.drafter, "online_seconds", 0.0)
        t0, cpu0 = time.perf_counter(), time.process_time()
        decoder = SpeculativeDecoder(target, state.drafter, policy=FixedDraftPolicy(k), seed=seed + index)
        result = decoder.generate(ids, max_new_tokens, stream_index=index)
        wall = time.perf_counter() - t0
        online = getattr(state.drafter, "online_seconds", 0.0) - online0
        done = _update_counters(state.adapter, before)
        rows.append({"index": index, "tokens": len(result.new_tokens), "rounds": len(result.trace),
                     "wall_s": wall, "online_s": online, "cpu_s": time.process_time() - cpu0, "wait_s": 0.0,
                     **done, "output": list(result.new_tokens)})
    if state.adapter is not None:                       # the worker's backlog belongs to this row
        before = _update_counters(state.adapter)
        t0, cpu0 = time.perf_counter(), time.process_time()
        state.adapter.wait()
        waited, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        done = _update_counters(state.adapter, before)
        total = sum(r["wall_s"] for r in rows) or 1.0
        for r in rows:
            share = r["wall_s"] / total
            for key, value in (("wall_s", waited), ("online_s", waited), ("wait_s", waited), ("cpu_s", cpu),
                               *done.items()):
                r[key] += value * share
    state.prompts.extend(rows)


def _update_counters(adapter, before: dict | None = None) -> dict:
    """The adapter's update counters (``update_cpu_s``: CPU seconds of the update steps,
    ``update_s``: their wall seconds, ``steps``: learner steps), or their growth since
    ``before``; zeros for a frozen row."""
    now = ({"update_cpu_s": 0.0, "update_s": 0.0, "steps": 0.0} if adapter is None else
           {"update_cpu_s": adapter.train_cpu_seconds, "update_s": adapter.train_seconds,
            "steps": float(adapter.num_steps)})
    return now if before is None else {key: now[key] - before[key] for key in now}


def run_live_wallclock(target, prompts: Sequence[list[int]], rows: Sequence[WallclockRow], *,
                       make_drafter: Callable[[str | None], object], chunk: int = 10, max_new_tokens: int = 128,
                       num_draft_tokens: int = 4, online: dict | None = None, seed: int = 0,
                       progress: Callable[[int], None] | None = None, state_dir=None,
                       deadline: float | None = None) -> dict:
    """Serve ``prompts`` with every row, interleaved per chunk (module docstring).

    Args:
        target: the `LoadedModel` target. prompts: token ids per prompt, in stream order.
        rows: the rows; exactly one frozen row (``method`` None), the pairing reference.
        make_drafter: drafter kind (a method's drafter, or None for the frozen row's) ->
            a fresh drafter; the frozen row's draft must be the online rows' start.
        chunk: prompts per chunk. online: further `OnlineConfig` fields of the online rows.
        progress: called with the number of prompts a row served, after each chunk of it.
        state_dir: a folder to resume from: after every chunk (all rows) the rows'
            per-prompt measurements and learner states are written there, and a later
            call with the same settings continues after the last finished chunk.
        deadline: wall-clock time (`time.time()`) after which no further chunk starts
            (``complete`` False in the result; call again to continue).

    Returns:
        ``{"rows": {name: summary}, "prompts": n, "outputs_equal": bool, "complete": bool}``; each summary
        has ``tokens_per_s``, ``tau``, ``threads``, ``background``, ``publish_every``,
        ``update_cost_fraction``, ``update_cpu_fraction``, ``rounds``, ``steps``, ``per_prompt``
        (index, tokens, rounds, wall_s, online_s, cpu_s, wait_s: the prompt's share of the
        chunk-end wait, update_s / update_cpu_s / steps: wall and CPU seconds of the update
        steps and their number, while it ran or in its share of the wait) and, for online rows,
        ``wallclock_vs_frozen``, ``wallclock_vs_frozen_ci``, ``n``, ``publications``,
        ``update_seconds``.

    Raises:
        ValueError: not exactly one frozen row, repeated names, chunk < 1, no prompts.
    """
    frozen = [r for r in rows if r.method is None]
    if len(frozen) != 1 or len({r.name for r in rows}) != len(rows) or int(chunk) < 1 or not prompts:
        raise ValueError("need prompts, chunk >= 1, unique row names and exactly one frozen row")
    states = [_build(r, make_drafter, dict(online or {}), seed) for r in rows]
    indexed = list(enumerate([list(map(int, p)) for p in prompts]))
    settings = {"rows": [r.__dict__ for r in rows], "chunk": int(chunk), "max_new_tokens": int(max_new_tokens),
                "k": int(num_draft_tokens), "online": dict(online or {}), "seed": int(seed),
                "prompts_sha256": _digest(indexed)}
    start_chunk = _resume(state_dir, settings, states)
    starts = list(range(0, len(indexed), int(chunk)))
    try:
        for c in range(start_chunk, len(starts)):
            if deadline is not None and time.time() >= deadline:
                break
            part = indexed[starts[c]:starts[c] + int(chunk)]
            for state in states[c % len(states):] + states[:c % len(states)]:
                _serve_chunk(state, target, part, max_new_tokens, num_draft_tokens, seed)
                if progress is not None:
                    progress(len(part))
            _save(state_dir, settings, states, c + 1)
    finally:
        for state in states:
            if state.adapter is not None:
                state.adapter.close()
    out = _summaries(states, frozen[0].name)
    out["complete"] = out["prompts"] == len(indexed)
    return out


def _digest(indexed) -> str:
    import hashlib
    import json
    return hashlib.sha256(json.dumps(indexed).encode()).hexdigest()


def _save(state_dir, settings: dict, states: list[_State], chunks_done: int) -> None:
    """Write the measurements so far and each online row's learner state (atomic files)."""
    if state_dir is None:
        return
    from pathlib import Path

    from specloop.realmodels.online import save_checkpoint
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for i, state in enumerate(states):
        if state.adapter is not None:
            save_checkpoint(folder / f"row-{i}.pt", state.adapter.state_dict())
    save_checkpoint(folder / "progress.pt", {"settings": settings, "chunks_done": chunks_done,
                                             "prompts": [s.prompts for s in states]})


def _resume(state_dir, settings: dict, states: list[_State]) -> int:
    """Restore a saved run's measurements and learner states; returns the next chunk.

    Raises:
        ValueError: the folder holds a run with other settings or prompts.
    """
    if state_dir is None:
        return 0
    from pathlib import Path

    from specloop.realmodels.online import load_checkpoint
    path = Path(state_dir) / "progress.pt"
    if not path.is_file():
        return 0
    saved = load_checkpoint(path)
    if saved["settings"] != settings:
        raise ValueError(f"{state_dir} holds a run with other rows, settings or prompts; use another folder")
    for i, (state, prompts) in enumerate(zip(states, saved["prompts"])):
        state.prompts = list(prompts)
        if state.adapter is not None:
            state.adapter.load_state_dict(load_checkpoint(Path(state_dir) / f"row-{i}.pt"))
    return int(saved["chunks_done"])


def _summaries(states: list[_State], frozen_name: str) -> dict:
    from specloop.stats import ratio_estimate
    by_name = {s.row.name: s for s in states}
    reference = {p["index"]: p for p in by_name[frozen_name].prompts}
    out, equal = {}, True
    for state in states:
        ps = state.prompts
        wall = sum(p["wall_s"] for p in ps)
        row = {"threads": state.row.threads, "background": state.row.background,
               "publish_every": state.row.publish_every, "method": state.row.method,
               "tokens_per_s": sum(p["tokens"] for p in ps) / wall if wall > 0 else math.nan,
               "tau": sum(p["tokens"] for p in ps) / max(1, sum(p["rounds"] for p in ps)),
               "update_cost_fraction": sum(p["online_s"] for p in ps) / wall if wall > 0 else math.nan,
               "update_cpu_fraction": (sum(p["update_cpu_s"] for p in ps) / sum(p["cpu_s"] for p in ps)
                                       if sum(p["cpu_s"] for p in ps) > 0 else math.nan),
               "rounds": sum(p["rounds"] for p in ps), "steps": sum(p.get("steps", 0.0) for p in ps),
               "per_prompt": [{k: v for k, v in p.items() if k != "output"} for p in ps]}
        equal = equal and all(p["output"] == reference[p["index"]]["output"] for p in ps)
        if state.adapter is not None:
            ratios = [(p["tokens"] / p["wall_s"]) / (reference[p["index"]]["tokens"] / reference[p["index"]]["wall_s"])
                      for p in ps]
            est = ratio_estimate(ratios, "tokens/s of the row / of the frozen draft, per prompt") if ratios else None
            row.update(wallclock_vs_frozen=est.effect if est else math.nan,
                       wallclock_vs_frozen_ci=list(est.interval) if est else [math.nan, math.nan],
                       n=len(ratios), publications=int(state.adapter.publications),
                       update_seconds=float(state.adapter.train_seconds))
        out[state.row.name] = row
    return {"rows": out, "prompts": len(by_name[frozen_name].prompts), "outputs_equal": bool(equal)}


def frozen_row(result: dict) -> tuple[str, dict]:
    """The pairing reference of a live result: ``(name, row)`` of its one row without a
    method (`run_live_wallclock`'s rows, or a committed JSON's).

    Raises:
        ValueError: no frozen row, or more than one.
    """
    frozen = [(name, row) for name, row in result["rows"].items() if row.get("method") is None]
    if len(frozen) != 1:
        raise ValueError(f"a live result needs exactly one frozen row, not {len(frozen)}")
    return frozen[0]


def cost_model_check(result: dict, chunk: int) -> dict:
    """`theory.online_cost` against the live rows: each online row's speedup over the
    frozen row predicted from its measured parts, beside the measured one.

    Parts (seconds, totals over the row's prompts): the frozen row's round v + d =
    wall / rounds; per online row the rounds R, the wall W, the online work O
    (``online_s``), the chunk-end waits A (``wait_s``), the update steps' wall U
    (``update_s``) over N steps, and the tau gain g = tau / tau_frozen - 1.

    * serial: the decoder-side online work per round besides the steps c = (O - U) / R;
      predicted `serial_speedup` with v + d from the frozen row and c + U / R seconds of
      online work a round, (1 + g) (v + d) / (v + d + c + U / R); the check is whether
      the row's decoding (W - O) / R equals the frozen row's round.
    * background: the decoder's round beside the worker sigma = (W - A) / (R (v + d))
      (its own online work included) and the worker's u = U / N; predicted
      `queued_background_speedup`, per chunk: each chunk takes the larger of the
      decoder's and the worker's seconds, so the prediction is the frozen wall over
      the sum of those maxima (equal to (1 + g) / sigma when the worker keeps up).

    Args:
        result: `run_live_wallclock`'s output (rows with ``per_prompt``). chunk: its prompts per chunk.

    Returns:
        ``{row name: {"placement", "predicted", "measured", "relative_error", inputs...}}``;
        ``measured`` is the ratio of total tokens/s (the frozen row's wall over the row's,
        tokens being equal), the aggregate the model speaks of.

    Raises:
        ValueError: no frozen row, a row without per-prompt parts (``wait_s``,
            ``update_s``, ``steps``), or chunk < 1.
    """
    from specloop.theory.online_cost import queued_background_speedup, serial_speedup
    if int(chunk) < 1:
        raise ValueError("cost_model_check needs chunk >= 1")
    rows = result["rows"]
    frozen_name, ref = frozen_row(result)
    wall_frozen = sum(p["wall_s"] for p in ref["per_prompt"])
    round_frozen = wall_frozen / max(1, sum(p["rounds"] for p in ref["per_prompt"]))
    out = {}
    for name, row in rows.items():
        if name == frozen_name:
            continue
        ps = row["per_prompt"]
        if not ps or any(k not in ps[0] for k in ("wait_s", "update_s", "steps")):
            raise ValueError(f"row {name!r} lacks the per-prompt wait_s / update_s / steps parts")
        total = {k: sum(p[k] for p in ps) for k in ("rounds", "wall_s", "online_s", "wait_s", "update_s", "steps")}
        gain = row["tau"] / ref["tau"] - 1
        per_update = total["update_s"] / max(1.0, total["steps"])
        measured = wall_frozen / total["wall_s"]
        if not row["background"]:
            extra = (total["online_s"] - total["update_s"]) / total["rounds"]
            predicted = serial_speedup(round_frozen, 0.0, max(0.0, extra) + total["update_s"] / total["rounds"], gain)
            parts = {"placement": "serial", "decode_seconds_per_round": (total["wall_s"] - total["online_s"])
                     / total["rounds"], "decoder_online_seconds_per_round": extra}
        else:
            decoder = total["wall_s"] - total["wait_s"]
            sigma = max(1.0, decoder / (total["rounds"] * round_frozen))
            by_chunk: dict[int, list[float]] = {}
            for p in ps:
                c = by_chunk.setdefault(int(p["index"]) // int(chunk), [0.0, 0.0])
                c[0] += p["wall_s"] - p["wait_s"]
                c[1] += p["update_s"]
            predicted = wall_frozen / sum(max(d, u) for d, u in by_chunk.values())
            parts = {"placement": "background, queued", "slowdown": sigma,
                     "whole_stream_formula": queued_background_speedup(
                         round_frozen, 0.0, total["update_s"] / total["rounds"], sigma, gain),
                     "wait_fraction": total["wait_s"] / total["wall_s"]}
        out[name] = {**parts, "predicted": predicted, "measured": measured,
                     "relative_error": predicted / measured - 1, "gain": gain,
                     "verify_plus_draft_seconds_per_round": round_frozen, "update_seconds_per_step": per_update,
                     "steps_per_round": total["steps"] / total["rounds"]}
    return out
