"""Figures: one module per figure, each ``main(out_dir, quick=False) -> FigureResult``
(compute -> save data as .csv/.npz/.json -> plot PNG + SVG with matplotlib Agg).

====================  ===========================================================  ===========
name                  what it shows                                                inputs
====================  ===========================================================  ===========
``theory_vs_sim``     tokens per round n_t and speedup vs acceptance rate and k:    theory, sim
                      theory curves, simulated points with error bars, Lemma 1 /
                      Theorem 1 bounds (OnlineSpec Sec. 2)
``optimal_k``         exact argmax of the speedup over k vs Corollary 4's closed    theory
                      form, and the closed form's efficiency
``regret``            dynamic regret vs T per learner and scenario (log-log) with   strategies
                      fitted and predicted slopes (Corollaries 1-3)
``online_stream``     mean accepted length and tokens/s per chunk over a real       realmodels
                      prompt stream, frozen vs online drafts (OnlineSpec Fig. 3)    (+ stream)
``online_substream``  tau per chunk over a held-out ShareGPT sub-stream (answers   realmodels
                      rebuilt by prefill, replayed): frozen Hydra vs Opt-Hydra      (+ stream scale)
``table1``            OnlineSpec Table 1 from the committed stream-scale replays   results/
                      (``results/stream_scale*``): gains over frozen drafts with
                      intervals, tau against T; nothing recomputed
``ltd``               LTD depth / verification-size distributions, ablation bars   ltd
                      (simulator)
``ltd_real``          LTD on the real decoder: paired speedups over the best        ltd, realmodels
                      static tree, replay of recorded rounds, transfer
``speedup_table``     real-model speedup against HF's modes (greedy, prompt         realmodels
                      lookup, assisted generation)
====================  ===========================================================  ===========

Shared modules: `_base` (`FigureResult`, `FigureUnavailable`, `require`, the CSV / NPZ /
PNG + SVG save helpers) and `_real` (held-out prompts as token ids, timed runs of HF
``generate`` modes and of the specloop decoder for the real-model figures).

`specloop.figures` may import every other layer (docs/design.md, section
"Architecture"); nothing imports it
except `specloop.cli`.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from specloop.figures._base import FigureResult, FigureUnavailable

__all__ = ["FIGURES", "FigureResult", "FigureUnavailable", "figure_names", "run_figure"]

# name -> (module, one-line description); order = report order.
FIGURES: dict[str, tuple[str, str]] = {
    "theory_vs_sim": ("specloop.figures.theory_vs_sim",
                      "tokens per round and speedup vs acceptance rate and k"),
    "optimal_k": ("specloop.figures.optimal_k",
                  "optimal k: exact argmax vs Corollary 4's closed form"),
    "regret": ("specloop.figures.regret",
               "dynamic regret vs T per learner and scenario"),
    "online_stream": ("specloop.figures.online_stream",
                      "per-chunk mean accepted length and tokens/s, frozen vs online"),
    "online_substream": ("specloop.figures.online_substream",
                         "held-out sub-stream replay: tau per chunk, frozen Hydra vs Opt-Hydra"),
    "table1": ("specloop.figures.table1",
               "Table 1 from the committed replays: online vs frozen gains with intervals"),
    "ltd": ("specloop.figures.ltd",
            "LTD depth / verification-size distributions and ablations"),
    "ltd_real": ("specloop.figures.ltd_real",
                 "LTD on the real decoder: paired speedups, replay, transfer"),
    "speedup_table": ("specloop.figures.speedup_table",
                      "real-model speedup against HF's decoding modes"),
}


def figure_names() -> list[str]:
    """Registry names, in report order."""
    return list(FIGURES)


def run_figure(name: str, out_dir: str | os.PathLike, quick: bool = False) -> FigureResult:
    """Run one figure's ``main`` into ``out_dir``.

    Raises:
        ValueError: unknown figure name.
        FigureUnavailable: the figure's inputs are not available (reason in message),
            including a ``specloop.*`` module that does not exist yet.
    """
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    module = importlib.import_module(FIGURES[name][0])
    try:
        result = module.main(Path(out_dir), quick=quick)
    except ModuleNotFoundError as exc:
        # a specloop module that another part has not landed yet (e.g. imported by a
        # registry that is being built): the figure's input is missing, not broken
        if (exc.name or "").startswith("specloop."):
            raise FigureUnavailable(f"{exc.name} is not available yet ({exc})") from exc
        raise
    if not isinstance(result, FigureResult):
        raise TypeError(f"figure {name!r} returned {type(result).__name__}, not FigureResult")
    return result
