"""Offline training of EAGLE / EAGLE-3 heads on the cached target features.

Objective per draft step s = 1..S (training-time test, EAGLE-3 Sec. 3; the head
feeds its own predicted features for steps >= 2, `EagleHead.forward_ttt`):

    L = sum_s w_s [ CE(q_draft^(s), p_target restricted to V_draft)
                    + lambda_feat * SmoothL1(h^(s), f_next)   (EAGLE only, EAGLE Eq. 5) ]

with w_s = 0.8^(s-1) / sum, CE against the cached top-K target distribution
(`topk_soft_ce`), AdamW with warm-up + cosine decay, gradient clipping at 1.
Held-out top-1 agreement is measured on the corpus's validation slice (documents
never trained on). With ``config.recordings`` the data is a stream recording instead
(`recording_data`: the target's own greedy answers, self-distillation; held out =
every `recording_data.VAL_EVERY`-th prompt). Registered for kinds ``eagle`` and ``eagle3``.
``config.arch`` picks the EAGLE-3 layer (`specloop.realmodels.heads.eagle3_arch`:
specloop's fused layer or the published one); the loss, data and schedule are the same.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specloop.realmodels.heads.common import ReducedVocab, build_reduced_vocab, draft_dir, save_draft
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle3_arch import build_eagle_head
from specloop.realmodels.training.head_data import choose_vocab_size, open_training_parts, remap_state_vocab
from specloop.realmodels.training.trainer import (FeatureBatcher, Stopwatch, TrainConfig, cosine_lr,
                                                   register_trainer, top1_agreement, topk_soft_ce,
                                                   vocab_counts)

__all__ = ["train_eagle", "head_features", "ttt_loss", "evaluate_head", "choose_vocab_size",
           "FEATURE_LOSS_WEIGHT", "STEP_DECAY"]

FEATURE_LOSS_WEIGHT = 1.0     # lambda_feat (EAGLE: 1.0 on the feature loss, 0.1 on CE)
STEP_DECAY = 0.8


def head_features(head_cfg: EagleConfig, features: dict[int, torch.Tensor]) -> torch.Tensor:
    """The head's input features [B, T, F] from a batch's per-layer hidden states."""
    return torch.cat([features[l] for l in head_cfg.feature_layers], -1)


def ttt_loss(head: EagleHead, batch, t2d: torch.Tensor, d2t: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Multi-step loss of one batch and per-step (top-1 matches, positions).

    Position i (0..T-1, T = window-1) reads (f_i, x_{i+1}); every step at position i
    predicts x_{i+2}, whose target distribution is the cached top-K at i+1; step s
    is valid where its anchor i-s+1 >= 0.
    """
    cfg = head.config
    feats = head_features(cfg, batch.features)
    t = feats.shape[1] - 1
    outs = head.forward_ttt(feats[:, :t], batch.tokens[:, 1:t + 1], steps)
    tgt_ids, tgt_probs = batch.topk_ids[:, 1:t + 1], batch.topk_probs[:, 1:t + 1]
    tgt_draft = t2d[tgt_ids]
    pos = torch.arange(t)
    weights = torch.tensor([STEP_DECAY ** s for s in range(steps)])
    weights = weights / weights.sum()
    total = feats.new_zeros(())
    stats = []
    for s, (h, logits) in enumerate(outs, start=1):
        mask = (pos >= s - 1)[None, :].expand(feats.shape[0], -1)
        if batch.valid is not None:          # a recording's padding / unlabelled positions
            mask = mask & batch.valid[:, 1:t + 1]
        loss = topk_soft_ce(logits, tgt_draft, tgt_probs, mask)
        if cfg.kind == "eagle":
            f_next = batch.features[-1][:, 1:t + 1]
            loss = loss + FEATURE_LOSS_WEIGHT * F.smooth_l1_loss(h[mask], f_next[mask])
        total = total + weights[s - 1] * loss
        stats.append(top1_agreement(logits.detach(), d2t, tgt_ids[..., 0], mask))
    return total, stats


@torch.no_grad()
def evaluate_head(head: EagleHead, batcher: FeatureBatcher, t2d: torch.Tensor, d2t: torch.Tensor, steps: int,
                  max_chunks: int | None = None) -> list[float]:
    """Held-out top-1 agreement per draft step (fractions), over whole chunks."""
    head.eval()
    hits = np.zeros(steps)
    counts = np.zeros(steps)
    for batch in batcher.iterate_all(0, max_chunks):
        _, stats = ttt_loss(head, batch, t2d, d2t, steps)
        for s, (h, c) in enumerate(stats):
            hits[s] += h
            counts[s] += c
    head.train()
    return [float(h / c) if c else float("nan") for h, c in zip(hits, counts)]


