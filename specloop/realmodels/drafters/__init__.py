"""Draft sources behind the decoder's `Drafter` interface (loading one by name is
`specloop.realmodels.registry`). Modules:

* `base`       -- the `Drafter` interface, `DraftProposal` / `VerifyFeedback`, `BaseDrafter`, `NoDraft`, policy hooks.
* `ngram`      -- n-gram prompt lookup (`NGramDrafter`).
* `datastore`  -- REST retrieval from an n-gram index merged with prompt lookup (`NGramIndex`, `DatastoreDrafter`).
* `suffix`     -- SuffixDecoding over earlier outputs and the current request.
* `hedge`      -- exponential weights over several draft sources (``hedge:A,B``).
* `small_lm`   -- a separate small causal LM as the draft, own KV cache, optional re-tokenisation.
* `options`    -- typed registry options: `ContextOptions` (shared by every kind), checks, `option_table`.
"""
