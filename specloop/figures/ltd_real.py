"""Figure (g): Learning To Draft (LTD) on the real decoder: SmolLM2-135M in
bfloat16 with the shipped EAGLE-3 head drafting EAGLE-2 trees, HumanEval prompts.

Three panels, every number measured by this figure through the library functions
behind the CLI (`specloop.ltd.eval_real`, `specloop.ltd.eval_sim`):

1. **Real decoder** (``specloop ltd eval --env real --paired``): wall-clock tokens/s
   of each policy relative to the best static tree, paired per prompt (the policies
   run back to back on the same prompt, alternating order; greedy output does not
   depend on the policy, so a time ratio is a speed ratio), with standard errors.
   The static trees are grid-searched on the warm-up recording and the best few
   re-measured on real warm-up prompts (``--grid-from-replay``).
2. **Replay** (``specloop ltd eval --env replay``): the same policies on held-out
   rounds recorded from the real decoder (``specloop ltd record``: every position's
   full draft tree and the target's tokens; costs timed on real decoder rounds),
   with the clairvoyant per-round oracle as the ceiling.
3. **Transfer**: the simulator-trained pair as shipped, the same pair fine-tuned on
   the recorded real rounds, and a pair trained on them from scratch (all on LTD's
   throughput reward), on the replay and on the real decoder.

Rows: static tree (grid best), LTD (co-trained on the recording, net-tokens reward),
depth-only, size-only, the independent (not co-trained) pair, the reward ablation
(the same training on LTD's per-cycle throughput reward), the sim-trained pair
(``ltd-sim``) and the fine-tuned pair (``ltd-sim-replay-ft``). The recordings are
written into the figure's folder and reused on a rerun (``ltd record`` resumes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from specloop.figures._base import (FigureResult, FigureUnavailable, fmt, new_figure, require, save_figure, sizes,
                                    write_csv, write_json)
from specloop.figures.ltd import LTD_TARGET_GAIN, cotraining_claim, paired_speed_ratio, target_gain_claim

__all__ = ["main", "SIZES", "POLICY", "SIM_POLICY", "FINE_TUNED", "REWARD_ABLATION"]

NAME = "ltd_real"
POLICY = "ltd-replay"                 # co-trained on recorded real rounds (net_tokens reward)
REWARD_ABLATION = "ltd-replay-throughput"  # the same training on LTD's throughput reward
SIM_POLICY = "ltd-sim"                # trained only in the simulator
FINE_TUNED = "ltd-sim-replay-ft"      # ltd-sim fine-tuned on the recorded real rounds
DRAFTER = "eagle3"

# Recording settings must match the shipped replay policies (top-6 trees, D <= 8, V <= 48).
RECORD = {"max_depth": 8, "max_verify": 48, "top_k": 6}

SIZES = {
    "full": {"warmup_prompts": 48, "heldout_prompts": 16, "record_tokens": 64, "cost_repeats": 3,
             "cost_tokens": 32, "real_prompts": 8, "real_tokens": 64, "repeats": 5, "grid_top": 6},
    "quick": {"warmup_prompts": 8, "heldout_prompts": 4, "record_tokens": 32, "cost_repeats": 1,
              "cost_tokens": 16, "real_prompts": 4, "real_tokens": 32, "repeats": 2, "grid_top": 3},
    "tiny": {"warmup_prompts": 1, "heldout_prompts": 1, "record_tokens": 6, "cost_repeats": 1,
             "cost_tokens": 4, "real_prompts": 1, "real_tokens": 6, "repeats": 1, "grid_top": 1},
}

SHORT = {"LTD (co-trained)": "LTD (co-trained)",
         "depth-only (size static)": "depth-only",
         "size-only (depth static)": "size-only",
         "independent (not co-trained)": "independent pair",
         REWARD_ABLATION: "reward: per-cycle throughput",
         SIM_POLICY: "transfer: sim-trained only",
         FINE_TUNED: "transfer: sim + fine-tuned on real rounds"}


def _short(label: str) -> str:
    if label.startswith("static"):
        return label.replace(" (grid best)", "") + " (best static)"
    if label.startswith("LTD fine-tuned on"):     # ltd.policy.fine_tuned_label (any policy name)
        return SHORT[FINE_TUNED]
    return SHORT.get(label, label)


def _record(out: Path, split: str, prompts: int, cfg: dict, costs_from: Path | None) -> Path:
    """Record (or resume) ``out/replay-<split>`` as ``specloop ltd record`` does
    (`specloop.ltd.eval_real.record_real`)."""
    from specloop.ltd.eval_real import RealLTDSetup, RecordConfig, record_real
    directory = out / f"replay-{split}"
    setup = RealLTDSetup(drafter=DRAFTER, dtype="bfloat16", prompts=prompts, max_new_tokens=cfg["record_tokens"])
    record_real(RecordConfig(directory, setup, split=split, max_depth=RECORD["max_depth"],
                             max_verify=RECORD["max_verify"], top_k=RECORD["top_k"], costs_from=costs_from,
                             cost_repeats=cfg["cost_repeats"], cost_tokens=cfg["cost_tokens"]))
    return directory


def _measure(out: Path, cfg: dict) -> tuple[dict, dict]:
    """The replay and real-decoder evaluations (`specloop.ltd.eval_sim.replay_eval`,
    `specloop.ltd.eval_real.real_eval`, as ``specloop ltd eval --env replay``
    and ``--env real --paired --grid-from-replay`` run them); each result and its
    decisions are also saved under ``out/replay_eval`` / ``out/real_eval``."""
    from specloop.ltd.eval_real import RealEvalConfig, RealLTDSetup, real_eval
    from specloop.ltd.eval_sim import ReplayEvalConfig, replay_eval, replay_grid_pairs
    from specloop.ltd.evaluate import save_eval
    warmup = _record(out, "warmup", cfg["warmup_prompts"], cfg, None)
    heldout = _record(out, "heldout", cfg["heldout_prompts"], cfg, warmup)
    extras = (REWARD_ABLATION, SIM_POLICY)
    replay, decisions = replay_eval(ReplayEvalConfig(warmup, heldout, policy=POLICY, fine_tuned=FINE_TUNED,
                                                     extra_policies=extras))
    save_eval(out / "replay_eval", replay, decisions)
    setup = RealLTDSetup(drafter=DRAFTER, dtype="bfloat16", prompts=cfg["real_prompts"],
                         max_new_tokens=cfg["real_tokens"])
    real, decisions = real_eval(RealEvalConfig(setup, out=out / "real_eval", policy=POLICY, fine_tuned=FINE_TUNED,
                                               extra_policies=extras, repeats=cfg["repeats"], paired=True,
                                               grid_pairs=tuple(replay_grid_pairs(warmup, cfg["grid_top"]))))
    save_eval(out / "real_eval", real, decisions)
    return replay, real


def _table(replay: dict, real: dict) -> list[dict]:
    """One row per policy: replay and real speedups over the best static tree."""
    def key(label: str) -> str:       # each env's own grid-best static tree is its reference row
        return "static" if label.startswith("static") else _short(label)

    by_replay = {key(r["config"]): r for r in replay["rows"]}
    table = []
    for row in real["rows"]:
        name = _short(row["config"])
        rep = by_replay.get(key(row["config"]), {})
        table.append({"policy": name, "real_speedup_vs_best_static": row["speedup_vs_best_static"],
                      "real_paired_speedup": row.get("paired_speedup"),
                      "real_paired_speedup_se": row.get("paired_speedup_se"),
                      "real_tokens_per_s": row["tokens_per_s"],
                      "real_mean_accepted_length": row["mean_accepted_length"],
                      "real_mean_depth": row["mean_depth"], "real_mean_verify_size": row["mean_verify_size"],
                      "replay_speedup_vs_best_static": rep.get("speedup_vs_best_static"),
                      "replay_mean_accepted_length": rep.get("mean_accepted_length")})
    return table


def _claims(table: list[dict], real: dict | None = None) -> list[dict]:
    """Verdicts from the paired real-decoder rows of ``real`` (``ltd eval --paired``:
    per (pass, prompt) time ratios, `ltd.paired_speed_ratio`); ``table`` gives the
    pooled and replay numbers quoted as evidence."""
    from specloop.report.verdicts import measured_claim
    rows = {r["policy"]: r for r in table}
    raw = {_short(r["config"]): r for r in (real or {}).get("rows", [])}
    static = next((r for name, r in raw.items() if name.endswith("(best static)")), None)
    claims = []
    ltd = rows.get("LTD (co-trained)")
    if ltd is not None:
        claims.append(target_gain_claim(
            "real", "real decoder, wall clock", paired_speed_ratio(raw.get(ltd["policy"], {}), static,
                                                                   "LTD / best static"),
            f"pooled {ltd['real_speedup_vs_best_static']:.3f}x tokens/s; replay "
            f"{fmt(ltd['replay_speedup_vs_best_static'])}x"))
        ind = rows.get("independent pair")
        if ind is not None:
            claims.append(cotraining_claim(
                "real", paired_speed_ratio(raw.get(ltd["policy"], {}), raw.get(ind["policy"]),
                                           "co-trained / independent"),
                f"pooled co-trained {ltd['real_tokens_per_s']:.2f} vs independent "
                f"{ind['real_tokens_per_s']:.2f} tokens/s"))
    sim, tuned = rows.get(SHORT[SIM_POLICY]), rows.get(SHORT[FINE_TUNED])
    if sim is not None and tuned is not None:
        evidence = (f"pooled fine-tuned {tuned['real_speedup_vs_best_static']:.3f}x vs sim-only "
                    f"{sim['real_speedup_vs_best_static']:.3f}x best static (real); replay "
                    f"{fmt(tuned['replay_speedup_vs_best_static'])}x vs {fmt(sim['replay_speedup_vs_best_static'])}x")
        claims.append(measured_claim(
            "ltd_fine_tuning_helps_transfer",
            "LTD transfer: the sim-trained policy fine-tuned on real rounds beats it unchanged on the real decoder",
            paired_speed_ratio(raw.get(tuned["policy"], {}), raw.get(sim["policy"]), "fine-tuned / sim-only"),
            null=1.0, evidence=evidence,
            why_missing=f"undecided: the real eval rows carry no per-prompt times to pair; {evidence}",
            wall_clock=True))
    return claims


def _column(table: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else r[key] for r in table], dtype=float)


def _plot(table: list[dict], oracle: float, out: Path, scale_note: str = "") -> list[Path]:
    """Dot plots (ratios around 1 on a cut axis: no bars). Colours: grey = the static
    tree, blue = LTD and its ablations, green = the transfer rows, in every panel."""
    fig, axes = new_figure(ncols=3, width=4.8, height=4.2)
    names = [r["policy"] for r in table]
    y = np.arange(len(names))
    colors = ["C7" if n.endswith("(best static)") else "C2" if n.startswith("transfer") else "C0" for n in names]
    pooled, replay = _column(table, "real_speedup_vs_best_static"), _column(table, "replay_speedup_vs_best_static")
    paired, err = _column(table, "real_paired_speedup"), np.nan_to_num(_column(table, "real_paired_speedup_se"))
    axes[0].scatter(pooled, y, c=colors, s=36, zorder=3)
    axes[0].scatter([], [], c="C0", s=36, label="pooled tokens/s")      # legend entry in the LTD colour
    axes[0].errorbar(paired, y + 0.25, xerr=err, fmt="none", ecolor="k", capsize=2, lw=0.8)
    axes[0].scatter(paired, y + 0.25, facecolors="none", edgecolors="k", s=20, zorder=3,
                    label="paired ratio +- s.e.")
    axes[0].set_yticks(y, names, fontsize=7)
    axes[0].set(xlabel="speed / best static tree", title=f"real decoder, wall clock{scale_note}")
    axes[1].scatter(replay, y, c=colors, s=36, zorder=3)
    if np.isfinite(oracle):
        axes[1].axvline(oracle, color="C1", lw=1.0, ls="--", label=f"per-round oracle {oracle:.2f}x")
    axes[1].set_yticks(y, [""] * len(names))
    axes[1].set(xlabel="tokens/s / best static tree", title="replay of recorded real rounds")
    finite = [v for v in np.concatenate([pooled, paired + err, paired - err, replay, [oracle]]) if np.isfinite(v)]
    for ax in axes[:2]:
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.axvline(LTD_TARGET_GAIN, color="C3", lw=0.8, ls=":", label=f"target {LTD_TARGET_GAIN:.2f}x")
        ax.set_xlim(min(finite + [1.0]) - 0.03, max(finite + [LTD_TARGET_GAIN]) + 0.03)
        ax.legend(fontsize=7, loc="lower right")
    _plot_transfer(axes[2], {r["policy"]: r for r in table})
    return save_figure(fig, out, NAME)


def _plot_transfer(ax, rows: dict) -> None:
    groups = [("sim-trained\nonly", SHORT[SIM_POLICY]),
              ("sim-trained,\nfine-tuned on\nreal rounds", SHORT[FINE_TUNED]),
              (f"trained on\nreal rounds\n({REWARD_ABLATION})", SHORT[REWARD_ABLATION])]
    x = np.arange(len(groups))
    for shift, (env, key, marker) in zip((-0.1, 0.1), (("replay", "replay_speedup_vs_best_static", "s"),
                                                        ("real decoder (pooled)", "real_speedup_vs_best_static",
                                                         "o"))):
        values = [rows.get(name, {}).get(key) for _, name in groups]
        ax.scatter(x + shift, [np.nan if v is None else v for v in values], marker=marker, s=40,
                   c=["C2", "C2", "C0"], edgecolors="k", zorder=3, label=env)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_xticks(x, [g for g, _ in groups], fontsize=7)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set(ylabel="tokens/s / best static tree", title="transfer (LTD's throughput reward)")
    ax.legend(fontsize=7, loc="lower right")


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Record, replay and run LTD on the real decoder; save and plot figure (g).

    Raises:
        FigureUnavailable: the real-model layer, the target's package, the shipped
            EAGLE-3 head or the shipped LTD policies are missing.
    """
    cfg = sizes(SIZES, quick)
    out = Path(out_dir)
    ltd = require("specloop.ltd.policy", "load_policy", why="LTD policies")
    require("specloop.ltd.eval_real", "record_real", "real_eval",
            why="`specloop ltd record` / `ltd eval --env real`")
    for name in (POLICY, REWARD_ABLATION, SIM_POLICY, FINE_TUNED):
        try:
            ltd.load_policy(name)
        except FileNotFoundError as exc:
            raise FigureUnavailable(f"LTD policy {name!r} is not shipped or saved: {exc}") from exc
    try:
        replay, real = _measure(out, cfg)
    except (FileNotFoundError, ImportError) as exc:     # the target's package or the drafter's checkpoint
        raise FigureUnavailable(f"cannot run LTD on the real decoder: {exc}") from exc
    write_json(out / "ltd_eval_replay.json", replay)
    write_json(out / "ltd_eval_real.json", real)
    table = _table(replay, real)
    data = [write_csv(out / f"{NAME}_rows.csv", table), out / "ltd_eval_replay.json", out / "ltd_eval_real.json"]
    note = f" ({cfg['real_prompts']} prompts x {cfg['repeats']} passes)"
    images = _plot(table, float(replay.get("oracle_vs_best_static", np.nan)), out, note)
    best = real["best_static"]
    return FigureResult(
        name=NAME, title="LTD on the real decoder: paired speedups, replay, transfer",
        data_paths=data, image_paths=images, claims=_claims(table, real), table=table,
        numbers={"best_static_depth": best["depth"], "best_static_verify_size": best["verify_size"],
                 "real_prompts": cfg["real_prompts"], "repeats": cfg["repeats"],
                 "replay_prompts": replay.get("prompts"),
                 "oracle_vs_best_static_replay": replay.get("oracle_vs_best_static"),
                 "policy_overhead_fraction": real.get("policy_overhead", {}).get("overhead_fraction")},
        notes=["Target SmolLM2-135M bfloat16, drafter: the shipped EAGLE-3 head (bfloat16), HumanEval prompts; "
               "static trees grid-searched on warm-up prompts, policies evaluated on held-out prompts.",
               "Wall-clock rows on a shared or 2-core machine move by ~5 % between runs; the paired ratio and "
               "its standard error are the number to read."])
