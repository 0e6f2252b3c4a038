"""`specloop.theory`: closed forms and bounds of speculative decoding, pure and vectorised.

Sources: OnlineSpec (Qian et al.) Section 2 (Eq. (1), Lemma 1, Theorem 1, Eq. (7)),
Corollaries 1-3 (Section 3, Appendix D), Corollary 4 (Appendix C.1); Leviathan et al.
2023 (speculative sampling, expected tokens); SpecInfer (multi-draft verification).
This layer imports no other specloop layer. Notation follows docs/design.md, section "Notation".

Modules:

* `acceptance`    -- acceptance rate, distances and the residual of speculative sampling.
* `tokens`        -- expected tokens per round for chain, per-position and tree drafts.
* `speedup`       -- speedup gamma for linear and measured cost models.
* `bounds`        -- Lemma 1 and Theorem 1: tokens and speedup bounds from a regret value.
* `regret`        -- dynamic-regret bounds of Corollaries 1-3 with explicit constants.
* `optimal_k`     -- optimal candidate length: exact integer argmax vs Corollary 4's closed form.
* `online_cost`   -- when online draft updates pay in wall-clock: serial, background, separate device.
* `lookahead_cost` -- when Lookahead Reasoning beats the target alone: one round's expected steps and seconds.
* `check`         -- `run_theory_check`: a computed verdict on each stated result.
* `_cases`        -- generated target / draft cases for the check (exact integers).
* `_claims`       -- `ClaimResult` and the tally that builds it.
* `_exact`        -- exact and high-precision evaluations used by the check.
* `_unreachable`  -- the claim that Theorem 1 holds when the comparator cannot match p.
* `_validation`   -- input validation shared by every function of the layer.
"""
from specloop.theory._claims import ClaimResult
from specloop.theory._validation import SUM_TOLERANCE, validate_distribution
from specloop.theory.acceptance import (acceptance_rate, kl_divergence,
                                        multidraft_sibling_acceptance, residual_distribution,
                                        total_variation)
from specloop.theory.bounds import lemma1_bounds, theorem1_bounds
from specloop.theory.check import CLAIMS, run_theory_check
from specloop.theory.optimal_k import (optimal_k_efficiency, optimal_k_exact, optimal_k_paper,
                                       round_paper_k)
from specloop.theory.regret import (corollary1_regret_bound, corollary2_regret_bound,
                                    corollary3_num_base_learners, corollary3_regret_bound,
                                    corollary_growth_exponent)
from specloop.theory.speedup import (VerifyCostTable, speedup_linear, speedup_measured,
                                     speedup_upper_bound)
from specloop.theory.tokens import (CONVENTIONS, expected_tokens_chain,
                                    expected_tokens_positional, expected_tokens_tree)

__all__ = [
    "SUM_TOLERANCE", "validate_distribution",
    "acceptance_rate", "total_variation", "kl_divergence", "residual_distribution",
    "multidraft_sibling_acceptance",
    "CONVENTIONS", "expected_tokens_chain", "expected_tokens_positional", "expected_tokens_tree",
    "VerifyCostTable", "speedup_linear", "speedup_measured", "speedup_upper_bound",
    "lemma1_bounds", "theorem1_bounds",
    "corollary1_regret_bound", "corollary2_regret_bound", "corollary3_regret_bound",
    "corollary3_num_base_learners", "corollary_growth_exponent",
    "optimal_k_exact", "optimal_k_paper", "optimal_k_efficiency", "round_paper_k",
    "ClaimResult", "CLAIMS", "run_theory_check",
]
