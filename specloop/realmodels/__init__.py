"""The real-model half: torch + transformers, CPU here and CUDA where present
(docs/design.md, sections "Contracts" and "Real models").

Modules (one job each):

* `loading`      -- ``load_model``: registry names (``smollm2-135m`` default,
  ``gemma3-270m``, ``qwen2.5-coder-1.5b``), GGUF -> cached safetensors, HF ids /
  local directories, offline only.
* `sampling`     -- ``SamplingConfig`` and ``processed_probs`` (temperature, top-k,
  top-p applied identically to p_target and q_draft).
* `tree`         -- float 4D tree attention mask and position ids.
* `kvcache`      -- cache crop / accepted-path pruning, model forward helpers.
* `padding`      -- verify-block padding to calibrated widths.
* `verify`       -- chain / tree speculative sampling on probabilities.
* `session`      -- ``DecodeSession``: one prompt's rounds (draft, verify, commit).
* `decoder`      -- ``SpeculativeDecoder``: the round loop, RoundRecord / Trace.
* `policy`       -- a fixed draft policy and ``--tree`` shape parsing.
* `recording`    -- a stream recording's settings, format and readers (numpy only).

Sub-packages:

* `drafters`     -- the ``Drafter`` plugin interface (``drafters.base``), n-gram
  prompt lookup, datastore, suffix, hedge, small-LM drafts.
* `heads`        -- trained EAGLE / EAGLE-3 / Medusa / Hydra / small-LM heads.
* `training`     -- offline training of the heads (corpus, features, trainers).
* `online`       -- online adaptation of a draft inside the decoder.
* `registry`     -- drafters by name: the one place that loads or trains a draft.
* `streams`      -- prompt streams: runner, recorder, replay, comparisons, grid.
* `answers`      -- answer sets: the batched greedy generator, the format, rebuilds.
* `reasoning`    -- Lookahead Reasoning (step drafts judged by the target).

Submodules are imported explicitly (``from specloop.realmodels.decoder import
SpeculativeDecoder``) so that importing the package stays cheap.
"""
