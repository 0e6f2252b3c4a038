"""LTD: Learning To Draft (ICLR 2026) -- the trained depth and verification-size
policies as `DraftPolicy` objects, their observations, the exported actors (plain
torch modules, no stable-baselines3 at inference) and save / load by name.

LTD (summary: docs/design.md, section "Sources") replaces EAGLE-3's static draft depth and
verification size with two small policies trained by PPO on the per-cycle
throughput reward R_t = L_A / (T_draft + T_verify):

* the **depth policy** is asked after every draft step of an EAGLE-2-style dynamic
  tree (``continue_drafting(DraftStep) -> bool``; action 1 = continue, 0 = stop);
  its observation is `depth_observation`: the depth D, the context length L and the
  last layer's candidate probabilities;
* the **size policy** is asked once the tree is drafted
  (``verify_size(TreeCandidates) -> int``): it picks V from a discrete set
  (`LTDConfig.verify_sizes`); its observation is `size_observation`: D, L and all
  tree candidate probabilities sorted descending and zero-padded.

The engines (``specloop.ltd.env_sim``, ``specloop.ltd.env_real``) build the
same observations from the same plain data, so a policy trained in one engine runs
in the other. Training (stable-baselines3 PPO) lives in
`specloop.ltd.train`; this module only needs torch.

Files: `save_policy` writes one ``.pt`` file (a dict of tensors and plain values,
loadable with ``torch.load(weights_only=True)``); `load_policy` accepts a path or a
name, looked up in ``$SPECLOOP_LTD_DIR`` (default ``~/.cache/specloop/ltd/``) and
then in the package's ``pretrained/`` folder (`specloop/ltd/pretrained/`).
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, DraftStep, PlanState, TreeCandidates, TreePlan
from specloop.strategies.policies import _PolicyBase, check_k

__all__ = [
    "LTDConfig", "MLPActor", "LTDPolicy", "depth_observation", "size_observation",
    "save_policy", "load_policy", "policy_path", "variant_name", "ltd_cache_dir", "PRETRAINED_DIR",
    "FILE_FORMAT_VERSION", "CONTINUE", "STOP", "REWARDS", "PAPER_REWARDS", "cycle_reward",
    "layer_step", "fine_tuned_label",
]

FILE_FORMAT_VERSION = 1
CONTINUE, STOP = 1, 0
PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
_MAX_CONTEXT_UNITS = 4.0


@dataclass(frozen=True)
class LTDConfig:
    """Shape of the LTD decision problem (shared by envs, actors and policies).

    Attributes:
        top_k: EAGLE-2 tree width: nodes kept per depth and children per node (>= 1).
        max_depth: largest draft depth D the depth policy may reach (tokens, >= 1);
            LTD trains the size policy under random depths 1..12.
        verify_sizes: the size policy's discrete action set of V (nodes sent to the
            target), increasing. LTD uses about 20..240 on a GPU; the default here
            is scaled to what this CPU verifies (the measured SmolLM2-135M table in
            ``specloop/sim/data`` covers 1..32 tokens; 33 tokens cost ~2.9x one in
            fp32, ~1.9x in bf16).
        context_scale: L is observed as min(L / context_scale, 4) (tokens).
        size_obs_probs: how many of the tree's node probabilities (the largest,
            sorted) the size policy observes; an EAGLE-2 tree of depth D has
            top_k + (D - 1) top_k^2 nodes, far more than any V, so the tail is cut.
    """

    top_k: int = 6
    max_depth: int = 12
    verify_sizes: tuple[int, ...] = (2, 4, 6, 8, 12, 16, 20, 24, 28, 32)
    context_scale: float = 1024.0
    size_obs_probs: int = 64

    def __post_init__(self) -> None:
        check_k(self.top_k, "top_k", 1)
        check_k(self.max_depth, "max_depth", 1)
        sizes = tuple(int(v) for v in self.verify_sizes)
        if not sizes or any(v < 1 for v in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"verify_sizes must be strictly increasing ints >= 1, got {self.verify_sizes}")
        object.__setattr__(self, "verify_sizes", sizes)
        check_k(self.size_obs_probs, "size_obs_probs", 1)
        if not (math.isfinite(self.context_scale) and self.context_scale > 0):
            raise ValueError(f"context_scale must be > 0 tokens, got {self.context_scale}")

    @property
    def depth_obs_dim(self) -> int:
        """2 + top_k: (D, L, the last layer's top_k candidate probabilities)."""
        return 2 + self.top_k

    @property
    def size_obs_dim(self) -> int:
        """2 + size_obs_probs: (D, L, the tree's largest node probabilities)."""
        return 2 + self.size_obs_probs

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["verify_sizes"] = list(self.verify_sizes)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "LTDConfig":
        return cls(**{**data, "verify_sizes": tuple(data["verify_sizes"])})


REWARDS = ("throughput", "accepted_length", "time_cost", "net_tokens")
PAPER_REWARDS = REWARDS[:3]          # LTD's reward and its two ablations


def cycle_reward(record: RoundRecord, kind: str = "throughput", scale: float = 1.0,
                 rate: float | None = None) -> float:
    """LTD's per-cycle reward from a round record, its two ablation rewards, and a
    net-token reward for the total throughput.

    * ``"throughput"`` (LTD): n_t / (draft_time + verify_time) * scale, n_t the
      committed tokens (`RoundRecord.tokens_per_round`, L_A of the paper) and the
      times in seconds; the engines pass scale = one target forward's seconds, so
      the reward is the cycle's tokens per target-forward time (a unitless speedup).
    * ``"accepted_length"``: n_t (the acceptance-length reward of LTD's ablation).
    * ``"time_cost"``: -(draft_time + verify_time) / scale (the time-cost reward).
    * ``"net_tokens"``: n_t - rate * (draft_time + verify_time) / scale, the tokens
      a cycle commits beyond what ``rate`` (tokens per target-forward time, e.g. the
      best static tree's speedup) would commit in the same time. The summed reward
      is Dinkelbach's parametric form of the ratio objective sum n_t / sum T_t, the
      decoder's throughput: at the optimal rate its maximiser maximises throughput.
      LTD's per-cycle ratio instead maximises the *mean of ratios*, which rewards
      cheap cycles whatever they commit.

    Raises:
        ValueError: unknown kind, non-positive scale, a zero-time round for the
            throughput / time rewards, or net_tokens without a rate > 0.
    """
    if kind not in REWARDS:
        raise ValueError(f"unknown reward {kind!r}; expected one of {REWARDS}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"reward scale must be > 0, got {scale}")
    if kind == "accepted_length":
        return float(record.tokens_per_round)
    seconds = record.draft_time + record.verify_time
    if not seconds > 0:
        raise ValueError("a round with zero draft + verify time has no throughput reward")
    if kind == "time_cost":
        return -seconds / scale
    if kind == "net_tokens":
        if rate is None or not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"the net_tokens reward needs a rate > 0 (tokens per target forward), got {rate}")
        return record.tokens_per_round - rate * seconds / scale
    return record.tokens_per_round / seconds * scale


def _checked_probs(values, name: str) -> np.ndarray:
    probs = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(probs)) or (probs < 0).any() or (probs > 1 + 1e-9).any():
        raise ValueError(f"{name} must be probabilities in [0, 1] (no NaN), got {probs[:8]}...")
    return probs


