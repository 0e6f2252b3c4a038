"""Real-model helpers shared by the real-model figures: held-out prompts as token
ids, timed runs of HF ``generate`` modes and of the specloop decoder.

Every timing is wall clock (``time.perf_counter``, CUDA synchronised) around one
whole generation call, prefill included, for HF and specloop alike, so tokens/s are
comparable; the first call of each method is an untimed warm-up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from specloop.figures._base import FigureUnavailable, require

__all__ = ["load_target", "heldout_prompt_ids", "TimedRun", "time_hf_generate",
           "time_specloop", "DEFAULT_TARGET"]

DEFAULT_TARGET = "smollm2-135m"


def load_target(name: str = DEFAULT_TARGET, dtype: str = "float32", device: str = "cpu"):
    """Load the target with `specloop.realmodels.loading.load_model`.

    Raises:
        FigureUnavailable: the real-model layer or the model's package is missing.
    """
    loading = require("specloop.realmodels.loading", "load_model",
                      why="real-model loading")
    try:
        return loading.load_model(name, dtype=dtype, device=device)
    except (FileNotFoundError, ImportError) as exc:
        raise FigureUnavailable(f"cannot load target {name!r}: {exc}") from exc


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of a `specloop.data.prompts.Prompt`: chat template for chat /
    instruction datasets (where the tokenizer has one), raw text for HumanEval
    (a code-completion stub)."""
    if prompt.dataset != "humaneval" and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}],
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(prompt.text)["input_ids"]]


def heldout_prompt_ids(tokenizer, per_dataset: dict[str, int]) -> list[tuple[str, list[int]]]:
    """(dataset, ids) for the first n held-out prompts of each dataset, in the
    given dataset order (a domain-shift order when iterated).

    Raises:
        FigureUnavailable: a dataset package is not installed.
    """
    from specloop.data.prompts import load_prompts
    out = []
    for dataset, n in per_dataset.items():
        try:
            prompts = load_prompts(dataset, "heldout", limit=n)
        except FileNotFoundError as exc:
            raise FigureUnavailable(str(exc)) from exc
        out += [(dataset, encode_prompt(tokenizer, p)) for p in prompts]
    return out


@dataclass
class TimedRun:
    """One method over a prompt set.

    Attributes:
        method: name; new_tokens: generated tokens in total; seconds: wall clock;
        rounds: speculative rounds (0 for HF modes, which do not expose them);
        outputs: generated ids per prompt (for the greedy-identity check).
    """

    method: str
    new_tokens: int
    seconds: float
    rounds: int
    outputs: list[list[int]]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else float("nan")


def _progress(prompts, method: str):
    """A transient tqdm bar over prompts (stderr)."""
    import sys

    from tqdm import tqdm
    return tqdm(prompts, desc=f"  {method}", unit="prompt", leave=False, file=sys.stderr)


def _sync(device) -> None:
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_hf_generate(target, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                     method: str, **generate_kwargs) -> TimedRun:
    """Greedy HF ``generate`` (plus ``generate_kwargs``, e.g. ``prompt_lookup_num_tokens``)
    over the prompts, one at a time, after one untimed warm-up call."""
    import torch
    model = target.model
    device = next(model.parameters()).device
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0,
                  pad_token_id=target.tokenizer.pad_token_id or target.tokenizer.eos_token_id,
                  **generate_kwargs)

    def one(ids, **override):
        x = torch.tensor([list(ids)], device=device)
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), **{**kwargs, **override})
        return out[0, x.shape[1]:].tolist()

    one(prompts[0][: max(1, len(prompts[0]) // 2)], max_new_tokens=8)  # warm-up, untimed
    outputs, total = [], 0.0
    for ids in _progress(prompts, method):
        _sync(device)
        t0 = time.perf_counter()
        outputs.append(one(ids))
        _sync(device)
        total += time.perf_counter() - t0
    return TimedRun(method, sum(len(o) for o in outputs), total, 0, outputs)


def time_specloop(make_decoder: Callable[[], object], prompts: Sequence[Sequence[int]],
                  max_new_tokens: int, method: str, traces: list | None = None) -> TimedRun:
    """The specloop decoder (built by ``make_decoder()``) over the prompts, after an
    untimed warm-up; appends each prompt's `Trace` to ``traces`` if given."""
    decoder = make_decoder()
    decoder.generate(list(prompts[0])[: max(1, len(prompts[0]) // 2)], max_new_tokens=8)
    outputs, total, rounds = [], 0.0, 0
    for i, ids in enumerate(_progress(prompts, method)):
        _sync(decoder.device)
        t0 = time.perf_counter()
        result = decoder.generate(list(ids), max_new_tokens=max_new_tokens, stream_index=i)
        _sync(decoder.device)
        total += time.perf_counter() - t0
        outputs.append(list(result.new_tokens))
        rounds += len(result.trace)
        if traces is not None:
            traces.append(result.trace)
    return TimedRun(method, sum(len(o) for o in outputs), total, rounds, outputs)


TRAINED_DRAFTERS = ("eagle", "eagle3", "hybrid", "medusa", "hydra", "small-lm")
_UNTRAINED_CLASSES = {"SmallLMDrafter", "RetokenizingDrafter"}


def saved_drafters(target, names: Sequence[str] = TRAINED_DRAFTERS) -> list[str]:
    """The trained drafters that load for ``target`` *without training* (a saved or
    shipped checkpoint exists): figures never start a draft's offline training."""
    try:
        registry = require("specloop.realmodels.registry.drafters", "make_drafter",
                           "drafter_names")
        known = set(registry.drafter_names())
    except (FigureUnavailable, ImportError):
        return []
    found = []
    for name in names:
        if name not in known:
            continue
        try:
            drafter = registry.make_drafter(name, target, train_if_missing=False, progress=False)
        except (FileNotFoundError, ValueError, ImportError, KeyError):
            continue
        if type(drafter).__name__ in _UNTRAINED_CLASSES:
            continue  # e.g. "small-lm" falling back to an off-the-shelf LM (the target itself)
        found.append(name)
    return found
