"""Adapters that run specloop inside other engines: transformers' ``generate``
(`specloop.integrations.hf`) and vLLM's ``custom_class`` speculative method
(`specloop.integrations.vllm`). This package may import `specloop.realmodels`;
nothing else in specloop imports it.

Modules:

* `hf`    -- ``speculative_generate`` for ``model.generate(custom_generate=...)``.
* `vllm`  -- `Proposer`, a ``custom_class`` proposer for the model-free drafters.
"""