def _head(depth: int, context_length: int, config: LTDConfig) -> tuple[float, float]:
    if int(depth) < 0 or int(context_length) < 0:
        raise ValueError(f"depth and context_length must be >= 0, got {depth}, {context_length}")
    return (min(int(depth), config.max_depth) / config.max_depth,
            min(int(context_length) / config.context_scale, _MAX_CONTEXT_UNITS))


def _padded(probs: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros(length, dtype=np.float32)
    top = np.sort(probs)[::-1][:length]          # a sorted copy: the input is never touched
    out[: top.size] = top
    return out


def depth_observation(step: DraftStep, config: LTDConfig) -> np.ndarray:
    """LTD depth-policy observation, float32 (2 + top_k,).

    ``[D / max_depth, min(L / context_scale, 4), c_1, ..., c_top_k]`` where c are the
    last drafted layer's candidate probabilities (``step.candidate_probs``; the
    engines pass cumulative path probabilities, EAGLE-2's ranking score) sorted
    descending, zero-padded / truncated to top_k.

    Raises:
        ValueError: negative D or L, probabilities outside [0, 1] or NaN.
    """
    probs = _checked_probs(step.candidate_probs, "DraftStep.candidate_probs")
    obs = np.empty(config.depth_obs_dim, dtype=np.float32)
    obs[:2] = _head(step.depth, step.context_length, config)
    obs[2:] = _padded(probs, config.top_k)
    return obs


def size_observation(candidates: TreeCandidates, config: LTDConfig) -> np.ndarray:
    """LTD size-policy observation, float32 (2 + size_obs_probs,).

    ``[D / max_depth, min(L / context_scale, 4), P_1 >= P_2 >= ...]``: the drafted
    nodes' cumulative draft probabilities, sorted descending, zero-padded /
    truncated to ``size_obs_probs``.

    Raises:
        ValueError: negative D or L, probabilities outside [0, 1] or NaN.
    """
    probs = _checked_probs(candidates.node_probs, "TreeCandidates.node_probs")
    obs = np.empty(config.size_obs_dim, dtype=np.float32)
    obs[:2] = _head(candidates.depth, candidates.context_length, config)
    obs[2:] = _padded(probs, config.size_obs_dim - 2)
    return obs


def layer_step(depths: np.ndarray, parents: np.ndarray, probs: np.ndarray, depth: int, context_length: int,
               top_k: int) -> DraftStep:
    """The `DraftStep` a depth policy sees after drafting layer ``depth`` of an
    EAGLE-2 tree (the same values the tree drafters pass to ``continue_drafting``).

    Args: as `specloop.strategies.subtree.select_subtree`; ``context_length`` L in tokens; ``top_k`` candidate
    probabilities kept.

    Returns:
        DraftStep(D, L, the layer's top_k cumulative probabilities sorted
        descending, the best of them, best / best parent probability (1 at D = 1),
        capped at 1).
    """
    at = depths == depth
    layer = np.sort(probs[at])[::-1]
    best = float(layer[0]) if layer.size else 0.0
    parent_best = float(probs[parents[at]].max()) if depth > 1 and layer.size else 1.0
    cond = min(best / max(parent_best, 1e-300), 1.0)
    return DraftStep(int(depth), int(context_length), layer[:top_k].copy(), best, cond)


class MLPActor(nn.Module):
    """A PPO actor exported as a plain torch module: tanh MLP -> action logits.

    Same layout as stable-baselines3's ``MlpPolicy`` actor (``mlp_extractor.policy_net``
    then ``action_net``; SB3's default tanh activation), so `load_sb3` copies the
    weights one to one. Inference: ``act(obs) -> int`` (argmax, i.e. SB3's
    ``predict(deterministic=True)``) costs one small matmul chain, no SB3 call.

    Args:
        obs_dim: observation length (float32 features).
        hidden: hidden widths, e.g. (1024,) (LTD depth) or (1024, 256) (LTD size).
        num_actions: number of discrete actions (>= 2 for depth: stop / continue).
    """

    def __init__(self, obs_dim: int, hidden: Sequence[int], num_actions: int):
        super().__init__()
        if obs_dim < 1 or num_actions < 1 or any(int(h) < 1 for h in hidden):
            raise ValueError(f"bad MLPActor shape obs_dim={obs_dim} hidden={hidden} actions={num_actions}")
        self.obs_dim, self.hidden, self.num_actions = int(obs_dim), tuple(int(h) for h in hidden), int(num_actions)
        layers: list[nn.Module] = []
        width = self.obs_dim
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.Tanh()]
            width = h
        self.body = nn.Sequential(*layers)
        self.action_net = nn.Linear(width, self.num_actions)
        self.eval()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """float32 (..., obs_dim) -> action logits float32 (..., num_actions)."""
        return self.action_net(self.body(obs))

    def act(self, obs: np.ndarray) -> int:
        """Greedy action for one observation (float32 (obs_dim,)): argmax of the same
        logits as `forward`, computed on float32 NumPy copies of the weights (a
        per-call cost of a few microseconds instead of torch's dispatch overhead;
        the copies are refreshed by ``load_state_dict`` / `refresh`)."""
        x = np.asarray(obs, dtype=np.float32)
        layers = self._numpy_layers()
        for weight, bias in layers[:-1]:
            x = np.tanh(weight @ x + bias)
        weight, bias = layers[-1]
        return int(np.argmax(weight @ x + bias))

    def _numpy_layers(self) -> list:
        if getattr(self, "_np_layers", None) is None:
            self.refresh()
        return self._np_layers

    def refresh(self) -> None:
        """Re-copy the weights used by `act` (call after editing parameters in place)."""
        linears = [m for m in self.body if isinstance(m, nn.Linear)] + [self.action_net]
        self._np_layers = [(m.weight.detach().cpu().float().numpy().copy(),
                            m.bias.detach().cpu().float().numpy().copy()) for m in linears]

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        out = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._np_layers = None
        return out

    @torch.inference_mode()
    def probs(self, obs: np.ndarray) -> np.ndarray:
        """Action probabilities float64 (num_actions,) for one observation."""
        return torch.softmax(self.forward(torch.from_numpy(obs)).double(), -1).numpy()

    def spec(self) -> dict:
        return {"obs_dim": self.obs_dim, "hidden": list(self.hidden), "num_actions": self.num_actions}

    @classmethod
    def load_sb3(cls, model) -> "MLPActor":
        """Copy the actor of a trained stable-baselines3 PPO (``MlpPolicy`` over a flat
        Box observation and a Discrete action space) into a plain `MLPActor`.

        Raises:
            ValueError: the policy is not a tanh MLP actor over a flat observation.
        """
        policy = model.policy
        linears = [m for m in policy.mlp_extractor.policy_net if isinstance(m, nn.Linear)]
        acts = [m for m in policy.mlp_extractor.policy_net if not isinstance(m, nn.Linear)]
        if any(not isinstance(a, nn.Tanh) for a in acts) or len(acts) != len(linears):
            raise ValueError("only tanh MLP actors (SB3's default activation) can be exported")
        obs_dim = int(np.prod(model.observation_space.shape))
        actor = cls(obs_dim, [lin.out_features for lin in linears], int(model.action_space.n))
        with torch.no_grad():
            for mine, theirs in zip([m for m in actor.body if isinstance(m, nn.Linear)], linears):
                mine.load_state_dict(theirs.state_dict())
            actor.action_net.load_state_dict(policy.action_net.state_dict())
        return actor.eval()


