"""Strategy objects shared by the simulator and the real decoder: draft policies
(plan/observe) and online learners (step). See `specloop.strategies.base`.

Policies: `FixedK`, `TheoryOptimalK`, `HeuristicK`, `ConfidenceStop` (chain),
`UCBK`, `EXP3K` (bandits over k), `StaticTree`, `DynamicTree` (trees).
Learners: `OGD`, `OptimisticOGD`, `HedgeEnsemble`, `OptimisticEnsemble`,
`OSDDistillation`, and the `Preconditioned` (RMS) wrapper; one registry of their names
(`specloop.strategies.registry`: `make_learner`, `resolve_learner`, `LEARNER_NAMES`).
"""
from specloop.strategies.base import (DraftPlan, DraftPolicy, DraftStep, OnlineLearner,
                                      PlanState, TreeCandidates, TreePlan)
from specloop.strategies.ogd import OGD, OptimisticOGD
from specloop.strategies.ensemble import (HedgeEnsemble, OptimisticEnsemble,
                                          default_num_learners, geometric_learning_rates)
from specloop.strategies.osd import OSDDistillation
from specloop.strategies.precondition import Preconditioned
from specloop.strategies.registry import (LEARNER_ALIASES, LEARNER_NAMES, LEARNER_SPECS, LearnerSpec,
                                          learner_feedback, learns_from_round, make_learner,
                                          resolve_learner)
from specloop.strategies.policies import ConfidenceStop, FixedK, HeuristicK, TheoryOptimalK
from specloop.strategies.bandits import EXP3K, UCBK
from specloop.strategies.trees import DynamicTree, StaticTree
