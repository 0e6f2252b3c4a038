"""Batches and losses for training Medusa / Hydra / small-LM drafts on the target
feature cache (`specloop.realmodels.training.features`), by teacher forcing.

Position convention (same as the cache): at chunk position i the cache holds the
token x_i, the target's last-layer feature h_i and the target's top-K distribution
of x_{i+1}. A head sample anchored at offset t with horizon K uses h_t, the tokens
x_{t+1..t+K} (what heads 1..K condition on), the target's features h_{t+1..t+K}
(Hydra's feature-regression targets) and the target's distributions at t+1..t+K
(the soft labels of heads 1..K: head i drafts x_{t+1+i}).

Loss (distillation, Hinton et al. 2015; the soft-label form Medusa-2 / Hydra use):
cross-entropy of the draft's reduced-vocabulary distribution against the target's
top-K probabilities, restricted to the reduced vocabulary and renormalised there
(FR-Spec, Zhao et al. 2025: tokens outside the reduced vocabulary can never be
drafted, so their mass carries no gradient signal).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["HeadBatch", "sample_anchors", "gather_head_batch", "gather_windows", "soft_labels",
           "distill_loss", "top1_agreement", "choose_vocab_size", "training_data", "heldout_top1"]


@dataclass(frozen=True)
class HeadBatch:
    """A training batch for K heads (B anchors).

    Attributes:
        h: float32 (B, d): h_t.
        tokens: int64 (B, K): x_{t+1} .. x_{t+K}.
        target_hidden: float32 (B, K, d): h_{t+1} .. h_{t+K}.
        topk_ids: int64 (B, K, top_k): the target's top ids at t+1 .. t+K.
        topk_probs: float32 (B, K, top_k): their probabilities.
    """

    h: torch.Tensor
    tokens: torch.Tensor
    target_hidden: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor


def sample_anchors(n_chunks: int, chunk_len: int, horizon: int, batch_size: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Uniform anchors (chunk, offset) with offset + horizon < chunk_len.

    Returns:
        (chunks, offsets): two int64 arrays (batch_size,), chunks sorted (memmap locality).

    Raises:
        ValueError: no chunk, or a chunk too short for the horizon.
    """
    if n_chunks < 1:
        raise ValueError("the feature cache has no finished chunk yet")
    if chunk_len - horizon < 1:
        raise ValueError(f"chunk_len {chunk_len} too short for horizon {horizon}")
    chunks = np.sort(rng.integers(0, n_chunks, size=batch_size))
    offsets = rng.integers(0, chunk_len - horizon, size=batch_size)
    return chunks, offsets


def gather_head_batch(part, chunks: np.ndarray, offsets: np.ndarray, horizon: int) -> HeadBatch:
    """Read a `HeadBatch` from a `FeaturePart` (memmaps) at the given anchors."""
    hidden, tokens = part.hidden(-1), part.array("tokens")
    top_ids, top_probs = part.array("topk_ids"), part.array("topk_probs")
    rows = chunks[:, None]
    cols = offsets[:, None] + np.arange(1, horizon + 1)[None, :]
    h = torch.from_numpy(np.asarray(hidden[chunks, offsets], dtype=np.float32))
    return HeadBatch(
        h=h,
        tokens=torch.from_numpy(np.asarray(tokens[rows, cols], dtype=np.int64)),
        target_hidden=torch.from_numpy(np.asarray(hidden[rows, cols], dtype=np.float32)),
        topk_ids=torch.from_numpy(np.asarray(top_ids[rows, cols], dtype=np.int64)),
        topk_probs=torch.from_numpy(np.asarray(top_probs[rows, cols], dtype=np.float32)),
    )


def gather_windows(part, chunks: np.ndarray, starts: np.ndarray, width: int) -> tuple[torch.Tensor, ...]:
    """Token windows for a small-LM draft: (tokens (B, W) int64, topk_ids (B, W, K)
    int64, topk_probs (B, W, K) float32) from positions start .. start+W-1."""
    rows = chunks[:, None]
    cols = starts[:, None] + np.arange(width)[None, :]
    return (torch.from_numpy(np.asarray(part.array("tokens")[rows, cols], dtype=np.int64)),
            torch.from_numpy(np.asarray(part.array("topk_ids")[rows, cols], dtype=np.int64)),
            torch.from_numpy(np.asarray(part.array("topk_probs")[rows, cols], dtype=np.float32)))


