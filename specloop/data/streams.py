"""Prompt streams for online draft adaptation (OnlineSpec Sec. 4: a draft serves a
stream of prompts whose domain shifts, and learns while it serves).

A stream is built from the **held-out** split of the installed prompt datasets
(`specloop.data.prompts.load_prompts`), so the warm-up split used for offline draft
initialisation never enters it. Two orders:

* ``"shift"`` (domain shift, the default): all prompts of the first dataset, then
  all of the second, ... -- e.g. code (HumanEval) -> chat (MT-bench) ->
  instructions (IFBench), so each boundary is a distribution shift;
* ``"interleave"``: round-robin over the datasets (a stationary mixture).

Prompts are tokenised with the model's chat template when its tokenizer has one
(a single user turn, or a prompt file's whole chat, generation prompt appended), else
as plain text.

A dataset name may be a prompt file's path or a cached Hugging Face dataset's id
(`specloop.data.prompt_files`): its rows are split like a packaged dataset's (every 4th
row held out), carry their ``id`` and ``domain``.
"""
from __future__ import annotations

from dataclasses import dataclass

from specloop.data.prompts import Prompt, dataset_names, load_prompts

__all__ = ["StreamItem", "STREAM_ORDERS", "DEFAULT_DATASETS", "split_counts", "stream_prompts",
           "encode_prompt_text", "encode_prompt", "build_stream"]

STREAM_ORDERS = ("shift", "interleave")
DEFAULT_DATASETS = ("humaneval", "mt-bench", "ifbench")


@dataclass(frozen=True)
class StreamItem:
    """One prompt of a stream.

    Attributes:
        index: position in the stream (0-based), the records' ``stream_index``.
        dataset: dataset name.
        prompt_id: the dataset's own id.
        text: the user turn.
        ids: target token ids (tuple of ints) after templating, length >= 1.
    """

    index: int
    dataset: str
    prompt_id: str
    text: str
    ids: tuple[int, ...]


def split_counts(num_prompts: int, num_datasets: int) -> list[int]:
    """Prompts per dataset: ``num_prompts`` split as evenly as possible, earlier
    datasets taking the remainder (e.g. 10 over 3 -> [4, 3, 3]).

    Raises:
        ValueError: num_prompts < 1 or num_datasets < 1.
    """
    if int(num_prompts) < 1:
        raise ValueError(f"a stream needs at least 1 prompt, got {num_prompts}")
    if int(num_datasets) < 1:
        raise ValueError("a stream needs at least one dataset")
    base, extra = divmod(int(num_prompts), int(num_datasets))
    return [base + (1 if i < extra else 0) for i in range(int(num_datasets))]


def stream_prompts(datasets, num_prompts: int, order: str = "shift", split: str = "heldout") -> list[Prompt]:
    """The stream's prompts (held-out split by default), in stream order.

    Args:
        datasets: dataset names (order = domain order for ``"shift"``).
        num_prompts: total prompts, split by `split_counts`.
        order: ``"shift"`` or ``"interleave"``.
        split: the datasets' split (`load_prompts`): "heldout" for a stream, "warmup"
            for offline initialisation data.

    Raises:
        ValueError: unknown order, dataset or split, repeated dataset, a dataset with
            fewer prompts in the split than its share.
        FileNotFoundError: a dataset's package is not installed.
    """
    names = [d.strip() for d in (datasets.split(",") if isinstance(datasets, str) else datasets) if d.strip()]
    if order not in STREAM_ORDERS:
        raise ValueError(f"stream order must be one of {STREAM_ORDERS}, got {order!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"datasets repeat in {names}")
    counts = split_counts(num_prompts, len(names))
    blocks = []
    for name, count in zip(names, counts):
        prompts = load_prompts(name, split)
        if len(prompts) < count:
            label = {"heldout": "held-out ", "warmup": "warm-up "}.get(split, "")
            how = "" if split == "all" or name in dataset_names() else \
                " (a prompt file is split like a packaged dataset: every 4th row is held out)"
            raise ValueError(f"dataset {name!r} has {len(prompts)} {label}prompts, the stream "
                             f"needs {count}{how}")
        blocks.append(prompts[:count])
    if order == "shift":
        return [p for block in blocks for p in block]
    out = []
    for i in range(max(counts)):
        out.extend(block[i] for block in blocks if i < len(block))
    return out


def encode_prompt_text(tokenizer, text: str, chat_template: bool = True) -> list[int]:
    """Token ids of one user turn: the tokenizer's chat template (single user message,
    generation prompt added) when it has one and ``chat_template``, else plain
    ``tokenizer.encode``.

    Raises:
        ValueError: empty text, or an empty encoding.
    """
    if not text or not text.strip():
        raise ValueError("empty prompt text")
    if chat_template and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer.encode(rendered, add_special_tokens=False))
    else:
        ids = list(tokenizer.encode(text))
    if not ids:
        raise ValueError(f"prompt encodes to no tokens: {text[:40]!r}")
    return [int(i) for i in ids]


def encode_prompt(tokenizer, prompt: Prompt, chat_template: bool = True) -> list[int]:
    """Token ids of a prompt: `encode_prompt_text` of its text, or for a chat from a
    prompt file (``prompt.messages``) the chat template over every message (generation
    prompt added); without a template or ``chat_template`` the messages' contents
    joined by blank lines, plain ``tokenizer.encode``.

    Raises:
        ValueError: empty text, or an empty encoding.
    """
    if prompt.messages is None:
        return encode_prompt_text(tokenizer, prompt.text, chat_template)
    if chat_template and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in prompt.messages],
                                                 add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer.encode(rendered, add_special_tokens=False))
    else:
        ids = list(tokenizer.encode("\n\n".join(c for _, c in prompt.messages)))
    if not ids:
        raise ValueError(f"prompt encodes to no tokens: {prompt.text[:40]!r}")
    return [int(i) for i in ids]


def build_stream(datasets, num_prompts: int, tokenizer, *, order: str = "shift",
                 chat_template: bool = True, max_prompt_tokens: int | None = None,
                 split: str = "heldout") -> list[StreamItem]:
    """Tokenised stream items (see `stream_prompts`, `encode_prompt_text`).

    Args:
        max_prompt_tokens: if given, prompts longer than this keep their *last*
            ``max_prompt_tokens`` tokens (the chat template's generation prompt
            stays intact); None keeps them whole.
        split: see `stream_prompts`.

    Raises:
        ValueError / FileNotFoundError: as `stream_prompts`; max_prompt_tokens < 1.
    """
    if max_prompt_tokens is not None and int(max_prompt_tokens) < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    items = []
    for index, prompt in enumerate(stream_prompts(datasets, num_prompts, order, split)):
        ids = encode_prompt(tokenizer, prompt, chat_template)
        if max_prompt_tokens is not None:
            ids = ids[-int(max_prompt_tokens):]
        items.append(StreamItem(index, prompt.dataset, prompt.id, prompt.text, tuple(ids)))
    return items
