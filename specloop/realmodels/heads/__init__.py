"""Trained draft heads for real targets: EAGLE, EAGLE-3, Medusa, Hydra, small LM, hybrid (issue 6)."""
