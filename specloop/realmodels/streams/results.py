"""A served prompt stream's result: the one JSON object of ``specloop stream
--json`` (OnlineSpec Table 1 rows per chunk), its plot, and `serve_stream`, which
serves a whole stream (greedy baseline first, then every method, resumably) and
returns that object.

Result keys: ``target``; ``methods`` maps each method name to label,
``mean_accepted_length`` (tau, tokens per round), ``speedup`` (tokens/s without
training time over the greedy baseline's), ``speedup_with_training``,
``tokens_per_s`` / ``tokens_per_s_with_training`` (tokens per second),
``update_seconds``, ``per_chunk`` (tau per chunk), ``per_chunk_tokens_per_s``,
``per_chunk_tokens_per_s_with_training``, ``per_domain`` (tau per dataset) and, for
an online method whose frozen draft ran too, ``vs_frozen`` (`vs_frozen`);
``failed`` (method -> why); ``baseline_tokens_per_s``,
``baseline_per_chunk_tokens_per_s``; ``stream`` (dataset of each prompt);
``config``; ``engine`` ("decoder", or "replay" for a replayed recording, whose
tokens/s price the target's verification from a measured cost table, see
`specloop.realmodels.streams.replay`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["vs_frozen", "stream_result", "plot_stream", "StreamRun", "serve_stream", "STREAM_ONLINE_DEFAULTS"]

# `StreamConfig.online` of ``specloop stream`` without online flags (its flag defaults)
STREAM_ONLINE_DEFAULTS = {"mode": "chunk", "lr": None, "batch_size": 4, "epochs": 2, "update_every": 1,
                          "precondition": "none", "background": False}


def vs_frozen(name: str, summaries: dict, domains: list[str]) -> dict | None:
    """Paired per-prompt gain of an online method over the frozen method with the
    same draft, overall and per dataset (`specloop.stats.paired_gain`),
    with ``frozen`` naming that method; None for a frozen method or when its frozen
    counterpart did not run. ``summaries``: method -> `StreamRunner.run_method`
    summary; ``domains``: dataset of each stream prompt."""
    from specloop.realmodels.streams.runner import frozen_method, resolve_method
    from specloop.stats import paired_gain
    spec = resolve_method(name)
    frozen = frozen_method(spec)
    if spec.learner is None or frozen not in summaries:
        return None
    a, b = summaries[frozen].get("prompts", []), summaries[name].get("prompts", [])
    per_domain = {d: paired_gain([p for p in a if domains[p["index"]] == d], [p for p in b if domains[p["index"]] == d])
                  for d in dict.fromkeys(domains)}
    return {"frozen": frozen, **paired_gain(a, b), "per_domain": per_domain}


def stream_result(summaries: dict, failures: dict, items: Sequence, config, *, target: str, datasets: str,
                  order: str, drafts: str | None = None, engine: str = "decoder",
                  recording: str | None = None, split: str = "heldout") -> dict:
    """The stream's result object (module docstring).

    Args:
        summaries: method -> `StreamRunner.run_method` summary; must hold the
            greedy baseline (`specloop.realmodels.streams.runner.BASELINE`).
        failures: method -> why it could not run.
        items: the stream's items (each with a ``dataset``), in order.
        config: the run's `StreamConfig`.
        engine: "decoder" or "replay"; recording: the replayed recording's folder.
        target, datasets, order, drafts, split: echoed in the result (``config`` holds
            datasets, split, order, drafts, the prompt count and the `StreamConfig` fields).

    Raises:
        KeyError: no baseline summary.
    """
    from specloop.realmodels.streams.runner import BASELINE, resolve_method
    from specloop.realmodels.streams.compare import domain_accepted_length
    domains = [i.dataset for i in items]
    base = summaries[BASELINE]
    base_tps = base["tokens_per_s"]
    methods = {}
    for name, s in summaries.items():
        if name == BASELINE:
            continue
        methods[name] = {
            "label": resolve_method(name).label,
            "mean_accepted_length": s["mean_accepted_length"],
            "speedup": s["tokens_per_s"] / base_tps,
            "speedup_with_training": s["tokens_per_s_with_training"] / base_tps,
            "tokens_per_s": s["tokens_per_s"], "tokens_per_s_with_training": s["tokens_per_s_with_training"],
            "update_seconds": s["update_seconds"],
            "per_chunk": [c["mean_accepted_length"] for c in s["chunks"]],
            "per_chunk_tokens_per_s": [c["tokens_per_s"] for c in s["chunks"]],
            "per_chunk_tokens_per_s_with_training": [c["tokens_per_s_with_training"] for c in s["chunks"]],
            "per_domain": domain_accepted_length(s.get("prompts", []), domains)}
        vs = vs_frozen(name, summaries, domains)
        if vs is not None:
            methods[name]["vs_frozen"] = vs
    return {"target": target, "engine": engine, "methods": methods, "failed": failures,
            "baseline_tokens_per_s": base_tps,
            "baseline_per_chunk_tokens_per_s": [c["tokens_per_s"] for c in base["chunks"]],
            "stream": domains,
            "config": {"datasets": datasets, "split": split, "order": order, "prompts": len(items),
                       "drafts": drafts, "recording": recording,
                       "chunk": config.chunk, "max_new_tokens": config.max_new_tokens,
                       "num_draft_tokens": config.num_draft_tokens, **config.online}}


def plot_stream(result: dict, path: str | Path) -> Path:
    """Two panels: mean accepted length and tokens/s per chunk, one line per method
    (online solid, frozen dashed; greedy baseline dotted on the tokens/s panel).
    Returns the PNG's path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from specloop.realmodels.streams.runner import resolve_method
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    for i, (name, m) in enumerate(result["methods"].items()):
        style = "-" if resolve_method(name).learner else "--"
        chunks = list(range(len(m["per_chunk"])))
        axes[0].plot(chunks, m["per_chunk"], style, marker="o", ms=4, color=f"C{i}", label=m["label"])
        axes[1].plot(chunks, m["per_chunk_tokens_per_s"], style, marker="o", ms=4, color=f"C{i}",
                     label=m["label"])
    base = result["baseline_per_chunk_tokens_per_s"]
    axes[1].plot(range(len(base)), base, ":", color="k", label="greedy (no draft)")
    axes[0].set(xlabel="chunk (stream order)", ylabel="mean accepted length (tokens/round)")
    axes[1].set(xlabel="chunk (stream order)", ylabel="tokens/s (training excluded)")
    chunk = int(result["config"]["chunk"])
    stream = result.get("stream", [])
    ticks = list(range(len(base)))
    labels = [f"{c}\n{'+'.join(dict.fromkeys(stream[c * chunk:(c + 1) * chunk]))}" for c in ticks]
    for ax in axes:
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['target']}: {result['config']['datasets']} ({result['config']['order']})", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _default_target() -> str:
    from specloop.realmodels.loading import registry_names
    return registry_names()[0]


