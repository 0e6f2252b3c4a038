"""Helpers the stream-scale grid's worker processes import (spawned processes cannot
see test-local functions): the tiny target and its recording."""
from __future__ import annotations

import torch

from specloop.data.streams import StreamItem

VOCAB, EOS, NEW = 24, 23, 20


def tiny_target(dtype: str = "float32"):
    from tests.realmodels.decoder_util import as_loaded, tiny_llama
    return as_loaded(tiny_llama(vocab=VOCAB, layers=3, hidden=16, max_positions=128, init_range=0.9, seed=5))


def record_tiny(folder, count: int = 8):
    from specloop.realmodels.recording import RecordSettings
    from specloop.realmodels.streams.record import record_stream
    gen = torch.Generator().manual_seed(4)
    # repetitive prompts: the suffix drafter has something to learn across the stream
    base = torch.randint(0, EOS, (6,), generator=gen).tolist()
    items = [StreamItem(i, "a" if i < count // 2 else "b", f"p{i}", "", tuple(base[: 2 + i % 5]))
             for i in range(count)]
    settings = RecordSettings(target="tiny", dtype="float32", datasets=("a", "b"), split="heldout", order="shift",
                              prompts=count, max_new_tokens=NEW, max_prompt_tokens=None, chat_template=False,
                              top_m=8, layers=(-1,), batch_size=4, shard_size=4)
    record_stream(tiny_target().model, items, folder, settings, check_prompts=0)
    return items
