"""Figure (d): mean accepted length tau and tokens/s per chunk over a real prompt
stream (held-out HumanEval -> MT-bench -> IFBench, a domain-shift order), frozen
against online drafts — OnlineSpec's per-chunk curves.

Sources, in order of preference:

1. ``specloop stream`` (`specloop.realmodels.streams.results.serve_stream`): it serves the stream
   with frozen and online-adapted drafts (Hydra and Opt-Hydra at the quick scale;
   also OSD-Hydra, Ens-Hydra, EAGLE, Ens-EAGLE at full scale) and reports per-chunk numbers and its greedy baseline.
2. Otherwise (no command, or no method it could run) this module serves the stream itself with the real decoder on the
   embedded SmolLM2-135M target, for every draft it can run *frozen* (n-gram prompt
   lookup; trained heads whose checkpoint is saved), plus plain HF greedy decoding
   of the same prompts as the tokens/s reference. No online curve exists then, and
   the report says so: nothing is synthesised.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from specloop.figures._base import (FigureResult, FigureUnavailable, new_figure, require,
                                    save_figure, sizes, write_csv, write_json)
from specloop.figures._real import (DEFAULT_TARGET, heldout_prompt_ids, load_target,
                                    saved_drafters, time_hf_generate, time_specloop)

__all__ = ["main", "SIZES", "chunk_summaries"]

NAME = "online_stream"
DATASET_ORDER = ("humaneval", "mt-bench", "ifbench")
ONLINE_TARGET_GAIN = 1.2  # stated target: online >= +20 % mean accepted length over frozen

SIZES = {
    "full": {"per_dataset": 8, "chunk": 4, "max_new_tokens": 128, "k": 4,
             "methods": ("hydra", "osd-hydra", "opt-hydra", "ens-hydra", "eagle", "ens-eagle")},
    "quick": {"per_dataset": 2, "chunk": 2, "max_new_tokens": 48, "k": 4,
              "methods": ("hydra", "opt-hydra")},
    "tiny": {"per_dataset": 1, "chunk": 1, "max_new_tokens": 10, "k": 3,
             "methods": ("hydra", "opt-hydra")},
}
BASELINE_LABEL = "greedy (no draft)"


def chunk_summaries(traces: list, chunk: int) -> list[dict]:
    """Per chunk of ``chunk`` consecutive prompts: mean accepted length (committed
    tokens per round over the chunk's rounds) and tokens/s (committed tokens over
    draft + verify + update seconds), from each prompt's `Trace`.

    Raises:
        ValueError: chunk < 1.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 prompt, got {chunk}")
    out = []
    for start in range(0, len(traces), chunk):
        group = [t for t in traces[start:start + chunk] if len(t)]
        tokens = sum(t.total_tokens for t in group)
        rounds = sum(len(t) for t in group)
        seconds = sum(t.total_time for t in group)
        out.append({"chunk": start // chunk, "prompts": len(traces[start:start + chunk]),
                    "rounds": rounds, "tokens": tokens,
                    "mean_accepted_length": tokens / rounds if rounds else float("nan"),
                    "tokens_per_s": tokens / seconds if seconds > 0 else float("nan")})
    return out


# -- source 1: `specloop stream` ------------------------------------------
def _from_stream_command(cfg: dict, out: Path) -> tuple[dict | None, str]:
    """Serve the stream as ``specloop stream --json`` does
    (`specloop.realmodels.streams.results.serve_stream`, the command's defaults).

    Returns:
        (its result, '') -- ``methods`` -> mean_accepted_length, speedup,
        speedup_with_training, per_chunk, per_chunk_tokens_per_s -- or (None, why)
        when the stream cannot run or produced no usable method (e.g. no trained
        draft: the result then names the failures).
    """
    try:
        from specloop.realmodels.streams.runner import StreamConfig
        from specloop.realmodels.streams.results import STREAM_ONLINE_DEFAULTS, StreamRun, serve_stream
    except ImportError as exc:  # the stream's own modules have not landed
        return None, f"`specloop stream` cannot run yet ({exc})"
    config = StreamConfig(chunk=cfg["chunk"], max_new_tokens=cfg["max_new_tokens"], num_draft_tokens=cfg["k"],
                          online=dict(STREAM_ONLINE_DEFAULTS))
    run = StreamRun(methods=tuple(cfg["methods"]), config=config, out=out / "stream", target=DEFAULT_TARGET,
                    datasets=",".join(DATASET_ORDER), prompts=cfg["per_dataset"] * len(DATASET_ORDER))
    try:
        data = serve_stream(run)
    except ImportError as exc:  # the stream's own modules have not landed
        return None, f"`specloop stream` cannot run yet ({exc})"
    except (ValueError, FileNotFoundError) as exc:      # what the command reports with exit status 2
        return None, f"`specloop stream` could not run: {exc}"
    if not data.get("methods"):
        return None, f"`specloop stream` ran no method: {data.get('failed')}"
    return data, ""


