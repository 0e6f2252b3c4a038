"""specloop's speculative decoder behind transformers' ``generate``.

    from specloop.integrations.hf import speculative_generate
    out = model.generate(input_ids, custom_generate=speculative_generate, drafter="eagle3:PATH",
                         max_new_tokens=64)                      # or drafter="ngram", "suffix", ...

transformers 5.x (checked against 5.24, ``GenerationMixin.generate``) accepts a
callable ``custom_generate``: after preparing the generation config, logits
processors and stopping criteria it calls ``custom_generate(model, input_ids,
logits_processor=, stopping_criteria=, generation_config=, **model_kwargs)`` plus the
keyword arguments the callable declares beyond ``GenerationMixin._sample``'s
(``drafter``, ``drafter_options``, ``num_draft_tokens``, ``policy``, ``seed``,
``target_name`` here), and returns its result as ``generate``'s. The callable does
not receive ``streamer`` (``generate`` keeps it and has already ``put`` the prompt
into it); `speculative_generate` reads it from ``generate``'s frame and then puts each
round's committed tokens and calls ``end()``, as HF's own loop does.

Decoding is lossless (Leviathan et al. 2023; Chen et al. 2023): greedy output equals
HF greedy; sampled output follows the same distribution as HF sampling (not the same
draws: specloop's own generator, seeded from ``seed`` or from torch's global RNG).

Mapped settings: ``max_new_tokens`` / ``max_length`` (through ``generation_config.
max_length``), the EOS ids, ``do_sample`` with ``temperature``, ``top_k``, ``top_p``
(specloop's `SamplingConfig`, same order as transformers' warpers), and
``return_dict_in_generate`` (a ``GenerateDecoderOnlyOutput`` holding ``sequences``).
Refused with a one-line ``ValueError``: an attention implementation that cannot take
the 4D tree mask (flash-attention: load the model with ``attn_implementation="sdpa"``),
batch > 1, beam search / several return
sequences, padded attention masks, any other logits processor (repetition penalty,
min_new_tokens, bad words, ...), stopping criteria other than length and EOS,
scores / logits / attentions / hidden states in the output.

Nothing is trained or built inside ``generate``: a registry drafter whose saved head
(``eagle``, ``eagle3``, ``hydra``, ``medusa``, ...) or index (``ngram-datastore``) is
missing raises a one-line ``FileNotFoundError`` naming the command that makes it
(``specloop draft train ...``, ``specloop draft datastore ...``), unless
``drafter_options`` explicitly asks for ``train_if_missing`` / ``build_if_missing``.
Drafters look their saved artefacts up by ``target_name`` (a registry name such as
``smollm2-135m``); without it the model's ``name_or_path`` is used, which for a model
loaded from the hub cache is a folder path no draft is saved under.
"""
from __future__ import annotations

import inspect
import weakref

import torch

from specloop.realmodels.loading import LoadedModel
from specloop.realmodels.sampling import SamplingConfig

__all__ = ["speculative_generate", "sampling_from_generation_config"]

_WARPERS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
_STOPPERS = {"MaxLengthCriteria", "EosTokenCriteria"}
_DRAFTERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def sampling_from_generation_config(generation_config) -> SamplingConfig:
    """`SamplingConfig` of a transformers ``GenerationConfig``: greedy unless
    ``do_sample``; then its temperature, top_k (0 = off) and top_p (1.0 = off).

    Raises:
        ValueError: beam search, several return sequences, or a sampling setting
            specloop does not implement (min_p, typical_p, epsilon / eta cutoff).
    """
    gc = generation_config
    if int(getattr(gc, "num_beams", 1) or 1) > 1:
        raise ValueError(f"speculative_generate does not do beam search (num_beams={gc.num_beams})")
    if int(getattr(gc, "num_return_sequences", 1) or 1) > 1:
        raise ValueError(f"speculative_generate returns one sequence (num_return_sequences={gc.num_return_sequences})")
    if not gc.do_sample:
        return SamplingConfig()
    for name, neutral in (("min_p", None), ("typical_p", 1.0), ("epsilon_cutoff", 0.0), ("eta_cutoff", 0.0)):
        value = getattr(gc, name, neutral)
        if value is not None and value != neutral:
            raise ValueError(f"speculative_generate does not implement {name}={value} (temperature, top_k and "
                             "top_p only)")
    top_k = int(gc.top_k) if gc.top_k else None
    top_p = float(gc.top_p) if gc.top_p is not None and float(gc.top_p) < 1.0 else None
    return SamplingConfig(float(gc.temperature if gc.temperature is not None else 1.0), top_k, top_p)


def _check_supported(input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs) -> None:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"speculative_generate decodes one sequence at a time, got input_ids of shape "
                         f"{tuple(input_ids.shape)} (batch > 1 is not supported)")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("speculative_generate does not take padded inputs (attention_mask has zeros)")
    others = sorted({type(p).__name__ for p in (logits_processor or [])} - _WARPERS)
    if others:
        raise ValueError(f"speculative_generate does not apply the logits processors {', '.join(others)} (only "
                         "temperature, top_k and top_p sampling)")
    stops = sorted({type(s).__name__ for s in (stopping_criteria or [])} - _STOPPERS)
    if stops:
        raise ValueError(f"speculative_generate stops on max length and EOS only, not on {', '.join(stops)}")
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(generation_config, flag, False):
            raise ValueError(f"speculative_generate does not return {flag.removeprefix('output_')} ({flag}=True)")


def _eos_ids(generation_config) -> list[int]:
    eos = getattr(generation_config, "_eos_token_tensor", None)
    if eos is None:
        eos = generation_config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in torch.as_tensor(eos).reshape(-1).tolist()]


