"""Trained draft heads for real targets: EAGLE, EAGLE-3, Medusa, Hydra, small LM, hybrid
(loading or training one by name is `specloop.realmodels.registry`). Modules:

* `common`           -- the reduced output vocabulary and the draft files (save / load).
* `eagle`            -- the EAGLE / EAGLE-3 head module.
* `eagle3_arch`      -- the EAGLE-3 layer choice (``--arch specloop|published``; the published layer).
* `eagle_drafter`    -- EAGLE / EAGLE-3 heads behind the `Drafter` interface, built from a saved draft.
* `medusa`, `hydra`  -- the Medusa and Hydra head modules.
* `head_drafting`    -- chain and tree drafting for the feature heads (`MedusaDrafter`, `HydraDrafter`).
* `small_lm`         -- the small LM distilled from the target, as a draft.
* `hybrid`           -- prompt lookup where it matches, the trained head otherwise.
* `published`        -- published EAGLE / EAGLE-3 / Medusa checkpoints as drafters.
* `published_hydra`  -- published Hydra checkpoints as drafters.
* `published_export` -- the heads written in the published layouts.
* `published_files`  -- files and checks shared by the published loaders and exporters.
* `compact`          -- the shipped heads' compact storage (int8 matrices, a scale per row group).
* `acceptance`       -- a draft's acceptance profile (tau and each position's share; the regression guard).
"""