def soft_labels(topk_ids: torch.Tensor, topk_probs: torch.Tensor,
                target_to_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Map the target's top-K (ids, probs) into the reduced vocabulary.

    Returns:
        (index, weight): int64 and float32 (..., K): draft-vocabulary rows (0 where the
        id is outside it) and weights renormalised to sum to 1 over the ids inside it
        (all zero when none is inside: such a position contributes no loss).
    """
    index = target_to_draft[topk_ids]
    inside = index >= 0
    weight = torch.where(inside, topk_probs, torch.zeros_like(topk_probs))
    weight = weight / weight.sum(-1, keepdim=True).clamp_min(1e-12)
    return index.clamp_min(0), weight


def distill_loss(logits: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum_j w_j log q_draft(index_j); logits (..., V_d)."""
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, index)
    per_pos = -(weight * logq).sum(-1)
    has_label = (weight.sum(-1) > 0).float()
    return (per_pos * has_label).sum() / has_label.sum().clamp_min(1.0)


def top1_agreement(logits: torch.Tensor, draft_to_target: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Fraction (float tensor (...) averaged over the batch axis 0) of positions where
    the draft's argmax (mapped to target ids) equals the target's top-1 id."""
    pred = draft_to_target[logits.argmax(-1)]
    return (pred == topk_ids[..., 0]).float().mean(0)


def open_training_parts(config, loaded=None, progress: bool = True):
    """The feature-cache parts a `TrainConfig` trains on: ``[train (+ chat)]`` and
    ``val`` under `features.training_features_root` (``config.feature_root``, else
    the target's cache for ``config.corpus_mix``), building the cache with
    `build_feature_cache` when it does not exist.

    Returns:
        (train_parts list, val_part).
    """
    from specloop.realmodels.training.features import (build_feature_cache, open_part,
                                                       training_features_root)
    root = training_features_root(config)
    try:
        train, val = [open_part(root / "train")], open_part(root / "val")
    except FileNotFoundError:
        if loaded is None:
            from specloop.realmodels.loading import load_model
            loaded = load_model(config.target, dtype=config.dtype)
        built = build_feature_cache(loaded, config.target, total_tokens=config.tokens, root=root,
                                    progress=progress, parts=("val", "train"),
                                    mix=getattr(config, "corpus_mix", None))
        train, val = [built["train"]], built["val"]
    chat = root / "chat" / "meta.json"
    if chat.is_file() and open_part(chat.parent).n_done:
        train.append(open_part(chat.parent))
    return train, val


def choose_vocab_size(counts: np.ndarray, val_top1: np.ndarray, coverage: float = 0.95,
                      cap: int = 8192, step: int = 256) -> int:
    """Smallest multiple of ``step`` whose frequency-ranked subset covers ``coverage``
    of the target's held-out top-1 predictions (capped at ``cap``): the reduced
    draft vocabulary size of EAGLE-3 / FR-Spec heads.

    Args:
        counts: int (V_target,) token frequencies of the training corpus.
        val_top1: int held-out top-1 target token ids (any shape).
    """
    order = np.lexsort((np.arange(counts.size), -counts))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    ranks = np.sort(rank[val_top1.reshape(-1)])
    need = ranks[min(len(ranks) - 1, int(np.ceil(coverage * len(ranks))) - 1)] + 1
    return int(min(cap, counts.size, max(step, int(np.ceil(need / step)) * step)))


def reduced_vocab_for(config, train_parts, val_part, target_config):
    """EAGLE-3 / FR-Spec reduced vocabulary, chosen exactly as the EAGLE trainer does
    (`choose_vocab_size`: smallest multiple
    of 256 covering 95 % of the held-out top-1, capped at 8192; EOS always in), so
    every trained kind of one target shares the recipe.

    Returns:
        (`ReducedVocab`, held-out top-1 ids array).
    """
    from specloop.realmodels.heads.common import build_reduced_vocab
    from specloop.realmodels.training.recording_data import RecordingSplit
    from specloop.realmodels.training.trainer import vocab_counts
    if isinstance(train_parts, RecordingSplit):
        vocab_size = int(target_config.vocab_size)
        counts = train_parts.answer_counts(vocab_size) if getattr(config, "vocab_from_answers", False) else \
            train_parts.vocab_counts(vocab_size)
    else:
        counts = vocab_counts(train_parts, int(target_config.vocab_size))
    val_top1 = heldout_top1(val_part)
    size = config.draft_vocab_size or choose_vocab_size(counts, val_top1)
    eos = getattr(target_config, "eos_token_id", None)
    return build_reduced_vocab(counts, size, always=(int(eos),) if isinstance(eos, int) else ()), val_top1


def heldout_top1(val_part) -> np.ndarray:
    """The target's top-1 next-token ids on the held-out slice (a feature part or a
    `recording_data.RecordingSplit`)."""
    from specloop.realmodels.training.recording_data import RecordingSplit
    if isinstance(val_part, RecordingSplit):
        return val_part.top1_labels()
    return np.asarray(val_part.array("topk_ids")[: val_part.n_done, :, 0])


def training_data(config, loaded, progress: bool = True):
    """(train, val, recording note or None): the recording's `RecordingSplit` s when
    ``config.recordings`` is set (`recording_data.open_recording_splits`), else the
    feature-cache parts of `open_training_parts`."""
    if not getattr(config, "recordings", ()):
        train, val = open_training_parts(config, loaded, progress)
        return train, val, None
    from specloop.realmodels.training.recording_data import open_recording_splits
    return open_recording_splits(config.recordings, config.target, loaded.model, config.kind,
                                 positions=config.recording_positions,
                                 soft_targets=config.recording_soft_targets)


def loaded_target(config, loaded=None):
    """The target `LoadedModel` (float32 weights are what the heads copy)."""
    if loaded is not None:
        return loaded
    from specloop.realmodels.loading import load_model
    return load_model(config.target, dtype="float32")


def save_trained(module: torch.nn.Module, report: dict, config, kind: str) -> dict:
    """Save ``module.state_dict()`` + ``report`` with `common.save_draft`; returns the
    report with ``path``."""
    from pathlib import Path

    from specloop.realmodels.heads.common import save_draft
    folder = save_draft(module.state_dict(), report, config.target, kind,
                        Path(config.out_dir) if config.out_dir else None)
    return {**report, "path": str(folder)}


def loop_config_for(config, batch_size: int, quick_eval_every: int = 0):
    """`LoopConfig` from a `TrainConfig` (``batch_size`` in the trainer's own unit)."""
    from specloop.realmodels.training.head_loop import LoopConfig
    steps = int(config.steps)
    return LoopConfig(steps=steps, batch_size=int(batch_size), lr=float(config.lr),
                      weight_decay=float(config.weight_decay),
                      warmup=min(int(getattr(config, "warmup", 100)), steps // 10 + 1),
                      max_seconds=config.time_limit_s,
                      eval_every=quick_eval_every or max(50, steps // 3),
                      checkpoint_every=0 if config.quick else 50, seed=int(config.seed),
                      autocast=bool(getattr(config, "bf16_autocast", False)))


def _init_state(config, kind: str) -> dict | None:
    """The state dict of the saved draft named by ``config.init_from`` (a draft folder,
    see `specloop.realmodels.heads.common.find_draft`), or None when training fresh.

    Raises:
        FileNotFoundError: ``init_from`` names no saved draft of this kind.
    """
    if not getattr(config, "init_from", None):
        return None
    from specloop.realmodels.heads.common import load_draft
    tensors, _ = load_draft(config.target, kind, config.init_from)
    return tensors


def remap_vocab_rows(rows: torch.Tensor, saved, vocab, fresh: torch.Tensor) -> torch.Tensor:
    """A saved head's reduced-vocabulary rows moved onto another reduced vocabulary
    (``specloop draft train --init-from ... --revocab``).

    Args:
        rows: float (V_saved, H) trained rows, row i for target id ``saved.d2t[i]``.
        saved / vocab: the saved and the new `ReducedVocab` (same V_target).
        fresh: float (V_new, H) the rows a fresh head of ``vocab`` starts from (the
            target's LM-head rows of ``vocab.d2t``).

    Returns:
        float32 (V_new, H): row j = the saved row of ``vocab.d2t[j]`` where the saved
        vocabulary has that token, else ``fresh[j]``.

    Raises:
        ValueError: shapes or vocabularies that do not fit together.
    """
    if rows.ndim != 2 or rows.shape[0] != saved.size or saved.target_vocab_size != vocab.target_vocab_size \
            or tuple(fresh.shape) != (vocab.size, rows.shape[1]):
        raise ValueError(f"cannot remap rows {tuple(rows.shape)} of a {saved.size}-token vocabulary onto "
                         f"{vocab.size} tokens starting from rows {tuple(fresh.shape)}")
    out = fresh.detach().clone().float()
    where = saved.t2d[vocab.d2t]
    shared = where >= 0
    out[shared] = rows[where[shared]].float()
    return out


def remap_state_vocab(init: dict, fresh_state: dict, saved, vocab) -> dict:
    """A saved draft's state dict on a new reduced vocabulary: tensors whose first axis
    is the saved vocabulary are remapped row by row (`remap_vocab_rows`, new tokens from
    ``fresh_state``), the vocabulary buffers come from ``fresh_state``, the rest is kept.

    Raises:
        ValueError: a tensor that fits neither shape."""
    out = {}
    for key, fresh in fresh_state.items():
        old = init[key]
        if key.endswith(("draft_to_target", "target_to_draft")) or key == "d2t":
            out[key] = fresh
        elif old.shape == fresh.shape:
            out[key] = old
        elif old.ndim == 2 and old.shape[0] == saved.size and fresh.shape[0] == vocab.size:
            out[key] = remap_vocab_rows(old, saved, vocab, fresh).to(fresh.dtype)
        else:
            raise ValueError(f"--revocab: {key} has shape {tuple(old.shape)} in the saved draft and "
                             f"{tuple(fresh.shape)} on the new vocabulary")
    return out


def _train_epochs(config, kind: str, module, loss_cfg, data: tuple, batch_size: int, hooks: dict, loaded,
                  progress: bool, folder) -> dict:
    """The resumable epoch run of Medusa / Hydra heads (`epoch_loop`): every anchor of
    the training prompts once per epoch; when finished, the heads are saved with the
    epoch report (train / held-out / eval top-1 per head), else only the checkpoint.

    ``data`` = (train split, val split, vocab, held-out top-1 ids, recording note);
    ``hooks``: ``loss(module, HeadBatch) -> (loss, metrics)``, ``logits(module,
    HeadBatch) -> (B, K, V_d)``, ``evaluate(logits, d2t, HeadBatch) -> dict``,
    ``prepare(module)`` (called before training)."""
    from specloop.realmodels.training.epoch_loop import (CHECKPOINT_NAME, EpochPlan, epoch_report,
                                                         epoch_signature, pieces_of, run_epochs, write_train_report)
    train, val, vocab, val_top1, note = data
    horizon = module.config.num_heads
    rows = train.epoch_anchors(horizon)
    plan = EpochPlan(len(rows), batch_size, config.epochs, config.seed)
    hooks["prepare"](module)

    def step_fn(idx):
        return hooks["loss"](module, HeadBatch(*train.anchor_batch(rows[idx], horizon)))

    params = [p for p in module.parameters() if p.requires_grad]
    loop = run_epochs(module, params, step_fn, plan, lr=float(config.lr),
                      warmup=min(int(config.warmup), plan.total_steps // 10 + 1), checkpoint=folder / CHECKPOINT_NAME,
                      signature=epoch_signature(config, module.config.to_dict(), loss_cfg.to_dict()),
                      pieces=pieces_of(config), weight_decay=float(config.weight_decay),
                      autocast=bool(config.bf16_autocast), progress=progress, desc=kind)
    report = {**epoch_report(loop, plan, rows.shape[0], kind), "target": config.target,
              "draft_vocab_size": vocab.size, "train_config": config.to_dict()}
    if not loop["complete"]:
        write_train_report(folder, report)
        return {**report, "path": str(folder)}
    count = 512 if config.quick else int(getattr(loss_cfg, "eval_positions", 2048))

    def per_head(split) -> tuple[list, dict]:
        batch = HeadBatch(*split.head_tensors(np.random.default_rng(1234), horizon, count))
        with torch.no_grad():
            out = hooks["evaluate"](hooks["logits"](module, batch), module.lm_head.draft_to_target, batch)
        return [out[f"top1_head{i + 1}"] for i in range(horizon)], out

    report["train_top1_per_step"], _ = per_head(train)
    report["heldout_top1_per_step"], report["heldout"] = per_head(val)
    report["heldout_top1"] = report["heldout_top1_per_step"][0]
    report["vocab_coverage_heldout_top1"] = vocab.coverage(val_top1)
    if config.eval_recordings:
        from specloop.realmodels.training.recording_data import open_eval_split
        split = open_eval_split(config.eval_recordings, config.target, loaded.model, kind)
        report["eval_top1_per_step"], report["eval"] = per_head(split)
        report.update(eval_positions=split.positions, eval_vocab_coverage=vocab.coverage(split.top1_labels()),
                      eval_recordings=[str(r) for r in config.eval_recordings])
    report["train_config"]["recording_data"] = note
    report.update(architecture=module.config.to_dict(), loss_config=loss_cfg.to_dict(),
                  optimizer_steps=report["steps"], positions_seen=report["positions_trained"],
                  train_seconds=report["seconds"], cached_positions=rows.shape[0])
    out = save_trained(module, report, config, kind)
    write_train_report(folder, out)
    return out


def train_registered(config, kind: str, loaded, progress: bool, build, train_fn, loss_cfg,
                     epoch_hooks: dict | None = None) -> dict:
    """The common body of ``specloop draft train --kind medusa|hydra|small-lm``.

    Args:
        config: the `TrainConfig`.
        kind: draft kind (folder name).
        loaded: target `LoadedModel` or None.
        build: ``build(model, d2t) -> (module, batch_size)``.
        train_fn: ``train_fn(module, train_parts, val_part, loop, loss_cfg, checkpoint=,
            signature=, progress=) -> report``.
        loss_cfg: the kind's loss config (dataclass with ``to_dict``).
        epoch_hooks: what an epoch run (``config.epochs``) needs of the kind (`_train_epochs`).

    Returns:
        The report saved in ``draft.json`` (``heldout_top1`` = head 1 / next-token
        top-1 agreement on the held-out slice, ``train_seconds``, ``positions_seen``,
        ``cached_positions``, ``draft_vocab_size``, ``architecture``, ``path``).
    """
    import json
    from pathlib import Path

    from specloop.realmodels.heads.common import draft_dir
    torch.manual_seed(config.seed)
    loaded = loaded_target(config, loaded)
    train_parts, val_part, note = training_data(config, loaded, progress)
    init = _init_state(config, kind)
    saved = None
    if init is None or getattr(config, "revocab", False):
        vocab, val_top1 = reduced_vocab_for(config, train_parts, val_part, loaded.model.config)
    if init is not None:   # continue from a saved draft: its reduced vocabulary unless revocab
        from specloop.realmodels.heads.common import ReducedVocab
        d2t = next((v for k, v in init.items() if k.endswith("draft_to_target") or k == "d2t"), None)
        if d2t is None:
            raise ValueError(f"the saved {kind} draft {config.init_from} has no reduced vocabulary")
        saved = ReducedVocab(d2t.long(), int(loaded.model.config.vocab_size))
        if not getattr(config, "revocab", False):
            vocab, val_top1 = saved, heldout_top1(val_part)
    module, batch_size = build(loaded.model, vocab.d2t)
    if init is not None:
        if vocab is not saved:
            init = remap_state_vocab(init, module.state_dict(), saved, vocab)
        module.load_state_dict(init, strict=True)
    folder = Path(config.out_dir) if config.out_dir else draft_dir(config.target, kind)
    if getattr(config, "epochs", 0):
        if epoch_hooks is None:
            raise ValueError(f"{kind} drafts have no epoch run")
        return _train_epochs(config, kind, module, loss_cfg, (train_parts, val_part, vocab, val_top1, note),
                             batch_size, epoch_hooks, loaded, progress, folder)
    loop = loop_config_for(config, batch_size)
    train_only = {k: v for k, v in loss_cfg.to_dict().items() if not k.startswith("eval")}
    signature = json.dumps([config.to_dict(), module.config.to_dict(), train_only], sort_keys=True, default=str)
    raw = train_fn(module, train_parts, val_part, loop, loss_cfg, checkpoint=folder / "checkpoint.pt",
                   signature=signature, progress=progress)
    final = raw["final"]
    per_step = [v for k, v in final.items() if k.startswith("top1_head")] or [final.get("top1")]
    report = {
        "architecture": module.config.to_dict(),
        "train_config": config.to_dict(),
        "loss_config": loss_cfg.to_dict(),
        "heldout_top1": per_step[0],
        "heldout_top1_per_step": per_step,
        "heldout": final,
        "history": raw["history"],
        "optimizer_steps": raw["steps"],
        "positions_seen": int(raw.get("train_positions", raw["positions"])),
        "cached_positions": int(raw["train_tokens_available"]),
        "train_seconds": float(raw["seconds"]),
        "draft_vocab_size": vocab.size,
        "vocab_coverage_heldout_top1": vocab.coverage(val_top1),
    }
    if note is not None:
        report["train_config"]["recording_data"] = note
    out = save_trained(module, report, config, kind)
    (folder / "checkpoint.pt").unlink(missing_ok=True)   # only needed to resume an interrupted run
    return out