@dataclass(frozen=True)
class StreamRun:
    """One ``specloop stream`` run.

    Attributes:
        methods: method names (`specloop.realmodels.streams.runner.resolve_method`); the
            greedy baseline always runs first.
        config: `StreamConfig` (chunk, max_new_tokens, num_draft_tokens, online, seed).
        out: results folder (resumable; gets summary.json and stream.png).
        target: registry name, HF id or path (default the registry's first name).
        datasets: comma-separated datasets, in domain order; order: "shift" or
            "interleave"; prompts: stream length; raw: no chat template;
            max_prompt_tokens: keep the last N prompt tokens.
        dtype, device: of the target. drafts: folder of per-kind drafts (None =
            the draft cache / shipped copies).
        replay: a stream recording's folder (`specloop stream record`): replay every
            method against it instead of decoding; the stream, target, dtype and
            max_new_tokens cap are the recording's (``prompts`` = its first prompts,
            None or 0 = all). cost_table: the replay's verify-cost JSON
            (``benchmarks/verify_cost.py``; None = the shipped SmolLM2 table).
        snapshot_chunks: online methods keep per-chunk parameter snapshots
            (`StreamRunner` ``snapshot_chunks``; no effect on the result).
        split: the datasets' split for live decoding (`specloop.data.streams.stream_prompts`:
            "heldout", the default, "warmup" or "all"; a prompt file is split like a
            packaged dataset, every 4th row held out, so "all" serves every row). With
            ``replay`` the recording's split is used.
    """

    methods: tuple[str, ...]
    config: object
    out: Path
    target: str = field(default_factory=_default_target)
    datasets: str = "humaneval,mt-bench,ifbench"
    order: str = "shift"
    prompts: int = 12
    raw: bool = False
    max_prompt_tokens: int = 512
    dtype: str = "float32"
    device: str = "cpu"
    drafts: str | None = None
    replay: str | None = None
    cost_table: str | None = None
    snapshot_chunks: bool = False
    split: str = "heldout"


