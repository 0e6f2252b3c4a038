"""Strategy objects shared by the simulator and the real decoder: draft policies
(plan/observe) and online learners (step). See `specloop.strategies.base`."""
from specloop.strategies.base import (DraftPlan, DraftPolicy, DraftStep, OnlineLearner,
                                      PlanState, TreeCandidates, TreePlan)