# -- the replay check: record the stream's target side, replay, compare ----------
def _replay_check(cfg: dict, out: Path) -> dict:
    """Record the stream ``specloop stream`` just served (batched greedy,
    `streams.record.record_stream`), replay every method it ran against the recording
    with the same settings (`StreamRunner` with ``replay=``) and compare round by round
    with the decoder's records (`replay_check.compare_traces`). Returns per method
    rounds / matching_rounds / tau_real / tau_replay, or {"error": why}."""
    from specloop.data.streams import build_stream
    from specloop.realmodels.streams.replay_check import compare_traces
    from specloop.realmodels.streams.runner import StreamConfig, StreamRunner
    from specloop.realmodels.recording import RecordSettings, head_feature_layers, open_recording
    from specloop.realmodels.streams.record import record_stream
    from specloop.realmodels.streams.results import STREAM_ONLINE_DEFAULTS
    from specloop.record import Trace
    target = load_target(DEFAULT_TARGET, dtype="float32")
    count = cfg["per_dataset"] * len(DATASET_ORDER)
    items = build_stream(",".join(DATASET_ORDER), count, target.tokenizer, max_prompt_tokens=512)
    settings = RecordSettings(target=DEFAULT_TARGET, dtype="float32", datasets=DATASET_ORDER, split="heldout",
                              order="shift", prompts=count, max_new_tokens=cfg["max_new_tokens"],
                              max_prompt_tokens=512, chat_template=True, top_m=32,
                              layers=head_feature_layers(target.model.config), batch_size=count, shard_size=count)
    folder = out / "stream_recording"
    record_stream(target, items, folder, settings, check_prompts=0)
    config = StreamConfig(chunk=cfg["chunk"], max_new_tokens=cfg["max_new_tokens"], num_draft_tokens=cfg["k"],
                          online=dict(STREAM_ONLINE_DEFAULTS))
    runner = StreamRunner(target, [list(i.ids) for i in items], out / "stream_replay", config,
                          replay=open_recording(folder))
    checks = {}
    for method in cfg["methods"]:
        live = out / "stream" / method / "rounds.jsonl"
        if not live.is_file():
            continue
        try:
            runner.run_method(method)
        except (ValueError, FileNotFoundError) as exc:
            checks[method] = {"error": str(exc)}
            continue
        row = compare_traces(Trace.load(live), Trace.load(out / "stream_replay" / method / "rounds.jsonl"))
        checks[method] = {k: row[k] for k in ("rounds", "matching_rounds", "tau_real", "tau_replay")}
    return checks


# -- source 2: frozen drafts served here ------------------------------------------------
def _serve_frozen(cfg: dict) -> tuple[list[dict], list[str]]:
    decoder_mod = require("specloop.realmodels.decoder", "SpeculativeDecoder",
                          why="the real-model decoder")
    registry = require("specloop.realmodels.registry.drafters", "make_drafter")
    policy_mod = require("specloop.realmodels.policy", "FixedDraftPolicy")
    target = load_target(DEFAULT_TARGET, dtype="float32")
    tagged = heldout_prompt_ids(target.tokenizer, {d: cfg["per_dataset"] for d in DATASET_ORDER})
    prompts = [ids for _, ids in tagged]
    rows, methods = [], []
    for drafter in ["ngram"] + saved_drafters(target):
        traces: list = []
        make = (lambda d=drafter: decoder_mod.SpeculativeDecoder(
            target, registry.make_drafter(d, target, train_if_missing=False, progress=False),
            policy=policy_mod.FixedDraftPolicy(cfg["k"])))
        time_specloop(make, prompts, cfg["max_new_tokens"], drafter, traces=traces)
        method = f"{drafter} (frozen)"
        methods.append(method)
        rows += [{"method": method, "online": False, "baseline": False, **r}
                 for r in chunk_summaries(traces, cfg["chunk"])]
    rows += _baseline_chunks(target, prompts, cfg)
    for row in rows:
        first = row["chunk"] * cfg["chunk"]
        row["datasets"] = "+".join(dict.fromkeys(d for d, _ in tagged[first:first + cfg["chunk"]]))
    return rows, methods


def _baseline_chunks(target, prompts: list, cfg: dict) -> list[dict]:
    """HF greedy tokens/s per chunk (the plain-decoding reference line)."""
    rows = []
    for start in range(0, len(prompts), cfg["chunk"]):
        run = time_hf_generate(target, prompts[start:start + cfg["chunk"]], cfg["max_new_tokens"],
                               "hf_greedy")
        rows.append({"method": BASELINE_LABEL, "online": False, "baseline": True,
                     "chunk": start // cfg["chunk"],
                     "prompts": len(run.outputs), "rounds": run.new_tokens, "tokens": run.new_tokens,
                     "mean_accepted_length": 1.0, "tokens_per_s": run.tokens_per_s})
    return rows


