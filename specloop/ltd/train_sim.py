"""LTD (Learning To Draft, ICLR 2026) training in the simulator and on recorded real
rounds: the back ends of ``specloop ltd train --env sim|replay``.

* `train_sim`: the depth and size policies with PPO (initial training of each alone,
  then alternating co-training, `specloop.ltd.train.co_train`) in the
  simulated tree world; saves ``<name>`` (co-trained) and ``<name>-independent``;
  optionally the reward ablation's size policies ``<name>-size-<reward>``.
* `train_replay`: the same co-training on rounds recorded from the real decoder
  (`specloop.ltd.env_replay`), or the fine-tuning of an initial policy there.

Both return the saved paths (in saving order) and the training metadata; the caller
writes the training log.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specloop.ltd.train import CoTrainSchedule

__all__ = ["SimTrainConfig", "train_sim", "ReplayTrainConfig", "train_replay"]


@dataclass(frozen=True)
class SimTrainConfig:
    """``ltd train --env sim``.

    Attributes:
        name: policy name (saved in the LTD policy store) or file path.
        schedule: PPO step budgets (`CoTrainSchedule`).
        seed: PPO / environment seed.
        reward: `specloop.ltd.policy.REWARDS` name of the co-training reward.
        reward_rate: (net_tokens) tokens per target-forward time to beat.
        reward_ablation: also train size policies on the other paper rewards.
        ablation_only: train only those, not the co-trained pair.
    """

    name: str = "ltd-sim"
    schedule: CoTrainSchedule = field(default_factory=CoTrainSchedule)
    seed: int = 0
    reward: str = "throughput"
    reward_rate: float | None = None
    reward_ablation: bool = False
    ablation_only: bool = False


def train_sim(config: SimTrainConfig) -> dict:
    """Train and save LTD policies in the simulator.

    Returns:
        {"saved": [paths in saving order], "meta": training metadata (env, schedule,
        reward, seed, world, cost_source, stages), "reward_ablation": {reward:
        {"path", "seconds"}}}.
    """
    from specloop.ltd.env_sim import SimTreeEngine, TreeWorld, make_size_env
    from specloop.ltd.policy import PAPER_REWARDS, LTDConfig, LTDPolicy, save_policy, variant_name
    from specloop.ltd.train import co_train, train_ppo

    ltd_config = LTDConfig()
    world = TreeWorld(config=ltd_config)
    schedule, name = config.schedule, config.name
    meta = {"env": "sim", "schedule": schedule.__dict__, "reward": config.reward, "seed": config.seed,
            "world": world.options.__dict__, "cost_source": world.cost_source}
    saved_paths = []
    if not config.ablation_only:
        result = co_train(lambda: SimTreeEngine(world), ltd_config, schedule, config.seed, config.reward,
                          reward_rate=config.reward_rate)
        meta["stages"] = result["log"]
        for key, suffix in (("ltd", ""), ("independent", "-independent")):
            saved_paths.append(save_policy(result[key], name if not suffix else variant_name(name, suffix), meta))
    ablation = {}
    if config.reward_ablation or config.ablation_only:
        for reward in PAPER_REWARDS:
            if reward == config.reward:
                continue
            # as the initial size policy of co_train: random depths 1..max_depth, size_steps cycles
            _, actor, seconds = train_ppo(make_size_env(world=world, reward=reward), "size", schedule.size_steps,
                                          seed=config.seed, n_steps=schedule.n_steps)
            path = save_policy(LTDPolicy(ltd_config, None, actor, name=f"size-{reward}"),
                               variant_name(name, f"-size-{reward}"),
                               {**meta, "reward": reward, "size_steps": schedule.size_steps, "seconds": seconds})
            ablation[reward] = {"path": str(path), "seconds": seconds}
            saved_paths.append(path)
    return {"saved": saved_paths, "meta": meta, "reward_ablation": ablation}


@dataclass(frozen=True)
class ReplayTrainConfig:
    """``ltd train --env replay``.

    Attributes:
        replay: the recording directory trained on.
        name: policy name or file path to save.
        schedule: PPO step budgets; with ``init`` only its rounds, co-training
            steps and n_steps are used.
        seed, reward, reward_rate: as `SimTrainConfig` (net_tokens without a rate:
            the best static tree's rate on the recording).
        init: policy (name or path) to fine-tune instead of training from scratch.
    """

    replay: Path
    name: str = "ltd-replay"
    schedule: CoTrainSchedule = field(default_factory=CoTrainSchedule)
    seed: int = 0
    reward: str = "throughput"
    reward_rate: float | None = None
    init: str | None = None


def train_replay(config: ReplayTrainConfig, log: Callable[[str], None] | None = None) -> dict:
    """Co-train LTD on the recording, saving ``name`` and ``name``-independent; with
    ``init``, fine-tune that policy there instead
    (`specloop.ltd.train.fine_tune`) and save it as ``name``. ``log``
    gets the derived net_tokens rate (one line) before training starts.

    Returns:
        {"saved": [paths], "meta": training metadata, "rate_from": the static
        grid's best row when the net_tokens rate was derived from it, else None}.

    Raises:
        ValueError: the schedule's fixed V exceeds the recording's largest V.
        FileNotFoundError: no such recording or init policy.
    """
    from specloop.ltd.eval_sim import replay_config
    from specloop.ltd.env_replay import ReplayTreeEngine, load_replay, run_replay_policy
    from specloop.ltd.policy import load_policy, save_policy, variant_name
    from specloop.ltd.evaluate import grid_search_static
    from specloop.ltd.train import co_train, fine_tune

    schedule, name = config.schedule, config.name
    data = load_replay(config.replay)
    ltd_config = replay_config(data)
    if schedule.fixed_verify_size > ltd_config.verify_sizes[-1]:
        raise ValueError(f"--fixed-verify-size {schedule.fixed_verify_size} exceeds the recording's largest "
                         f"replayable V ({ltd_config.verify_sizes[-1]} nodes)")
    rate, rate_from = config.reward_rate, None
    if config.reward == "net_tokens" and rate is None:       # the best static tree's speedup on the recording
        rate_from, _ = grid_search_static(lambda p: run_replay_policy(p, data, ltd_config), ltd_config)
        rate = rate_from["tokens_per_s"] * data.autoregressive_step_s
        if log is not None:
            log(f"net_tokens reward rate {rate:.3f} (static D={rate_from['depth']} V={rate_from['verify_size']})")
    meta = {"env": "replay", "replay": str(config.replay), "schedule": schedule.__dict__, "reward": config.reward,
            "reward_rate": rate, "seed": config.seed, "prompts": len(data.prompts),
            "positions": sum(p.positions for p in data.prompts), "costs": {
                k: data.meta[k] for k in ("drafter", "dtype", "autoregressive_step_s") if k in data.meta}}
    if config.init:
        init = load_policy(config.init)
        tuned, stages = fine_tune(init, lambda: ReplayTreeEngine(data, init.config), schedule.co_depth_steps,
                                  schedule.co_size_steps, schedule.rounds, config.seed, config.reward, rate,
                                  schedule.n_steps)
        meta.update(init=str(config.init), stages=stages,
                    schedule={k: getattr(schedule, k) for k in ("rounds", "co_depth_steps", "co_size_steps",
                                                                 "n_steps")})
        return {"saved": [save_policy(tuned, name, meta)], "meta": meta, "rate_from": rate_from}
    result = co_train(lambda: ReplayTreeEngine(data, ltd_config), ltd_config, schedule, config.seed, config.reward,
                      reward_rate=rate)
    meta["stages"] = result["log"]
    saved = [save_policy(result[key], name if not suffix else variant_name(name, suffix), meta)
             for key, suffix in (("ltd", ""), ("independent", "-independent"))]
    return {"saved": saved, "meta": meta, "rate_from": rate_from}