def _drafter_for(model, drafter, options: dict, target: LoadedModel, named: bool):
    """A `Drafter` instance as given, or the registry's drafter of that name (built
    once per model, name and options, then reused). Registry drafters never train a
    head or build an index here (``train_if_missing`` / ``build_if_missing`` default to
    False); a missing one is a FileNotFoundError naming the command that makes it."""
    if not isinstance(drafter, str):
        return drafter
    from specloop.realmodels.registry.drafters import make_drafter
    options = {"train_if_missing": False, "build_if_missing": False, "progress": False, **options}
    key = (drafter, tuple(sorted((k, repr(v)) for k, v in options.items() if k != "tokenizer")))
    per_model = _DRAFTERS.setdefault(model, {})
    if key not in per_model:
        try:
            per_model[key] = make_drafter(drafter, target, **options)
        except FileNotFoundError as err:
            hint = "" if named else (f" (drafts are looked up by target_name, here the model's name_or_path "
                                     f"{target.name!r}; pass target_name=, e.g. 'smollm2-135m')")
            raise FileNotFoundError(f"speculative_generate: drafter {drafter!r}: {err}{hint}") from None
    return per_model[key]


def _generate_streamer():
    """The ``streamer`` local of transformers' ``generate`` when it is our caller's caller."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    if caller is not None and caller.f_code.co_name == "generate" and "streamer" in caller.f_locals:
        return caller.f_locals["streamer"]
    return None


def speculative_generate(model, input_ids: torch.Tensor, logits_processor=None, stopping_criteria=None,
                         generation_config=None, drafter="ngram", drafter_options: dict | None = None,
                         num_draft_tokens: int = 5, policy=None, seed: int | None = None,
                         target_name: str | None = None, streamer=None, tokenizer=None, **model_kwargs):
    """transformers ``custom_generate`` callable running `SpeculativeDecoder`.

    Args:
        model: the transformers causal LM (``generate`` passes itself).
        input_ids: int64 (1, L) prompt (on the model's device or the CPU).
        logits_processor, stopping_criteria, generation_config: as ``generate``
            prepared them (checked, see the module docstring).
        drafter: a registry name (``ngram``, ``suffix``, ``eagle3:PATH``, ``medusa:PATH``,
            ``eagle`` for the target's trained head, ...) or a `Drafter` instance.
        drafter_options: keyword options for the registry factory (``dtype`` ...;
            `specloop.realmodels.registry.drafters.drafter_options` lists a drafter's,
            an option it does not declare is a ValueError naming the valid ones).
        num_draft_tokens: k of the default fixed chain policy.
        policy: a `DraftPolicy` instead (e.g. ``FixedDraftPolicy(6, tree=TreePlan(...))``).
        seed: seed of the decoder's sampling generator (default: drawn from torch's
            global RNG, so ``torch.manual_seed`` makes sampled runs repeatable).
        target_name: the target's name for drafters that look up saved drafts by it
            (default: the model's ``name_or_path``).
        streamer: used when called directly; under ``generate`` its own is used.
        tokenizer: the target's tokenizer, for drafters that read text (it becomes the
            target's ``LoadedModel.tokenizer``). transformers 5.x drops ``generate``'s
            own ``tokenizer=`` before calling a ``custom_generate`` callable, so under
            ``generate`` pass it as ``drafter_options={"tokenizer": tok}``.

    Returns:
        int64 (1, L + n) sequences (prompt + new tokens, EOS included when hit, n <=
        max_length - L) on input_ids' device, or a ``GenerateDecoderOnlyOutput``
        with ``sequences`` when ``generation_config.return_dict_in_generate``.

    Raises:
        ValueError: an unsupported setting (named), or errors of the drafter / decoder.
        FileNotFoundError: a registry drafter's saved head or index is missing (one
            line naming the command that makes it; nothing is trained or built here).
    """
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.policy import FixedDraftPolicy
    gc = generation_config if generation_config is not None else model.generation_config
    sampling = sampling_from_generation_config(gc)
    _check_supported(input_ids, logits_processor, stopping_criteria, gc, model_kwargs)
    from specloop.realmodels.kvcache import check_tree_attention
    check_tree_attention(model, "the model")        # before any drafter is built
    if streamer is None:
        streamer = _generate_streamer()          # generate has put the prompt already
    else:
        streamer.put(input_ids.cpu())
    prompt_len = int(input_ids.shape[1])
    max_length = gc.max_length if gc.max_length is not None else prompt_len + int(gc.max_new_tokens or 20)
    max_new = max(0, int(max_length) - prompt_len)
    options = dict(drafter_options or {})
    tokenizer = options.pop("tokenizer", tokenizer)
    target = LoadedModel(model=model, tokenizer=tokenizer,
                         name=target_name or str(getattr(model, "name_or_path", "")), source="transformers")
    draft = _drafter_for(model, drafter, options, target, named=target_name is not None)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    decoder = SpeculativeDecoder(target, draft, policy=policy or FixedDraftPolicy(int(num_draft_tokens)),
                                 sampling=sampling, seed=seed, eos_token_id=_eos_ids(gc))
    on_tokens = (lambda toks: streamer.put(torch.tensor(toks, dtype=torch.long))) if streamer is not None else None
    result = decoder.generate(input_ids[0].cpu(), max_new, on_tokens=on_tokens)
    if streamer is not None:
        streamer.end()
    new = torch.tensor(result.new_tokens, dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new[None]], 1)
    if getattr(gc, "return_dict_in_generate", False):
        from transformers.generation.utils import GenerateDecoderOnlyOutput
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences
