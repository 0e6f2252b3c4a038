"""LTD training: the two gymnasium environments over any tree-drafting engine, PPO
with LTD's settings (stable-baselines3), export to plain torch actors and the
alternating co-training schedule (LTD, ICLR 2026, Sec. 3 and App. "training").

The environments are engine-agnostic: an *engine* is anything with the
`LTDEngine` methods (the simulator's `specloop.ltd.env_sim.SimTreeEngine` and the
real decoder's `specloop.ltd.env_real.RealTreeEngine`), so one definition of
observation, action and reward serves both halves:

* `DepthEnv`: one step per draft step; an episode is one draft-and-verify cycle.
  Observation `depth_observation`; action 1 = continue (draft one more level),
  0 = stop (then the size side -- a fixed V or a trained size policy -- picks V,
  the target verifies, reward = `cycle_reward`, the episode terminates).
  Intermediate steps have reward 0; reaching ``max_depth`` forces a stop. With one
  cycle per episode the return is gamma^(D-1) R_t, which LTD's gamma = 0.999 leaves
  almost undiscounted; a multi-cycle episode would instead reward short cycles
  (more cycles per env step), the premature-stop bias LTD's gamma avoids.
  ``reset()`` without a seed continues the same prompt; with a seed (or once the
  prompt is finished) it starts a new one.
* `SizeEnv`: one step per cycle. The depth side (uniform random depth 1..max_depth
  as in LTD's initial training, or a trained depth policy) drafts the tree;
  observation `size_observation`; action = index into ``config.verify_sizes``.

A `SizeEnv` episode is one prompt (until ``engine.episode_done``): truncated, never
terminated (the size choice barely changes the next state; LTD's gamma = 0.9).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import gymnasium as gym
import numpy as np

from specloop.record import RoundRecord
from specloop.strategies.base import DraftStep, TreeCandidates
from specloop.ltd.policy import (CONTINUE, LTDConfig, LTDPolicy, MLPActor, cycle_reward,
                                 depth_observation, size_observation)

__all__ = ["LTDEngine", "DepthEnv", "SizeEnv", "PPO_SETTINGS", "ppo_kwargs", "train_ppo",
           "CoTrainSchedule", "co_train", "fine_tune", "measure_policy_overhead"]


class LTDEngine(Protocol):
    """What the LTD environments drive (one draft-and-verify cycle at a time).

    Attributes: ``config`` (`LTDConfig`), ``max_depth`` (the deepest draft step the
    engine can take, <= config.max_depth), ``target_time`` (seconds of one plain
    target forward: the reward scale), ``rounds_done``, ``episode_done`` (True
    once the prompt is finished).
    """

    config: LTDConfig
    max_depth: int
    target_time: float
    rounds_done: int
    episode_done: bool

    def reset(self, rng: np.random.Generator) -> None: ...

    def begin_round(self) -> DraftStep: ...          # first draft step (depth 1)

    def deepen(self) -> DraftStep: ...               # one more draft step

    def candidates(self) -> TreeCandidates: ...      # the tree drafted so far

    def finish(self, verify_size: int) -> RoundRecord: ...   # verify the best V nodes


SizeChooser = Callable[[TreeCandidates], int]
DepthChooser = Callable[[DraftStep], bool]


class _EnvBase(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, engine: LTDEngine, reward: str, obs_dim: int, reward_rate: float | None = None):
        super().__init__()
        self.engine = engine
        self.config = engine.config
        self.reward_kind, self.reward_rate = reward, reward_rate
        cycle_reward(RoundRecord(0, 0, 1, 1, 2, 0, 1, 1.0, 1.0), reward, 1.0, reward_rate)   # validates them
        self.observation_space = gym.spaces.Box(0.0, 4.0, shape=(obs_dim,), dtype=np.float32)

    def _reward(self, record: RoundRecord) -> float:
        return cycle_reward(record, self.reward_kind, self.engine.target_time, self.reward_rate)

    def _truncated(self) -> bool:
        return bool(self.engine.episode_done)


class DepthEnv(_EnvBase):
    """LTD's depth-policy environment (see the module docstring).

    Args:
        engine: an `LTDEngine`.
        size_chooser: V for each drafted tree (e.g. a trained `LTDPolicy.verify_size`);
            None = ``fixed_verify_size`` (LTD trains the depth policy under V = 60 on
            a GPU; scaled here).
        fixed_verify_size: V without a chooser (nodes).
        reward: a kind of `cycle_reward`; reward_rate: its ``rate`` (net_tokens).
    """

    def __init__(self, engine: LTDEngine, size_chooser: SizeChooser | None = None,
                 fixed_verify_size: int = 16, reward: str = "throughput", reward_rate: float | None = None):
        super().__init__(engine, reward, engine.config.depth_obs_dim, reward_rate)
        self.action_space = gym.spaces.Discrete(2)
        self.size_chooser = size_chooser
        self.fixed_verify_size = int(fixed_verify_size)
        self._step: DraftStep | None = None
        self._done = True

    def _obs(self) -> np.ndarray:
        return depth_observation(self._step, self.config)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None or self._step is None or self.engine.episode_done:
            self.engine.reset(self.np_random)
        self._step = self.engine.begin_round()
        self._done = False
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(int(action)):
            raise ValueError(f"depth action must be 0 (stop) or 1 (continue), got {action!r}")
        if self._done:
            raise ValueError("the cycle (episode) is over: call reset() before step()")
        if int(action) == CONTINUE and self._step.depth < self.engine.max_depth:
            self._step = self.engine.deepen()
            return self._obs(), 0.0, False, False, {}
        cands = self.engine.candidates()
        size = self.size_chooser(cands) if self.size_chooser else self.fixed_verify_size
        record = self.engine.finish(int(size))
        self._done = True
        return self._obs(), self._reward(record), True, False, {"record": record.to_dict()}


class SizeEnv(_EnvBase):
    """LTD's verification-size environment (see the module docstring).

    Args:
        engine: an `LTDEngine`.
        depth_chooser: continue/stop after each draft step (e.g. a trained
            `LTDPolicy.continue_drafting`); None = a uniform random depth in
            1..max_depth per cycle, drawn from the env's generator (LTD's initial
            size training).
        reward: a kind of `cycle_reward`; reward_rate: its ``rate`` (net_tokens).
    """

    def __init__(self, engine: LTDEngine, depth_chooser: DepthChooser | None = None,
                 reward: str = "throughput", reward_rate: float | None = None):
        super().__init__(engine, reward, engine.config.size_obs_dim, reward_rate)
        self.action_space = gym.spaces.Discrete(len(engine.config.verify_sizes))
        self.depth_chooser = depth_chooser

    def _draft(self) -> np.ndarray:
        step = self.engine.begin_round()
        if self.depth_chooser is None:
            target = int(self.np_random.integers(1, self.engine.max_depth + 1))
            while step.depth < target:
                step = self.engine.deepen()
        else:
            while step.depth < self.engine.max_depth and self.depth_chooser(step):
                step = self.engine.deepen()
        return size_observation(self.engine.candidates(), self.config)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.engine.reset(self.np_random)
        self._obs = self._draft()
        return self._obs, {}

    def step(self, action):
        if not self.action_space.contains(int(action)):
            raise ValueError(f"size action must be in [0, {self.action_space.n}), got {action!r}")
        record = self.engine.finish(self.config.verify_sizes[int(action)])
        truncated = self._truncated()
        if not truncated:
            self._obs = self._draft()
        return self._obs, self._reward(record), False, truncated, {"record": record.to_dict()}


# -- PPO ---------------------------------------------------------------------------------
PPO_SETTINGS = {
    # LTD: size actor & critic [1024, 256], gamma 0.9; depth one hidden layer of 1024,
    # gamma 0.999; rollout 2048, minibatch 256, 20 epochs, ent_coef 0.01, lr 1e-3 -> 0.
    "size": {"net_arch": {"pi": [1024, 256], "vf": [1024, 256]}, "gamma": 0.9},
    "depth": {"net_arch": {"pi": [1024], "vf": [1024]}, "gamma": 0.999},
    "common": {"n_steps": 2048, "batch_size": 256, "n_epochs": 20, "ent_coef": 0.01,
               "learning_rate": 1e-3},
}


def ppo_kwargs(kind: str, n_steps: int | None = None) -> dict:
    """stable-baselines3 PPO keyword arguments with LTD's settings for ``kind``
    ("depth" or "size"); ``n_steps`` overrides the rollout length (tests).

    Raises:
        ValueError: unknown kind.
    """
    if kind not in ("depth", "size"):
        raise ValueError(f"kind must be 'depth' or 'size', got {kind!r}")
    common = dict(PPO_SETTINGS["common"])
    lr0 = common.pop("learning_rate")
    if n_steps is not None:
        common["n_steps"] = int(n_steps)
        common["batch_size"] = min(common["batch_size"], int(n_steps))
    return {**common, "gamma": PPO_SETTINGS[kind]["gamma"],
            "learning_rate": lambda progress: lr0 * progress,      # linear decay to 0
            "policy_kwargs": {"net_arch": PPO_SETTINGS[kind]["net_arch"]}}


def train_ppo(env: gym.Env, kind: str, total_timesteps: int, seed: int = 0,
              n_steps: int | None = None, init_actor: MLPActor | None = None, verbose: int = 0):
    """Train one LTD policy with PPO; returns (sb3_model, exported `MLPActor`, seconds).

    Args:
        env: a `DepthEnv` or `SizeEnv`.
        kind: "depth" or "size" (selects the settings of `PPO_SETTINGS`).
        total_timesteps: environment steps (depth: draft steps; size: cycles).
        seed: PPO seed.
        n_steps: rollout length override (default 2048).
        init_actor: start the actor from these weights (co-training continues a
            policy instead of restarting it).
    """
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", env, seed=seed, verbose=verbose, device="cpu", **ppo_kwargs(kind, n_steps))
    if init_actor is not None:
        _load_actor_into(model, init_actor)
    start = time.perf_counter()
    model.learn(total_timesteps=int(total_timesteps))
    return model, MLPActor.load_sb3(model), time.perf_counter() - start


def _load_actor_into(model, actor: MLPActor) -> None:
    import torch
    linears = [m for m in model.policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
    mine = [m for m in actor.body if isinstance(m, torch.nn.Linear)]
    if len(linears) != len(mine):
        raise ValueError("init_actor's hidden layers do not match the PPO policy")
    with torch.no_grad():
        for theirs, ours in zip(linears, mine):
            theirs.load_state_dict(ours.state_dict())
        model.policy.action_net.load_state_dict(actor.action_net.state_dict())


@dataclass(frozen=True)
class CoTrainSchedule:
    """Step budgets of LTD's schedule: initial training of each policy alone, then
    ``rounds`` alternations (depth with the size policy fixed, then size with the
    new depth policy fixed). Steps are environment steps."""

    depth_steps: int = 30_720
    size_steps: int = 16_384
    rounds: int = 2
    co_depth_steps: int = 12_288
    co_size_steps: int = 8_192
    fixed_verify_size: int = 12
    n_steps: int | None = None


def co_train(make_engine: Callable[[], LTDEngine], config: LTDConfig, schedule: CoTrainSchedule,
             seed: int = 0, reward: str = "throughput", log: Callable[[str], None] = print,
             reward_rate: float | None = None) -> dict:
    """LTD's training: initial depth (fixed V) and size (random depths) policies,
    then ``schedule.rounds`` alternating rounds, on the `cycle_reward` ``reward``
    (``reward_rate``: its rate, for net_tokens).

    Returns:
        dict with ``"ltd"`` (co-trained `LTDPolicy`), ``"independent"`` (the two
        initial policies combined without co-training), ``"depth_only"``,
        ``"size_only"`` (one actor each, the other side static) and ``"log"``
        (per-stage seconds and steps).
    """
    stages = []

    def run(kind, env, steps):
        _, actor, seconds = train_ppo(env, kind, steps, seed=seed + len(stages), n_steps=schedule.n_steps)
        stages.append({"stage": len(stages), "kind": kind, "steps": int(steps), "seconds": seconds})
        log(f"LTD stage {len(stages)}: {kind} policy, {steps} steps, {seconds:.1f} s")
        return actor

    rw = {"reward": reward, "reward_rate": reward_rate}
    depth0 = run("depth", DepthEnv(make_engine(), None, schedule.fixed_verify_size, **rw), schedule.depth_steps)
    size0 = run("size", SizeEnv(make_engine(), None, **rw), schedule.size_steps)
    depth, size = depth0, size0
    if schedule.rounds > 0:          # the alternation is fine-tuning the initial pair in the same engine
        initial = LTDPolicy(config, depth0, size0, static_verify_size=schedule.fixed_verify_size)
        tuned, co_stages = fine_tune(initial, make_engine, schedule.co_depth_steps, schedule.co_size_steps,
                                     schedule.rounds, seed, reward, reward_rate, schedule.n_steps, log,
                                     first_stage=len(stages))
        depth, size = tuned.depth_actor, tuned.size_actor
        stages.extend(co_stages)
    static = {"static_verify_size": schedule.fixed_verify_size}
    return {"ltd": LTDPolicy(config, depth, size, name="ltd", **static),
            "independent": LTDPolicy(config, depth0, size0, name="ltd-independent", **static),
            "depth_only": LTDPolicy(config, depth, None, name="ltd-depth-only", **static),
            "size_only": LTDPolicy(config, None, size, name="ltd-size-only", **static),
            "log": stages}


def fine_tune(policy: LTDPolicy, make_engine: Callable[[], LTDEngine], depth_steps: int, size_steps: int,
              rounds: int = 1, seed: int = 0, reward: str = "throughput", reward_rate: float | None = None,
              n_steps: int | None = None, log: Callable[[str], None] = print,
              first_stage: int = 0) -> tuple[LTDPolicy, list[dict]]:
    """Continue training a trained `LTDPolicy` in another engine (LTD's transfer
    question: sim-trained policies fine-tuned on the real decoder or its recorded
    rounds). ``rounds`` alternations as in `co_train`'s co-training: the depth
    actor with the size actor fixed (``depth_steps`` draft steps), then the size
    actor with the new depth actor fixed (``size_steps`` cycles); each PPO run
    starts from the policy's weights. A missing actor (or 0 steps) stays as it is.
    `co_train` runs its co-training rounds through this. Stages are numbered from
    ``first_stage``; stage i of a round trains with seed ``seed + i`` (its slot,
    so a skipped stage does not shift the others' seeds).

    Returns:
        (the fine-tuned `LTDPolicy` with the same config and static fallbacks,
        per-stage log of kind / steps / seconds).

    Raises:
        ValueError: rounds < 1, negative steps, or a policy with neither actor.
    """
    if int(rounds) < 1 or depth_steps < 0 or size_steps < 0:
        raise ValueError(f"need rounds >= 1 and steps >= 0, got {rounds}, {depth_steps}, {size_steps}")
    if policy.depth_actor is None and policy.size_actor is None:
        raise ValueError("a static policy has no actor to fine-tune")
    config, depth, size, stages = policy.config, policy.depth_actor, policy.size_actor, []
    statics = {"static_depth": policy.static_depth, "static_verify_size": policy.static_verify_size}
    rw = {"reward": reward, "reward_rate": reward_rate}

    def run(slot: int, kind: str, env, steps: int, init: MLPActor) -> MLPActor:
        stage = first_stage + slot
        _, actor, seconds = train_ppo(env, kind, steps, seed + stage, n_steps, init_actor=init)
        stages.append({"stage": stage, "kind": kind, "steps": int(steps), "seconds": seconds})
        log(f"LTD stage {stage + 1}: {kind} policy, {steps} steps, {seconds:.1f} s")
        return actor

    for r in range(int(rounds)):
        if depth is not None and depth_steps > 0:
            chooser = LTDPolicy(config, None, size, **statics)
            depth = run(2 * r, "depth", DepthEnv(make_engine(), chooser.verify_size, policy.static_verify_size, **rw),
                        depth_steps, depth)
        if size is not None and size_steps > 0:
            chooser = LTDPolicy(config, depth, None, **statics)
            size = run(2 * r + 1, "size", SizeEnv(make_engine(), chooser.continue_drafting, **rw), size_steps, size)
    return LTDPolicy(config, depth, size, name=f"{policy.name}-fine-tuned", **statics), stages


def measure_policy_overhead(policy: LTDPolicy, steps: list[DraftStep], candidates: list[TreeCandidates],
                            repeats: int = 3) -> dict:
    """Wall-clock seconds of the policy's decisions: mean seconds per
    ``continue_drafting`` and per ``verify_size`` call over the given inputs (best
    of ``repeats`` passes)."""
    def best(fn, items):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for item in items:
                fn(item)
            times.append((time.perf_counter() - t0) / max(len(items), 1))
        return min(times)

    saved = list(policy.decisions)
    out = {"continue_drafting_s": best(policy.continue_drafting, steps),
           "verify_size_s": best(policy.verify_size, candidates)}
    policy.decisions = saved
    return out
