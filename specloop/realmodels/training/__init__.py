"""Offline training of draft heads: warm-up corpus, target feature cache, trainers. Modules:

* `corpus`          -- the warm-up corpus of real offline text.
* `features`        -- the target feature cache (teacher-forced target forwards, on disk).
* `recording_data`  -- training data read from a stream recording (the target's own answers).
* `head_data`       -- batches and losses for the Medusa / Hydra / small-LM trainers.
* `head_loop`       -- the optimisation loop those trainers share.
* `epoch_loop`      -- epoch training in resumable pieces (checkpoints, budgets) for runs on answer sets.
* `trainer`         -- shared training utilities and the trainer registry (`get_trainer`).
* `train_eagle`, `train_hydra`, `train_medusa`, `train_small_lm` -- one trainer per draft kind.
"""
