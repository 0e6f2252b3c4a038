"""`specloop.sim`: exact and fast simulation of speculative-decoding rounds.

Modules (import the one you need; the Numba kernels compile on first use, cached):

* `streams`   -- `make_stream`: target distribution streams (stationary, piecewise,
  smooth, fast, trained-target), Zipf shapes, chain correlation.
* `drafts`    -- `ParametricDraft` (low-rank q_w with analytic CE gradients),
  `NoisyDraft` (fixed-error / frozen drafts of a stream).
* `rounds`    -- chain rounds: `chain_round`, batched `simulate_chain_tables`, the
  Assumption-1 fast path `simulate_iid_chain`.
* `trees`     -- static and EAGLE-2 dynamic trees, greedy and recursive-rejection
  verification: `tree_round`, `simulate_tree_tables`, `theory_tokens_tree`.
* `costs`     -- `LinearCost` (a k + A), `TableCost` (measured verify table).
* `engine`    -- `SimChainEngine`, `run_chain`: policy -> draft -> verify -> record ->
  observe (-> learn) through `specloop.strategies.engine.drive_round`.
* `batch`     -- batched simulation of a whole stream with a fixed draft length or tree plan.
* `online`    -- `OnlineChainEngine`, `run_online`: a draft that learns from verification
  feedback, with dynamic regret against two comparators (and the regret sweep).
* `hedge_sources` -- Hedge over simulated draft sources (`SimSourcesEngine`).
* `_kernels`  -- the private Numba kernels (preallocated outputs, pre-drawn uniforms).
* `_reference` -- plain NumPy references the kernels are tested against.

Layering: imports `specloop.theory`, `specloop.record` and `specloop.strategies`
(contracts, policies, learners, the round driver); never `specloop.realmodels`, and
loads no torch.
"""
