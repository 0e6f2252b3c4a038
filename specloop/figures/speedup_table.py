"""Figure (f): real-model speedup table against HF's decoding modes, on the embedded
SmolLM2-135M-Instruct target with held-out HumanEval and MT-bench prompts.

Source: ``benchmarks/decode.py`` (the decoding-speed benchmark: repeats, medians, float32 and
bfloat16), run as a subprocess into the figure's folder, when the checkout has it;
otherwise the same kind of measurement made here (one pass per method):

Measured in one run, same machine, same prompts, greedy decoding: HF ``generate``
(plain greedy: the baseline of every speedup), HF prompt lookup
(``prompt_lookup_num_tokens``), and the specloop decoder with every drafter that is
available without training (n-gram prompt lookup as a chain and as a tree of several
continuations; trained heads when a trained checkpoint is already saved). Each
specloop row also says whether its output is token-for-token identical to HF greedy
(the decoder is lossless: it must be, in float32).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specloop.figures._base import (FigureResult, FigureUnavailable, fmt, new_figure, require,
                                    save_figure, scale, sizes, write_csv)
from specloop.figures._real import (DEFAULT_TARGET, heldout_prompt_ids, load_target,
                                    saved_drafters, time_hf_generate, time_specloop)

__all__ = ["main", "SIZES", "TARGET_VS_PROMPT_LOOKUP"]

NAME = "speedup_table"
TARGET_VS_PROMPT_LOOKUP = 1.3  # stated target: specloop tree n-gram >= 1.3x HF prompt lookup

# benchmarks/decode.py arguments per scale (its defaults at full scale).
DECODE_ARGS = {
    "full": [],
    "quick": ["--quick", "--lookup-tokens", "10", "--max-verify", "8"],
    "tiny": ["--prompts", "1", "--repeats", "1", "--max-new-tokens", "8", "--verify-repeats", "1",
             "--max-verify", "2", "--lookup-tokens", "3", "--dtypes", "float32"],
}
TREE_METHODS = ("specloop_tree_ngram", "specloop-ngram-tree")
LOOKUP_PREFIXES = ("hf_prompt_lookup", "hf-prompt-lookup")

SIZES = {
    "full": {"dtypes": ("float32", "bfloat16"), "prompts": {"humaneval": 8, "mt-bench": 8},
             "max_new_tokens": 128, "chain_k": 8, "head_k": 4, "tree": (4, 1, 1, 1, 1, 1, 1, 1)},
    "quick": {"dtypes": ("float32",), "prompts": {"humaneval": 3, "mt-bench": 2},
              "max_new_tokens": 64, "chain_k": 8, "head_k": 4, "tree": (4, 1, 1, 1, 1, 1, 1, 1)},
    "tiny": {"dtypes": ("float32",), "prompts": {"humaneval": 1, "mt-bench": 1},
             "max_new_tokens": 12, "chain_k": 4, "head_k": 3, "tree": (2, 1, 1, 1)},
}


def _specloop_methods(target, cfg: dict) -> list[tuple[str, object]]:
    """(name, make_decoder) for every specloop configuration measured."""
    decoder_mod = require("specloop.realmodels.decoder", "SpeculativeDecoder",
                          why="the real-model decoder")
    registry = require("specloop.realmodels.registry.drafters", "make_drafter")
    policy_mod = require("specloop.realmodels.policy", "FixedDraftPolicy")
    from specloop.strategies.base import TreePlan

    def factory(drafter: str, policy):
        return lambda: decoder_mod.SpeculativeDecoder(
            target, registry.make_drafter(drafter, target, train_if_missing=False,
                                          progress=False), policy=policy)

    methods = [
        (f"specloop_chain_ngram_k{cfg['chain_k']}",
         factory("ngram", policy_mod.FixedDraftPolicy(cfg["chain_k"]))),
        ("specloop_tree_ngram",
         factory("ngram", policy_mod.FixedDraftPolicy(tree=TreePlan(branching=cfg["tree"])))),
    ]
    for name in saved_drafters(target):
        methods.append((f"specloop_chain_{name}_k{cfg['head_k']}",
                        factory(name, policy_mod.FixedDraftPolicy(cfg["head_k"]))))
    return methods


def _measure(dtype: str, cfg: dict) -> list[dict]:
    target = load_target(DEFAULT_TARGET, dtype=dtype)
    prompts = [ids for _, ids in heldout_prompt_ids(target.tokenizer, cfg["prompts"])]
    n_new = cfg["max_new_tokens"]
    runs = [time_hf_generate(target, prompts, n_new, "hf_greedy"),
            time_hf_generate(target, prompts, n_new, "hf_prompt_lookup",
                             prompt_lookup_num_tokens=10)]
    for name, make in _specloop_methods(target, cfg):
        runs.append(time_specloop(make, prompts, n_new, name))
    base, lookup = runs[0], runs[1]
    rows = []
    for run in runs:
        rows.append({
            "method": run.method, "dtype": dtype, "prompts": len(prompts),
            "new_tokens": run.new_tokens, "seconds": run.seconds,
            "tokens_per_s": run.tokens_per_s,
            "mean_accepted_length": run.mean_accepted_length,
            "speedup": run.tokens_per_s / base.tokens_per_s,
            "speedup_vs_prompt_lookup": run.tokens_per_s / lookup.tokens_per_s,
            "identical_to_greedy": run.outputs == base.outputs,
        })
    return rows


def decode_script() -> Path | None:
    """``benchmarks/decode.py`` of the checkout specloop runs from, or None (an
    installed package without the benchmarks folder)."""
    import specloop
    path = Path(specloop.__file__).resolve().parents[1] / "benchmarks" / "decode.py"
    return path if path.is_file() else None


def _from_decode_benchmark(script: Path, quick: bool, out: Path) -> list[dict]:
    """Run ``benchmarks/decode.py`` (a subprocess; its per-method progress goes to
    stderr) into ``out`` and turn its JSON into table rows.

    Raises:
        RuntimeError: the benchmark exits non-zero.
    """
    import subprocess
    import sys
    result_path = out / "decode.json"
    argv = [sys.executable, str(script), "--out", str(result_path),
            "--verify-out", str(out / "decode_verify_cost.json"), *DECODE_ARGS[scale(quick)]]
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL)  # stderr inherited: progress lines
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}")
    data = json.loads(result_path.read_text(encoding="utf-8"))
    rows = []
    prompts = len(data.get("meta", {}).get("prompts", []))
    for dtype, table in data["results"].items():
        for method, row in table.items():
            rows.append({"method": method, "dtype": dtype, "prompts": prompts,
                         "new_tokens": row.get("new_tokens"), "tokens_per_s": row["tokens_per_s"],
                         "mean_accepted_length": row.get("mean_accepted_length"),
                         "speedup": row["speedup"],
                         "speedup_vs_prompt_lookup": row.get("vs_hf_prompt_lookup"),
                         "speedup_vs_best_plain": row.get("speedup_vs_best_plain"),
                         "identical_to_greedy": None,
                         "tokens_per_s_per_prompt": row.get("tokens_per_s_per_prompt")})
    return rows


def _paired_vs_lookup(tree: dict, rows: list[dict]):
    """Per (repeat, prompt) tokens/s ratios of ``tree`` over the fastest HF prompt-lookup
    row of its dtype, as an `Estimate` (None when either row has no per-prompt times)."""
    from specloop.report.verdicts import ratio_estimate
    lookups = [r for r in rows if r["dtype"] == tree["dtype"] and r["method"].startswith(LOOKUP_PREFIXES)]
    if not lookups:
        return None, "no HF prompt-lookup row"
    lookup = max(lookups, key=lambda r: r["tokens_per_s"])
    mine, theirs = tree.get("tokens_per_s_per_prompt"), lookup.get("tokens_per_s_per_prompt")
    if not mine or not theirs:
        return None, "no per-prompt times in this measurement (one pooled pass)"
    ratios = [a / b for rep_a, rep_b in zip(mine, theirs) for a, b in zip(rep_a, rep_b)]
    return ratio_estimate(ratios, f"paired per-(pass, prompt) tokens/s ratio {tree['method']} / "
                                  f"{lookup['method']} (geometric mean, t interval on log ratios)"), ""


def _claims(rows: list[dict]) -> list[dict]:
    from specloop.report.verdicts import measured_claim
    claims = []
    for dtype in sorted({r["dtype"] for r in rows}):
        tree = [r for r in rows if r["dtype"] == dtype and r["method"] in TREE_METHODS]
        if tree:
            r = tree[0]
            estimate, why = _paired_vs_lookup(r, rows)
            evidence = (f"pooled {fmt(r['speedup_vs_prompt_lookup'], 2)}x HF prompt lookup, "
                        f"{r['speedup']:.2f}x HF greedy ({dtype}, {r['prompts']} prompts)")
            claims.append(measured_claim(
                f"tree_ngram_vs_hf_prompt_lookup_{dtype}",
                f"target: specloop's n-gram tree >= {TARGET_VS_PROMPT_LOOKUP}x HF "
                "prompt lookup on SmolLM2-135M", estimate, null=1.0, claimed_size=TARGET_VS_PROMPT_LOOKUP,
                evidence=evidence, why_missing=f"undecided: {why}; {evidence}", wall_clock=True))
    spec = [r for r in rows if r["method"].startswith("specloop") and r["dtype"] == "float32"
            and r.get("identical_to_greedy") is not None]
    if spec:
        claims.append({
            "claim": "lossless_greedy_float32",
            "statement": "speculative decoding is lossless: greedy output identical to the target's",
            "holds": all(r["identical_to_greedy"] for r in spec),
            "evidence": ", ".join(f"{r['method']}: {'identical' if r['identical_to_greedy'] else 'DIFFERS'}"
                                  for r in spec)})
    return claims


def _plot(rows: list[dict], out: Path) -> list[Path]:
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = new_figure(ncols=len(dtypes), width=6.0, height=3.8)
    for ax, dtype in zip(axes, dtypes):
        sub = [r for r in rows if r["dtype"] == dtype]
        y = np.arange(len(sub))
        ax.barh(y, [r["speedup"] for r in sub],
                color=["C7" if r["method"].startswith("hf") else "C0" for r in sub])
        ax.set_yticks(y, [r["method"] for r in sub], fontsize=7)
        ax.axvline(1.0, color="k", lw=0.8)
        for yi, r in zip(y, sub):
            ax.text(r["speedup"], yi, f" {r['speedup']:.2f}x ({r['tokens_per_s']:.1f} tok/s)",
                    va="center", fontsize=7)
        ax.set(xlabel="speedup vs HF greedy (tokens/s ratio)",
               title=f"{DEFAULT_TARGET}, {dtype}")
        ax.invert_yaxis()
        ax.set_xlim(0, max(r["speedup"] for r in sub) * 1.45)
    return save_figure(fig, out, NAME)


def main(out_dir: str | Path, quick: bool = False) -> FigureResult:
    """Measure, save (``speedup_table.csv``) and plot figure (f).

    Raises:
        FigureUnavailable: the decoder, the model package or the prompt datasets
            are missing.
    """
    cfg = sizes(SIZES, quick)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    script = decode_script()
    if script is not None:
        load_target(DEFAULT_TARGET)  # FigureUnavailable (not a subprocess error) if missing
        rows = _from_decode_benchmark(script, quick, out)
        source = f"benchmarks/decode.py {' '.join(DECODE_ARGS[scale(quick)])}".strip()
    else:
        rows = [row for dtype in cfg["dtypes"] for row in _measure(dtype, cfg)]
        source = "measured by this figure (benchmarks/decode.py not present)"
    if not rows:
        raise FigureUnavailable("no measurement rows")
    data = write_csv(out / f"{NAME}.csv", rows, [k for k in rows[0] if k != "tokens_per_s_per_prompt"])
    images = _plot(rows, out)
    cols = ("method", "dtype", "tokens_per_s", "mean_accepted_length", "speedup",
            "speedup_vs_prompt_lookup", "identical_to_greedy")
    base = next(r for r in rows if r["method"] in ("hf_greedy", "hf-greedy"))
    return FigureResult(
        name=NAME, title="real-model speedup vs HF decoding modes (SmolLM2-135M, greedy)",
        data_paths=[data], image_paths=images, claims=_claims(rows),
        table=[{c: r.get(c) for c in cols} for r in rows],
        numbers={"prompts": rows[0]["prompts"], "hf_greedy_tokens_per_s": base["tokens_per_s"],
                 "source": source},
        notes=[f"Source: {source}.",
               "Speedup = tokens/s of the method / tokens/s of HF greedy generate in the same "
               "precision, same run; timing covers each whole generate call (prefill included).",
               "speedup_vs_prompt_lookup: against the best HF prompt-lookup setting measured.",
               "At --quick, benchmarks/decode.py times only the rows a reader compares (its QUICK_METHODS: "
               "HF greedy and prompt lookup, specloop plain, the n-gram tree and learned chain, the Hydra "
               "chain and tree, the hybrid); the full run times every method.",
               "mean_accepted_length = committed tokens per round (specloop rows only).",
               "HF assisted generation needs a separate small draft model with the target's "
               "tokenizer (benchmarks/decode.py --draft-model); none ships in a package."])
