"""``specloop ltd train|eval``: LTD (Learning To Draft) in the simulator and on the
real decoder (issue 8).

* ``specloop ltd train --env sim`` trains the depth and size policies with PPO
  (initial training of each alone, then alternating co-training) in
  `specloop.sim.ltd_env` and saves ``<name>`` (co-trained) and ``<name>-independent``
  (the initial pair, not co-trained) by name (`specloop.strategies.ltd.save_policy`).
  ``--reward-ablation`` also trains size policies on the acceptance-length and
  time-cost rewards (LTD's reward ablation) and saves ``<name>-size-<reward>``;
  ``--ablation-only`` trains just those (the co-trained pair is left as it is).
  ``--name`` is a name (saved in `specloop.strategies.ltd.ltd_cache_dir`) or a file
  path (the variants go next to it, `specloop.strategies.ltd.variant_name`); the
  training log is ``--out/ltd_train_<basename>.json``.
* ``specloop ltd train --env real --init NAME`` fine-tunes a (sim-trained) policy on
  the real decoder (`specloop.realmodels.ltd_env`, wall-clock rewards) and saves
  ``<name>``; ``--env replay --init NAME`` fine-tunes it on rounds recorded from the
  real decoder instead (``--rounds`` alternations of ``--co-depth-steps`` /
  ``--co-size-steps``; without ``--init``, replay trains from scratch).
* ``specloop ltd eval --env sim|real [--json]``: static trees grid-searched over
  (depth, V) on separate tuning prompts, LTD, depth-only, size-only, the
  independent combination, the reward ablation and (real) the transfer rows.
  Writes ``ltd_eval_<env>.json`` and the per-cycle decisions
  ``ltd_decisions_<env>.npz`` / ``.csv`` under ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

# specloop.strategies.ltd (torch) and everything heavier are imported inside the
# command functions, so building the parser (`specloop --help`) stays light.
__all__ = ["register", "evaluate_rows", "evaluate_rows_paired", "grid_search_static", "add_extra_policies",
           "REWARD_CHOICES"]

DEFAULT_OUT = Path("results/ltd")
# = specloop.strategies.ltd.REWARDS (tests/cli/test_ltd_cmd.py keeps them equal)
REWARD_CHOICES = ("throughput", "accepted_length", "time_cost", "net_tokens")


def register(subparsers) -> None:
    parser = subparsers.add_parser("ltd", help="LTD: PPO depth / verification-size policies (train, eval)")
    sub = parser.add_subparsers(dest="ltd_command", metavar="ACTION")
    sub.required = True
    train = sub.add_parser("train", help="train LTD policies (sim: from scratch; real: fine-tune)")
    _common(train)
    train.add_argument("--name", default=None,
                       help="policy name or file path to save (default: ltd-sim for sim, ltd-real for real, "
                            "ltd-replay for replay; a saved name takes precedence over the shipped policy of the "
                            "same name)")
    train.add_argument("--depth-steps", type=int, default=30_720, help="initial depth-policy env steps")
    train.add_argument("--size-steps", type=int, default=16_384, help="initial size-policy env steps (cycles)")
    train.add_argument("--rounds", type=int, default=2, help="alternating co-training rounds")
    train.add_argument("--co-depth-steps", type=int, default=12_288,
                       help="depth-policy env steps per co-training round (and per fine-tuning round)")
    train.add_argument("--co-size-steps", type=int, default=8_192,
                       help="size-policy cycles per co-training round (and per fine-tuning round)")
    train.add_argument("--n-steps", type=int, default=None,
                       help="PPO rollout length (default LTD's 2048; smaller for quick runs)")
    train.add_argument("--fixed-verify-size", type=int, default=12,
                       help="V while the depth policy trains alone (LTD: 60 on a GPU)")
    train.add_argument("--reward", choices=REWARD_CHOICES, default="throughput",
                       help="throughput: LTD's per-cycle tokens / second; net_tokens: tokens - rate x time "
                            "(Dinkelbach form of the total throughput; see strategies.ltd.cycle_reward)")
    train.add_argument("--reward-rate", type=float, default=None,
                       help="(net_tokens) tokens per target-forward time to beat; default (replay): the best "
                            "static tree's on the recording")
    train.add_argument("--reward-ablation", action="store_true",
                       help="also train size policies on the other rewards (saved as <name>-size-<reward>)")
    train.add_argument("--ablation-only", action="store_true",
                       help="(sim) train only the --reward-ablation size policies, not the co-trained pair")
    train.add_argument("--init", default=None,
                       help="policy (name or path) to fine-tune instead of training from scratch: --rounds "
                            "alternations of --co-depth-steps / --co-size-steps from its weights (the initial-stage "
                            "--depth-steps / --size-steps / --fixed-verify-size are not used). real: default ltd-sim; "
                            "replay: no default (without it, replay trains from scratch)")
    train.set_defaults(func=_train)
    ev = sub.add_parser("eval", help="evaluate LTD against static trees and its ablations")
    _common(ev)
    ev.add_argument("--policy", default=None,
                    help="LTD policy name or file path (default ltd-sim; ltd-replay with --env replay); its "
                         "variants are looked up beside it")
    ev.add_argument("--episodes", type=int, default=48, help="(sim) evaluation prompts")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument("--grid-only", action="store_true",
                    help="(real) only grid-search the static trees and save ltd_grid_real.json under --out")
    ev.add_argument("--reuse-grid", action="store_true",
                    help="(real) reuse --out/ltd_grid_real.json from an earlier --grid-only run")
    ev.add_argument("--hooks", choices=("native", "emulated"), default="native",
                    help="(real) native: the drafter itself stops at the depth policy's answer and verifies the "
                         "size policy's V (all times wall clock); emulated: draft to the cap and charge calibrated "
                         "layer costs (what the PPO environments do)")
    ev.add_argument("--extra-policies", default="",
                    help="comma-separated policy names / paths evaluated as extra rows (e.g. another reward)")
    ev.add_argument("--fine-tuned", default="ltd-real",
                    help="(real, replay) the transfer row: a policy fine-tuned on the real decoder or its recorded "
                         "rounds (`ltd train --env real|replay --init ltd-sim`); skipped when it does not exist")
    ev.add_argument("--tune-replay", type=Path, default=None,
                    help="(replay) recording the static trees are grid-searched on (default <out>/replay-warmup)")
    ev.add_argument("--grid-from-replay", type=Path, default=None,
                    help="(real) grid-search the static trees on this recording and re-measure only the best "
                         "--grid-top of them on the real decoder")
    ev.add_argument("--grid-top", type=int, default=6, help="(real, with --grid-from-replay) static trees re-measured")
    ev.add_argument("--repeats", type=int, default=1,
                    help="(real) passes over the prompts, the policies interleaved within each pass")
    ev.add_argument("--paired", action="store_true",
                    help="(real) run the policies back to back per prompt (alternating order) and report paired "
                         "speed ratios with standard errors; cancels the machine's drift")
    ev.set_defaults(func=_eval)
    rec = sub.add_parser("record", help="record every position's draft tree and target tokens on the real "
                                        "decoder, for --env replay (resumable)")
    _common(rec)
    rec.add_argument("--split", default="warmup", help="HumanEval split of the prompts (warmup / heldout)")
    rec.add_argument("--max-depth", type=int, default=8, help="tree depth drafted at every position (tokens)")
    rec.add_argument("--max-verify", type=int, default=48, help="largest verification size V replayable (nodes)")
    rec.add_argument("--top-k", type=int, default=6, help="EAGLE-2 tree width")
    rec.add_argument("--costs-from", type=Path, default=None,
                     help="copy costs.json from this recording (same target, drafter, machine) instead of timing")
    rec.add_argument("--cost-repeats", type=int, default=3,
                     help="timed passes over the static-tree settings when measuring the cost tables")
    rec.add_argument("--cost-tokens", type=int, default=32, help="tokens generated per setting when timing costs")
    rec.set_defaults(func=_record)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", choices=("sim", "real", "replay"), default="sim",
                   help="sim: synthetic world; real: the real decoder (wall clock); replay: rounds recorded on the "
                        "real decoder by `ltd record`")
    p.add_argument("--replay", type=Path, default=None,
                   help="(replay) recording directory: written by record (default <out>/replay-<split>), trained "
                        "on by train (default <out>/replay-warmup), evaluated on by eval (<out>/replay-heldout)")
    p.add_argument("--seed", type=int, default=0, help="PPO / environment seed (default 0)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"output directory, relative to the current one (default {DEFAULT_OUT})")
    p.add_argument("--prompts", type=int, default=8, help="(real) prompts per evaluation / training pass")
    p.add_argument("--max-new-tokens", type=int, default=64, help="(real) tokens per prompt")
    p.add_argument("--drafter", default=None,
                   help="(real, record) EAGLE tree drafter: eagle (default for real) or eagle3 (default for record)")
    p.add_argument("--dtype", default="bfloat16",
                   help="(real) target dtype (bfloat16: the sim's cost column; float32 for exactness)")


# -- train -----------------------------------------------------------------------------
def train_log_path(out: Path, name: str) -> Path:
    """``out/ltd_train_<basename>.json`` for a policy name or path (a path's folders
    and ``.pt`` extension are dropped, so ``/tmp/x/p.pt`` -> ``out/ltd_train_p.json``).

    Raises:
        ValueError: the name has no usable basename.
    """
    base = Path(str(name)).name
    if base.endswith(".pt"):
        base = base[:-3]
    if not base or base in (".", ".."):
        raise ValueError(f"policy name {name!r} has no basename for the training log")
    return out / f"ltd_train_{base}.json"


def _train(args) -> int:
    from specloop.strategies.ltd import PAPER_REWARDS, LTDConfig, LTDPolicy, load_policy, save_policy, variant_name
    from specloop.strategies.ltd_train import CoTrainSchedule, co_train

    if args.n_steps is not None and args.n_steps < 2:
        raise ValueError(f"--n-steps must be >= 2 (PPO rollout length), got {args.n_steps}")
    if args.reward == "net_tokens" and args.env != "replay" and args.reward_rate is None:
        raise ValueError("--reward net_tokens needs --reward-rate (tokens per target forward) outside --env replay")
    config = LTDConfig()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.env == "replay":
        from specloop.cli.ltd_replay_cmd import train_replay
        if args.ablation_only or args.reward_ablation:
            raise ValueError("the reward ablation trains in the simulator (--env sim)")
        name = args.name or "ltd-replay"
        log_path = train_log_path(args.out, name)
        schedule = CoTrainSchedule(args.depth_steps, args.size_steps, args.rounds, args.co_depth_steps,
                                   args.co_size_steps, args.fixed_verify_size, args.n_steps)
        start = time.perf_counter()
        meta = train_replay(args, schedule, name)
        log_path.write_text(json.dumps({**meta, "name": str(name), "seconds": time.perf_counter() - start},
                                       indent=2, default=str))
        print(f"training log {log_path}")
        return 0
    if args.env == "real":
        if args.ablation_only:
            raise ValueError("--ablation-only trains in the simulator (--env sim)")
        from specloop.realmodels.ltd_env import fine_tune
        name = args.name or "ltd-real"
        init = args.init or "ltd-sim"
        policy, log = fine_tune(load_policy(init), args, config)
        path = save_policy(policy, name, {"env": "real", "init": init, "log": log})
        print(f"saved {path}")
        return 0
    from specloop.sim.ltd_env import SimTreeEngine, TreeWorld, make_size_env
    from specloop.strategies.ltd_train import train_ppo

    name = args.name or "ltd-sim"
    log_path = train_log_path(args.out, name)          # checked before any training
    world = TreeWorld(config=config)
    schedule = CoTrainSchedule(args.depth_steps, args.size_steps, args.rounds, args.co_depth_steps,
                               args.co_size_steps, args.fixed_verify_size, args.n_steps)
    start = time.perf_counter()
    meta = {"env": "sim", "schedule": schedule.__dict__, "reward": args.reward, "seed": args.seed,
            "world": world.options.__dict__, "cost_source": world.cost_source}
    if not args.ablation_only:
        result = co_train(lambda: SimTreeEngine(world), config, schedule, args.seed, args.reward,
                          reward_rate=args.reward_rate)
        meta["stages"] = result["log"]
        for key, suffix in (("ltd", ""), ("independent", "-independent")):
            print(f"saved {save_policy(result[key], name if not suffix else variant_name(name, suffix), meta)}")
    saved = {}
    if args.reward_ablation or args.ablation_only:
        for reward in PAPER_REWARDS:
            if reward == args.reward:
                continue
            # as the initial size policy of co_train: random depths 1..max_depth, size_steps cycles
            _, actor, seconds = train_ppo(make_size_env(world=world, reward=reward), "size", args.size_steps,
                                          seed=args.seed, n_steps=args.n_steps)
            path = save_policy(LTDPolicy(config, None, actor, name=f"size-{reward}"),
                               variant_name(name, f"-size-{reward}"),
                               {**meta, "reward": reward, "size_steps": args.size_steps, "seconds": seconds})
            saved[reward] = {"path": str(path), "seconds": seconds}
            print(f"saved {path}")
    if args.ablation_only:
        log_path = log_path.with_name(log_path.stem + "-reward-ablation.json")
    log_path.write_text(json.dumps({**meta, "name": str(name), "reward_ablation": saved,
                                    "seconds": time.perf_counter() - start}, indent=2, default=str))
    print(f"training log {log_path}")
    return 0


def _record(args) -> int:
    from specloop.cli.ltd_replay_cmd import record
    return record(args)


# -- eval ------------------------------------------------------------------------------
def grid_search_static(run, config, depths=None, sizes=None, pairs=None) -> tuple[dict, list[dict]]:
    """Best static (D, V) by tokens/s; ``run(policy) -> (trace, depths, sizes)``,
    ``config`` an `LTDConfig`; the grid is ``depths`` x ``sizes`` (default all of
    the config's) or the (D, V) ``pairs`` given. Returns (best row, all rows)."""
    from specloop.strategies.ltd import LTDPolicy

    if pairs is None:
        pairs = [(d, v) for d in depths or range(1, config.max_depth + 1) for v in sizes or config.verify_sizes]
    rows = []
    for depth, size in pairs:
        trace, _, _ = run(LTDPolicy(config, static_depth=int(depth), static_verify_size=int(size)))
        rows.append({"depth": int(depth), "verify_size": int(size), "tokens_per_s": trace.tokens_per_second(),
                     "mean_accepted_length": trace.mean_accepted_length()})
    return max(rows, key=lambda r: r["tokens_per_s"]), rows


def _ablation_policies(ltd, independent, best: dict) -> dict:
    from specloop.strategies.ltd import LTDPolicy

    cfg, d, v = ltd.config, best["depth"], best["verify_size"]
    out = {f"static D={d} V={v} (grid best)": LTDPolicy(cfg, static_depth=d, static_verify_size=v),
           "LTD (co-trained)": ltd,
           "depth-only (size static)": LTDPolicy(cfg, ltd.depth_actor, None, static_verify_size=v),
           "size-only (depth static)": LTDPolicy(cfg, None, ltd.size_actor, static_depth=d)}
    if independent is not None:
        out["independent (not co-trained)"] = independent
    return out


def evaluate_rows_paired(run, policies: dict, prompts: list, repeats: int = 1) -> tuple[list[dict], dict]:
    """Rows like `evaluate_rows`, measured in a paired design that cancels drift:
    for each pass and prompt the policies run back to back (order reversed on
    alternate prompts), ``run(policy, [prompt])``. Greedy output does not depend on
    the policy, so per (pass, prompt) the time ratio first policy / policy is a
    speed ratio; rows add ``paired_speedup`` (mean of those ratios),
    ``paired_speedup_se`` (its standard error) and ``pair_seconds`` (seconds per
    (pass, prompt), pass-major: any two rows pair element-wise), and
    ``speedup_vs_best_static`` is pooled tokens/s against the first policy's."""
    from specloop.record import Trace

    if int(repeats) < 1 or not prompts:
        raise ValueError(f"need repeats >= 1 and prompts, got {repeats} and {len(prompts)} prompts")
    labels = list(policies)
    runs: dict = {label: ([], [], [], []) for label in labels}       # records, depths, sizes, seconds per pair
    for rep in range(int(repeats)):
        for i, prompt in enumerate(prompts):
            for label in (labels if (rep + i) % 2 == 0 else labels[::-1]):
                trace, depths, sizes = run(policies[label], [prompt])
                records, ds, vs, seconds = runs[label]
                records.extend(trace)
                ds.extend(depths)
                vs.extend(sizes)
                seconds.append(trace.total_time)
    ref_seconds = np.asarray(runs[labels[0]][3])
    ref_tps = Trace(runs[labels[0]][0]).tokens_per_second()
    rows, decisions = [], {}
    for label in labels:
        records, depths, sizes, seconds = runs[label]
        trace = Trace(records)
        ratios = ref_seconds / np.asarray(seconds)
        rows.append({"config": label, "mean_accepted_length": trace.mean_accepted_length(),
                     "tokens_per_s": trace.tokens_per_second(),
                     "speedup_vs_best_static": trace.tokens_per_second() / ref_tps,
                     "paired_speedup": float(ratios.mean()),
                     "paired_speedup_se": float(ratios.std(ddof=1) / np.sqrt(ratios.size)) if ratios.size > 1 else
                     float("nan"),
                     "mean_depth": float(np.mean(depths)), "mean_verify_size": float(np.mean(sizes)),
                     "rounds": len(trace), "pair_seconds": [float(x) for x in seconds]})
        decisions[label] = (np.asarray(depths), np.asarray(sizes), trace.column("tokens_per_round"))
    return rows, decisions


def evaluate_rows(run, policies: dict, best_static_tps: float | None, repeats: int = 1,
                  prompts: list | None = None, paired: bool = False) -> tuple[list[dict], dict]:
    """One row per policy: config, mean_accepted_length, tokens_per_s,
    speedup_vs_best_static, mean depth / V; and the per-cycle decisions.

    ``repeats`` passes run every policy once each, interleaved (wall-clock drift
    hits all rows alike), and the rows pool the passes. ``best_static_tps`` None:
    the first policy (the grid-best static tree) measured in these same passes.
    ``paired``: `evaluate_rows_paired` over ``prompts`` instead.
    """
    from specloop.record import Trace

    if paired:
        return evaluate_rows_paired(run, policies, prompts or [], repeats)
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: dict = {label: ([], [], []) for label in policies}
    for _ in range(int(repeats)):
        for label, policy in policies.items():
            trace, depths, sizes = run(policy)
            for store, part in zip(runs[label], (list(trace), list(depths), list(sizes))):
                store.extend(part)
    rows, decisions = [], {}
    for label in policies:
        records, depths, sizes = runs[label]
        trace = Trace(records)
        tps = trace.tokens_per_second()
        if best_static_tps is None:
            best_static_tps = tps
        rows.append({"config": label, "mean_accepted_length": trace.mean_accepted_length(),
                     "tokens_per_s": tps, "speedup_vs_best_static": tps / best_static_tps,
                     "mean_depth": float(np.mean(depths)), "mean_verify_size": float(np.mean(sizes)),
                     "rounds": len(trace), "tokens_per_s_per_episode": _per_episode_tokens_per_s(records)})
        decisions[label] = (np.asarray(depths), np.asarray(sizes), trace.column("tokens_per_round"))
    return rows, decisions


def _per_episode_tokens_per_s(records) -> list[float]:
    """Tokens/s of each episode (records grouped by ``stream_index``, passes pooled), in
    episode order: the same seeded episodes for every policy, so rows pair by episode."""
    totals: dict = {}
    for r in records:
        tokens, seconds = totals.get(int(r.stream_index), (0, 0.0))
        totals[int(r.stream_index)] = (tokens + r.tokens_per_round, seconds + r.round_time)
    return [t / s if s > 0 else float("nan") for _, (t, s) in sorted(totals.items())]


def add_extra_policies(args, policies: dict) -> dict:
    """Add the ``--extra-policies`` (loaded by name or path) as rows labelled by name."""
    from specloop.strategies.ltd import load_policy

    for name in [n.strip() for n in (getattr(args, "extra_policies", "") or "").split(",") if n.strip()]:
        policies[name] = load_policy(name)
    return policies


def _load_optional(name: str):
    """`load_policy(name)`, or None when there is no such policy."""
    from specloop.strategies.ltd import load_policy

    try:
        return load_policy(name)
    except FileNotFoundError:
        return None


def _eval(args) -> int:
    from specloop.strategies.ltd import LTDConfig

    def ablations(ltd, independent, best):
        return add_extra_policies(args, _ablation_policies(ltd, independent, best))

    if args.env == "real":
        from specloop.realmodels.ltd_env import real_eval
        args.grid_pairs = _replay_grid_pairs(args) if getattr(args, "grid_from_replay", None) else None
        result, decisions = real_eval(args, LTDConfig(), ablations, grid_search_static, evaluate_rows,
                                      _load_optional)
        if result is None:          # --grid-only
            return 0
    elif args.env == "replay":
        from specloop.cli.ltd_replay_cmd import replay_eval
        result, decisions = replay_eval(args, ablations, evaluate_rows, _load_optional)
    else:
        result, decisions = _sim_eval(args)
    _write(args, result, decisions)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        _print_table(result)
    return 0


def _replay_grid_pairs(args) -> list[tuple[int, int]]:
    """The ``--grid-top`` best static (D, V) of the full grid on ``--grid-from-replay``
    (priced by the recording's measured costs), to re-measure on the real decoder."""
    from specloop.cli.ltd_replay_cmd import replay_config
    from specloop.sim.ltd_replay import load_replay, run_replay_policy

    if args.grid_top < 1:
        raise ValueError(f"--grid-top must be >= 1, got {args.grid_top}")
    data = load_replay(args.grid_from_replay)
    config = replay_config(data)
    _, rows = grid_search_static(lambda p: run_replay_policy(p, data, config), config)
    rows.sort(key=lambda r: -r["tokens_per_s"])
    return [(r["depth"], r["verify_size"]) for r in rows[: args.grid_top]]


def _sim_eval(args):
    from specloop.sim.ltd_env import TreeWorld, run_policy
    from specloop.strategies.ltd import LTDPolicy, REWARDS, load_policy, variant_name

    name = args.policy or "ltd-sim"
    ltd = load_policy(name)
    world = TreeWorld(config=ltd.config)

    def runner(seed, episodes):
        def run(policy):
            res = run_policy(policy, world, episodes, seed=seed)
            return res.trace, res.depths, res.sizes
        return run

    best, grid = grid_search_static(runner(args.seed + 1000, max(8, args.episodes // 3)), ltd.config)
    run = runner(args.seed, args.episodes)
    best_tps = run(LTDPolicy(ltd.config, static_depth=best["depth"], static_verify_size=best["verify_size"]))[0] \
        .tokens_per_second()
    independent = _load_optional(variant_name(name, "-independent"))
    policies = _ablation_policies(ltd, independent, best)
    for reward in REWARDS:
        ablation = _load_optional(variant_name(name, f"-size-{reward}"))
        if ablation is not None:
            policies[f"reward={reward} (size-only)"] = LTDPolicy(ltd.config, None, ablation.size_actor,
                                                                 static_depth=best["depth"])
    if independent is not None and independent.size_actor is not None:   # trained alone, throughput reward
        policies["reward=throughput (size-only)"] = LTDPolicy(ltd.config, None, independent.size_actor,
                                                              static_depth=best["depth"])
    add_extra_policies(args, policies)
    rows, decisions = evaluate_rows(run, policies, best_tps)
    overhead = _sim_overhead(ltd, world, args.seed)
    result = {"env": "sim", "policy": name, "rows": rows, "best_static": best, "grid": grid,
              "policy_overhead": overhead, "cost_source": world.cost_source,
              "episodes": args.episodes, "rounds_per_episode": world.options.rounds_per_episode}
    return result, decisions


def _sim_overhead(ltd, world, seed: int) -> dict:
    """Measured seconds of the exported actors per decision vs the simulated round time."""
    from specloop.sim.ltd_env import run_policy

    res = run_policy(ltd, world, 4, seed=seed, charge_policy_time=False)
    round_time = res.trace.total_time / len(res.trace)
    per_round = res.policy_seconds / len(res.trace)
    return {"policy_seconds_per_round": per_round, "round_seconds": round_time,
            "overhead_fraction": per_round / round_time}


def _write(args, result: dict, decisions: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    env = result["env"]
    (args.out / f"ltd_eval_{env}.json").write_text(json.dumps(result, indent=2))
    arrays = {}
    with open(args.out / f"ltd_decisions_{env}.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["config", "cycle", "tree_depth", "verify_size", "tokens_per_round"])
        for i, (label, (depths, sizes, tokens)) in enumerate(decisions.items()):
            arrays[f"config_{i}_depth"], arrays[f"config_{i}_verify_size"] = depths, sizes
            arrays[f"config_{i}_tokens"] = tokens
            for j, (d, v, n) in enumerate(zip(depths, sizes, tokens)):
                writer.writerow([label, j, int(d), int(v), int(n)])
    arrays["config_labels"] = np.asarray(list(decisions))
    np.savez(args.out / f"ltd_decisions_{env}.npz", **arrays)


def _print_table(result: dict) -> None:
    best = result["best_static"]
    print(f"LTD eval ({result['env']}); LTD (co-trained) = policy {result['policy']}")
    print(f"best static tree, grid-searched on the tuning prompts: D={best['depth']} V={best['verify_size']} "
          f"({best['tokens_per_s']:.2f} tokens/s there); rows below are on the evaluation prompts, relative to it")
    print("tau = mean accepted length (tokens per round); D, V = mean draft depth and verification size")
    print(f"{'config':60s} {'tau':>6s} {'tok/s':>8s} {'vs best static':>14s} {'D':>5s} {'V':>6s}")
    for row in result["rows"]:
        print(f"{row['config']:60s} {row['mean_accepted_length']:6.2f} {row['tokens_per_s']:8.2f} "
              f"{row['speedup_vs_best_static']:14.3f} {row['mean_depth']:5.2f} {row['mean_verify_size']:6.1f}")
    if "oracle_vs_best_static" in result:
        print(f"clairvoyant per-round oracle: {result['oracle_vs_best_static']:.3f}x the best static tree")
    if "policy_overhead" in result:
        frac = result["policy_overhead"].get("overhead_fraction")
        print(f"policy overhead: {100 * frac:.2f} % of a round" if frac is not None else
              f"policy overhead: {result['policy_overhead']}")
