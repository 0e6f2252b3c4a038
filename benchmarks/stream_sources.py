"""Draft sources on one long recorded stream: tau, priced and wall-clock tokens/s, Hedge's
regret, the Arctic peer and the suffix tree's learning curve.

Stream: a `specloop stream record` recording (default ``/work/recordings/sharegpt3x400``:
1200 held-out ShareGPT first turns in three topic domains, 400 each, domain-shift order,
SmolLM2-135M float32 greedy, 128 new tokens). Three parts, one run:

1. **Replay** (exact for greedy, `specloop.realmodels.streams.replay.ReplayDecoder`) over the whole
   recording in stream order, each method with ONE drafter object across the stream (as
   `specloop.realmodels.streams.runner.StreamRunner` serves it): every source alone -- ``ngram``
   (context n-gram trie), ``ngram-learned`` (n-gram chain whose length `LookupLength`
   learns from the verifier), ``datastore`` (REST-style index of the warm-up corpus +
   context), ``suffix`` (SuffixDecoding tree; ``suffix-chain`` its chain), ``eagle3`` (the
   shipped EAGLE-3 head, a chain) -- and Hedge over the model-free sources
   (``hedge-choose``, ``hedge-merge``: shadow feedback, one AdaHedge choice per request;
   ``hedge-choose-round`` / ``hedge-merge-round``: every source scored on the played
   rounds, the earlier design, for the comparison; ``hedge-sources`` = the stream method
   ``hedge:suffix@160us,ngram@70us``). EAGLE-3 cannot be a Hedge source (the hedge drafter
   refuses heads: a round they did not draft would corrupt their own cache). Rows: tau
   (``mean_accepted_length``, bonus included), verified nodes per round, priced tokens/s
   (drafting + updates measured, verification priced from the shipped cost table of each
   dtype) and its ratio to priced greedy, per domain and per ``--chunk`` requests. Rows whose
   drafting reads the cost table (cost rules, Hedge's loss) are replayed once per table
   (``--replay-tables``), tuned to the dtype they are priced in.
2. **Peer**: Arctic Inference 0.3.0's ``SuffixDecodingCache`` (`arctic_peer.build_arctic`,
   its C++ extension built here) served the same prompts and recorded responses in the same
   order at the same verify budget (``--budget`` nodes, chain and tree), tau of its proposals
   against the recorded continuation (`arctic_peer.replay`).
3. **Wall clock** on ``--wall-prompts`` prompts spread evenly over the domains, for each dtype
   in the same run: HF greedy, HF prompt lookup (``--lookup-tokens`` grid, the best one is the
   ``vs_hf_prompt_lookup`` denominator), each source alone and Hedge through the real
   decoder, all methods back to back per prompt in alternating order. Drafters that keep
   stream state (suffix, Hedge) start each wall prompt from the state the replay had reached
   at that prompt (`state_dict` snapshot, loaded untimed); the learned lengths likewise.
   The 1-minute load average before/after each dtype is in ``meta``: on the 2 shared cores
   the wall-clock ratios only mean something when it is low.

Targets (computed, never assumed): bf16 best of suffix / Hedge >= 2x HF greedy and
>= 1.3x the best HF prompt lookup (wall clock); suffix tau >= Arctic's at the same budget;
Hedge within 2 % of the best of its sources alone (priced tokens/s of the replay), and above
it when the best source changes between domains.

    python benchmarks/stream_sources.py --json [--recording DIR] [--limit-prompts N]
        [--wall-prompts 24] [--dtypes float32,bfloat16] [--out FILE]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_RECORDING = Path("/work/recordings/sharegpt3x400")
SOURCES = ("ngram", "ngram-learned", "datastore", "suffix", "suffix-chain", "eagle3")
HEDGES = ("hedge-choose", "hedge-merge", "hedge-sources")
#: the same Hedges scored with the mean per-round rate loss (``loss="rate"``), beside the
#: default throughput (Dinkelbach ratio) loss, for the comparison; not in the default rows
RATE_HEDGES = ("hedge-choose-rate", "hedge-merge-rate")
#: the same Hedges scored on the played rounds (``feedback="round"``, with the ratio loss)
#: instead of each source's own run (the default rows' shadow feedback): the comparison
ROUND_HEDGES = ("hedge-choose-round", "hedge-merge-round")
#: the model-free sources Hedge mixes (the plain-name rows above, same plans)
HEDGE_SOURCES = ("suffix", "ngram", "ngram-learned", "datastore")
#: rows whose rounds do not depend on the cost table (no cost rule, no Hedge loss): replayed once
TABLE_FREE = ("ngram", "datastore", "eagle3")
WALL_METHODS = ("ngram", "ngram-learned", "datastore", "suffix", "eagle3", "hedge-choose", "hedge-merge")
LOAD_NOTE = ("2 CPU cores shared with other jobs: wall-clock tokens/s and their ratios are meaningful only "
             "when the 1-minute load average stays low (below ~2.5) through a dtype's block")


# -- drafters and plans ----------------------------------------------------------------
class ChainPlanSource:
    """A source that always drafts a chain of ``k`` tokens whatever the round's plan (so the
    learned-length n-gram keeps its chain rule inside a Hedge whose plan is a tree)."""

    keeps_stream_state = False

    def __init__(self, inner, k: int):
        self.inner, self.k = inner, int(k)
        self.name = getattr(inner, "name", "chain")
        self.needs_target_hidden = tuple(getattr(inner, "needs_target_hidden", ()))

    def reset(self, prompt_ids, *, target_hidden=None):
        return self.inner.reset(prompt_ids, target_hidden=target_hidden)

    def propose(self, request):
        from specloop.strategies.base import DraftPlan
        return self.inner.propose(dataclasses.replace(request, plan=DraftPlan(self.k)))

    def observe(self, feedback):
        return self.inner.observe(feedback)

    def parameters(self):
        return []


def tree_plan(budget: int):
    from specloop.strategies.base import TreePlan
    return TreePlan(top_k=4, max_depth=budget, verify_size=budget)


def build_method(name: str, target, dtype: str, args, index):
    """(drafter, policy) of a method row; ``dtype`` picks the shipped verify-cost column the
    cost rules and Hedge's loss read (the EAGLE-3 head takes the target's own dtype).

    Raises:
        ValueError: an unknown method; FileNotFoundError: no shipped EAGLE-3 head."""
    from specloop.realmodels.drafters.datastore import DatastoreDrafter
    from specloop.realmodels.drafters.hedge import HEDGE_SOURCES_DRAFTER, HedgeDrafter
    from specloop.realmodels.drafters.ngram import NGramDrafter
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.drafters.suffix import SuffixDrafter, shipped_verify_cost
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.strategies.lookup_length import LookupLength
    cost = shipped_verify_cost(dtype)
    budget = args.budget
    tree = FixedDraftPolicy(budget, tree_plan(budget))
    if name == "ngram":
        return NGramDrafter(max_matches=4), tree
    if name == "ngram-learned":
        return NGramDrafter(length_model=LookupLength(cost, max_length=budget)), FixedDraftPolicy(budget)
    if name == "datastore":
        return DatastoreDrafter(index), tree
    if name == "suffix":
        return SuffixDrafter(dtype=dtype), tree
    if name == "suffix-chain":
        return SuffixDrafter(dtype=dtype), FixedDraftPolicy(budget)
    if name == "eagle3":
        model_dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")   # the head runs as the target
        head = make_drafter("eagle3", target, train_if_missing=False, progress=False, dtype=model_dtype)
        return head, FixedDraftPolicy(args.eagle3_k)
    if name in ("hedge-choose", "hedge-merge") + RATE_HEDGES + ROUND_HEDGES:
        parts = {n: build_method(n, target, dtype, args, index)[0] for n in HEDGE_SOURCES}
        parts["ngram-learned"] = ChainPlanSource(parts["ngram-learned"], budget)
        shadow = name in ("hedge-choose", "hedge-merge")
        drafter = HedgeDrafter(list(parts.values()), list(parts), verify_cost=cost, mode=name.split("-")[1],
                               feedback="shadow" if shadow else "round",
                               loss=None if shadow else "rate" if name.endswith("-rate") else "ratio",
                               max_nodes=budget, seed=0)
        return drafter, tree
    if name == "hedge-sources":
        return make_drafter(HEDGE_SOURCES_DRAFTER, target, dtype=dtype), tree
    raise ValueError(f"unknown method {name!r}; known: {', '.join(SOURCES + HEDGES + RATE_HEDGES + ROUND_HEDGES)}")


def _length_models(drafter) -> list:
    """The `LookupLength` objects inside ``drafter`` (a hedge's sources included)."""
    found = []
    for part in [drafter] + list(getattr(drafter, "sources", [])):
        part = getattr(part, "inner", part)
        if getattr(part, "length_model", None) is not None:
            found.append(part.length_model)
    return found


def snapshot(drafter) -> tuple:
    """What a drafter learned so far: its stream state (`state_dict`, when it keeps one)
    and copies of its learned-length models."""
    state = drafter.state_dict() if getattr(drafter, "keeps_stream_state", False) else None
    return state, [copy.deepcopy(m.__dict__) for m in _length_models(drafter)]


def restore(drafter, snap: tuple) -> None:
    """Put ``drafter`` back to a `snapshot` (the open request is closed first, so the last
    request served here does not join the restored global structure)."""
    state, lengths = snap
    if state is not None:
        for part in [drafter] + list(getattr(drafter, "sources", [])):
            if hasattr(part, "end_request"):
                part.end_request()
        drafter.load_state_dict(state)
    for model, saved in zip(_length_models(drafter), lengths):
        model.__dict__.update(copy.deepcopy(saved))


# -- part 1: replay ----------------------------------------------------------------------
def replay_method(name: str, rec, target, items, args, index, wall_indices: set, table: str = "float32") -> dict:
    """Replay ``items`` in order with one drafter whose cost rules / Hedge loss read the
    ``table`` dtype's verify costs; per-round columns, snapshots at the wall prompts and
    (Hedge) the cumulative losses after every prompt."""
    from specloop.realmodels.drafters.hedge import HedgeDrafter
    from specloop.realmodels.streams.replay import ReplayDecoder
    drafter, policy = build_method(name, target, table, args, index)
    cols = {k: [] for k in ("stream_index", "tokens", "verified", "nodes", "draft", "update")}
    snaps, hedge_losses = {}, []
    t0 = time.perf_counter()
    for item in items:
        if item.index in wall_indices:
            snaps[item.index] = snapshot(drafter)
        record = rec.prompt(item.index)
        decoder = ReplayDecoder(rec, target, drafter, policy=policy, seed=args.seed + item.index)
        result = decoder.generate(list(item.ids), record["new_tokens"], stream_index=item.index)
        for r in result.trace:
            for key, value in (("stream_index", r.stream_index), ("tokens", r.tokens_per_round),
                               ("verified", r.verified_tokens), ("nodes", r.num_draft_tokens),
                               ("draft", r.draft_time), ("update", r.update_time)):
                cols[key].append(value)
        if isinstance(drafter, HedgeDrafter):
            hedge = drafter.hedge                         # losses resolved by the prompt's end
            hedge_losses.append(list(hedge.cumulative_loss) + [hedge.expected_loss, hedge.chosen_loss])
    out = {"columns": {k: np.asarray(v) for k, v in cols.items()}, "snapshots": snaps,
           "seconds": time.perf_counter() - t0}
    if isinstance(drafter, HedgeDrafter):
        out["hedge_report"] = drafter.report()
        out["hedge_losses"] = np.asarray(hedge_losses)
    print(f"[replay {table} table] {name}: {out['seconds']:.0f} s", file=sys.stderr)
    return out


def _priced_rate(c: dict, mask, cost) -> float:
    seconds = c["draft"][mask].sum() + c["update"][mask].sum() + cost(c["verified"][mask]).sum()
    return float(c["tokens"][mask].sum() / seconds) if seconds > 0 else math.nan


def round_summary(c: dict, mask, costs: dict) -> dict:
    """tau, nodes per round and priced tokens/s (per dtype table) of the masked rounds."""
    rounds = int(mask.sum())
    if not rounds:
        return {"rounds": 0}
    tokens = int(c["tokens"][mask].sum())
    row = {"rounds": rounds, "tokens": tokens, "mean_accepted_length": tokens / rounds,
           "verified_nodes_per_round": float(c["nodes"][mask].mean()),
           "draft_us_per_round": float(c["draft"][mask].mean() * 1e6),
           "update_us_per_token": float(c["update"][mask].sum() / tokens * 1e6)}
    for dtype, cost in costs.items():
        rate = _priced_rate(c, mask, cost)
        row[f"priced_tokens_per_s_{dtype}"] = rate
        step = float(cost(np.array([1]))[0])                  # one target forward over 1 token
        row[f"priced_speedup_vs_greedy_{dtype}"] = rate * step
        row[f"draft_percent_of_target_forward_{dtype}"] = 100.0 * row["draft_us_per_round"] * 1e-6 / step
    return row


def summarise_replay(run: dict, domain_of: dict, costs: dict, chunk: int) -> dict:
    c = run["columns"]
    domains = np.array([domain_of[int(i)] for i in c["stream_index"]])
    row = round_summary(c, np.ones(len(domains), bool), costs)
    row["per_domain"] = {d: round_summary(c, domains == d, costs) for d in dict.fromkeys(domain_of.values())}
    order = {i: n for n, i in enumerate(sorted(domain_of))}
    pos = np.array([order[int(i)] for i in c["stream_index"]])
    row["per_chunk_tau"] = [round_summary(c, pos // chunk == k, costs).get("mean_accepted_length", math.nan)
                            for k in range(math.ceil(len(order) / chunk))]
    row["replay_seconds"] = run["seconds"]
    return row


def hedge_analysis(run: dict, items) -> dict:
    """Regret (the drafter's own report) and, per domain, Hedge's regret and the best source
    by Hedge's own losses (differences of the cumulative losses over the domain's prompts;
    every round of a prompt is resolved by its end)."""
    report = dict(run["hedge_report"])
    names, k = report["sources"], len(report["sources"])
    per_domain, prev = {}, np.zeros(k + 2)
    for item, cum in zip(items, run["hedge_losses"]):
        per_domain.setdefault(item.dataset, np.zeros(k + 2))
        per_domain[item.dataset] += np.asarray(cum) - prev
        prev = np.asarray(cum)
    regret = report["regret"]
    report["best_source_name"] = names[regret["best_source"]]
    report["regret_per_round"] = {key: regret[key] / max(1, regret["rounds"])
                                  for key in ("expected", "realised", "bound")}
    report["per_domain"] = {d: {"cumulative_loss": v[:k].tolist(), "best_source": names[int(np.argmin(v[:k]))],
                                "expected_regret": float(v[k] - v[:k].min()),
                                "realised_regret": float(v[k + 1] - v[:k].min())} for d, v in per_domain.items()}
    report["best_source_by_domain"] = {d: row["best_source"] for d, row in report["per_domain"].items()}
    report["best_source_changes"] = len(set(report["best_source_by_domain"].values())) > 1
    return report


# -- part 2: Arctic --------------------------------------------------------------------
def arctic_rows(rec, items, args) -> dict:
    """Arctic's SuffixDecodingCache (chain, tree) at ``--budget`` over the recorded stream."""
    sys.path.insert(0, str(HERE))
    from arctic_peer import ARCTIC_VERSION, ArcticPeer, build_arctic, load_arctic, replay
    try:
        module = load_arctic(build_arctic())
    except Exception as exc:                       # report why, keep the other parts
        return {"error": f"Arctic Inference {ARCTIC_VERSION} could not be built/loaded: {exc}"}
    stream, lengths = [], []
    for item in items:
        record = rec.prompt(item.index)
        length = record["prompt_length"]
        response = [int(t) for t in record["tokens"][length:length + record["new_tokens"]]]
        stream.append((list(item.ids), response))
        lengths.append(len(response))
    out = {"version": ARCTIC_VERSION}
    domains = [it.dataset for it in items]
    for tree in (False, True):
        t0 = time.perf_counter()
        result = replay(ArcticPeer(module, args.budget, tree), stream)
        groups = pooled_tau(lengths, result["tau_by_request"], domains, args.chunk)
        out["tree" if tree else "chain"] = {
            "mean_accepted_length": result["mean_accepted_length"],
            "verified_nodes_per_round": result["verified_nodes_per_round"], "rounds": result["rounds"],
            "propose_us_mean": result["propose_us_mean"], "replay_seconds": time.perf_counter() - t0,
            "per_domain": {d: {"mean_accepted_length": tau} for d, tau in groups["per_domain"].items()},
            "per_chunk_tau": groups["per_chunk_tau"]}
    return out


def pooled_tau(lengths, taus, domains, chunk: int) -> dict:
    """Pooled tau (committed tokens / rounds) per domain and per ``chunk`` consecutive
    requests, from each request's response length and tau (`arctic_peer.replay` reports
    tau per request; its rounds are length / tau, pooled by summing tokens and rounds).

    Raises:
        ValueError: lists of different lengths, a non-positive tau or length, chunk < 1.
    """
    if not len(lengths) == len(taus) == len(domains) or chunk < 1:
        raise ValueError("pooled_tau needs one length, tau and domain per request and chunk >= 1")
    toks, tau = np.asarray(lengths, float), np.asarray(taus, float)
    if np.any(toks <= 0) or np.any(~(tau > 0)):
        raise ValueError("pooled_tau needs response lengths >= 1 and taus > 0")
    rounds, doms = toks / tau, np.asarray(domains)
    return {"per_domain": {d: float(toks[doms == d].sum() / rounds[doms == d].sum()) for d in dict.fromkeys(domains)},
            "per_chunk_tau": [float(toks[k:k + chunk].sum() / rounds[k:k + chunk].sum())
                              for k in range(0, len(toks), chunk)]}


# -- part 3: wall clock --------------------------------------------------------------------
def wall_indices_of(items, count: int) -> list[int]:
    """``count`` stream indices spread evenly over the domains (and within each)."""
    by_domain: dict[str, list[int]] = {}
    for item in items:
        by_domain.setdefault(item.dataset, []).append(item.index)
    picked, share = [], [count // len(by_domain) + (k < count % len(by_domain)) for k in range(len(by_domain))]
    for indices, n in zip(by_domain.values(), share):
        n = min(n, len(indices))
        picked += [indices[int(j)] for j in np.linspace(0, len(indices) - 1, n).round()] if n else []
    return sorted(set(picked))


def wall_block(dtype: str, items, wall: list[int], snaps: dict, args, index) -> dict:
    """Tokens/s of every wall method on the wall prompts in ``dtype`` (module docstring)."""
    from decode import _hf_runner
    from specloop.realmodels.decoder import SpeculativeDecoder, eos_ids_of
    from specloop.realmodels.loading import load_model
    target = load_model(args.target, dtype=dtype)
    eos = sorted(eos_ids_of(target.model, target.tokenizer))
    runners = {"hf-greedy": _hf_runner(target.model, eos)}
    for n in args.lookup_tokens:
        runners[f"hf-prompt-lookup-{n}"] = _hf_runner(target.model, eos, prompt_lookup_num_tokens=n)
    drafters = {}
    for name in args.wall_methods:
        drafter, policy = build_method(name, target, dtype, args, index)
        drafters[name] = (drafter, SpeculativeDecoder(target, drafter, policy=policy, seed=args.seed))
    ids_of = {it.index: list(it.ids) for it in items}
    for name, run in runners.items():                       # warm-up, dropped
        run(ids_of[wall[0]], 8)
    for name, (drafter, dec) in drafters.items():
        dec.generate(ids_of[wall[0]], 8)
    stats = {name: {"tokens": 0, "seconds": 0.0, "rounds": 0, "same": 0, "per_domain": {}}
             for name in list(runners) + list(drafters)}
    domain_of = {it.index: it.dataset for it in items}
    load_before = os.getloadavg()
    for n, idx in enumerate(wall):
        names = list(stats) if n % 2 == 0 else list(reversed(stats))
        outputs = {}
        for name in names:
            rounds = 0
            if name in runners:
                new_ids, seconds, _ = runners[name](ids_of[idx], args.max_new_tokens)
            else:
                drafter, dec = drafters[name]
                if name in snaps and idx in snaps[name]:
                    restore(drafter, snaps[name][idx])       # the stream's state at this prompt (untimed)
                t0 = time.perf_counter()
                result = dec.generate(ids_of[idx], args.max_new_tokens)
                seconds = time.perf_counter() - t0
                new_ids, rounds = list(result.new_tokens), len(result.trace)
            outputs[name] = new_ids
            acc, dom = stats[name], stats[name]["per_domain"].setdefault(domain_of[idx], [0, 0.0])
            acc["tokens"] += len(new_ids)
            acc["seconds"] += seconds
            acc["rounds"] += rounds
            dom[0] += len(new_ids)
            dom[1] += seconds
        greedy_ids = outputs["hf-greedy"]
        for name, ids in outputs.items():
            stats[name]["same"] += int(list(ids) == list(greedy_ids))
        print(f"[wall {dtype}] prompt {n + 1}/{len(wall)} (stream {idx}) load {os.getloadavg()[0]:.2f}",
              file=sys.stderr)
    load_after = os.getloadavg()
    rows, best = _wall_rows(stats, len(wall))
    return {"rows": rows, "best_hf_prompt_lookup": best, "load_avg_before": load_before,
            "load_avg_after": load_after}


def _wall_rows(stats: dict, prompts: int) -> dict:
    rows = {}
    for name, s in stats.items():
        rows[name] = {"tokens_per_s": s["tokens"] / s["seconds"], "new_tokens": s["tokens"],
                      "mean_accepted_length": s["tokens"] / s["rounds"] if s["rounds"] else math.nan,
                      "identical_to_hf_greedy": f"{s['same']}/{prompts}",
                      "per_domain": {d: {"tokens_per_s": t / sec} for d, (t, sec) in s["per_domain"].items()}}
    base = rows["hf-greedy"]
    lookups = {k: v for k, v in rows.items() if k.startswith("hf-prompt-lookup")}
    best = max(lookups, key=lambda k: lookups[k]["tokens_per_s"]) if lookups else None
    for name, row in rows.items():
        row["speedup_vs_hf_greedy"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["vs_hf_prompt_lookup"] = row["tokens_per_s"] / rows[best]["tokens_per_s"] if best else math.nan
        for d, dom in row["per_domain"].items():
            dom["speedup_vs_hf_greedy"] = dom["tokens_per_s"] / base["per_domain"][d]["tokens_per_s"]
            if best:
                dom["vs_hf_prompt_lookup"] = dom["tokens_per_s"] / rows[best]["per_domain"][d]["tokens_per_s"]
    return rows, best


# -- learning curve and targets ---------------------------------------------------------------
def learning_curve(replay: dict, arctic: dict, chunk: int, requests: int) -> list[dict]:
    """tau per ``chunk`` requests served: suffix vs the context n-gram (and Arctic's tree);
    ``requests`` (the stream's length) caps the last point's count."""
    if "suffix" not in replay or "ngram" not in replay:
        return []
    out = []
    arctic_tree = arctic.get("tree", {}).get("per_chunk_tau", [])
    for k, (ours, ctx) in enumerate(zip(replay["suffix"]["per_chunk_tau"], replay["ngram"]["per_chunk_tau"])):
        out.append({"requests_served": min((k + 1) * chunk, requests), "suffix_tau": ours, "ngram_tau": ctx,
                    "suffix_gain_over_ngram": ours / ctx,
                    "arctic_tree_tau": arctic_tree[k] if k < len(arctic_tree) else None})
    return out


def _target(value: float, threshold: float, **extra) -> dict:
    return {**extra, "value": value, "threshold": threshold, "met": bool(value >= threshold)}


def compute_targets(replays: dict, hedges: dict, arctic: dict, wall: dict) -> dict:
    """The targets as booleans with the numbers they come from (module docstring);
    the replay targets once per cost table (``replays`` / ``hedges``: table -> rows)."""
    out = {}
    block = wall.get("bfloat16")
    if block is None:
        for key in ("bf16_best_suffix_or_hedge_vs_hf_greedy", "bf16_best_suffix_or_hedge_vs_hf_prompt_lookup"):
            out[key] = {"met": None, "reason": "no bfloat16 wall-clock block in this run"}
    else:
        rows = block["rows"]
        mine = {m: rows[m]["tokens_per_s"] for m in ("suffix",) + HEDGES if m in rows}
        if mine:
            best = max(mine, key=mine.get)
            out["bf16_best_suffix_or_hedge_vs_hf_greedy"] = _target(rows[best]["speedup_vs_hf_greedy"], 2.0,
                                                                     method=best)
            if block["best_hf_prompt_lookup"]:
                out["bf16_best_suffix_or_hedge_vs_hf_prompt_lookup"] = _target(
                    rows[best]["vs_hf_prompt_lookup"], 1.3, method=best, lookup=block["best_hf_prompt_lookup"])
    for table, replay in replays.items():
        out.update(_replay_targets(replay, hedges.get(table, {}), arctic, table))
    return out


def _replay_targets(replay: dict, hedge: dict, arctic: dict, table: str) -> dict:
    out = {}
    for kind, ours in (("chain", "suffix-chain"), ("tree", "suffix")):
        if kind in arctic and ours in replay:
            theirs = arctic[kind]["mean_accepted_length"]
            out[f"suffix_tau_vs_arctic_{kind}_{table}_table"] = _target(
                replay[ours]["mean_accepted_length"], theirs, method=ours, budget_nodes=arctic.get("budget"))
    metric = f"priced_tokens_per_s_{table}"
    alone = {m: replay[m][metric] for m in HEDGE_SOURCES if m in replay}
    if alone:
        best = max(alone, key=alone.get)
        domains = list(replay[best]["per_domain"])
        by_domain = {d: max(alone, key=lambda m: replay[m]["per_domain"][d].get(metric, -1.0)) for d in domains}
        changes = len(set(by_domain.values())) > 1
        for name in ("hedge-choose", "hedge-merge") + RATE_HEDGES + ROUND_HEDGES:
            if name not in replay:
                continue
            ratio = replay[name][metric] / alone[best]
            out[f"{name}_vs_best_single_source_{table}_table"] = {
                "metric": metric, "best_single_source": best, "best_source_by_domain": by_domain,
                "best_source_changes": changes, "ratio": ratio, "within_2_percent": bool(ratio >= 0.98),
                "above_best": bool(ratio > 1.0), "tau_ratio": replay[name]["mean_accepted_length"]
                / max(replay[m]["mean_accepted_length"] for m in alone),
                "hedge_best_source_by_domain": hedge.get(name, {}).get("best_source_by_domain"),
                "met": bool(ratio >= 0.98 and (ratio > 1.0 if changes else True))}
    return out


# -- main ---------------------------------------------------------------------------------------
def _split(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    parser.add_argument("--recording", type=Path, default=DEFAULT_RECORDING)
    parser.add_argument("--limit-prompts", type=int, default=None, help="replay only the first N prompts")
    parser.add_argument("--out", type=Path, default=RESULTS / "stream_sources.json")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--methods", default=",".join(SOURCES + HEDGES), help="replayed rows (comma list)")
    parser.add_argument("--wall-methods", default=",".join(WALL_METHODS),
                        help="decoder rows of the wall clock (HF greedy / prompt lookup always run)")
    parser.add_argument("--wall-prompts", type=int, default=24, help="wall-clock prompts (0 = no wall clock)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="wall-clock dtypes")
    parser.add_argument("--lookup-tokens", default="3,5,10", help="HF prompt_lookup_num_tokens grid")
    parser.add_argument("--budget", type=int, default=8, help="verify budget: nodes per round (lookup sources, Arctic)")
    parser.add_argument("--eagle3-k", type=int, default=2, help="EAGLE-3 chain length")
    parser.add_argument("--chunk", type=int, default=40, help="requests per learning-curve point")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="wall-clock generation cap")
    parser.add_argument("--no-arctic", action="store_true", help="skip the Arctic peer")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the wall clock (default torch's; on a loaded 2-core machine 2 "
                             "threads contend badly, 1 is steadier); the replay always runs on 1")
    parser.add_argument("--replay-tables", default="float32,bfloat16",
                        help="verify-cost tables the replay prices (and tunes the cost rules / Hedge loss) with")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.methods, args.wall_methods, args.dtypes = _split(args.methods), _split(args.wall_methods), _split(args.dtypes)
    args.lookup_tokens = [int(x) for x in _split(args.lookup_tokens)]
    args.replay_tables = _split(args.replay_tables)
    known = set(SOURCES + HEDGES + RATE_HEDGES + ROUND_HEDGES)
    bad = [m for m in args.methods + args.wall_methods if m not in known]
    if bad or (args.threads is not None and args.threads < 1) or min(args.budget, args.eagle3_k, args.chunk, args.max_new_tokens) < 1 or args.wall_prompts < 0 \
            or not args.replay_tables or any(d not in ("float32", "bfloat16") for d in args.dtypes + args.replay_tables) \
            or (args.limit_prompts is not None and args.limit_prompts < 1):
        parser.error(f"unknown methods {bad} (known: {sorted(known)}) or a size < 1 or a dtype other than "
                     "float32/bfloat16")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import transformers
    from specloop.realmodels.registry.datastore import load_or_build_index
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.streams.replay import load_verify_cost
    from specloop.realmodels.recording import open_recording, recorded_items
    sys.path.insert(0, str(HERE))
    try:
        rec = open_recording(args.recording)
        items = recorded_items(rec, args.limit_prompts)
    except (FileNotFoundError, ValueError) as exc:
        print(f"stream_sources: {exc}", file=sys.stderr)
        return 2
    domain_of = {it.index: it.dataset for it in items}
    costs = {d: load_verify_cost(None, d) for d in ("float32", "bfloat16")}
    target = load_model(args.target, dtype="float32")
    index = load_or_build_index(target, args.target)
    wall = wall_indices_of(items, args.wall_prompts) if args.wall_prompts else []
    started, load_start = datetime.now(timezone.utc), os.getloadavg()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # the replay's feedback rows are small tensors: threads only contend
    replay, hedge, snaps = ({t: {} for t in args.replay_tables} for _ in range(3))
    for table in args.replay_tables:
        for name in args.methods:
            if name in TABLE_FREE and table != args.replay_tables[0]:     # same rounds under any table
                first = args.replay_tables[0]
                replay[table][name], snaps[table][name] = replay[first][name], snaps[first][name]
                continue
            run = replay_method(name, rec, target, items, args, index,
                                set(wall) if name in args.wall_methods else set(), table)
            row = replay[table][name] = summarise_replay(run, domain_of, costs, args.chunk)
            if wall:       # the float32 wall clock must reproduce these (exact replay, restored state)
                on_wall = np.isin(run["columns"]["stream_index"], wall)
                row["tau_on_wall_prompts"] = round_summary(run["columns"], on_wall, costs)["mean_accepted_length"]
            if "hedge_report" in run:
                hedge[table][name] = hedge_analysis(run, items)
            snaps[table][name] = run["snapshots"]
    arctic = {} if args.no_arctic else {**arctic_rows(rec, items, args), "budget": args.budget}
    load_replay_end = os.getloadavg()
    torch.set_num_threads(args.threads or threads)    # the wall clock: torch's default unless --threads
    walls = {dtype: wall_block(dtype, items, wall, snaps.get(dtype) or snaps[args.replay_tables[0]], args, index)
             for dtype in args.dtypes} if wall else {}
    complete = bool(rec.manifest.get("complete")) and len(items) == int(rec.settings["prompts"])
    meta = {"full_run": bool(complete and set(walls) == {"float32", "bfloat16"}),
            "recording": str(args.recording), "recording_complete": bool(rec.manifest.get("complete")),
            "recording_settings": rec.settings, "prompts_replayed": len(items),
            "prompts_per_domain": {d: sum(1 for it in items if it.dataset == d) for d in dict.fromkeys(domain_of.values())},
            "wall_prompts": wall, "budget_nodes": args.budget, "eagle3_k": args.eagle3_k, "chunk": args.chunk,
            "plans": {"ngram / datastore / suffix / hedge": f"tree top_k=4 depth={args.budget} v={args.budget}",
                      "ngram-learned / suffix-chain": f"chain k<={args.budget} (cost rule)",
                      "eagle3": f"chain k={args.eagle3_k}"},
            "hedge_sources": list(HEDGE_SOURCES), "hedge_note": "EAGLE-3 is not a Hedge source: the hedge drafter "
            "refuses heads (a round they did not draft would corrupt their own draft cache)",
            "replay_pricing": "tau exact (greedy float32 recording); priced tokens/s = tokens / (measured drafting "
            "+ updates + verify seconds from the shipped SmolLM2 CPU table of each dtype); replay[T] = drafters "
            "whose cost rules / Hedge loss read table T (ngram, datastore, eagle3 do not: shared rows)",
            "wall_state": "suffix / Hedge start each wall prompt from the replay's state at that prompt (float32 "
            "stream); learned lengths likewise; checks.float32_wall_tau_equals_replay tests it (Hedge prices "
            "drafting on the wall clock, so its choices, hence tau, may differ between replay and wall)",
            "lookup_tokens": args.lookup_tokens,
            "max_new_tokens": args.max_new_tokens, "load_note": LOAD_NOTE, "load_avg_start": load_start,
            "load_avg_after_replay": load_replay_end,
            "load_avg_by_dtype": {d: {"before": w["load_avg_before"], "after": w["load_avg_after"]}
                                  for d, w in walls.items()},
            "wall_torch_threads": torch.get_num_threads(), "replay_torch_threads": 1,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "started": started.isoformat(timespec="seconds"),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    checks = {}
    if "float32" in walls and "float32" in replay:   # exactness: restored state + float32 decoder == replay
        rows, tables = walls["float32"]["rows"], replay["float32"]
        checks["float32_wall_tau_equals_replay"] = {
            m: {"wall": rows[m]["mean_accepted_length"], "replay": tables[m]["tau_on_wall_prompts"],
                "equal": bool(abs(rows[m]["mean_accepted_length"] - tables[m]["tau_on_wall_prompts"]) < 1e-9)}
            for m in rows if m in tables}
    result = {"meta": meta, "checks": checks, "replay": replay, "hedge": hedge, "arctic": arctic,
              "learning_curve": {t: learning_curve(r, arctic, args.chunk, len(items)) for t, r in replay.items()},
              "wall_clock": walls,
              "targets": compute_targets(replay, hedge, arctic, walls)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1, default=float)
    args.out.write_text(text)
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
