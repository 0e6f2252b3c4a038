"""Back ends of ``specloop ltd record`` and ``specloop ltd train|eval --env replay``.

* ``ltd record`` runs the real decoder once per position of a greedy generation and
  stores every position's full draft tree, the target's tokens at its nodes and the
  measured costs (`specloop.realmodels.ltd_record`; resumable: a rerun skips prompts
  already on disk).
* ``ltd train --env replay`` trains LTD's depth and size policies with PPO on the
  recorded rounds (`specloop.sim.ltd_replay`): the real drafter's own confidences
  and acceptance, priced by the measured costs.
* ``ltd eval --env replay`` grid-searches static trees on the tuning recording and
  evaluates LTD, its ablations and the clairvoyant per-round oracle on the
  evaluation recording.
"""
from __future__ import annotations

import time
from pathlib import Path

__all__ = ["record", "train_replay", "replay_eval", "replay_config", "default_replay_dir"]

# LTDConfig.verify_sizes of replay-trained policies (capped at the recording's max_verify)
REPLAY_VERIFY_SIZES = (2, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48)


def default_replay_dir(out: Path, split: str) -> Path:
    """``<out>/replay-<split>``: where ``ltd record`` writes by default."""
    return Path(out) / f"replay-{split}"


def _replay_config(top_k: int, max_depth: int, max_verify: int):
    from specloop.strategies.ltd import LTDConfig

    sizes = tuple(v for v in REPLAY_VERIFY_SIZES if v <= max_verify)
    return LTDConfig(top_k=top_k, max_depth=max_depth, verify_sizes=sizes)


def replay_config(data):
    """The `LTDConfig` a recording supports: its top_k and max_depth, V up to max_verify."""
    return _replay_config(int(data.meta.get("config", {}).get("top_k", 6)), data.max_depth, data.max_verify)


def record(args) -> int:
    from tqdm import tqdm

    from specloop.realmodels.drafters.registry import make_drafter
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.ltd_env import _prompt_ids
    from specloop.realmodels.ltd_record import check_resumable, record_replay

    if args.max_depth < 1 or args.max_verify < 2 or args.max_new_tokens < 1 or args.prompts < 1:
        raise ValueError("need --max-depth >= 1, --max-verify >= 2, --max-new-tokens >= 1 and --prompts >= 1")
    if getattr(args, "cost_repeats", 3) < 1 or getattr(args, "cost_tokens", 32) < 2:
        raise ValueError("need --cost-repeats >= 1 and --cost-tokens >= 2")
    out = args.replay or default_replay_dir(args.out, args.split)
    check_resumable(out, max_depth=args.max_depth, max_verify=args.max_verify, max_new_tokens=args.max_new_tokens,
                    top_k=args.top_k, drafter=args.drafter or "eagle3", dtype=args.dtype)    # before loading
    target = load_model("smollm2-135m", dtype=args.dtype)
    drafter = make_drafter(args.drafter or "eagle3", target, train_if_missing=False, progress=False,
                           dtype=args.dtype)
    config = _replay_config(args.top_k, args.max_depth, args.max_verify)
    prompts = _prompt_ids(target, args.split, args.prompts)
    bar = tqdm(total=len(prompts), desc=f"recording {args.split}", unit="prompt")

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    start = time.perf_counter()
    record_replay(target, drafter, prompts, out, config, max_depth=args.max_depth, max_verify=args.max_verify,
                  max_new_tokens=args.max_new_tokens, progress=progress, costs_from=args.costs_from,
                  repeats=getattr(args, "cost_repeats", 3), draft_tokens=getattr(args, "cost_tokens", 32))
    bar.close()
    print(f"recorded {len(prompts)} prompts in {out} ({time.perf_counter() - start:.0f} s)")
    return 0


