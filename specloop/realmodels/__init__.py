"""The real-model half (DESIGN.md): torch + transformers, CPU here and CUDA where present.

Modules (one job each):

* `loading`      -- ``load_model``: registry names (``smollm2-135m`` default,
  ``gemma3-270m``, ``qwen2.5-coder-1.5b``), GGUF -> cached safetensors, HF ids /
  local directories, offline only.
* `sampling`     -- ``SamplingConfig`` and ``processed_probs`` (temperature, top-k,
  top-p applied identically to p_target and q_draft).
* `tree`         -- float 4D tree attention mask and position ids.
* `kvcache`      -- cache crop / accepted-path pruning, model forward helpers.
* `verify`       -- chain / tree speculative sampling on probabilities.
* `decoder`      -- ``SpeculativeDecoder``: the round loop, RoundRecord / Trace.
* `policy`       -- a fixed draft policy and ``--tree`` shape parsing.
* `drafters`     -- the ``Drafter`` plugin interface (``drafters.base``), n-gram
  prompt lookup, small-LM drafts (same or re-tokenised vocabulary), registry.
* `heads`, `training` -- trained EAGLE / Medusa / Hydra heads (their own issue).

Submodules are imported explicitly (``from specloop.realmodels.decoder import
SpeculativeDecoder``) so that importing the package stays cheap.
"""
