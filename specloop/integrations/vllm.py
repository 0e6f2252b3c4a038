"""specloop's model-free drafters as a vLLM ``custom_class`` speculative proposer.

Interface, as read from vLLM (vllm-project/vllm ``vllm/v1/spec_decode/
custom_class_proposer.py`` at commit 71f7afb3f9fc8525ae50e0b9ea2d2072faba49a7, and
``ngram_proposer.py``, which the GPU runner drives through the same call): vLLM
imports the class named by ``speculative_config.custom_proposer_backend``
(``"specloop.integrations.vllm.Proposer"``), builds it as ``Proposer(vllm_config)``
and, every step, calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=None) -> list[list[int]]``:

* ``sampled_token_ids``: list (one per request in the batch) of the token ids
  sampled this step; an empty list means the request is not decoding (e.g. a
  partial prefill) and gets no proposal.
* ``num_tokens_no_spec``: per-request count of committed tokens (NumPy int array of
  the batch's slots, or one int for all), including the ones just sampled.
* ``token_ids_cpu``: [max_num_reqs, max_model_len] token ids (NumPy or torch, CPU);
  row i's first ``num_tokens_no_spec[i]`` entries are request i's context.
* return: one list of draft token ids per request, at most
  ``num_speculative_tokens`` long, not reaching past ``max_model_len``.

Settings read from ``vllm_config``: ``speculative_config.num_speculative_tokens``
(k), ``prompt_lookup_min`` / ``prompt_lookup_max`` (the n-gram sizes, when set),
``model_config.max_model_len``, and the drafter: the speculative config's
``specloop_drafter`` / ``specloop_options`` attributes when it carries them, else
the environment variables ``SPECLOOP_VLLM_DRAFTER`` (default ``ngram``) and
``SPECLOOP_VLLM_OPTIONS`` (a JSON object of the registry factory's options).

Drafters: the model-free ones, ``ngram`` (prompt lookup, `NGramDrafter`) and
``suffix`` (SuffixDecoding, Oliaro et al. 2024, `SuffixDrafter`). Each request is
drafted on its own context by a fresh drafter (vLLM does not say which request a
row holds from one step to the next), so a proposal equals what the drafter
proposes on that context alone; SuffixDecoding's cross-request tree is not kept.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan

__all__ = ["Proposer", "MODEL_FREE_DRAFTERS"]

MODEL_FREE_DRAFTERS = ("ngram", "suffix")


def _drafter_settings(spec) -> tuple[str, dict]:
    name = getattr(spec, "specloop_drafter", None) or os.environ.get("SPECLOOP_VLLM_DRAFTER") or "ngram"
    options = getattr(spec, "specloop_options", None)
    if options is None:
        raw = os.environ.get("SPECLOOP_VLLM_OPTIONS") or "{}"
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"SPECLOOP_VLLM_OPTIONS is not a JSON object: {raw!r} ({exc.msg})") from None
    if not isinstance(options, dict):
        raise ValueError(f"specloop drafter options must be a JSON object, got {options!r}")
    if name not in MODEL_FREE_DRAFTERS:
        raise ValueError(f"specloop's vLLM proposer runs the model-free drafters {', '.join(MODEL_FREE_DRAFTERS)}, "
                         f"not {name!r} (drafters that read the target's hidden states need vLLM's own "
                         "eagle / eagle3 / medusa methods)")
    if name == "ngram":
        for key, attr in (("min_ngram", "prompt_lookup_min"), ("max_ngram", "prompt_lookup_max")):
            if options.get(key) is None and getattr(spec, attr, None) is not None:
                options[key] = int(getattr(spec, attr))
    return name, options


class Proposer:
    """vLLM ``custom_class`` proposer over a specloop model-free drafter.

    Args:
        vllm_config: vLLM's ``VllmConfig`` (or any object with ``speculative_config``
            and ``model_config`` as described in the module docstring).

    Attributes:
        num_speculative_tokens: k, the longest proposal.
        max_model_len: context cap (proposals never reach past it).
        drafter_name, drafter_options: the registry drafter and its options.

    Raises:
        ValueError: no speculative config, k < 1, a drafter that is not model-free,
            options that are not a JSON object, or that the drafter does not declare
            or with a value of the wrong type (`registry.drafters.drafter_options`).
    """

    def __init__(self, vllm_config) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is None:
            raise ValueError("specloop's vLLM proposer needs vllm_config.speculative_config")
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.drafter_name, self.drafter_options = _drafter_settings(spec)
        make_drafter(self.drafter_name, None, **self.drafter_options)       # options checked now, not mid-serving
        self._generator = torch.Generator().manual_seed(0)

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load (model-free drafters)."""

    def propose_one(self, context: list[int]) -> list[int]:
        """Draft tokens (at most k, not past ``max_model_len``) after ``context``
        (the request's committed token ids) by a fresh drafter; [] when nothing matches."""
        budget = min(self.num_speculative_tokens, self.max_model_len - len(context))
        if budget <= 0 or not context:
            return []
        drafter = make_drafter(self.drafter_name, None, **self.drafter_options)
        ids = torch.tensor(context, dtype=torch.long)
        drafter.reset(ids)
        proposal = drafter.propose(DraftRequest(ids, DraftPlan(budget), budget, SamplingConfig(), self._generator))
        chain, last = [], -1                 # nodes are topological: the chain is the first root path
        for index, (tok, parent) in enumerate(zip(proposal.tokens.tolist(), proposal.parents.tolist())):
            if parent == last:
                chain.append(int(tok))
                last = index
        return chain[:budget]

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        """One list of draft ids per request of the batch (see the module docstring
        for the arguments); ``slot_mappings`` is unused (no KV cache of our own).

        Raises:
            ValueError: ``num_tokens_no_spec`` / ``token_ids_cpu`` shorter than the
                batch, or a count past a row's width.
        """
        rows = token_ids_cpu.numpy() if isinstance(token_ids_cpu, torch.Tensor) else np.asarray(token_ids_cpu)
        batch = len(sampled_token_ids)
        counts = np.broadcast_to(np.asarray(num_tokens_no_spec).reshape(-1), (batch,)) \
            if np.ndim(num_tokens_no_spec) == 0 else np.asarray(num_tokens_no_spec).reshape(-1)
        if counts.shape[0] < batch or rows.ndim != 2 or rows.shape[0] < batch:
            raise ValueError(f"propose got {batch} requests but num_tokens_no_spec of shape {counts.shape} and "
                             f"token_ids_cpu of shape {rows.shape}")
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(counts[i])
            if n > rows.shape[1]:
                raise ValueError(f"request {i} has {n} tokens, token_ids_cpu rows hold {rows.shape[1]}")
            out.append(self.propose_one(rows[i, :n].astype(np.int64).tolist()) if len(sampled) else [])
        return out
