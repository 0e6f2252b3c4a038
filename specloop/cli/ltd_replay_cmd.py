"""Back ends of ``specloop ltd record`` and ``specloop ltd train|eval --env replay``:
the flags turned into typed configs, the library called, its result printed.

* ``ltd record`` runs the real decoder once per position of a greedy generation and
  stores every position's full draft tree, the target's tokens at its nodes and the
  measured costs (`specloop.ltd.eval_real.record_real`; resumable: a rerun
  skips prompts already on disk).
* ``ltd train --env replay`` trains LTD's depth and size policies with PPO on the
  recorded rounds (`specloop.ltd.train_sim.train_replay`): the real drafter's own
  confidences and acceptance, priced by the measured costs.
* ``ltd eval --env replay`` grid-searches static trees on the tuning recording and
  evaluates LTD, its ablations and the clairvoyant per-round oracle on the
  evaluation recording (`specloop.ltd.eval_sim.replay_eval`).
"""
from __future__ import annotations

import time
from pathlib import Path

__all__ = ["record", "train_replay", "replay_eval", "default_replay_dir"]


def default_replay_dir(out: Path, split: str) -> Path:
    """``<out>/replay-<split>``: where ``ltd record`` writes by default."""
    return Path(out) / f"replay-{split}"


def record(args) -> int:
    from tqdm import tqdm

    from specloop.ltd.eval_real import RealLTDSetup, RecordConfig, record_real

    if args.max_depth < 1 or args.max_verify < 2 or args.max_new_tokens < 1 or args.prompts < 1:
        raise ValueError("need --max-depth >= 1, --max-verify >= 2, --max-new-tokens >= 1 and --prompts >= 1")
    if getattr(args, "cost_repeats", 3) < 1 or getattr(args, "cost_tokens", 32) < 2:
        raise ValueError("need --cost-repeats >= 1 and --cost-tokens >= 2")
    out = args.replay or default_replay_dir(args.out, args.split)
    setup = RealLTDSetup(drafter=args.drafter or "eagle3", dtype=args.dtype, prompts=args.prompts,
                         max_new_tokens=args.max_new_tokens, seed=args.seed)
    config = RecordConfig(out, setup, split=args.split, max_depth=args.max_depth, max_verify=args.max_verify,
                          top_k=args.top_k, costs_from=args.costs_from, cost_repeats=getattr(args, "cost_repeats", 3),
                          cost_tokens=getattr(args, "cost_tokens", 32))
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=f"recording {args.split}", unit="prompt")
        bar.n = done
        bar.refresh()

    start = time.perf_counter()
    try:
        count = record_real(config, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    print(f"recorded {count} prompts in {out} ({time.perf_counter() - start:.0f} s)")
    return 0


def train_replay(args, schedule, name: str) -> dict:
    """``ltd train --env replay``: `specloop.ltd.train_sim.train_replay` on
    ``args.replay`` (default ``<out>/replay-warmup``); prints what it saved and
    returns the training metadata."""
    from specloop.ltd.train_sim import ReplayTrainConfig, train_replay as train

    directory = args.replay or default_replay_dir(args.out, "warmup")
    trained = train(ReplayTrainConfig(directory, name=name, schedule=schedule, seed=args.seed, reward=args.reward,
                                      reward_rate=args.reward_rate, init=getattr(args, "init", None)), log=print)
    for path in trained["saved"]:
        print(f"saved {path}")
    return trained["meta"]


def replay_eval(args, extra_policies: tuple[str, ...] = ()):
    """``ltd eval --env replay``: `specloop.ltd.eval_sim.replay_eval` with the static
    grid on ``--tune-replay`` (default ``<out>/replay-warmup``) and rows on
    ``--replay`` (default ``<out>/replay-heldout``). Returns (result, decisions)."""
    from specloop.ltd.eval_sim import ReplayEvalConfig, replay_eval as evaluate

    config = ReplayEvalConfig(tune_replay=args.tune_replay or default_replay_dir(args.out, "warmup"),
                              replay=args.replay or default_replay_dir(args.out, "heldout"),
                              policy=args.policy or "ltd-replay", fine_tuned=getattr(args, "fine_tuned", None),
                              extra_policies=tuple(extra_policies))
    return evaluate(config)
