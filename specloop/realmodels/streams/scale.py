"""The online-at-scale grid: protocol x method x seed x learning rate,
each cell a replay of one recorded stream (`specloop.realmodels.streams.replay`), run on a
local process pool or on Ray.

A *job* serves the whole recording (or its first ``prompts``) with one method through
`StreamRunner` (replay engine) into ``out/<protocol>/<job name>/<method>/`` --
resumable, so a killed grid rerun with the same arguments continues every unfinished
job and returns finished ones at once. The greedy baseline (no draft) runs once per
grid (its priced tokens/s is the denominator of every speedup; it does not depend on
the protocol). Jobs never share state, so any backend gives the same records:

* ``"serial"``: in this process, in order;
* ``"process"``: `concurrent.futures.ProcessPoolExecutor` with ``workers`` processes
  (each loads the target once and uses ``threads`` torch threads);
* ``"ray"``: one Ray task per job (``ray.init(address=...)``: local by default, a
  cluster's address otherwise; ``pip install "specloop[distributed]"``).

Chunk sizes follow OnlineSpec App. B (`PAPER_CHUNKS`: 80 prompts for the Hydra family,
40 for EAGLE / EAGLE-3 / vanilla SD) unless a job sets its own.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["ScaleJob", "PAPER_CHUNKS", "paper_chunk", "plan_jobs", "run_job", "run_grid", "BACKENDS"]

BACKENDS = ("serial", "process", "ray")
#: prompts per chunk in OnlineSpec's experiments (App. B), by drafter family
PAPER_CHUNKS = {"hydra": 80, "medusa": 80, "eagle": 40, "eagle3": 40, "small-lm": 40}


def paper_chunk(method: str) -> int:
    """The paper's chunk size for a method's drafter (40 when the family is not listed)."""
    from specloop.realmodels.streams.runner import resolve_method
    return PAPER_CHUNKS.get(resolve_method(method).draft_kind, 40)


@dataclass(frozen=True)
class ScaleJob:
    """One cell of the grid.

    Attributes:
        protocol: protocol name (e.g. "off-domain", "paper"); its drafts folder is
            ``drafts`` (None = the draft cache / shipped copies).
        method: `specloop.realmodels.streams.runner.resolve_method` name.
        seed: the stream's seed (learner initialisation, replay sampling).
        lr: learner step size (None = the learner's default).
        chunk: prompts per chunk.
        drafts: `StreamRunner` ``drafts_dir``.
        online: further `OnlineConfig` fields (mode, epochs, batch_size, ...) as
            sorted (name, value) pairs (a job is hashable).
    """

    protocol: str
    method: str
    seed: int = 0
    lr: float | None = None
    chunk: int = 40
    drafts: str | None = None
    online: tuple = ()

    @property
    def name(self) -> str:
        """Folder name: method, then ``-lr<lr>`` and ``-s<seed>`` where they apply."""
        lr = "" if self.lr is None else f"-lr{self.lr:g}"
        return f"{self.method}{lr}-s{self.seed}"

    def folder(self, out: str | os.PathLike) -> Path:
        return Path(out) / self.protocol / self.name


def plan_jobs(protocols: dict[str, str | None], methods: Sequence[str], *, seeds: int = 1,
              lr_grid: dict[str, Sequence[float]] | None = None, chunk: int | None = None,
              online: dict | None = None, method_seeds: dict[str, int] | None = None,
              first_seed: int = 0) -> list[ScaleJob]:
    """The grid's jobs: every protocol x method; online methods get ``seeds`` seeds
    (first_seed..first_seed+seeds-1; a frozen draft's rounds do not depend on the seed, so it gets seed 0
    only) and, when ``lr_grid`` names them, one job per learning rate as well as
    their default-rate job; a method only ``lr_grid`` names gets its learning-rate
    jobs alone (seed 0).

    Args:
        protocols: protocol name -> drafts folder (None = shipped drafts).
        methods: method names. seeds: seeds per online method (>= 1).
        method_seeds: method name -> seeds for that method instead of ``seeds``
            (e.g. 3 seeds for the headline rows, 1 for the costly contenders).
        first_seed: the online methods' first seed (>= 0), so that more seeds can be
            added in a later run (seeds 1, 2 after a run of seed 0).
        lr_grid: method name -> learning rates to add.
        chunk: prompts per chunk for every job (None = `paper_chunk`).
        online: `OnlineConfig` fields shared by every job.

    Raises:
        ValueError: no protocol or method, seeds < 1, first_seed < 0, an unknown method, a
            non-positive learning rate or chunk, a learning-rate grid for a frozen draft.
    """
    from specloop.realmodels.streams.runner import BASELINE, resolve_method
    if not protocols or not methods:
        raise ValueError("the grid needs at least one protocol and one method")
    per_method = {resolve_method(k).name: int(v) for k, v in (method_seeds or {}).items()}
    if int(seeds) < 1 or any(v < 1 for v in per_method.values()):
        raise ValueError(f"seeds must be >= 1, got {seeds} and {method_seeds}")
    if int(first_seed) < 0:
        raise ValueError(f"first_seed must be >= 0, got {first_seed}")
    if chunk is not None and int(chunk) < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    grid = {resolve_method(k).name: [float(x) for x in v] for k, v in (lr_grid or {}).items()}
    if any(x <= 0 for v in grid.values() for x in v):
        raise ValueError(f"learning rates must be > 0, got {lr_grid}")
    frozen = [name for name in grid if resolve_method(name).learner is None]
    if frozen:
        raise ValueError(f"--lr-grid names {frozen[0]!r}, a frozen draft: it has no learning rate")
    listed = {resolve_method(m).name for m in methods}
    grid_only = [name for name in grid if name not in listed]      # their learning-rate jobs only
    jobs = []
    for protocol, drafts in protocols.items():
        for method in [*methods, *grid_only]:
            spec = resolve_method(method)
            if spec.name == BASELINE:
                continue
            size = int(chunk) if chunk is not None else paper_chunk(spec.name)
            base = ScaleJob(protocol, spec.name, 0, None, size, drafts, tuple(sorted((online or {}).items())))
            if spec.learner is None:
                jobs.append(base)
                continue
            if spec.name not in grid_only:
                jobs.extend(dataclasses.replace(base, seed=seed)
                            for seed in range(int(first_seed), int(first_seed) + per_method.get(spec.name, int(seeds))))
            jobs.extend(dataclasses.replace(base, lr=lr) for lr in grid.get(spec.name, ()))
    return jobs


def baseline_job(chunk: int = 40) -> ScaleJob:
    """The greedy baseline's job (protocol "baseline")."""
    from specloop.realmodels.streams.runner import BASELINE
    return ScaleJob("baseline", BASELINE, 0, None, int(chunk))


@dataclass(frozen=True)
class GridSettings:
    """What every job shares: the recording, its first ``prompts`` (None = all), the
    output root, the sub-stream step ``every`` (`recorded_items`), the chain length k, ``max_new_tokens`` (None = the recording's), the
    verify-cost JSON, torch threads per job, and optionally ``target_loader``
    ("package.module:function", called with the recording's dtype name) to build the
    target instead of `load_model` of the recording's target name; ``snapshot_chunks``:
    online jobs keep per-chunk parameter snapshots (`StreamRunner`); ``deadline``: the
    wall-clock time (`time.time()`) after which a job starts no further prompt and stops
    with its state written (``stopped_early`` in its summary; rerun to continue)."""

    recording: str
    out: str
    prompts: int | None = None
    every: int = 1
    num_draft_tokens: int = 4
    max_new_tokens: int | None = None
    cost_table: str | None = None
    threads: int = 1
    target_loader: str | None = None
    snapshot_chunks: bool = False
    deadline: float | None = None


_WORKER: dict = {}


def _worker_state(settings: GridSettings):
    """The recording, target, items and cost table, loaded once per process."""
    key = (settings.recording, settings.prompts, settings.every, settings.cost_table)
    if _WORKER.get("key") != key:
        from specloop.realmodels.streams.replay import load_verify_cost
        from specloop.realmodels.recording import open_recording, recorded_items
        recording = open_recording(settings.recording)
        dtype = recording.settings["dtype"]
        _WORKER.update(key=key, recording=recording, items=recorded_items(recording, settings.prompts, settings.every),
                       target=_load_target(settings.target_loader, recording.settings["target"], dtype),
                       cost=load_verify_cost(settings.cost_table, dtype))
    return _WORKER


def _load_target(loader: str | None, name: str, dtype: str):
    if loader is None:
        from specloop.realmodels.loading import load_model
        return load_model(name, dtype=dtype)
    import importlib
    module, _, function = loader.partition(":")
    return getattr(importlib.import_module(module), function)(dtype)


def run_job(job: ScaleJob, settings: GridSettings) -> dict:
    """Run (or resume, or just summarise) one job; returns its `StreamRunner`
    summary plus ``job`` (the job's fields) and ``folder``.

    Raises:
        ValueError / FileNotFoundError: as `StreamRunner.run_method`.
    """
    import torch

    from specloop.realmodels.streams.runner import StreamConfig, StreamRunner
    torch.set_num_threads(max(1, int(settings.threads)))
    state = _worker_state(settings)
    max_new = settings.max_new_tokens or int(state["recording"].settings["max_new_tokens"])
    online = {**dict(job.online), "lr": job.lr}
    config = StreamConfig(chunk=job.chunk, max_new_tokens=max_new, num_draft_tokens=settings.num_draft_tokens,
                          online=online, seed=job.seed)
    folder = job.folder(settings.out)
    runner = StreamRunner(state["target"], [list(i.ids) for i in state["items"]], folder, config,
                          drafts_dir=job.drafts, replay=state["recording"], verify_cost=state["cost"],
                          replay_indices=[i.index for i in state["items"]], snapshot_chunks=settings.snapshot_chunks)
    summary = runner.run_method(job.method, deadline=settings.deadline)
    return {**summary, "job": dataclasses.asdict(job), "folder": str(folder / job.method)}


def run_grid(jobs: Sequence[ScaleJob], settings: GridSettings, *, backend: str = "process", workers: int = 2,
             address: str | None = None, on_done: Callable[[ScaleJob, dict | Exception], None] | None = None
             ) -> dict[ScaleJob, dict | Exception]:
    """Run every job (module docstring); a job that fails maps to its exception.

    Args:
        jobs: `plan_jobs` (+ `baseline_job`). settings: `GridSettings`.
        backend: "serial", "process" or "ray". workers: processes for "process".
        address: Ray cluster address (None = a local Ray).
        on_done: called with each job and its result as it finishes.

    Raises:
        ValueError: unknown backend, workers < 1. ImportError: "ray" without Ray.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: dict = {}

    def done(job, value):
        results[job] = value
        if on_done is not None:
            on_done(job, value)

    if backend == "serial":
        for job in jobs:
            done(job, _safe(job, settings))
    elif backend == "process":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        context = multiprocessing.get_context("spawn")             # no forked torch / OpenMP state
        with ProcessPoolExecutor(max_workers=int(workers), mp_context=context) as pool:
            futures = {pool.submit(_safe, job, settings): job for job in jobs}
            for future in as_completed(futures):
                done(futures[future], future.result())
    else:
        _run_ray(jobs, settings, address, done)
    return {job: results[job] for job in jobs}


def _safe(job: ScaleJob, settings: GridSettings):
    try:
        return run_job(job, settings)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        return exc


def _run_ray(jobs, settings: GridSettings, address: str | None, done) -> None:
    try:
        import ray
    except ImportError as exc:
        raise ImportError('--backend ray needs Ray: pip install "specloop[distributed]"') from exc
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=max(1, int(settings.threads)))(_safe)
    pending = {task.remote(job, settings): job for job in jobs}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            done(pending.pop(ref), ray.get(ref))
