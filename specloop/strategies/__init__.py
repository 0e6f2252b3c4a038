"""Strategy objects shared by the simulator and the real decoder: draft policies
(plan/observe) and online learners (step). See `specloop.strategies.base`.

Policies: `FixedK`, `TheoryOptimalK`, `HeuristicK`, `ConfidenceStop` (chain),
`UCBK`, `EXP3K` (bandits over k), `StaticTree`, `DynamicTree` (trees).
Learners: `OGD`, `OptimisticOGD`, `HedgeEnsemble`, `OptimisticEnsemble`,
`OSDDistillation`, and the `Preconditioned` (RMS) wrapper; one registry of their names
(`specloop.strategies.registry`: `learner_from_name`, `resolve_learner`, `LEARNER_NAMES`).

Modules:

* `base`           -- the contracts: `PlanState`, `DraftPlan` / `TreePlan`, `DraftStep`,
  `TreeCandidates`, `DraftPolicy`, `OnlineLearner`.
* `engine`         -- the engine step protocol, `RoundHooks` and the one round driver `drive_round`.
* `policies`       -- chain policies: fixed k, theory-optimal k, the +2/-1 heuristic, confidence stop.
* `bandits`        -- UCB1 and EXP3 over a set of chain lengths.
* `trees`          -- static tree shapes and EAGLE-2's dynamic tree.
* `subtree`        -- keeping part of a drafted tree; the nodes a verification size V keeps.
* `lookup_length`  -- cost-aware candidate length for lookup drafts, learned from the verifier.
* `suffix_tree`    -- bounded-depth suffix tries, the data structure of SuffixDecoding.
* `hedge_sources`  -- Hedge over draft sources with delayed, censoring-free feedback.
* `hedge_shadow`   -- each draft source's own trajectory: unbiased feedback for that Hedge.
* `ogd`            -- projected OGD and optimistic OGD.
* `ensemble`       -- the Hedge ensemble of learners and the optimism + ensemble combination.
* `osd`            -- OSD-style online distillation on rejected positions.
* `precondition`   -- RMS preconditioning as a wrapper learner.
* `registry`       -- the one registry of learner names.
* `_arrays`        -- array-API helpers of the learners (NumPy and torch).
* `_state`         -- seeding and state-dict helpers shared by policies and learners.
"""
from specloop.strategies.base import (DraftPlan, DraftPolicy, DraftStep, OnlineLearner,
                                      PlanState, TreeCandidates, TreePlan)
from specloop.strategies.ogd import OGD, OptimisticOGD
from specloop.strategies.ensemble import (HedgeEnsemble, OptimisticEnsemble,
                                          default_num_learners, geometric_learning_rates)
from specloop.strategies.osd import OSDDistillation
from specloop.strategies.precondition import Preconditioned
from specloop.strategies.registry import (LEARNER_ALIASES, LEARNER_NAMES, LEARNER_SPECS, LearnerSpec,
                                          learner_feedback, learns_from_round, learner_from_name,
                                          resolve_learner)
from specloop.strategies.policies import ConfidenceStop, FixedK, HeuristicK, TheoryOptimalK
from specloop.strategies.bandits import EXP3K, UCBK
from specloop.strategies.trees import DynamicTree, StaticTree
