"""Shared fixtures for the Medusa / Hydra / small-LM draft tests: a tiny randomly
initialised Llama target and a tiny on-disk feature cache built from it."""
from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specloop.realmodels.training.features import chunk_stream, create_part, extract_features

VOCAB, HIDDEN, CHUNK = 96, 32, 32


def tiny_target(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    """A tiny Llama (vocab 96, width 32) in eval mode, frozen; tied embeddings."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than the default init
        model.lm_head.weight.mul_(6.0)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def token_stream(n: int, seed: int) -> np.ndarray:
    """A structured stream: a noisy cycle x_{i+1} = 3 x_i + 5 (mod V) with 20 % noise."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    out[0] = 3
    for i in range(1, n):
        out[i] = (3 * out[i - 1] + 5) % VOCAB if rng.random() > 0.2 else rng.integers(VOCAB)
    return out


def tiny_cache(model, folder, n_tokens: int, seed: int):
    """A feature part (last layer only, top-8) of ``n_tokens`` tokens in ``folder``."""
    chunks = chunk_stream(token_stream(n_tokens, seed), CHUNK)
    part = create_part(folder, chunks, layers=(-1,), hidden_size=HIDDEN, top_k=8, target="tiny",
                       fingerprint=f"tiny-{seed}-{n_tokens}")
    return extract_features(model, part, batch_size=16, progress=False)


def frequency_vocab(part, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids of a part (ties by id), int64."""
    counts = np.bincount(np.asarray(part.array("tokens")).ravel(), minlength=VOCAB)
    order = np.lexsort((np.arange(VOCAB), -counts))
    return torch.from_numpy(order[:size].astype(np.int64))


def registered_roundtrip(kind: str, tmp_path, steps: int = 20, **train_options):
    """Train ``kind`` through the trainer registry on a tiny feature cache
    (``feature_root`` with train/val parts), then build its drafter through the
    decoder's drafter registry from the saved folder. Returns (drafter, report, target)."""
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.loading import LoadedModel
    from specloop.realmodels.training.trainer import TrainConfig, get_trainer
    model = tiny_target(layers=3)
    root = tmp_path / "features"
    tiny_cache(model, root / "train", 4096, seed=0)
    tiny_cache(model, root / "val", 1024, seed=1)
    target = LoadedModel(model, None, "tiny", "test")
    config = TrainConfig(target="tiny", kind=kind, steps=steps, batch_size=2, window=17, lr=3e-3,
                         draft_vocab_size=64, quick=True, feature_root=str(root), out_dir=str(tmp_path / kind),
                         **train_options)
    report = get_trainer(kind)(config, loaded=target, progress=False)
    drafter = make_drafter(kind, target, checkpoint=str(tmp_path / kind), train_if_missing=False, progress=False)
    return drafter, report, target
