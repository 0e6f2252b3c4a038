"""specloop: speculative decoding whose drafts learn from the verifier.

Layers (docs/design.md, section "Architecture"): `theory` (pure), `sim` (Numba
simulator), `strategies` (draft policies and online learners), `realmodels` (torch +
transformers decoder), `ltd` (LTD's trained tree policies, above `sim` and
`realmodels`), `figures`, `report` and `cli` (the only layers that import everything).

Packages:

* `theory`        -- closed forms and bounds, the theory check (pure functions).
* `strategies`    -- draft policies, online learners, the engine protocol and `drive_round`.
* `sim`           -- the Numba simulator of draft / target distributions.
* `realmodels`    -- models, drafters, the lossless decoder, streams, recordings, answer sets.
* `data`          -- prompt streams from installed dataset packages.
* `ltd`           -- LTD's PPO depth / size policies, their training and evaluation.
* `integrations`  -- transformers ``generate`` and vLLM adapters.
* `figures`       -- one module per figure.
* `report`        -- ``specloop reproduce``: the parts, the verdicts, report.md.
* `cli`           -- the ``specloop`` command.

Modules:

* `record`        -- `RoundRecord` and `Trace`, the round record every engine emits.
* `stats`         -- the verdict rule and the paired intervals it rests on.
* `_folder_lock`  -- one writer per results folder (an advisory ``flock``).
* `_integrity`    -- size and sha256 of the resumable folder formats' files, checked on open.
* `__main__`      -- ``python -m specloop``.
"""
__version__ = "0.1.0"
