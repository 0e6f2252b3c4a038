"""LTD on the real decoder: the depth / size decisions inside real tree drafting,
wall-clock costs (device synchronised) and gymnasium environments;
evaluation, fine-tuning and recording with typed configs: `specloop.ltd.eval_real`.

`RealTreeEngine` is the real decoder's `specloop.strategies.engine.StepwiseEngine`: it
steps a `specloop.realmodels.session.DecodeSession` one decision at a time, so the
gymnasium environments (`DepthEnv` / `SizeEnv`) and `drive_round` (`RealHarness.run`)
drive the same object, with no thread. A round drafts the EAGLE-2 tree to the plan's
depth cap through the drafter's public ``propose``, then reveals it one layer at a time
(an EAGLE-2 layer depends only on earlier layers, so the depth-<=D part of the cap-depth
tree *is* the depth-D tree), takes V, and verifies the best V nodes (by cumulative draft
probability, closed under ancestors: `strategies.subtree.select_subtree`) with the session.
Verification time is real. Draft time is the measured wall time of the round's drafting
minus the calibrated seconds of the layers deeper than D that the policy did not ask for
(`calibrate_layer_costs`, measured on the same drafter in the same run), i.e. what a
drafter honouring the hook would have spent; under `drive_round` the policy's own
decision seconds are added (the gym environments' waits are not).

``native=True`` in `RealHarness` instead hands the policy to drafters that honour the
hooks themselves (all wall clock, nothing calibrated).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftProposal, DraftRequest
from specloop.record import RoundRecord, Trace
from specloop.strategies.base import DraftPlan, DraftStep, PlanState, TreeCandidates, TreePlan
from specloop.strategies.engine import StepwiseRound, drive_round
from specloop.ltd.policy import LTDConfig, layer_step
from specloop.strategies.subtree import select_subtree

__all__ = ["calibrate_layer_costs", "RealHarness", "RealTreeEngine",
           "make_real_depth_env", "make_real_size_env",
           "select_subtree"]   # select_subtree: re-exported from strategies.subtree


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
            wall clock, nothing is calibrated. False = the `RealTreeEngine`
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
        """Generate every prompt with ``policy``; returns (trace with the LTD draft-time
        accounting, depth per round, V per round). Emulated hooks: `drive_round` over a
        `RealTreeEngine` (its policy seconds charged); native: the decoder, whose
        drafter asks the hooks itself."""
        records: list[RoundRecord] = []
        if self.native:
            capped = _CappedPolicy(policy, self.max_depth, records)
            decoder = self._decoder_for(self.base, capped)
            for index, prompt in enumerate(prompts or self.prompts):
                decoder.generate(prompt, self.max_new_tokens, stream_index=index)
        else:
            engine = RealTreeEngine(self)
            engine.charge_policy_time = True
            for index, prompt in enumerate(prompts or self.prompts):
                engine.start_prompt(prompt, index)
                while not engine.episode_done:
                    drive_round(policy, engine)
                records.extend(engine.records)
        return (Trace(records, {"layer_costs": self.layer_costs.tolist()}),
                np.asarray([r.tree_depth for r in records]), np.asarray([r.num_draft_tokens for r in records]))


class _CappedPolicy:
    """Delegates to a policy, capping the plan's depth at the drafter's limit, and
    collects the records it observes into ``records``."""

    def __init__(self, policy, max_depth: int, records: list):
        self.policy, self.max_depth, self.records = policy, int(max_depth), records
        for hook in ("continue_drafting", "verify_size"):
            if hasattr(policy, hook):
                setattr(self, hook, getattr(policy, hook))

    def plan(self, state: PlanState) -> DraftPlan:
        plan = self.policy.plan(state)
        if plan.tree is None or plan.num_draft_tokens <= self.max_depth:
            return plan
        tree = dataclasses.replace(plan.tree, max_depth=min(plan.tree.max_depth, self.max_depth))
        return DraftPlan(min(plan.num_draft_tokens, self.max_depth), tree)

    def observe(self, record: RoundRecord) -> None:
        self.records.append(record)
        self.policy.observe(record)


# -- the step-wise engine ---------------------------------------------------------------
class RealTreeEngine(StepwiseRound):
    """`LTDEngine` / `StepwiseEngine` over the real decoder (one prompt per episode;
    module docstring). Rounds in which nothing can be drafted (one token left) are
    run as plain target steps, outside the environment's decisions. ``records`` holds
    the current prompt's rounds in order (the plain ones included), with the LTD
    draft-time accounting.

    Args:
        harness: a `RealHarness` (target, drafter, prompts, calibrated costs).
    """

    def __init__(self, harness: RealHarness):
        self.harness, self.config = harness, harness.config
        self.max_depth = harness.max_depth
        self.target_time = harness.target_time
        self.decoder = harness._decoder_for(harness.base)
        self.rounds_done, self.episode_done = 0, True
        self.session, self.records = None, []
        self._cap = self.max_depth

    @property
    def context_length(self) -> int:
        return len(self.session.seq) if self.session is not None else 0

    def close(self) -> None:
        """Drop the current prompt (nothing runs in the background)."""
        self.session, self.episode_done = None, True

    def reset(self, rng: np.random.Generator) -> None:
        """Start a prompt drawn from the harness's prompts."""
        prompts = self.harness.prompts
        self.start_prompt(prompts[int(rng.integers(len(prompts)))])

    def start_prompt(self, prompt, stream_index: int = 0) -> None:
        """Prefill ``prompt`` in a fresh session and run its undraftable rounds."""
        self.session = self.decoder.session(prompt, self.harness.max_new_tokens, stream_index=stream_index)
        self.rounds_done, self.records = 0, []
        self._skip_plain_rounds()

    def _full_plan(self, depth: int) -> DraftPlan:
        return DraftPlan(depth, TreePlan(top_k=self.config.top_k, max_depth=depth))

    def _skip_plain_rounds(self) -> None:
        """Plain target steps while the session cannot draft; episode_done after."""
        session = self.session
        while not session.done and session.start_round(self._full_plan(self.max_depth)) == 0:
            session.mark_drafted()
            self.records.append(session.commit(session.target_pass(DraftProposal.empty())))
        self.episode_done = session.done

    # -- StepwiseEngine ----------------------------------------------------------------
    def start_round(self, plan: DraftPlan) -> int:
        """The depth cap of an EAGLE-2 ``plan`` (ValueError for any other plan)."""
        tree = plan.tree
        if tree is None or tree.top_k != self.config.top_k:
            raise ValueError(f"the LTD engine drafts EAGLE-2 trees with top_k={self.config.top_k}; got plan {plan}")
        self._cap = max(1, min(int(plan.num_draft_tokens), int(tree.max_depth), self.max_depth))
        return self._cap

    def begin_round(self) -> DraftStep:
        """Draft the tree to the depth cap (timed) and reveal depth 1."""
        if self.episode_done:
            raise ValueError("the prompt is finished; reset the environment")
        session = self.session
        # the cap-depth tree (as at any position), verified only to the depth the
        # tokens left allow (the session's cap)
        self._verify_cap = session.start_round(self._full_plan(self._cap))
        proposal = session.propose(self._full_plan(self._cap), cap=self._cap)
        session.mark_drafted()
        self._cap = self.max_depth
        if proposal.size and proposal.node_probs is None:
            raise ValueError(f"{getattr(self.harness.base, 'name', 'drafter')} reports no node_probs; LTD needs them")
        self._proposal = proposal
        self._depths = proposal.depths().numpy()
        self._parents = proposal.parents.cpu().numpy()
        self._probs = proposal.node_probs.double().cpu().numpy() if proposal.size else np.zeros(0)
        self._drafted = int(self._depths.max()) if proposal.size else 0
        self.depth = 1
        return self._step()

    @property
    def drafted_depth(self) -> int:
        """Depth of the tree drafted this round (the reveal stops there)."""
        return max(1, self._drafted)

    def _step(self) -> DraftStep:
        return layer_step(self._depths, self._parents, self._probs, self.depth, self.context_length,
                          self.config.top_k)

    def deepen(self) -> DraftStep:
        """Reveal one more level (ValueError past the drafted depth)."""
        if self.depth >= self._drafted:
            raise ValueError(f"cannot draft past depth {self._drafted} this round")
        self.depth += 1
        return self._step()

    def candidates(self) -> TreeCandidates:
        return TreeCandidates(self.depth, self.context_length, self._probs[self._depths <= self.depth].copy())

    def finish(self, verify_size: int, extra_draft_seconds: float = 0.0) -> RoundRecord:
        """Verify the best ``verify_size`` nodes of depth <= D; the record's draft time
        drops the calibrated seconds of the undrafted levels (+ ``extra_draft_seconds``)."""
        if int(verify_size) < 1:
            raise ValueError(f"verify_size must be >= 1, got {verify_size}")
        depth = min(self.depth, self._verify_cap)
        keep = select_subtree(self._depths, self._parents, self._probs, depth, int(verify_size)) \
            if self._proposal.size and depth > 0 else np.zeros(0, dtype=np.int64)
        record = self.session.commit(self.session.target_pass(self._proposal.subset(keep)))
        costs = self.harness.layer_costs
        saved = max(0.0, float(costs[self._drafted] - costs[self.depth])) if self._drafted else 0.0
        record = dataclasses.replace(record, draft_time=max(record.draft_time - saved, 0.0) + extra_draft_seconds,
                                     tree_depth=max(depth if self._drafted else 0, record.tree_depth))
        self.rounds_done += 1
        self.records.append(record)
        self._skip_plain_rounds()
        return record


def make_real_depth_env(harness: RealHarness, **kwargs):
    """A `DepthEnv` over a `RealTreeEngine` (kwargs: size_chooser, fixed_verify_size, reward)."""
    from specloop.ltd.train import DepthEnv
    return DepthEnv(RealTreeEngine(harness), **kwargs)


def make_real_size_env(harness: RealHarness, **kwargs):
    """A `SizeEnv` over a `RealTreeEngine` (kwargs: depth_chooser, reward)."""
    from specloop.ltd.train import SizeEnv
    return SizeEnv(RealTreeEngine(harness), **kwargs)
