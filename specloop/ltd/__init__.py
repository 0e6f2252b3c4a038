"""`specloop.ltd`: LTD (Learning To Draft) -- trained depth and verification-size
policies for dynamic draft trees, their training and their evaluation on every engine.

A layer above `specloop.sim` and `specloop.realmodels` (as `specloop.figures` is): it
imports both, neither imports it, so `specloop.strategies` and `specloop.sim` load no
torch, gymnasium or stable-baselines3. Modules (import the one you need):

* `policy`      -- `LTDConfig`, observations, the exported actors, `LTDPolicy`, save / load by name (torch).
* `train`       -- the gymnasium depth / size environments, PPO training, co-training, fine-tuning (SB3).
* `evaluate`    -- engine-free evaluation helpers: named policies, ablations, static grid, result files.
* `env_sim`     -- the simulator's tree world and engine (`TreeWorld`, `SimTreeEngine`) for training.
* `env_replay`  -- the replay engine over recorded real-decoder rounds (`ReplayTreeEngine`).
* `train_sim`   -- ``ltd train`` on the model-free engines (simulator and replay).
* `eval_sim`    -- ``ltd eval`` on the model-free engines (simulator and replay).
* `env_real`    -- the real decoder as an LTD environment (`RealHarness`, `RealTreeEngine`).
* `record`      -- ``ltd record``: recording real-decoder rounds for the replay engine.
* `eval_real`   -- ``ltd eval`` / fine-tuning on the real decoder.

The shipped policies are in ``pretrained/`` (`policy.PRETRAINED_DIR`).
"""