_FROZEN_NAMES = {"vanilla-sd", "vanilla sd", "vanilla", "sd", "hydra", "medusa", "eagle", "eagle3",
                 "eagle-3", "small-lm", "ngram", "frozen"}


def _is_online(method: str) -> bool:
    """OnlineSpec Table 1 naming: OSD-*, Opt-*, Ens-* and combinations adapt online;
    Vanilla SD, Hydra, Medusa, EAGLE(-3) rows are the frozen drafts."""
    name = method.strip().lower()
    return not ("frozen" in name or name in _FROZEN_NAMES)


def _rows_from_stream_json(data: dict) -> list[dict]:
    """Per-chunk rows (method, online, baseline, chunk, datasets, mean_accepted_length,
    tokens_per_s) from ``specloop stream --json``.

    Raises:
        FigureUnavailable: no per-chunk results in the JSON.
    """
    chunk = int(data.get("config", {}).get("chunk", 1) or 1)
    stream = list(data.get("stream", []))
    labels = ["+".join(dict.fromkeys(stream[i:i + chunk])) for i in range(0, len(stream), chunk)]
    rows = []
    for method, summary in data.get("methods", {}).items():
        per_chunk = summary.get("per_chunk") or []
        tps = summary.get("per_chunk_tokens_per_s") or [float("nan")] * len(per_chunk)
        online = summary["online"] if "online" in summary else _is_online(method)
        for i, (tau, rate) in enumerate(zip(per_chunk, tps)):
            rows.append({"method": summary.get("label", method), "online": bool(online),
                         "baseline": False, "chunk": i,
                         "datasets": labels[i] if i < len(labels) else "",
                         "mean_accepted_length": tau, "tokens_per_s": rate})
    if not rows:
        raise FigureUnavailable("`specloop stream --json` returned no per-chunk results")
    for i, rate in enumerate(data.get("baseline_per_chunk_tokens_per_s") or []):
        rows.append({"method": BASELINE_LABEL, "online": False, "baseline": True, "chunk": i,
                     "datasets": labels[i] if i < len(labels) else "",
                     "mean_accepted_length": 1.0, "tokens_per_s": rate})
    return rows


_STATEMENTS = {
    "online_beats_frozen_stream": "OnlineSpec: online-adapted drafts reach a higher mean accepted length "
                                  "than frozen drafts over a shifting prompt stream",
    "online_tau_gain_20pct": f"target: online >= {ONLINE_TARGET_GAIN:.1f}x the frozen mean "
                             "accepted length on a domain-shifting stream"}
_CLAIMED_SIZE = {"online_beats_frozen_stream": None, "online_tau_gain_20pct": ONLINE_TARGET_GAIN}


def _claims(rows: list[dict], stream_json: dict | None = None) -> list[dict]:
    """Verdicts from the paired per-prompt comparison of each online method with its
    own frozen draft (``vs_frozen`` of ``specloop stream --json``:
    `specloop.stats.paired_gain`, a t interval on per-prompt log tau ratios): the
    online method whose interval lies highest decides (best of the methods run)."""
    from specloop.report.verdicts import Estimate, measured_claim
    paired = [(m, s["vs_frozen"]) for m, s in ((stream_json or {}).get("methods") or {}).items()
              if s.get("vs_frozen") and s["vs_frozen"].get("n")]
    if not paired:
        why = ("undecided: no online method produced results (frozen drafts only; the figure's source "
               "note says why)" if not any(r["online"] for r in rows) else
               "undecided: no online method has a paired per-prompt comparison with its frozen draft")
        return [measured_claim(c, text, None, null=1.0, claimed_size=_CLAIMED_SIZE[c], why_missing=why)
                for c, text in _STATEMENTS.items()]
    claims = []
    for claim, size in _CLAIMED_SIZE.items():
        parts = []
        for method, vs in paired:
            lo, hi = vs["gain_ci"]
            estimate = Estimate(1.0 + vs["gain"], (1.0 + _nan(lo), 1.0 + _nan(hi)), int(vs["n"]),
                                f"paired per-prompt tau ratio {method} / {vs['frozen']} (geometric mean, "
                                "t interval on log ratios)")
            parts.append((method, measured_claim(
                claim, _STATEMENTS[claim], estimate, null=1.0, claimed_size=size,
                evidence=f"{method} vs {vs['frozen']}: {vs.get('better', 0)} prompts better, "
                         f"{vs.get('worse', 0)} worse; Wilcoxon p = {_nan(vs.get('wilcoxon_p')):.3g}")))
        best = max(parts, key=lambda p: p[1]["interval"][0] if np.isfinite(p[1]["interval"][0]) else -np.inf)
        claims.append({**best[1], "statistic": best[1]["statistic"] + (
            f"; best of {len(parts)} online methods" if len(parts) > 1 else "")})
    return claims


