"""``specloop ltd train|eval``: LTD (Learning To Draft) in the simulator and on the
real decoder.

* ``specloop ltd train --env sim`` trains the depth and size policies with PPO
  (initial training of each alone, then alternating co-training) in
  `specloop.ltd.env_sim` (`specloop.ltd.train_sim.train_sim`) and saves ``<name>``
  (co-trained) and ``<name>-independent`` (the initial pair, not co-trained) by name (`specloop.ltd.policy.save_policy`).
  ``--reward-ablation`` also trains size policies on the acceptance-length and
  time-cost rewards (LTD's reward ablation) and saves ``<name>-size-<reward>``;
  ``--ablation-only`` trains just those (the co-trained pair is left as it is).
  ``--name`` is a name (saved in `specloop.ltd.policy.ltd_cache_dir`) or a file
  path (the variants go next to it, `specloop.ltd.policy.variant_name`); the
  training log is ``--out/ltd_train_<basename>.json``.
* ``specloop ltd train --env real --init NAME`` fine-tunes a (sim-trained) policy on
  the real decoder (`specloop.ltd.eval_real.fine_tune_real`, wall-clock rewards) and saves
  ``<name>``; ``--env replay --init NAME`` fine-tunes it on rounds recorded from the
  real decoder instead (``--rounds`` alternations of ``--co-depth-steps`` /
  ``--co-size-steps``; without ``--init``, replay trains from scratch).
* ``specloop ltd eval --env sim|real [--json]``: static trees grid-searched over
  (depth, V) on separate tuning prompts, LTD, depth-only, size-only, the
  independent combination, the reward ablation and (real) the transfer rows.
  Writes ``ltd_eval_<env>.json`` and the per-cycle decisions
  ``ltd_decisions_<env>.npz`` / ``.csv`` under ``--out``.

This module parses, calls and prints: the work is in library modules with typed
configs (`specloop.ltd.train_sim`, `specloop.ltd.eval_sim`,
`specloop.ltd.eval_real`, the shared rows and grid search in
`specloop.ltd.evaluate`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# specloop.ltd.policy (torch) and everything heavier are imported inside the
# command functions, so building the parser (`specloop --help`) stays light.
__all__ = ["register", "train_log_path", "REWARD_CHOICES"]

DEFAULT_OUT = Path("results/ltd")
# = specloop.ltd.policy.REWARDS (tests/cli/test_ltd_cmd.py keeps them equal)
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
                            "(Dinkelbach form of the total throughput; see ltd.policy.cycle_reward)")
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


def _schedule(args):
    from specloop.ltd.train import CoTrainSchedule
    return CoTrainSchedule(args.depth_steps, args.size_steps, args.rounds, args.co_depth_steps,
                           args.co_size_steps, args.fixed_verify_size, args.n_steps)


def _check_ltd_paths(args, replay_is_output: bool = False) -> None:
    """The ltd commands' path flags, checked before any work (`specloop.cli._paths`)."""
    from specloop.cli._paths import check_paths
    check_paths(args, out_folders=("out",) + (("replay",) if replay_is_output else ()),
                in_folders=("tune_replay", "grid_from_replay", "costs_from")
                + (("replay",) if args.env == "replay" and not replay_is_output else ()))