def serve_stream(run: StreamRun, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Serve the stream with the greedy baseline and every method, write
    ``out/summary.json`` and ``out/stream.png``, and return the result object. A
    method that cannot run (FileNotFoundError / ValueError, e.g. an untrained draft)
    is listed under ``failed``; ``progress(method, prompts_served, total)`` is called
    with 0 when a method starts and with 1 after each prompt.

    Raises:
        ValueError: no method, an unknown method, or the baseline fails.
        FileNotFoundError: the target or a dataset package is missing.
    """
    from specloop.data.streams import build_stream, stream_prompts
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.runner import BASELINE, StreamRunner, resolve_method
    specs = [resolve_method(m) for m in run.methods if m.strip()]
    if not specs:
        raise ValueError("--method names no method")
    if run.replay is not None:
        return _serve_replay(run, specs, progress)
    stream_prompts(run.datasets, run.prompts, run.order, run.split)    # a bad prompt file before the model loads
    target = load_model(run.target, dtype=run.dtype, device=run.device)
    items = build_stream(run.datasets, run.prompts, target.tokenizer, order=run.order,
                         chat_template=not run.raw, max_prompt_tokens=run.max_prompt_tokens, split=run.split)
    out = Path(run.out)
    runner = StreamRunner(target, [list(i.ids) for i in items], out, run.config, drafts_dir=run.drafts,
                          snapshot_chunks=run.snapshot_chunks)
    return _serve(runner, specs, items, run, progress)


def _serve_replay(run: StreamRun, specs, progress) -> dict:
    """`serve_stream` over a recording (``run.replay``)."""
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.replay import load_verify_cost
    from specloop.realmodels.streams.runner import StreamRunner
    from specloop.realmodels.recording import open_recording, recorded_items
    recording = open_recording(run.replay)
    settings = recording.settings
    if run.config.max_new_tokens > int(settings["max_new_tokens"]):
        raise ValueError(f"--max-new-tokens {run.config.max_new_tokens} exceeds the recording's "
                         f"{settings['max_new_tokens']}")
    items = recorded_items(recording, run.prompts or None)
    target = load_model(settings["target"], dtype=settings["dtype"], device=run.device)
    runner = StreamRunner(target, [list(i.ids) for i in items], Path(run.out), run.config, drafts_dir=run.drafts,
                          replay=recording, verify_cost=load_verify_cost(run.cost_table, settings["dtype"]),
                          snapshot_chunks=run.snapshot_chunks)
    replayed = StreamRun(**{**run.__dict__, "target": settings["target"], "datasets": ",".join(settings["datasets"]),
                            "order": settings["order"], "split": settings.get("split", "heldout")})
    return _serve(runner, specs, items, replayed, progress)


def _serve(runner, specs, items, run: StreamRun, progress) -> dict:
    from specloop.realmodels.streams.runner import BASELINE
    out = Path(run.out)
    names = [BASELINE] + [s.name for s in specs if s.name != BASELINE]
    total = len(names) * len(items)
    summaries, failures = {}, {}
    for name in names:
        if progress is not None:
            progress(name, 0, total)
        try:
            summaries[name] = runner.run_method(
                name, progress=None if progress is None else (lambda n, name=name: progress(name, n, total)))
        except (FileNotFoundError, ValueError) as exc:
            if name == BASELINE:
                raise
            failures[name] = str(exc)
    result = stream_result(summaries, failures, items, run.config, target=run.target, datasets=run.datasets,
                           order=run.order, drafts=run.drafts, engine=runner.engine, split=run.split,
                           recording=None if run.replay is None else str(run.replay))
    (out / "summary.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    plot_stream(result, out / "stream.png")
    return result
