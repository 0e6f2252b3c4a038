"""The one place that loads or trains a draft by name: above `drafters`, `heads` and
`training`, which never import it.

Modules:

* `drafters`        -- ``make_drafter(name, target)``: the names, the built-ins, published checkpoints.
* `heads`           -- the trained-head drafters' factories by name (``eagle``, ``hydra``, ``hybrid`` ...).
* `head_factories`  -- a target's saved draft, loaded or trained first (`load_or_train`, `load_eagle_drafter`).
* `datastore`       -- the ``ngram-datastore`` index of the warm-up corpus, loaded or built once.
"""