def _loaded_target(config: TrainConfig, loaded):
    if loaded is None:
        from specloop.realmodels.loading import load_model
        loaded = load_model(config.target, dtype="float32")
    return loaded


def _eagle_data(config: TrainConfig, loaded, target_cfg, parts) -> dict:
    """The training data: a stream recording (``config.recordings``, `recording_data`;
    ``loaded`` is the target) or the feature cache (``parts`` = (train parts, val
    part) from `open_training_parts`). Returns ``counts`` (float64 [V] token counts for the reduced
    vocabulary), ``val_top1`` (held-out target top-1 ids), ``batcher`` (``sample()``
    -> `Batch`, ``positions``), ``val_batcher`` (``iterate_all``), ``feature_dtype``
    and ``note`` (the recording's `recording_data.recording_note`, or None)."""
    if config.recordings:
        from specloop.realmodels.training.recording_data import open_recording_splits
        train, val, note = open_recording_splits(config.recordings, config.target, loaded.model, config.kind,
                                                 positions=config.recording_positions,
                                                 soft_targets=config.recording_soft_targets)
        dtypes = sorted({r["dtype"] for r in note["recordings"]})
        vocab = int(target_cfg.vocab_size)
        counts = train.answer_counts(vocab) if config.vocab_from_answers else train.vocab_counts(vocab)
        return {"counts": counts, "val_top1": val.top1_labels(),
                "batcher": train.window_sampler(config.window, config.batch_size, seed=config.seed),
                "val_batcher": val, "feature_dtype": ",".join(dtypes), "note": note}
    train_parts, val_part = parts
    probe = EagleConfig.from_target(target_cfg, config.kind, 1)
    layers = tuple(sorted(set(probe.feature_layers) | {-1}))
    counts = vocab_counts(train_parts, int(target_cfg.vocab_size))
    corpus_ids = Path(train_parts[0].folder).parent / "corpus" / "train_ids.npy"
    if corpus_ids.is_file():  # the whole corpus's token counts, even before its features exist
        counts += np.bincount(np.load(corpus_ids), minlength=counts.size)[: counts.size]
    return {"counts": counts, "val_top1": np.asarray(val_part.array("topk_ids")[: val_part.n_done, :, 0]),
            "batcher": FeatureBatcher(train_parts, layers, config.window, config.batch_size, seed=config.seed),
            "val_batcher": FeatureBatcher([val_part], layers, int(val_part.meta["chunk_len"]), 1, seed=0),
            "feature_dtype": train_parts[0].meta.get("dtype", "float32"), "note": None}


def _target_tensors(config: TrainConfig, loaded):
    loaded = _loaded_target(config, loaded)
    model = loaded.model
    embed = model.get_input_embeddings().weight.detach().float()
    lm = model.get_output_embeddings().weight.detach().float()
    return model.config, embed, lm


def _new_vocab(config, counts, val_top1, target_cfg) -> ReducedVocab:
    """The reduced vocabulary of this run's data: ``draft_vocab_size`` tokens, or the
    95 %-coverage size (`choose_vocab_size`); EOS always in."""
    size = config.draft_vocab_size or choose_vocab_size(counts, val_top1)
    eos = getattr(target_cfg, "eos_token_id", None)
    return build_reduced_vocab(counts, size, always=(int(eos),) if isinstance(eos, int) else ())


def _train_steps(config: TrainConfig, head: EagleHead, vocab: ReducedVocab, batcher, clock, progress: bool):
    """The ``steps`` run: random windows, AdamW; returns (decayed per-step top-1 hits,
    their counts, the last step index)."""
    from tqdm.auto import tqdm
    params = head.trainable()
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    bar = tqdm(range(config.steps), desc=f"train {config.kind}", disable=not progress)
    hits = np.zeros(config.ttt_steps)
    seen = np.zeros(config.ttt_steps)
    step = 0
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, config.steps, config.lr, warmup=min(config.warmup, config.steps // 10 + 1),
                                    progress=None if config.time_limit_s is None else clock() / config.time_limit_s)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16_autocast):
            loss, stats = ttt_loss(head, batcher.sample(), vocab.t2d, vocab.d2t, config.ttt_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hits = 0.98 * hits + np.array([h for h, _ in stats])
        seen = 0.98 * seen + np.array([c for _, c in stats])
        if step % 10 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=f"{hits[0] / max(seen[0], 1):.3f}",
                            cached=batcher.positions)
        if config.time_limit_s is not None and clock() > config.time_limit_s:
            break
    bar.close()
    return hits, seen, step