def _train(args) -> int:
    _check_ltd_paths(args)
    if args.n_steps is not None and args.n_steps < 2:
        raise ValueError(f"--n-steps must be >= 2 (PPO rollout length), got {args.n_steps}")
    if args.reward == "net_tokens" and args.env != "replay" and args.reward_rate is None:
        raise ValueError("--reward net_tokens needs --reward-rate (tokens per target forward) outside --env replay")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.env == "replay":
        from specloop.cli.ltd_replay_cmd import train_replay
        if args.ablation_only or args.reward_ablation:
            raise ValueError("the reward ablation trains in the simulator (--env sim)")
        name = args.name or "ltd-replay"
        log_path = train_log_path(args.out, name)
        start = time.perf_counter()
        meta = train_replay(args, _schedule(args), name)
        log_path.write_text(json.dumps({**meta, "name": str(name), "seconds": time.perf_counter() - start},
                                       indent=2, default=str))
        print(f"training log {log_path}")
        return 0
    if args.env == "real":
        return _train_real(args)
    from specloop.ltd.train_sim import SimTrainConfig, train_sim

    name = args.name or "ltd-sim"
    log_path = train_log_path(args.out, name)          # checked before any training
    start = time.perf_counter()
    trained = train_sim(SimTrainConfig(name=name, schedule=_schedule(args), seed=args.seed, reward=args.reward,
                                       reward_rate=args.reward_rate, reward_ablation=args.reward_ablation,
                                       ablation_only=args.ablation_only))
    for path in trained["saved"]:
        print(f"saved {path}")
    if args.ablation_only:
        log_path = log_path.with_name(log_path.stem + "-reward-ablation.json")
    log_path.write_text(json.dumps({**trained["meta"], "name": str(name), "reward_ablation": trained["reward_ablation"],
                                    "seconds": time.perf_counter() - start}, indent=2, default=str))
    print(f"training log {log_path}")
    return 0


def _real_setup(args, drafter: str):
    """The `RealLTDSetup` of the flags (target: the registry's default)."""
    from specloop.ltd.eval_real import RealLTDSetup
    return RealLTDSetup(drafter=args.drafter or drafter, dtype=args.dtype, prompts=args.prompts,
                        max_new_tokens=args.max_new_tokens, seed=args.seed)


def _train_real(args) -> int:
    if args.ablation_only:
        raise ValueError("--ablation-only trains in the simulator (--env sim)")
    from specloop.ltd.eval_real import RealFineTuneConfig, fine_tune_real
    from specloop.ltd.policy import load_policy, save_policy

    name = args.name or "ltd-real"
    init = args.init or "ltd-sim"
    config = RealFineTuneConfig(_real_setup(args, "eagle"), co_depth_steps=args.co_depth_steps,
                                co_size_steps=args.co_size_steps, n_steps=args.n_steps, reward=args.reward)
    policy, log = fine_tune_real(load_policy(init), config)
    path = save_policy(policy, name, {"env": "real", "init": init, "log": log})
    print(f"saved {path}")
    return 0


def _record(args) -> int:
    _check_ltd_paths(args, replay_is_output=True)
    from specloop.cli.ltd_replay_cmd import record
    return record(args)


# -- eval ------------------------------------------------------------------------------
def _eval(args) -> int:
    from specloop.ltd.evaluate import parse_policy_names, save_eval

    _check_ltd_paths(args)
    extra = parse_policy_names(getattr(args, "extra_policies", ""))
    if args.env == "real":
        result, decisions = _real_eval(args, extra)
        if result is None:          # --grid-only
            return 0
    elif args.env == "replay":
        from specloop.cli.ltd_replay_cmd import replay_eval
        result, decisions = replay_eval(args, extra)
    else:
        from specloop.ltd.eval_sim import SimEvalConfig, sim_eval
        result, decisions = sim_eval(SimEvalConfig(policy=args.policy or "ltd-sim", episodes=args.episodes,
                                                   seed=args.seed, extra_policies=extra))
    save_eval(args.out, result, decisions)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        _print_table(result)
    return 0


def _real_eval(args, extra: tuple[str, ...]):
    from specloop.ltd.eval_real import RealEvalConfig, real_eval

    pairs = None
    if getattr(args, "grid_from_replay", None):
        from specloop.ltd.eval_sim import replay_grid_pairs
        pairs = tuple(replay_grid_pairs(args.grid_from_replay, args.grid_top))
    config = RealEvalConfig(_real_setup(args, "eagle"), out=args.out, policy=args.policy or "ltd-sim",
                            fine_tuned=args.fine_tuned, extra_policies=extra, hooks=args.hooks,
                            repeats=args.repeats, paired=args.paired, grid_pairs=pairs, reuse_grid=args.reuse_grid,
                            grid_only=args.grid_only)
    return real_eval(config)


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
