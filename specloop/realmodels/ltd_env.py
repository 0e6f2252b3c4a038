"""LTD on the real decoder: the depth / size decisions inside real tree drafting,
wall-clock costs (device synchronised) and gymnasium environments (issue 8);
evaluation, fine-tuning and recording with typed configs: `specloop.realmodels.ltd_eval`.

Missing hooks. `SpeculativeDecoder` asks its drafter for a whole tree
(``drafter.propose``) and the tree drafters (`heads.eagle_drafter.EagleDrafter`,
`heads.head_drafting.draft_tree`) do not call the policy's optional
``continue_drafting(DraftStep)`` after each draft step nor ``verify_size(TreeCandidates)``
after drafting. `LTDTreeDrafter` therefore wraps any tree drafter through the public
interface only: it drafts the EAGLE-2 tree to the plan's depth cap, then reveals it
one layer at a time to the policy (an EAGLE-2 layer depends only on earlier
layers, so the depth-<=D part of the cap-depth tree *is* the depth-D tree), asks for
V, and returns the best V nodes (by cumulative draft probability, closed under
ancestors) for the decoder to verify. Verification time is real. Draft time is the
measured wall time of the round's drafting minus the calibrated seconds of the
layers deeper than D that the policy did not ask for (`calibrate_layer_costs`,
measured on the same drafter in the same run), i.e. what a drafter honouring the
hook would have spent; the policy's own decision time is kept in it.

Environments: `RealTreeEngine` implements `specloop.strategies.ltd_train.LTDEngine`
by running ``decoder.generate`` in a worker thread whose policy is a bridge that
hands each decision to the environment's ``step`` (the wait is excluded from the
round's draft time).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftProposal, DraftRequest
from specloop.record import RoundRecord, Trace
from specloop.strategies.base import DraftPlan, DraftStep, PlanState, TreeCandidates, TreePlan
from specloop.strategies.ltd import LTDConfig, layer_step, select_subtree

__all__ = ["LTDTreeDrafter", "calibrate_layer_costs", "RealHarness", "RealTreeEngine",
           "make_real_depth_env", "make_real_size_env",
           "select_subtree"]   # select_subtree: re-exported from strategies.ltd


def _subset(proposal: DraftProposal, keep: np.ndarray) -> DraftProposal:
    idx = torch.as_tensor(keep, dtype=torch.long)
    remap = torch.full((proposal.size,), -1, dtype=torch.long)
    remap[idx] = torch.arange(idx.numel())
    parents = proposal.parents.cpu()[idx]
    parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], parents)
    q = None if proposal.q_draft is None else proposal.q_draft[idx.to(proposal.q_draft.device)]
    return DraftProposal(proposal.tokens[idx.to(proposal.tokens.device)], parents.to(proposal.parents.device), q,
                         proposal.node_probs.cpu()[idx])


class LTDTreeDrafter:
    """A `Drafter` that applies a policy's ``continue_drafting`` / ``verify_size``
    hooks to any EAGLE-2 tree drafter (see the module docstring).

    Args:
        base: a tree drafter whose proposals carry ``node_probs``.
        policy: the decision object (an `LTDPolicy`, a static one, or the env bridge).
        config: `LTDConfig` (top_k of the drafted trees).
        layer_costs: seconds of pure drafting to depth d (index d, 0 = 0 s), from
            `calibrate_layer_costs`; None = charge the measured time unchanged.

    After each ``propose``, ``last`` holds (depth D, V, seconds saved).
    """

    def __init__(self, base, policy, config: LTDConfig, layer_costs: np.ndarray | None = None):
        self.base, self.policy, self.config = base, policy, config
        self.name = f"ltd[{getattr(base, 'name', 'drafter')}]"
        self.needs_target_hidden = tuple(base.needs_target_hidden)
        self.layer_costs = layer_costs
        self.last = (0, 0, 0.0)

    def reset(self, prompt_ids, *, target_hidden=None) -> None:
        self.base.reset(prompt_ids, target_hidden=target_hidden)

    def observe(self, feedback) -> None:
        self.base.observe(feedback)

    def parameters(self) -> list:
        return self.base.parameters()

    def propose(self, request: DraftRequest) -> DraftProposal:
        plan = request.plan
        if plan.tree is None or plan.tree.top_k is None or plan.num_draft_tokens < 1:
            self.last = (0, 0, 0.0)
            return self.base.propose(request)
        cap = max(1, min(int(plan.tree.max_depth), int(plan.num_draft_tokens)))
        full = DraftPlan(cap, TreePlan(top_k=self.config.top_k, max_depth=cap))
        # the hooks are applied here, layer by layer, not inside the base drafter
        proposal = self.base.propose(dataclasses.replace(request, plan=full, policy=None))
        if proposal.size == 0:
            self.last = (0, 0, 0.0)
            return proposal
        if proposal.node_probs is None:
            raise ValueError(f"{self.name}: the base drafter reports no node_probs; LTD needs them")
        return self._decide(proposal, cap, request.context_length, plan)

    def _decide(self, proposal: DraftProposal, cap: int, length: int, plan: DraftPlan) -> DraftProposal:
        depths = proposal.depths().numpy()
        probs = proposal.node_probs.double().cpu().numpy()
        parents = proposal.parents.cpu().numpy()
        drafted = int(depths.max())
        depth = 1
        hook = getattr(self.policy, "continue_drafting", None)
        while True:
            step = layer_step(depths, parents, probs, depth, length, self.config.top_k)
            go = hook(step) if hook is not None else True
            if not go or depth >= min(cap, drafted):
                break
            depth += 1
        cands = TreeCandidates(depth, length, probs[depths <= depth].copy())
        sizer = getattr(self.policy, "verify_size", None)
        size = sizer(cands) if sizer is not None else (plan.tree.verify_size or cands.node_probs.size)
        keep = select_subtree(depths, parents, probs, depth, min(int(size), cands.node_probs.size))
        saved = 0.0
        if self.layer_costs is not None:
            saved = max(0.0, float(self.layer_costs[drafted] - self.layer_costs[depth]))
        self.last = (depth, int(keep.size), saved)
        return _subset(proposal, keep)


def calibrate_layer_costs(base, decoder_factory, prompt_ids, config: LTDConfig, max_depth: int,
                          repeats: int = 5) -> np.ndarray:
    """Seconds of pure EAGLE-2 drafting to each depth 0..max_depth (median of
    ``repeats``), measured on ``base`` after generating a few tokens of a prompt
    (so its state is warm); device synchronised.

    Args:
        base: the tree drafter. decoder_factory: ``(drafter, policy) -> SpeculativeDecoder``.
        prompt_ids: int64 (L,). config: `LTDConfig`. max_depth: deepest level.

    Returns:
        float64 (max_depth + 1,), non-decreasing (cumulative maximum of the medians).
    """
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.sampling import SamplingConfig

    decoder = decoder_factory(base, FixedDraftPolicy(max_depth, TreePlan(top_k=config.top_k, max_depth=max_depth)))
    result = decoder.generate(prompt_ids, 8)
    ids = torch.cat([result.prompt_ids, torch.tensor(result.new_tokens, dtype=torch.long)]).to(decoder.device)
    cuda = decoder.device.type == "cuda"
    costs = np.zeros(max_depth + 1)
    for depth in range(1, max_depth + 1):
        plan = DraftPlan(depth, TreePlan(top_k=config.top_k, max_depth=depth))
        request = DraftRequest(ids, plan, 4096, SamplingConfig(), torch.Generator().manual_seed(0))
        times = []
        for _ in range(repeats + 1):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            base.propose(request)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        costs[depth] = float(np.median(times[1:]))
    return np.maximum.accumulate(costs)


class RealHarness:
    """Target + tree drafter + prompts + calibrated layer costs: runs any tree
    policy on the real decoder and returns traces with the LTD draft-time
    accounting (module docstring).

    Args:
        target: a `LoadedModel` (or transformers causal LM).
        base: the tree drafter (must report node_probs).
        prompts: list of int64 prompt tensors.
        config: `LTDConfig`.
        max_new_tokens: tokens per prompt.
        max_depth: deepest draft level (default config.max_depth, capped by the
            drafter's ``max_depth`` attribute where it has one).
        seed: decoder seed (greedy decoding: the outputs do not depend on it).
        native: run policies through the drafter's own hooks (the decoder hands the
            policy to the drafter, which stops drafting when ``continue_drafting``
            says so and verifies ``verify_size`` nodes): every second is measured
            wall clock, nothing is calibrated. False = the `LTDTreeDrafter`
            emulation (draft to the cap, reveal layers, subtract calibrated layer
            costs), which the PPO environments use.
    """

    def __init__(self, target, base, prompts: list, config: LTDConfig, max_new_tokens: int = 64,
                 max_depth: int | None = None, seed: int = 0, native: bool = False):
        if not prompts:
            raise ValueError("RealHarness needs at least one prompt")
        self.target, self.base, self.prompts, self.config = target, base, list(prompts), config
        self.max_new_tokens, self.seed, self.native = int(max_new_tokens), int(seed), bool(native)
        limit = getattr(base, "max_depth", None)
        self.max_depth = min(config.max_depth, max_depth or config.max_depth, limit or config.max_depth)
        self.layer_costs = (np.zeros(self.max_depth + 1) if native else
                            calibrate_layer_costs(base, self._decoder_for, self.prompts[0], config, self.max_depth))
        self.target_time = self._autoregressive_step_seconds()

    def _decoder_for(self, drafter, policy=None):
        from specloop.realmodels.decoder import SpeculativeDecoder
        return SpeculativeDecoder(self.target, drafter, policy=policy, seed=self.seed)

    def _autoregressive_step_seconds(self) -> float:
        """Seconds per token of plain decoding (k = 0), measured on the first prompt."""
        from specloop.realmodels.policy import FixedDraftPolicy
        result = self._decoder_for(self.base, FixedDraftPolicy(0)).generate(self.prompts[0], 16)
        return result.trace.total_time / max(result.trace.total_tokens, 1)

    def run(self, policy, prompts: list | None = None) -> tuple[Trace, np.ndarray, np.ndarray]:
        """Generate every prompt with ``policy``; returns (trace with corrected draft
        times, depth per round, V per round)."""
        drafter = None if self.native else LTDTreeDrafter(self.base, policy, self.config, self.layer_costs)
        wrapped = _AccountingPolicy(policy, self.max_depth, drafter)
        decoder = self._decoder_for(self.base if drafter is None else drafter, wrapped)
        for index, prompt in enumerate(prompts or self.prompts):
            decoder.generate(prompt, self.max_new_tokens, stream_index=index)
        records = wrapped.records
        return (Trace(records, {"layer_costs": self.layer_costs.tolist()}),
                np.asarray([r.tree_depth for r in records]), np.asarray([r.num_draft_tokens for r in records]))


class _AccountingPolicy:
    """Delegates to a policy; caps the plan's depth at the drafter's limit and, after
    each round, subtracts the seconds the `LTDTreeDrafter` saved (and any extra
    wait, e.g. the env bridge's) from the record's draft time before the policy
    observes it. ``records`` collects the corrected records."""

    def __init__(self, policy, max_depth: int, drafter: LTDTreeDrafter | None):
        self.policy, self.max_depth, self.drafter = policy, int(max_depth), drafter
        self.records: list[RoundRecord] = []

    def plan(self, state: PlanState) -> DraftPlan:
        plan = self.policy.plan(state)
        if plan.tree is None or plan.num_draft_tokens <= self.max_depth:
            return plan
        tree = dataclasses.replace(plan.tree, max_depth=min(plan.tree.max_depth, self.max_depth))
        return DraftPlan(min(plan.num_draft_tokens, self.max_depth), tree)

    def continue_drafting(self, step: DraftStep) -> bool:
        return self.policy.continue_drafting(step)

    def verify_size(self, candidates: TreeCandidates) -> int:
        return self.policy.verify_size(candidates)

    def observe(self, record: RoundRecord) -> None:
        depth, saved = 0, 0.0
        if self.drafter is not None:   # emulated hooks: charge only the layers the policy asked for
            depth, _, saved = self.drafter.last
            self.drafter.last = (0, 0, 0.0)
        saved += float(getattr(self.policy, "take_wait", lambda: 0.0)())
        record = dataclasses.replace(record, draft_time=max(record.draft_time - saved, 0.0),
                                     tree_depth=max(depth, record.tree_depth))
        self.records.append(record)
        self.policy.observe(record)


# -- gymnasium engine ---------------------------------------------------------------------
class _Abort(Exception):
    """Raised inside the decoder thread to end a generation early."""


class _Bridge:
    """The decoder thread's policy: hands every decision to the environment and
    waits for the answer; the waiting seconds are excluded from draft time."""

    def __init__(self, config: LTDConfig, max_depth: int):
        self.config, self.max_depth = config, max_depth
        self.to_env: queue.Queue = queue.Queue()
        self.to_decoder: queue.Queue = queue.Queue()
        self._wait = 0.0

    def plan(self, state: PlanState) -> DraftPlan:
        tree = TreePlan(top_k=self.config.top_k, max_depth=self.max_depth, verify_size=self.config.verify_sizes[-1])
        return DraftPlan(self.max_depth, tree)

    def _ask(self, kind: str, payload):
        t0 = time.perf_counter()
        self.to_env.put((kind, payload))
        answer = self.to_decoder.get()
        self._wait += time.perf_counter() - t0
        if answer is _Abort:
            raise _Abort()
        return answer

    def continue_drafting(self, step: DraftStep) -> bool:
        return bool(self._ask("step", step))

    def verify_size(self, candidates: TreeCandidates) -> int:
        return int(self._ask("cands", candidates))

    def take_wait(self) -> float:
        wait, self._wait = self._wait, 0.0
        return wait

    def observe(self, record: RoundRecord) -> None:
        self.to_env.put(("record", record))


class RealTreeEngine:
    """`LTDEngine` over the real decoder (one prompt per episode; module docstring).

    Args:
        harness: a `RealHarness` (target, drafter, prompts, calibrated costs).
    """

    def __init__(self, harness: RealHarness):
        self.harness, self.config = harness, harness.config
        self.max_depth = harness.max_depth
        self.target_time = harness.target_time
        self.rounds_done, self.episode_done = 0, True
        self._thread: threading.Thread | None = None
        self._bridge: _Bridge | None = None
        self._next = None
        self.timeout_s = 600.0

    def _send(self, answer) -> None:
        if self.episode_done or self._thread is None:
            raise ValueError("the prompt is finished; reset the environment")
        self._bridge.to_decoder.put(answer)

    def _run(self, bridge: _Bridge, prompt) -> None:
        drafter = LTDTreeDrafter(self.harness.base, bridge, self.config, self.harness.layer_costs)
        decoder = self.harness._decoder_for(drafter, _AccountingPolicy(bridge, self.max_depth, drafter))
        try:
            decoder.generate(prompt, self.harness.max_new_tokens)
            bridge.to_env.put(("done", None))
        except _Abort:
            pass
        except Exception as exc:  # surfaced in the env thread
            bridge.to_env.put(("error", exc))

    def close(self) -> None:
        """Abort a running generation and join its thread."""
        if self._thread is not None and self._thread.is_alive():
            self._bridge.to_decoder.put(_Abort)
            self._thread.join()
        self._thread = None

    def _get(self):
        try:
            kind, payload = self._bridge.to_env.get(timeout=self.timeout_s)
        except queue.Empty:
            raise RuntimeError(f"the decoder thread sent nothing for {self.timeout_s} s") from None
        if kind == "error":
            raise payload
        return kind, payload

    def reset(self, rng: np.random.Generator) -> None:
        self.close()
        prompt = self.harness.prompts[int(rng.integers(len(self.harness.prompts)))]
        self._bridge = _Bridge(self.config, self.max_depth)
        self._thread = threading.Thread(target=self._run, args=(self._bridge, prompt), daemon=True)
        self._thread.start()
        self.rounds_done, self.episode_done = 0, False
        self._next = self._advance()

    def _advance(self):
        """Next message that starts a drafted round (skips rounds without drafting)."""
        while True:
            kind, payload = self._get()
            if kind == "record":
                continue
            if kind == "done":
                self.episode_done = True
            return kind, payload

    def begin_round(self) -> DraftStep:
        kind, payload = self._next
        if kind != "step":
            raise ValueError("the prompt is finished; reset the environment")
        self._step = payload
        return payload

    def deepen(self) -> DraftStep:
        self._send(True)
        kind, payload = self._get()
        if kind != "step":
            raise ValueError(f"drafter stopped before the policy asked (got {kind!r})")
        self._step = payload
        return payload

    def candidates(self) -> TreeCandidates:
        self._send(False)
        kind, payload = self._get()
        if kind != "cands":
            raise ValueError(f"expected the drafted tree, got {kind!r}")
        return payload

    def finish(self, verify_size: int) -> RoundRecord:
        self._send(int(verify_size))
        kind, record = self._get()
        if kind != "record":
            raise ValueError(f"expected the round record, got {kind!r}")
        self.rounds_done += 1
        self._next = self._advance()
        return record


def make_real_depth_env(harness: RealHarness, **kwargs):
    """A `DepthEnv` over a `RealTreeEngine` (kwargs: size_chooser, fixed_verify_size, reward)."""
    from specloop.strategies.ltd_train import DepthEnv
    return DepthEnv(RealTreeEngine(harness), **kwargs)


def make_real_size_env(harness: RealHarness, **kwargs):
    """A `SizeEnv` over a `RealTreeEngine` (kwargs: depth_chooser, reward)."""
    from specloop.strategies.ltd_train import SizeEnv
    return SizeEnv(RealTreeEngine(harness), **kwargs)