def train_replay(args, schedule, name: str) -> dict:
    """Co-train LTD on ``args.replay`` (default ``<out>/replay-warmup``), saving
    ``name`` and ``name``-independent; with ``args.init``, fine-tune that policy on
    the recording instead (`specloop.strategies.ltd_train.fine_tune`, ``schedule``'s
    rounds and co-training steps) and save it as ``name``. Returns the training
    metadata."""
    from specloop.sim.ltd_replay import ReplayTreeEngine, load_replay, run_replay_policy
    from specloop.strategies.ltd import load_policy, save_policy, variant_name
    from specloop.strategies.ltd_train import co_train, fine_tune

    directory = args.replay or default_replay_dir(args.out, "warmup")
    data = load_replay(directory)
    config = replay_config(data)
    if schedule.fixed_verify_size > config.verify_sizes[-1]:
        raise ValueError(f"--fixed-verify-size {schedule.fixed_verify_size} exceeds the recording's largest "
                         f"replayable V ({config.verify_sizes[-1]} nodes)")
    rate = args.reward_rate
    if args.reward == "net_tokens" and rate is None:       # the best static tree's speedup on the recording
        from specloop.cli.ltd_cmd import grid_search_static
        best, _ = grid_search_static(lambda p: run_replay_policy(p, data, config), config)
        rate = best["tokens_per_s"] * data.autoregressive_step_s
        print(f"net_tokens reward rate {rate:.3f} (static D={best['depth']} V={best['verify_size']})")
    meta = {"env": "replay", "replay": str(directory), "schedule": schedule.__dict__, "reward": args.reward,
            "reward_rate": rate, "seed": args.seed, "prompts": len(data.prompts),
            "positions": sum(p.positions for p in data.prompts), "costs": {
                k: data.meta[k] for k in ("drafter", "dtype", "autoregressive_step_s") if k in data.meta}}
    if getattr(args, "init", None):
        init = load_policy(args.init)
        tuned, stages = fine_tune(init, lambda: ReplayTreeEngine(data, init.config), schedule.co_depth_steps,
                                  schedule.co_size_steps, schedule.rounds, args.seed, args.reward, rate,
                                  schedule.n_steps)
        meta.update(init=str(args.init), stages=stages,
                    schedule={k: getattr(schedule, k) for k in ("rounds", "co_depth_steps", "co_size_steps",
                                                                 "n_steps")})
        print(f"saved {save_policy(tuned, name, meta)}")
        return meta
    result = co_train(lambda: ReplayTreeEngine(data, config), config, schedule, args.seed, args.reward,
                      reward_rate=rate)
    meta["stages"] = result["log"]
    for key, suffix in (("ltd", ""), ("independent", "-independent")):
        print(f"saved {save_policy(result[key], name if not suffix else variant_name(name, suffix), meta)}")
    return meta


def replay_eval(args, ablations, evaluate_rows, load_optional):
    """``ltd eval --env replay``: static grid on the tuning recording (``--tune-replay``,
    default ``<out>/replay-warmup``), rows on ``--replay`` (default ``<out>/replay-heldout``).
    ``ablations(ltd, independent, best)`` returns the rows' policies, the static
    tree first."""
    from specloop.cli.ltd_cmd import grid_search_static
    from specloop.sim.ltd_replay import load_replay, oracle_tokens_per_second, run_replay_policy
    from specloop.strategies.ltd import fine_tuned_label, load_policy, variant_name

    name = args.policy or "ltd-replay"
    ltd = load_policy(name)
    tune = load_replay(args.tune_replay or default_replay_dir(args.out, "warmup"))
    held = load_replay(args.replay or default_replay_dir(args.out, "heldout"))
    config = ltd.config
    best, grid = grid_search_static(lambda p: run_replay_policy(p, tune, config), config)

    def run(policy):
        return run_replay_policy(policy, held, config)

    # the first policy is the tuning grid's best static tree: rows are relative to it
    policies = ablations(ltd, load_optional(variant_name(name, "-independent")), best)
    tuned_name = getattr(args, "fine_tuned", None)
    tuned = load_optional(tuned_name) if tuned_name else None
    if tuned is not None:
        policies[fine_tuned_label(tuned_name)] = tuned
    rows, decisions = evaluate_rows(run, policies, None)
    best_tps = rows[0]["tokens_per_s"]
    held_best = max(grid_search_static(run, config)[1], key=lambda r: r["tokens_per_s"])
    oracle = oracle_tokens_per_second(held, config)
    return ({"env": "replay", "policy": name, "rows": rows, "best_static": best, "grid": grid,
             "heldout_best_static": held_best, "oracle_tokens_per_s": oracle,
             "oracle_vs_best_static": oracle / best_tps,
             "autoregressive_step_s": held.autoregressive_step_s,
             "prompts": len(held.prompts), "tune_prompts": len(tune.prompts)}, decisions)