class LTDPolicy(_PolicyBase):
    """LTD's depth and verification-size policies as one `DraftPolicy`.

    Each side is either a trained actor or a static value, so the same class gives
    LTD (both actors), LTD's ablations "depth-only" / "size-only" (one actor, the
    other side static) and a static EAGLE-3 tree (neither).

    ``plan`` asks for an EAGLE-2 dynamic tree (``TreePlan(top_k, max_depth, verify_size)``
    with the depth cap, and V = the static size or the largest size of the set, for
    engines that ignore the hooks); the engines then call ``continue_drafting`` after
    every draft step and ``verify_size`` once the tree is drafted.

    Args:
        config: `LTDConfig` (the actors must match its observation / action sizes).
        depth_actor: `MLPActor` (2 actions: 0 stop, 1 continue) or None = draft to
            ``static_depth``.
        size_actor: `MLPActor` (len(verify_sizes) actions) or None = ``static_verify_size``.
        static_depth: D used without a depth actor (tokens, 1..max_depth; default
            min(6, max_depth)).
        static_verify_size: V used without a size actor (nodes, >= 1).
        deterministic: argmax actions (default) or sampled from the actor's softmax
            with the policy's own generator.
        seed: seed of that generator.
        name: label for reports.

    Raises:
        ValueError: actor shapes not matching ``config``, bad static values.
    """

    _fields = ("decisions",)

    def __init__(self, config: LTDConfig | None = None, depth_actor: MLPActor | None = None,
                 size_actor: MLPActor | None = None, static_depth: int | None = None,
                 static_verify_size: int = 16, deterministic: bool = True, seed: int | None = 0,
                 name: str = "ltd"):
        super().__init__(seed)
        self.config = config or LTDConfig()
        if static_depth is None:
            static_depth = min(6, self.config.max_depth)
        self.static_depth = check_k(static_depth, "static_depth", 1)
        if self.static_depth > self.config.max_depth:
            raise ValueError(f"static_depth {static_depth} exceeds config.max_depth {self.config.max_depth}")
        self.static_verify_size = check_k(static_verify_size, "static_verify_size", 1)
        _check_actor(depth_actor, self.config.depth_obs_dim, 2, "depth_actor")
        _check_actor(size_actor, self.config.size_obs_dim, len(self.config.verify_sizes), "size_actor")
        self.depth_actor, self.size_actor = depth_actor, size_actor
        self.deterministic = bool(deterministic)
        self.name = name
        self.decisions: list[tuple[int, int]] = []   # (D, V) per drafted tree
        self._cap = self.max_depth

    @property
    def max_depth(self) -> int:
        return self.config.max_depth if self.depth_actor is not None else self.static_depth

    def plan(self, state: PlanState) -> DraftPlan:
        """EAGLE-2 dynamic-tree plan with the depth cap (clipped to remaining - 1)."""
        depth = self.max_depth
        if state.remaining_tokens is not None:
            depth = min(depth, int(state.remaining_tokens) - 1)
            if depth < 1:
                self._cap = 0
                return DraftPlan(num_draft_tokens=0)
        self._cap = depth
        budget = self.static_verify_size if self.size_actor is None else self.config.verify_sizes[-1]
        return DraftPlan(num_draft_tokens=depth,
                         tree=TreePlan(top_k=self.config.top_k, max_depth=depth, verify_size=budget))

    def _choose(self, actor: MLPActor, obs: np.ndarray) -> int:
        if self.deterministic:
            return actor.act(obs)
        probs = actor.probs(obs)
        return int(min(np.searchsorted(np.cumsum(probs), self._rng.random() * probs.sum(), side="right"),
                       probs.size - 1))

    def continue_drafting(self, step: DraftStep) -> bool:
        """After a draft step at depth D: True = draft one more level (LTD depth policy)."""
        if step.depth >= min(self._cap, self.max_depth):
            return False
        if self.depth_actor is None:
            return step.depth < self.static_depth
        return self._choose(self.depth_actor, depth_observation(step, self.config)) == CONTINUE

    def verify_size(self, candidates: TreeCandidates) -> int:
        """V for the drafted tree: the size policy's choice (or the static V), at most
        the number of drafted nodes, at least 1."""
        n = int(np.asarray(candidates.node_probs).size)
        if self.size_actor is None:
            size = self.static_verify_size
        else:
            size = self.config.verify_sizes[self._choose(self.size_actor, size_observation(candidates, self.config))]
        size = max(1, min(size, n))
        self.decisions.append((int(candidates.depth), int(size)))
        return size

    def observe(self, record: RoundRecord) -> None:
        super().observe(record)

    def decision_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The (D, V) of every tree this policy sized: two int64 (rounds,) arrays."""
        arr = np.asarray(self.decisions, dtype=np.int64).reshape(-1, 2)
        return arr[:, 0].copy(), arr[:, 1].copy()

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.decisions = [tuple(int(x) for x in d) for d in self.decisions]


def _check_actor(actor, obs_dim: int, num_actions: int, name: str) -> None:
    if actor is None:
        return
    if not isinstance(actor, MLPActor):
        raise ValueError(f"{name} must be an MLPActor, got {type(actor).__name__}")
    if actor.obs_dim != obs_dim or actor.num_actions != num_actions:
        raise ValueError(f"{name} has obs_dim={actor.obs_dim}, actions={actor.num_actions}; the config "
                         f"needs obs_dim={obs_dim}, actions={num_actions}")


# -- files -----------------------------------------------------------------------------
def ltd_cache_dir() -> Path:
    """``$SPECLOOP_LTD_DIR`` or ``~/.cache/specloop/ltd``."""
    root = os.environ.get("SPECLOOP_LTD_DIR")
    return Path(root) if root else Path.home() / ".cache" / "specloop" / "ltd"


def _is_path(name_or_path: str | Path) -> bool:
    text = str(name_or_path)
    return isinstance(name_or_path, Path) or "/" in text or os.sep in text or text.endswith(".pt")


def policy_path(name_or_path: str | Path) -> Path:
    """Where `save_policy` writes: the path itself, or ``ltd_cache_dir()/<name>.pt``.

    Raises:
        ValueError: an empty name.
    """
    if not str(name_or_path).strip():
        raise ValueError("empty LTD policy name")
    return Path(name_or_path) if _is_path(name_or_path) else ltd_cache_dir() / f"{name_or_path}.pt"


def variant_name(name_or_path: str | Path, suffix: str) -> str:
    """The name (or path) of a policy saved alongside ``name_or_path``: LTD's ablation
    variants ``<name>-independent`` and ``<name>-size-<reward>``.

    A name gets the suffix appended (``ltd-sim`` -> ``ltd-sim-independent``); a path
    gets it on its stem, in the same folder, keeping a ``.pt`` extension
    (``/tmp/x/p.pt`` -> ``/tmp/x/p-independent.pt``; ``/tmp/x/p`` -> ``/tmp/x/p-independent``).

    Raises:
        ValueError: an empty name or suffix.
    """
    if not str(name_or_path).strip() or not suffix:
        raise ValueError(f"need a policy name and a suffix, got {name_or_path!r}, {suffix!r}")
    if not _is_path(name_or_path):
        return f"{name_or_path}{suffix}"
    path = Path(name_or_path)
    if path.suffix == ".pt":
        return str(path.with_name(f"{path.stem}{suffix}.pt"))
    return str(path.with_name(f"{path.name}{suffix}"))


def _actor_blob(actor: MLPActor | None):
    if actor is None:
        return None
    return {"spec": actor.spec(), "state_dict": {k: v.detach().clone() for k, v in actor.state_dict().items()}}


def fine_tuned_label(name: str) -> str:
    """Report label of LTD's transfer row: policy ``name`` fine-tuned on real decoder
    rounds (``ltd train --env real`` on wall-clock rounds, ``--env replay`` on
    recorded ones)."""
    return f"LTD fine-tuned on real decoder rounds ({name})"


def save_policy(policy: LTDPolicy, name_or_path: str | Path, meta: dict | None = None) -> Path:
    """Save an `LTDPolicy` (config, actors, static sides, metadata) to one ``.pt`` file.

    Args:
        policy: the policy.
        name_or_path: a name (-> ``ltd_cache_dir()/<name>.pt``) or a file path.
        meta: JSON-like metadata (training steps, env, seed...).

    Returns:
        the written path (written to a temporary sibling, then renamed).
    """
    path = policy_path(name_or_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"format": FILE_FORMAT_VERSION, "config": policy.config.to_dict(),
            "depth_actor": _actor_blob(policy.depth_actor), "size_actor": _actor_blob(policy.size_actor),
            "static_depth": policy.static_depth, "static_verify_size": policy.static_verify_size,
            "name": policy.name, "meta": dict(meta or {})}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    return path


def _resolve(name_or_path: str | Path) -> Path:
    candidates = [Path(name_or_path)] if _is_path(name_or_path) else [
        ltd_cache_dir() / f"{name_or_path}.pt", PRETRAINED_DIR / f"{name_or_path}.pt"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no LTD policy {str(name_or_path)!r}; looked in "
                            + ", ".join(str(c) for c in candidates))


def _actor_from(blob) -> MLPActor | None:
    if blob is None:
        return None
    spec = blob["spec"]
    actor = MLPActor(spec["obs_dim"], spec["hidden"], spec["num_actions"])
    actor.load_state_dict(blob["state_dict"])
    return actor.eval()


def load_policy(name_or_path: str | Path, seed: int | None = 0, deterministic: bool = True) -> LTDPolicy:
    """Load a policy written by `save_policy` (by path or by name; see the module doc).

    Returns:
        a fresh `LTDPolicy` (no decisions yet); ``policy.meta`` holds the saved metadata.

    Raises:
        FileNotFoundError: no such file / name. ValueError: not an LTD policy file.
    """
    path = _resolve(name_or_path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if blob.get("format") != FILE_FORMAT_VERSION:
            raise ValueError(f"unsupported LTD policy format {blob.get('format')!r}")
        policy = LTDPolicy(LTDConfig.from_dict(blob["config"]), _actor_from(blob["depth_actor"]),
                           _actor_from(blob["size_actor"]), static_depth=blob["static_depth"],
                           static_verify_size=blob["static_verify_size"], deterministic=deterministic,
                           seed=seed, name=blob.get("name", "ltd"))
    except (KeyError, AttributeError, RuntimeError, TypeError) as exc:
        raise ValueError(f"{path}: not an LTD policy file ({exc})") from exc
    policy.meta = dict(blob.get("meta", {}))
    return policy