def _train_epochs(config: TrainConfig, head: EagleHead, vocab: ReducedVocab, data: dict, loaded, init_meta: dict,
                  progress: bool) -> dict:
    """The resumable epoch run (`epoch_loop`): windows tiling the training prompts;
    when finished, the head is saved with the epoch report (`epoch_loop.REPORT_NAME`:
    train / held-out / eval top-1 per TTT step, vocabulary coverage), else only the
    checkpoint and a progress report."""
    from specloop.realmodels.training.epoch_loop import (CHECKPOINT_NAME, EpochPlan, epoch_report,
                                                         epoch_signature, pieces_of, write_train_report)
    train, val = data["batcher"].split, data["val_batcher"]
    folder = Path(config.out_dir) if config.out_dir else draft_dir(config.target, config.kind)
    rows = train.epoch_windows(config.window)
    plan = EpochPlan(len(rows), config.batch_size, config.epochs, config.seed)

    def step_fn(idx):
        loss, stats = ttt_loss(head, train.window_batch(rows[idx], config.window), vocab.t2d, vocab.d2t,
                               config.ttt_steps)
        return loss, {"top1": stats[0][0] / max(stats[0][1], 1)}

    from specloop.realmodels.training.epoch_loop import run_epochs
    loop = run_epochs(head, head.trainable(), step_fn, plan, lr=config.lr,
                      warmup=min(config.warmup, plan.total_steps // 10 + 1), checkpoint=folder / CHECKPOINT_NAME,
                      signature=epoch_signature(config, head.config.to_dict()), pieces=pieces_of(config),
                      weight_decay=config.weight_decay, autocast=config.bf16_autocast, progress=progress,
                      desc=f"train {config.kind}")
    report = {**epoch_report(loop, plan, train.positions, config.kind), "target": config.target,
              "draft_vocab_size": vocab.size, "train_config": config.to_dict()}
    if not loop["complete"]:
        write_train_report(folder, report)
        return {**report, "path": str(folder)}
    limit = 8 if config.quick else None      # training prompts measured: as many as held out
    train_limit = limit or max(1, sum(1 for _ in _val_prompts(val)))
    report["train_top1_per_step"] = evaluate_head(head, train, vocab.t2d, vocab.d2t, config.ttt_steps, train_limit)
    report["heldout_top1_per_step"] = evaluate_head(head, val, vocab.t2d, vocab.d2t, config.ttt_steps, limit)
    report["heldout_top1"] = report["heldout_top1_per_step"][0]
    report["vocab_coverage_heldout_top1"] = vocab.coverage(data["val_top1"])
    report.update(_eval_recordings(config, loaded, lambda split: evaluate_head(
        head, split, vocab.t2d, vocab.d2t, config.ttt_steps), vocab))
    report["train_config"]["recording_data"] = data["note"]
    report["train_seconds"], report["optimizer_steps"] = report["seconds"], report["steps"]
    report["positions_seen"] = report["positions_trained"]
    for key in ("train_seconds", "positions_seen", "optimizer_steps"):
        report[f"{key}_total"] = report[key] + type(report[key])(init_meta.get(f"{key}_total", init_meta.get(key, 0)))
    tensors = {**head.state_for_saving(), "d2t": vocab.d2t}
    save_draft(tensors, {"config": head.config.to_dict(), **report}, config.target, config.kind, folder)
    write_train_report(folder, {**report, "path": str(folder)})
    return {**report, "path": str(folder)}


def _val_prompts(split):
    """The prompts `RecordingSplit.iterate_all` visits (first positions; no feature read)."""
    want = split.name == "val"
    for shard in split.shards:
        for a, b in zip(shard.starts, shard.stops):
            if shard.is_val[a] == want and shard.labelled[a:b].any():
                yield a


def _eval_recordings(config: TrainConfig, loaded, per_step, vocab: ReducedVocab) -> dict:
    """``eval_top1_per_step`` (``per_step(split)`` on every prompt of
    ``config.eval_recordings``), ``eval_positions`` and ``eval_vocab_coverage`` (share of
    their greedy answer tokens inside the reduced vocabulary); {} without them."""
    if not config.eval_recordings:
        return {}
    from specloop.realmodels.training.recording_data import open_eval_split
    split = open_eval_split(config.eval_recordings, config.target, loaded.model, config.kind,
                            positions="continuation")
    return {"eval_top1_per_step": per_step(split), "eval_positions": split.positions,
            "eval_vocab_coverage": vocab.coverage(split.top1_labels()),
            "eval_recordings": [str(Path(r).resolve()) for r in config.eval_recordings]}


def train_eagle(config: TrainConfig, *, loaded=None, progress: bool = True) -> dict:
    """Train an EAGLE (``config.kind == "eagle"``) or EAGLE-3 head and save it.

    Args:
        config: `TrainConfig`.
        loaded: the target `LoadedModel` (loaded from ``config.target`` if None).
        progress: tqdm bars.

    Returns:
        The report dict saved in ``draft.json`` (held-out top-1 per step, training
        positions seen, distinct cached positions, seconds, vocabulary size and
        coverage, path); with ``config.epochs`` the epoch report (`_train_epochs`).
    """
    if config.kind not in ("eagle", "eagle3"):
        raise ValueError(f"train_eagle trains kinds 'eagle' and 'eagle3', got {config.kind!r}")
    torch.manual_seed(config.seed)
    clock = Stopwatch()
    parts = None
    if config.recordings:
        loaded = _loaded_target(config, loaded)
    else:   # the cache first (it may extract with a config.dtype target), as before
        parts = open_training_parts(config, loaded, progress)
    target_cfg, embed, lm = _target_tensors(config, loaded)
    data = _eagle_data(config, loaded, target_cfg, parts)
    counts, val_top1, batcher, val_batcher = data["counts"], data["val_top1"], data["batcher"], data["val_batcher"]
    init, init_meta = None, {}
    if config.init_from:
        from specloop.realmodels.heads.common import load_draft
        init, init_meta = load_draft(config.target, config.kind, config.init_from)
        saved = ReducedVocab(init.pop("d2t").long(), int(target_cfg.vocab_size))
        vocab = _new_vocab(config, counts, val_top1, target_cfg) if config.revocab else saved
    else:
        saved, vocab = None, _new_vocab(config, counts, val_top1, target_cfg)
    head_cfg = EagleConfig.from_target(target_cfg, config.kind, vocab.size, arch=config.arch)
    head = build_eagle_head(head_cfg, embed, lm[vocab.d2t])
    if init is not None:
        saved_arch = (init_meta.get("config") or {}).get("arch", "specloop")
        if saved_arch != config.arch:
            raise ValueError(f"--init-from holds an eagle3 head of arch {saved_arch!r}, not {config.arch!r} "
                             f"(pass --arch {saved_arch})")
        if vocab is not saved:       # --revocab: the same remap as the other kinds (head_data)
            init = remap_state_vocab(init, head.state_dict(), saved, vocab)
        head.load_state_dict(init, strict=True)
    t2d = vocab.t2d
    if config.epochs:
        return _train_epochs(config, head, vocab, data, loaded, init_meta, progress)
    hits, seen, step = _train_steps(config, head, vocab, batcher, clock, progress)
    train_seconds = clock()
    eval_chunks = 8 if config.quick else None
    heldout = evaluate_head(head, val_batcher, t2d, vocab.d2t, config.ttt_steps, eval_chunks)
    report = {
        "config": head_cfg.to_dict(),
        "train_config": config.to_dict(),
        "heldout_top1": heldout[0],
        "heldout_top1_per_step": heldout,
        "train_top1_per_step": [float(h / max(c, 1)) for h, c in zip(hits, seen)],
        "optimizer_steps": step + 1,
        "positions_seen": int((step + 1) * config.batch_size * (config.window - 1)),
        "cached_positions": int(batcher.positions),
        "train_seconds": float(train_seconds),
        "draft_vocab_size": vocab.size,
        "vocab_coverage_heldout_top1": vocab.coverage(val_top1),
        "feature_dtype": data["feature_dtype"],
    }
    if data.get("note") is not None:
        report["train_config"]["recording_data"] = data["note"]
    # totals over a continued run (init_from) and the runs before it
    report["train_seconds_total"] = report["train_seconds"] + float(
        init_meta.get("train_seconds_total", init_meta.get("train_seconds", 0.0)))
    report["positions_seen_total"] = report["positions_seen"] + int(
        init_meta.get("positions_seen_total", init_meta.get("positions_seen", 0)))
    report["optimizer_steps_total"] = report["optimizer_steps"] + int(
        init_meta.get("optimizer_steps_total", init_meta.get("optimizer_steps", 0)))
    tensors = {**head.state_for_saving(), "d2t": vocab.d2t}
    folder = save_draft(tensors, report, config.target, config.kind,
                        Path(config.out_dir) if config.out_dir else None)
    report["path"] = str(folder)
    return report


register_trainer("eagle", train_eagle)
register_trainer("eagle3", train_eagle)
