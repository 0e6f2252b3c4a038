"""Figure (a): tokens per round n_t and speedup gamma against the acceptance rate
Acc and the chain length k — theory curves, simulated points with error bars, and
the Lemma 1 / Theorem 1 bounds (OnlineSpec Sec. 2.2; Leviathan et al. 2023 Eq. (1)).

Counting: n_t = committed tokens (accepted draft tokens + 1), the "committed"
convention of `specloop.theory.tokens`.

Draft/target pairs with a chosen Acc: p_target is a Zipf-shaped distribution over V
tokens; q_draft = (1 - lam) p_target + lam u with u a point mass on p's rarest token
(a draft confidently wrong part of the time), so TV(p, q) = lam TV(p, u) and
Acc = 1 - lam TV(p, u) exactly. The
simulator (`specloop.sim`) runs real speculative-sampling rounds on each pair: the
points are the simulated mean n_t with 95 % error bars (1.96 standard errors).

Bounds: with a fixed draft and comparators that match the target exactly, the
dynamic regret of T rounds under cross-entropy loss is T * KL(p || q) (OnlineSpec
Eq. (4)), which gives Lemma 1's per-round lower bound (k+1)/(1+(k+1) sqrt(KL/2)) and
Theorem 1's speedup bounds, drawn for each simulated pair.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from specloop.figures._base import (FigureResult, new_figure, require, save_figure, sizes,
                                    write_csv)

__all__ = ["main", "SIZES", "make_pair"]

NAME = "theory_vs_sim"

SIZES = {
    "full": {"vocab": 256, "acceptance_rates": np.linspace(0.1, 0.95, 12),
             "ks": (1, 2, 4, 8), "rounds": 20000, "cost_ratio": 0.1, "k_grid": 16},
    "quick": {"vocab": 128, "acceptance_rates": np.linspace(0.1, 0.95, 7),
              "ks": (1, 2, 4, 8), "rounds": 4000, "cost_ratio": 0.1, "k_grid": 12},
    "tiny": {"vocab": 16, "acceptance_rates": np.array([0.3, 0.8]),
             "ks": (1, 4), "rounds": 300, "cost_ratio": 0.1, "k_grid": 6},
}


def make_pair(vocab: int, acceptance_rate: float, zipf_exponent: float = 1.1
              ) -> tuple[np.ndarray, np.ndarray]:
    """A (p_target, q_draft) pair over ``vocab`` tokens with Acc = ``acceptance_rate``.

    Returns:
        two float64 arrays of shape (vocab,), each summing to 1.
    Raises:
        ValueError: vocab < 2, or Acc below what the construction reaches
            (p's smallest probability).
    """
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p_target = ranks ** -zipf_exponent
    p_target /= p_target.sum()
    u = np.zeros(vocab)
    u[-1] = 1.0  # all of u's mass on p's rarest token
    tv = 0.5 * np.abs(p_target - u).sum()
    lam = (1.0 - acceptance_rate) / tv
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"acceptance_rate {acceptance_rate} not reachable with vocab {vocab} "
                         f"(minimum {1.0 - tv:.3f})")
    q_draft = (1.0 - lam) * p_target + lam * u
    return p_target, q_draft / q_draft.sum()


def _simulate(p_target: np.ndarray, q_draft: np.ndarray, k: int, rounds: int, seed: int
              ) -> np.ndarray:
    """Committed tokens n_t of ``rounds`` simulated chain rounds (int64 (rounds,)):
    full-vocabulary speculative sampling (`specloop.sim.rounds.simulate_chain_tables`)
    with the same p/q at every position (Assumption 1, ``iid=True``)."""
    rounds_mod = require("specloop.sim.rounds", "simulate_chain_tables",
                         why="simulated chain rounds")
    batch = rounds_mod.simulate_chain_tables(
        p_target[None, :], q_draft[None, :], np.zeros(rounds, dtype=np.int64), k,
        np.random.default_rng(seed), mode="sampling", iid=True)
    return np.asarray(batch.tokens_per_round)


def _compute(cfg: dict) -> list[dict]:
    theory = require("specloop.theory", "acceptance_rate", "kl_divergence",
                     "expected_tokens_chain", "speedup_linear", "lemma1_bounds",
                     "theorem1_bounds", why="theory curves and bounds")
    rows = []
    seed = 0
    for acc_target in cfg["acceptance_rates"]:
        p_target, q_draft = make_pair(cfg["vocab"], float(acc_target))
        acc = float(theory.acceptance_rate(p_target, q_draft))
        kl = float(theory.kl_divergence(p_target, q_draft))
        for k in list(cfg["ks"]) + [kk for kk in range(cfg["k_grid"] + 1)
                                     if kk not in cfg["ks"] and _on_k_panel(acc_target, cfg)]:
            seed += 1
            tokens = _simulate(p_target, q_draft, k, cfg["rounds"], seed)
            rows.append(_row(theory, acc, kl, k, tokens, cfg["cost_ratio"]))
    return rows


def _on_k_panel(acc_target: float, cfg: dict) -> bool:
    """The acceptance rates whose whole k range is simulated (speedup-vs-k panel)."""
    rates = np.asarray(cfg["acceptance_rates"])
    chosen = rates[[len(rates) // 2, -1]] if len(rates) > 1 else rates
    return bool(np.isclose(chosen, acc_target).any())


def _row(theory, acc: float, kl: float, k: int, tokens: np.ndarray, cost_ratio: float) -> dict:
    rounds = tokens.size
    mean = float(tokens.mean())
    se = float(tokens.std(ddof=1) / np.sqrt(rounds)) if rounds > 1 else float("nan")
    lo, hi = theory.lemma1_bounds(rounds * kl, rounds, k)
    glo, ghi = theory.theorem1_bounds(rounds * kl, rounds, k, cost_ratio)
    scale = 1.0 / (cost_ratio * k + 1.0)
    return {
        "num_draft_tokens": k, "acceptance_rate": acc, "kl_divergence": kl, "rounds": rounds,
        "sim_tokens_per_round": mean, "sim_standard_error": se,
        "theory_tokens_per_round": float(theory.expected_tokens_chain(acc, k)),
        "lemma1_lower": float(lo) / rounds, "lemma1_upper": float(hi) / rounds,
        "cost_ratio": cost_ratio, "sim_speedup": mean * scale, "sim_speedup_se": se * scale,
        "theory_speedup": float(theory.speedup_linear(acc, k, cost_ratio)),
        "theorem1_lower": float(glo), "theorem1_upper": float(ghi),
    }


def _claims(rows: list[dict]) -> list[dict]:
    """Simulation vs theory (z-test, Bonferroni over all points at family-wise 1e-3)
    and the Lemma 1 / Theorem 1 bounds against the simulated means."""
    z = np.array([(r["sim_tokens_per_round"] - r["theory_tokens_per_round"])
                  / max(r["sim_standard_error"], 1e-12) for r in rows])
    z_crit = float(stats.norm.ppf(1.0 - 1e-3 / (2 * len(rows))))
    worst = int(np.argmax(np.abs(z)))
    lemma_bad = [r for r in rows if r["sim_tokens_per_round"] + z_crit * r["sim_standard_error"]
                 < r["lemma1_lower"] or r["sim_tokens_per_round"] > r["lemma1_upper"] + 1e-12]
    thm_bad = [r for r in rows if r["sim_speedup"] + z_crit * r["sim_speedup_se"]
               < r["theorem1_lower"] or r["sim_speedup"] > r["theorem1_upper"] + 1e-12]
    tightness = min(r["lemma1_lower"] / r["theory_tokens_per_round"] for r in rows)
    return [
        {"claim": "sim_matches_theory_tokens",
         "statement": "E[n_t] = (1 - Acc^(k+1)) / (1 - Acc) under Assumption 1 (Leviathan et al. Eq. 1)",
         "holds": bool(np.abs(z).max() <= z_crit),
         "evidence": f"{len(rows)} (Acc, k) points; max |z| = {np.abs(z).max():.2f} "
                     f"(k={rows[worst]['num_draft_tokens']}, Acc={rows[worst]['acceptance_rate']:.3f}) "
                     f"vs critical {z_crit:.2f}"},
        {"claim": "lemma1_bounds_simulated",
         "statement": "Lemma 1: (k+1)T/(1+(k+1)sqrt(Reg_T/2T)) <= E|x| <= (k+1)T",
         "holds": not lemma_bad,
         "evidence": f"{len(lemma_bad)} of {len(rows)} points outside; tightest lower bound / "
                     f"theory = {tightness:.3f}"},
        {"claim": "theorem1_bounds_simulated",
         "statement": "Theorem 1: speedup between the regret lower bound and (k+1)/(cost_ratio k+1)",
         "holds": not thm_bad,
         "evidence": f"{len(thm_bad)} of {len(rows)} points outside"},
    ]


def _plot(rows: list[dict], cfg: dict, out_dir: Path) -> list[Path]:
    theory = require("specloop.theory", "expected_tokens_chain", "speedup_linear")
    fig, axes = new_figure(ncols=3, width=4.6, height=3.8)
    acc_grid = np.linspace(0.0, 0.999, 200)
    colors = dict(zip(cfg["ks"], ["C0", "C1", "C2", "C3", "C4", "C5"]))
    for k in cfg["ks"]:
        pts = sorted((r for r in rows if r["num_draft_tokens"] == k),
                     key=lambda r: r["acceptance_rate"])
        acc = np.array([r["acceptance_rate"] for r in pts])
        for ax, (key, se, curve, lo, hi) in zip(axes[:2], [
                ("sim_tokens_per_round", "sim_standard_error",
                 theory.expected_tokens_chain(acc_grid, k), "lemma1_lower", "lemma1_upper"),
                ("sim_speedup", "sim_speedup_se",
                 theory.speedup_linear(acc_grid, k, cfg["cost_ratio"]),
                 "theorem1_lower", "theorem1_upper")]):
            c = colors[k]
            ax.plot(acc_grid, curve, color=c, lw=1.2, label=f"k={k} theory")
            ax.errorbar(acc, [r[key] for r in pts], yerr=[1.96 * r[se] for r in pts],
                        fmt="o", ms=3.5, color=c, capsize=2)
            ax.plot(acc, [r[lo] for r in pts], ls="--", color=c, lw=0.9, alpha=0.8)
            ax.axhline(pts[0][hi] if pts else np.nan, ls=":", color=c, lw=0.8, alpha=0.6)
    axes[0].set(xlabel="acceptance rate Acc", ylabel="tokens per round n_t (committed)",
                title="tokens per round: theory, sim (95% CI), Lemma 1 (--)")
    axes[1].set(xlabel="acceptance rate Acc", ylabel=f"speedup (cost ratio {cfg['cost_ratio']})",
                title="speedup: theory, sim, Theorem 1 bounds")
    axes[0].legend(fontsize=7)
    _plot_vs_k(axes[2], rows, cfg, theory)
    return save_figure(fig, out_dir, NAME)


def _plot_vs_k(ax, rows: list[dict], cfg: dict, theory) -> None:
    k_grid = np.arange(cfg["k_grid"] + 1)
    for i, acc in enumerate(sorted({round(r["acceptance_rate"], 6) for r in rows
                                    if r["num_draft_tokens"] == 0} or set())):
        pts = sorted((r for r in rows if abs(r["acceptance_rate"] - acc) < 1e-6),
                     key=lambda r: r["num_draft_tokens"])
        c = f"C{i + 4}"
        ax.plot(k_grid, theory.speedup_linear(acc, k_grid, cfg["cost_ratio"]), color=c,
                label=f"Acc={acc:.2f} theory")
        ax.errorbar([r["num_draft_tokens"] for r in pts], [r["sim_speedup"] for r in pts],
                    yerr=[1.96 * r["sim_speedup_se"] for r in pts], fmt="o", ms=3.5,
                    color=c, capsize=2)
    ax.set(xlabel="chain length k (num_draft_tokens)", ylabel="speedup",
           title=f"speedup vs k (cost ratio {cfg['cost_ratio']})")
    ax.legend(fontsize=7)


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Compute, save (``theory_vs_sim.csv``) and plot (PNG + SVG) figure (a).

    Raises:
        FigureUnavailable: `specloop.theory` or the simulator's chain rounds are missing.
    """
    cfg = sizes(SIZES, quick)
    out = Path(out_dir)
    rows = _compute(cfg)
    data = write_csv(out / f"{NAME}.csv", rows)
    images = _plot(rows, cfg, out)
    claims = _claims(rows)
    main_rows = [r for r in rows if r["num_draft_tokens"] in cfg["ks"]]
    table = [{k: r[k] for k in ("num_draft_tokens", "acceptance_rate", "theory_tokens_per_round",
                                "sim_tokens_per_round", "sim_standard_error", "lemma1_lower",
                                "theory_speedup", "sim_speedup", "theorem1_lower")}
             for r in main_rows]
    return FigureResult(
        name=NAME, title="tokens per round and speedup vs acceptance rate and k",
        data_paths=[data], image_paths=images, table=table, claims=claims,
        numbers={"points": len(rows), "rounds_per_point": cfg["rounds"], "vocab": cfg["vocab"],
                 "cost_ratio": cfg["cost_ratio"]},
        notes=["n_t counts committed tokens (accepted + 1).",
               "Simulated points: specloop.sim chain speculative sampling on exact p/q pairs; "
               "error bars 1.96 standard errors.",
               "Lemma 1 / Theorem 1 lower bounds use Reg_T = T KL(p||q) (fixed draft, "
               "comparator matching the target)."])
