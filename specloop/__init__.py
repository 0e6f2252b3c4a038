"""specloop: speculative decoding whose drafts learn from the verifier.

Layers (DESIGN.md): `theory` (pure), `sim` (Numba simulator), `strategies` (draft
policies and online learners), `realmodels` (torch + transformers decoder), `ltd`
(LTD's trained tree policies, above `sim` and `realmodels`), `figures` and `cli` (the
only layers that import everything). The round record and `Trace` shared by all of
them live in `specloop.record`; the verdict rule and paired intervals in
`specloop.stats`.
"""
__version__ = "0.1.0"
