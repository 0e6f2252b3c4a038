"""Figure (e): Learning To Draft (LTD, ICLR 2026) in the simulator — the
distributions of the draft depth D and the verification size V chosen by the
co-trained PPO policies (against the grid-searched best static tree), and the
ablation bars: tokens/s relative to the best static tree for LTD, depth-only,
size-only, the independent (not co-trained) pair and the reward ablation.

The numbers come from `specloop.ltd.eval_sim.sim_eval` (``specloop ltd eval --env
sim``). It needs trained policies: the saved or shipped ``ltd-sim`` policy
when there is one (``specloop ltd train --env sim``); otherwise this figure trains a
set itself as ``specloop ltd train`` does (`specloop.ltd.train_sim.train_sim`)
into its output folder (PPO with LTD's settings; the quick preset uses fewer steps
and takes a few minutes on 2 cores).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from specloop.figures._base import (FigureResult, FigureUnavailable, new_figure, require, save_figure, sizes,
                                    write_csv, write_json)

__all__ = ["main", "SIZES", "LTD_TARGET_GAIN", "cotraining_claim", "target_gain_claim", "paired_speed_ratio"]

NAME = "ltd"
LTD_TARGET_GAIN = 1.05  # the stated LTD target: >= +5 % tokens/s over the best static tree
SAVED_POLICY = "ltd-sim"

SIZES = {
    "full": {"train_steps": None, "episodes": 48, "own_name": "specloop-figures-full",
             "reward_ablation": True},
    "quick": {"train_steps": 2048, "episodes": 16, "own_name": "specloop-figures-quick",
              "reward_ablation": False},
    "tiny": {"train_steps": 256, "episodes": 4, "own_name": "specloop-figures-tiny",
             "reward_ablation": False},
}


@contextlib.contextmanager
def _policy_dir(folder: Path):
    """Point `specloop.ltd.policy`'s policy store (``SPECLOOP_LTD_DIR``) at
    ``folder`` for the duration (policies trained here stay with the part)."""
    import os
    old = os.environ.get("SPECLOOP_LTD_DIR")
    os.environ["SPECLOOP_LTD_DIR"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPECLOOP_LTD_DIR", None)
        else:
            os.environ["SPECLOOP_LTD_DIR"] = old


def _saved_policy_exists(ltd) -> bool:
    try:
        ltd.load_policy(SAVED_POLICY)
        return True
    except FileNotFoundError:
        return False


def _train_own(cfg: dict, out: Path) -> str:
    """Train a policy set as ``specloop ltd train --env sim`` does
    (`specloop.ltd.train_sim.train_sim`; call inside `_policy_dir`); the training
    log goes to ``out/train/ltd_train_<name>.json``."""
    ltd = require("specloop.ltd.policy", "load_policy")
    name = cfg["own_name"]
    try:
        ltd.load_policy(name)
        ltd.load_policy(f"{name}-independent")
        return name
    except FileNotFoundError:
        pass
    training = require("specloop.ltd.train_sim", "train_sim", why="LTD training in the simulator")
    from specloop.ltd.train import CoTrainSchedule
    schedule = CoTrainSchedule()          # `specloop ltd train`'s defaults (LTD's settings)
    if cfg["train_steps"] is not None:
        steps = int(cfg["train_steps"])
        schedule = CoTrainSchedule(steps, steps, 1, steps, steps, schedule.fixed_verify_size, None)
    trained = training.train_sim(training.SimTrainConfig(name=name, schedule=schedule,
                                                         reward_ablation=cfg["reward_ablation"]))
    write_json(out / "train" / f"ltd_train_{name}.json",
               {**trained["meta"], "name": name, "reward_ablation": trained["reward_ablation"]})
    return name


def _evaluate(name: str, cfg: dict, out: Path) -> dict:
    """`specloop.ltd.eval_sim.sim_eval` of policy ``name``; the rows and decisions are
    saved under ``out/eval`` as ``specloop ltd eval --env sim`` saves them."""
    evaluation = require("specloop.ltd.eval_sim", "sim_eval", why="LTD evaluation in the simulator")
    from specloop.ltd.evaluate import save_eval
    result, decisions = evaluation.sim_eval(evaluation.SimEvalConfig(policy=name, episodes=cfg["episodes"]))
    save_eval(out / "eval", result, decisions)
    return result


def _decisions(out: Path) -> list[dict]:
    path = out / "eval" / "ltd_decisions_sim.csv"
    if not path.exists():
        raise FigureUnavailable(f"{path} was not written by `specloop ltd eval`")
    import csv
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _claims(result: dict) -> list[dict]:
    rows = {r["config"]: r for r in result["rows"]}
    static = next((r for r in result["rows"] if r["config"].startswith("static")), None)
    ltd = rows.get("LTD (co-trained)")
    claims = []
    if ltd is not None:
        best = result["best_static"]
        claims.append(target_gain_claim(
            "sim", "simulator, measured costs", paired_speed_ratio(ltd, static, "LTD / best static"),
            f"pooled {ltd['speedup_vs_best_static']:.3f}x best static (D={best['depth']}, V={best['verify_size']})"))
        ind = rows.get("independent (not co-trained)")
        if ind is not None:
            claims.append(cotraining_claim(
                "sim", paired_speed_ratio(ltd, ind, "co-trained / independent"),
                f"pooled co-trained {ltd['tokens_per_s']:.2f} vs independent {ind['tokens_per_s']:.2f} tokens/s"))
    return claims


def paired_speed_ratio(row: dict, reference: dict | None, what: str):
    """Paired speed ratio ``row`` / ``reference`` of two `specloop ltd eval` rows, as
    a `specloop.report.verdicts.Estimate`: per (pass, prompt) time ratios from
    ``pair_seconds`` (``--paired``), else per-episode tokens/s ratios from
    ``tokens_per_s_per_episode`` (the same seeded episodes / prompts for every
    policy); None when the rows carry neither (an eval written
    before the rows carried those times)."""
    from specloop.report.verdicts import ratio_estimate
    if reference is None:
        return None
    if row.get("pair_seconds") and reference.get("pair_seconds"):
        ratios = [b / a for a, b in zip(row["pair_seconds"], reference["pair_seconds"])]
        unit = "(pass, prompt) time ratio"
    elif row.get("tokens_per_s_per_episode") and reference.get("tokens_per_s_per_episode"):
        ratios = [a / b for a, b in zip(row["tokens_per_s_per_episode"], reference["tokens_per_s_per_episode"])]
        unit = "episode tokens/s ratio"
    else:
        return None
    return ratio_estimate(ratios, f"paired per-{unit} {what} (geometric mean, t interval on log ratios)")


_NO_PAIRS = "undecided: the eval rows carry no per-prompt or per-episode times to pair"


def target_gain_claim(env: str, where: str, estimate, evidence: str) -> dict:
    """Verdict ``ltd_beats_best_static_<env>``: the paired speed ratio of LTD over the
    grid-best static tree (``estimate``, a `verdicts.Estimate` or None) lies above
    `LTD_TARGET_GAIN` (the stated LTD target)."""
    from specloop.report.verdicts import measured_claim
    return measured_claim(
        f"ltd_beats_best_static_{env}",
        f"LTD: learned depth + size policies >= {LTD_TARGET_GAIN:.2f}x the tokens/s of the best "
        f"grid-searched static tree ({where})", estimate, null=1.0, claimed_size=LTD_TARGET_GAIN,
        evidence=evidence, why_missing=f"{_NO_PAIRS}; {evidence}", wall_clock=env == "real")


def cotraining_claim(env: str, estimate, evidence: str) -> dict:
    """Verdict ``ltd_cotraining_helps_<env>``: the paired speed ratio co-trained /
    independently trained pair (``estimate``) lies above 1 (``env``: "sim" or "real")."""
    from specloop.report.verdicts import measured_claim
    where = {"sim": "simulated", "real": "real decoder"}.get(env, env)
    return measured_claim(
        f"ltd_cotraining_helps_{env}",
        f"LTD: alternating co-training beats the independently trained pair ({where})", estimate,
        null=1.0, evidence=f"{evidence} ({where})", why_missing=f"{_NO_PAIRS}; {evidence} ({where})",
        wall_clock=env == "real")


def _discrete_bars(ax, values: dict[str, list[int]]) -> None:
    """Side-by-side bars of the fraction of cycles at each integer value, per label."""
    support = sorted({v for vals in values.values() for v in vals})
    if not support:
        return
    x = np.arange(len(support))
    width = 0.8 / max(1, len(values))
    for i, (label, vals) in enumerate(values.items()):
        counts = np.array([vals.count(v) for v in support], dtype=float)
        ax.bar(x + i * width, counts / max(1, len(vals)), width=width, color=f"C{i}", label=label)
    step = max(1, len(support) // 12)
    ax.set_xticks(x[::step] + 0.4 - width / 2, [str(v) for v in support[::step]], fontsize=7)


def _plot(result: dict, decisions: list[dict], out: Path) -> list[Path]:
    fig, axes = new_figure(ncols=3, width=4.6, height=3.9)
    labels = [r["config"] for r in result["rows"]]
    show = [l for l in labels if l.startswith("LTD") or l.startswith("static")]
    for key, ax in (("tree_depth", axes[0]), ("verify_size", axes[1])):
        _discrete_bars(ax, {label: [int(d[key]) for d in decisions if d["config"] == label]
                            for label in show})
    axes[0].set(xlabel="draft depth D (tokens)", ylabel="fraction of cycles",
                title="depth distribution")
    axes[1].set(xlabel="verification size V (tokens)", ylabel="fraction of cycles",
                title="verification-size distribution")
    for ax in axes[:2]:
        ax.legend(fontsize=7)
    gains = [r["speedup_vs_best_static"] for r in result["rows"]]
    y = np.arange(len(labels))
    axes[2].barh(y, gains, color=["C0" if l.startswith("LTD") else "C7" for l in labels])
    axes[2].axvline(1.0, color="k", lw=0.8)
    axes[2].axvline(LTD_TARGET_GAIN, color="C3", lw=0.8, ls=":")
    axes[2].set_yticks(y, labels, fontsize=7)
    axes[2].invert_yaxis()
    lo = min(gains + [1.0])
    axes[2].set(xlim=(max(0.0, lo - 0.1), max(gains + [LTD_TARGET_GAIN]) + 0.05),
                xlabel="tokens/s / best static tree", title="ablations (simulator)")
    return save_figure(fig, out, NAME)


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Train (if needed) and evaluate LTD in the simulator; save and plot figure (e).

    Raises:
        FigureUnavailable: `specloop.ltd.policy` or `specloop ltd` is missing.
    """
    cfg = sizes(SIZES, quick)
    out = Path(out_dir)
    ltd = require("specloop.ltd.policy", "load_policy", why="LTD policies")
    if _saved_policy_exists(ltd):
        name = SAVED_POLICY
        result = _evaluate(name, cfg, out)
    else:
        with _policy_dir(out.resolve() / "policies"):
            name = _train_own(cfg, out)
            result = _evaluate(name, cfg, out)
    write_json(out / "ltd_eval_sim.json", result)
    decisions = _decisions(out)
    cols = ("config", "mean_accepted_length", "tokens_per_s", "speedup_vs_best_static",
            "mean_depth", "mean_verify_size")
    table = [{c: r.get(c) for c in cols} for r in result["rows"]]
    data = [write_csv(out / f"{NAME}_rows.csv", table), out / "eval" / "ltd_decisions_sim.csv"]
    images = _plot(result, decisions, out)
    overhead = result.get("policy_overhead", {}).get("overhead_fraction")
    return FigureResult(
        name=NAME, title="LTD: depth / verification-size distributions and ablations (simulator)",
        data_paths=data, image_paths=images, claims=_claims(result), table=table,
        numbers={"policy": name, "episodes": cfg["episodes"],
                 "best_static_depth": result["best_static"]["depth"],
                 "best_static_verify_size": result["best_static"]["verify_size"],
                 "policy_overhead_fraction": overhead},
        notes=[f"Policies: {name} ({'saved / shipped ltd-sim' if name == SAVED_POLICY else 'trained by this figure with specloop ltd train'}).",
               f"Cost source of the simulated tree world: {result.get('cost_source', 'unknown')}.",
               "Real-decoder and replay LTD rows (transfer, fine-tuning) are figure ltd_real."])