def _replay_note(replay: dict | None) -> str:
    """One line on the replay check: rounds matching per method."""
    if not replay:
        return "Replay check: not run (no `specloop stream` result)."
    if "error" in replay:
        return f"Replay check: could not run ({replay['error']})."
    parts = [f"{m}: {r['matching_rounds']}/{r['rounds']} rounds equal, tau {r['tau_real']:.3f} decoder vs "
             f"{r['tau_replay']:.3f} replay" if "rounds" in r else f"{m}: {r['error']}" for m, r in replay.items()]
    return ("Replay check (the stream recorded batched, every method replayed against the recording and "
            "compared with the decoder round for round): " + "; ".join(parts) + ".")


def _nan(value) -> float:
    """``value`` as a float, None -> NaN (JSON writes NaN as null)."""
    return float("nan") if value is None else float(value)


def _mean_tau(rows: list[dict], method: str) -> float:
    return float(np.nanmean([r["mean_accepted_length"] for r in rows if r["method"] == method]))


def _plot(rows: list[dict], out: Path) -> list[Path]:
    fig, axes = new_figure(ncols=2, width=5.2, height=3.8)
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["chunk"])
        chunks = [r["chunk"] for r in pts]
        baseline = bool(pts[0].get("baseline"))
        style = dict(color="k", ls=":", marker="") if baseline else \
            dict(color=f"C{i}", ls="-" if pts[0]["online"] else "--", marker="o", ms=4)
        if not baseline:
            axes[0].plot(chunks, [r["mean_accepted_length"] for r in pts], label=method, **style)
        axes[1].plot(chunks, [r["tokens_per_s"] for r in pts], label=method, **style)
    labels = {r["chunk"]: r.get("datasets", "") for r in rows}
    for ax, ylabel in zip(axes, ("mean accepted length tau (tokens/round)", "tokens/s")):
        ax.set(xlabel="chunk of prompts (stream order)", ylabel=ylabel)
        ax.set_xticks(sorted(labels), [f"{c}\n{labels[c]}" for c in sorted(labels)], fontsize=7)
        ax.legend(fontsize=7)
    axes[0].set_title("per-chunk tau: online (—) vs frozen (--)")
    axes[1].set_title(f"per-chunk tokens/s ({DEFAULT_TARGET})")
    return save_figure(fig, out, NAME)


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Serve (or read) the stream, save (``online_stream.csv``) and plot figure (d).

    Raises:
        FigureUnavailable: no decoder / model / dataset packages.
    """
    cfg = sizes(SIZES, quick)
    out = Path(out_dir)
    stream_json, why = _from_stream_command(cfg, out)
    replay = None
    if stream_json is not None:
        write_json(out / "stream.json", stream_json)
        try:
            replay = _replay_check(cfg, out)
        except (ImportError, ValueError, FileNotFoundError) as exc:
            replay = {"error": str(exc)}
        write_json(out / "replay_check.json", replay)
        rows = _rows_from_stream_json(stream_json)
        source = "specloop stream, methods " + ", ".join(stream_json["methods"])
        if stream_json.get("failed"):
            source += f"; failed: {stream_json['failed']}"
    else:
        rows, _ = _serve_frozen(cfg)
        source = f"frozen drafts served by this figure ({why})"
    data = write_csv(out / f"{NAME}.csv", rows)
    images = _plot(rows, out)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    table = [{"method": m, "online": next(r["online"] for r in rows if r["method"] == m),
              "mean_accepted_length": _mean_tau(rows, m),
              "tokens_per_s": float(np.nanmean([r["tokens_per_s"] for r in rows if r["method"] == m])),
              "per_chunk_tau": " ".join(f"{r['mean_accepted_length']:.2f}"
                                        for r in rows if r["method"] == m)}
             for m in methods]
    return FigureResult(
        name=NAME, title="per-chunk mean accepted length and tokens/s over a real prompt stream",
        data_paths=[data], image_paths=images, claims=_claims(rows, stream_json), table=table,
        numbers={"prompts_per_dataset": cfg["per_dataset"], "chunk_prompts": cfg["chunk"],
                 "max_new_tokens": cfg["max_new_tokens"]},
        notes=[f"Source: {source}.", _replay_note(replay),
               "Stream order: held-out HumanEval, then MT-bench, then IFBench prompts "
               "(domain shifts at chunk boundaries); greedy decoding, float32."])
