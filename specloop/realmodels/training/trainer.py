"""Shared training utilities for draft heads and the trainer registry.

``register_trainer(kind, fn)`` maps a draft kind (``eagle``, ``eagle3``, ``medusa``,
``hydra``, ``small-lm``) to ``fn(config: TrainConfig, *, loaded=None, progress=True)
-> dict`` (the report: held-out top-1, data size, seconds, path). ``specloop draft
train`` dispatches through it; modules that define trainers are imported lazily by
`get_trainer` (``specloop.realmodels.training.train_<kind>``).

Data: `FeatureBatcher` samples random windows of the cached teacher-forced chunks
(`specloop.realmodels.training.features`), re-reading how many chunks are complete
so training can start while extraction still runs. Loss helpers implement the
distillation objective against the target's cached top-K distribution restricted to
the draft's reduced vocabulary.
"""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

__all__ = ["TrainConfig", "register_trainer", "get_trainer", "trainer_kinds", "FeatureBatcher",
           "Batch", "topk_soft_ce", "top1_agreement", "cosine_lr", "vocab_counts", "TRAINER_MODULES"]

_TRAINERS: dict[str, Callable[..., dict]] = {}

#: kind -> module that registers its trainer on import
TRAINER_MODULES = {
    "eagle": "specloop.realmodels.training.train_eagle",
    "eagle3": "specloop.realmodels.training.train_eagle",
    "medusa": "specloop.realmodels.training.train_medusa",
    "hydra": "specloop.realmodels.training.train_hydra",
    "small-lm": "specloop.realmodels.training.train_small_lm",
}


@dataclass
class TrainConfig:
    """Offline (warm-up) training settings shared by every draft kind.

    Attributes:
        target: target model name (registry name / path), also the cache folder name.
        kind: draft kind.
        tokens: corpus training-token budget (tokens) for the feature cache.
        steps: optimizer steps.
        batch_size: windows per step.
        window: positions per window (tokens).
        lr: peak learning rate (AdamW, linear warm-up then cosine decay).
        weight_decay: AdamW weight decay.
        ttt_steps: draft steps unrolled in training (multi-step / training-time test).
        draft_vocab_size: V_draft of the reduced vocabulary (0 = choose for 95 %
            coverage of the target's top-1, capped at 8192).
        time_limit_s: stop (and save) after this many seconds (None = no limit).
        seed: data-sampling and init seed.
        quick: a small, fast run (tests, ``--quick``).
        feature_root: feature-cache root (None = the default cache).
        out_dir: where to save the draft (None = the default draft cache).
        dtype: target dtype used to extract features when the cache is missing.
        bf16_autocast: run the training forward/backward under bfloat16 autocast
            (float32 master weights and optimizer; about 2x faster on CPUs with
            AVX512-BF16). Evaluation and drafting stay float32.
        warmup: learning-rate warm-up steps.
        init_from: folder of a saved draft of the same kind to continue training from
            (its reduced vocabulary is kept unless ``revocab``); None = fresh initialisation.
        revocab: with ``init_from``: rebuild the reduced vocabulary from this run's
            training data (``draft_vocab_size``, 0 = the 95 % coverage rule) instead of
            keeping the saved one; the saved LM-head rows of tokens in both vocabularies
            are kept, new tokens start from the target's rows
            (`head_data.remap_vocab_rows`).
        corpus_mix: warm-up corpus source weights (`corpus.parse_mix`; None = the
            default `corpus.DEFAULT_MIX`). A non-default mix gets its own feature
            cache (`features.training_features_root`), e.g. to train a draft that
            has never seen the stream's domains.
        recordings: stream-recording folders to train on instead of the feature cache
            (`recording_data`: the target's own greedy answers, features read from the
            recording, no target forward); empty = the feature cache.
        recording_positions: "continuation" (label positions whose next token is a
            greedy answer token) or "all" (prompt positions too).
        recording_soft_targets: label = the recorded top-m p_target instead of the
            greedy token.
        epochs: > 0: train ``epochs`` passes over the recordings' items in resumable
            pieces (`epoch_loop`; ``steps`` and ``time_limit_s`` do not apply); 0: the
            ``steps`` run. EAGLE / EAGLE-3 / Medusa / Hydra, recordings only.
        checkpoint_every_steps / checkpoint_every_minutes: an epoch run's piece length
            (whichever comes first; 0 = not by that measure).
        budget_minutes: an epoch run stops at the piece boundary before this many
            minutes of training in this process (checkpoint written; rerun to resume).
        eval_recordings: recordings of held-out prompts (every prompt evaluated, none
            trained on): per-step top-1 and reduced-vocabulary coverage in the report.
        vocab_from_answers: choose the reduced vocabulary from the counts of the
            target's greedy answer tokens of the training prompts (the answer sets'
            own target tokens) instead of prompt tokens + labels.
        arch: EAGLE-3 layer, "specloop" (default) or "published" (EAGLE-3's own layer,
            exportable in the published layout; `specloop.realmodels.heads.eagle3_arch`);
            kind "eagle3" only. Left out of `to_dict` when "specloop", so reports and
            resume signatures written before the option read the same.
    """

    target: str = "smollm2-135m"
    kind: str = "eagle"
    tokens: int = 1_200_000
    steps: int = 3000
    batch_size: int = 8
    window: int = 128
    lr: float = 3e-4
    weight_decay: float = 0.0
    ttt_steps: int = 3
    draft_vocab_size: int = 0
    time_limit_s: float | None = None
    seed: int = 0
    quick: bool = False
    feature_root: str | None = None
    out_dir: str | None = None
    dtype: str = "bfloat16"
    bf16_autocast: bool = True
    warmup: int = 100
    init_from: str | None = None
    corpus_mix: dict[str, float] | None = None
    recordings: tuple[str, ...] = ()
    recording_positions: str = "continuation"
    recording_soft_targets: bool = False
    revocab: bool = False
    epochs: int = 0
    checkpoint_every_steps: int = 0
    checkpoint_every_minutes: float = 10.0
    budget_minutes: float | None = None
    eval_recordings: tuple[str, ...] = ()
    vocab_from_answers: bool = False
    arch: str = "specloop"

    def __post_init__(self) -> None:
        if self.arch not in ("specloop", "published"):
            raise ValueError(f"TrainConfig.arch must be 'specloop' or 'published', got {self.arch!r}")
        if self.arch != "specloop" and self.kind != "eagle3":
            raise ValueError(f"TrainConfig.arch {self.arch!r} is an EAGLE-3 layer: it needs kind 'eagle3', "
                             f"not {self.kind!r}")
        if self.revocab and not self.init_from:
            raise ValueError("TrainConfig.revocab needs init_from (a saved draft to continue)")
        self.recordings = tuple(str(r) for r in (self.recordings or ()))
        self.eval_recordings = tuple(str(r) for r in (self.eval_recordings or ()))
        self._check_epochs()
        if self.recording_positions not in ("continuation", "all"):
            raise ValueError(f"TrainConfig.recording_positions must be 'continuation' or 'all', "
                             f"got {self.recording_positions!r}")
        for name in ("tokens", "steps", "batch_size", "ttt_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.window < 3:
            raise ValueError(f"TrainConfig.window must be >= 3 tokens, got {self.window}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"TrainConfig.lr must be a positive finite number, got {self.lr}")
        if self.corpus_mix is not None:
            from specloop.realmodels.training.corpus import check_mix
            check_mix(self.corpus_mix)
        if self.draft_vocab_size < 0:
            raise ValueError(f"TrainConfig.draft_vocab_size must be >= 0, got {self.draft_vocab_size}")

    def _check_epochs(self) -> None:
        if self.epochs < 0:
            raise ValueError(f"TrainConfig.epochs must be >= 0, got {self.epochs}")
        if not self.epochs:
            if self.budget_minutes is not None:
                raise ValueError("TrainConfig.budget_minutes needs epochs (a resumable epoch run)")
            return
        if not self.recordings:
            raise ValueError("TrainConfig.epochs trains on recordings (--from-answers / --from-recording)")
        if self.kind not in ("eagle", "eagle3", "medusa", "hydra"):
            raise ValueError(f"an epoch run trains eagle, eagle3, medusa or hydra, not {self.kind!r}")
        if self.time_limit_s is not None:
            raise ValueError("an epoch run stops by budget_minutes (--budget-minutes), not time_limit_s")
        from specloop.realmodels.training.epoch_loop import PieceSettings
        PieceSettings(self.checkpoint_every_steps, self.checkpoint_every_minutes, self.budget_minutes)

    def to_dict(self) -> dict:
        """The fields as a dict; ``arch`` only when not "specloop"."""
        out = asdict(self)
        if out["arch"] == "specloop":
            del out["arch"]
        return out


def register_trainer(kind: str, fn: Callable[..., dict], *, overwrite: bool = False) -> None:
    """Register ``fn(config, *, loaded=None, progress=True) -> report`` for ``kind``.

    Raises:
        ValueError: empty kind, or kind taken and not ``overwrite``.
    """
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError("trainer kind must be a non-empty string")
    if kind in _TRAINERS and not overwrite and _TRAINERS[kind] is not fn:
        raise ValueError(f"a trainer for {kind!r} is already registered")
    _TRAINERS[kind] = fn


def get_trainer(kind: str) -> Callable[..., dict]:
    """The trainer for ``kind`` (importing its module on first use).

    Raises:
        ValueError: no trainer for that kind.
    """
    if kind not in _TRAINERS and kind in TRAINER_MODULES:
        try:
            importlib.import_module(TRAINER_MODULES[kind])
        except ModuleNotFoundError as exc:
            raise ValueError(f"the trainer module for {kind!r} is not available: {exc}") from exc
    if kind not in _TRAINERS:
        raise ValueError(f"no trainer registered for draft kind {kind!r}; known: {trainer_kinds()}")
    return _TRAINERS[kind]


def trainer_kinds() -> list[str]:
    """Known draft kinds (registered or importable)."""
    return sorted(set(_TRAINERS) | set(TRAINER_MODULES))


@dataclass
class Batch:
    """Windows of teacher-forced positions (T = window - 1 positions each).

    Attributes:
        features: dict layer -> float32 [B, T+1, H] target hidden states at positions
            0..T (position T is the regression target of position T-1).
        tokens: int64 [B, T+1] token ids x_0..x_T.
        topk_ids: int64 [B, T+1, K] target top-K next-token ids per position.
        topk_probs: float32 [B, T+1, K] their probabilities.
        valid: bool [B, T+1] positions whose label counts (None = all; a recording's
            windows mask padding and unlabelled positions, `recording_data`).
    """

    features: dict[int, torch.Tensor]
    tokens: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    valid: torch.Tensor | None = None


class FeatureBatcher:
    """Random windows from one or more feature-cache parts (weighted by size).

    Args:
        parts: `FeaturePart` s to sample from (chunks not yet extracted are skipped;
            the count is re-read every ``refresh`` batches).
        layers: hidden-state layers to load.
        window: tokens per window (<= chunk_len).
        batch_size: windows per batch.
        seed: sampling seed (np.random.Generator).
        max_chunks: use at most this many chunks of each part (None = all done).

    Raises:
        ValueError: no part has any finished chunk, or window > chunk_len.
    """

    def __init__(self, parts, layers: tuple[int, ...], window: int, batch_size: int, seed: int = 0,
                 max_chunks: int | None = None, refresh: int = 50) -> None:
        self.parts, self.layers, self.window, self.batch_size = list(parts), tuple(layers), window, batch_size
        self.rng = np.random.default_rng(seed)
        self.max_chunks, self.refresh, self._calls = max_chunks, refresh, 0
        for part in self.parts:
            if window > int(part.meta["chunk_len"]):
                raise ValueError(f"window {window} > chunk_len {part.meta['chunk_len']} of {part.folder}")
        self._maps = [({l: p.hidden(l) for l in self.layers}, p.array("tokens"), p.array("topk_ids"),
                       p.array("topk_probs")) for p in self.parts]
        self._update_counts()

    def _update_counts(self) -> None:
        done = [p.n_done for p in self.parts]
        if self.max_chunks is not None:
            done = [min(d, self.max_chunks) for d in done]
        if sum(done) == 0:
            raise ValueError("the feature cache has no finished chunk yet")
        self.done = done

    @property
    def positions(self) -> int:
        """Teacher-forced positions available now (tokens)."""
        return sum(d * int(p.meta["chunk_len"]) for d, p in zip(self.done, self.parts))

    def sample(self) -> Batch:
        self._calls += 1
        if self._calls % self.refresh == 0:
            self._update_counts()
        weights = np.asarray(self.done, dtype=np.float64)
        which = self.rng.choice(len(self.parts), size=self.batch_size, p=weights / weights.sum())
        rows = []
        for j in which:
            hid, tok, tid, tpr = self._maps[j]
            c = int(self.rng.integers(self.done[j]))
            s = int(self.rng.integers(tok.shape[1] - self.window + 1))
            sl = slice(s, s + self.window)
            rows.append(({l: np.asarray(h[c, sl], dtype=np.float32) for l, h in hid.items()},
                         np.asarray(tok[c, sl]), np.asarray(tid[c, sl]), np.asarray(tpr[c, sl], dtype=np.float32)))
        return Batch({l: torch.from_numpy(np.stack([r[0][l] for r in rows])) for l in self.layers},
                     torch.from_numpy(np.stack([r[1] for r in rows])).long(),
                     torch.from_numpy(np.stack([r[2] for r in rows])).long(),
                     torch.from_numpy(np.stack([r[3] for r in rows])))

    def iterate_all(self, part_index: int = 0, limit: int | None = None):
        """Deterministic pass over whole chunks of one part (evaluation): yields a
        `Batch` of one full chunk at a time."""
        hid, tok, tid, tpr = self._maps[part_index]
        n = self.done[part_index] if limit is None else min(limit, self.done[part_index])
        for c in range(n):
            yield Batch({l: torch.from_numpy(np.asarray(h[c:c + 1], dtype=np.float32)) for l, h in hid.items()},
                        torch.from_numpy(np.array(tok[c:c + 1])).long(),
                        torch.from_numpy(np.array(tid[c:c + 1])).long(),
                        torch.from_numpy(np.asarray(tpr[c:c + 1], dtype=np.float32)))


def topk_soft_ce(logits: torch.Tensor, topk_draft: torch.Tensor, topk_probs: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of draft logits against the target's top-K distribution,
    restricted to the reduced vocabulary: -sum_k p_k [k in V_draft] log q(k), averaged
    over masked-in positions.

    Args:
        logits: [B, T, V_draft] draft logits.
        topk_draft: int [B, T, K] the target's top-K ids as draft indices (-1 = not in
            the draft vocabulary).
        topk_probs: float [B, T, K] the target's probabilities of those ids.
        mask: bool [B, T] positions that count.
    """
    logq = torch.log_softmax(logits.float(), -1)
    inside = topk_draft >= 0
    picked = torch.gather(logq, -1, topk_draft.clamp(min=0))
    per_pos = -(picked * topk_probs * inside).sum(-1)
    m = mask.float()
    return (per_pos * m).sum() / m.sum().clamp(min=1.0)


def top1_agreement(logits: torch.Tensor, d2t: torch.Tensor, target_top1: torch.Tensor,
                   mask: torch.Tensor) -> tuple[int, int]:
    """(matches, count): draft argmax (mapped to target ids) == the target's argmax."""
    pred = d2t.to(logits.device)[logits.argmax(-1)]
    hit = (pred == target_top1) & mask
    return int(hit.sum()), int(mask.sum())


def cosine_lr(step: int, total: int, peak: float, warmup: int = 100, progress: float | None = None) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then cosine decay to 10 %.

    ``progress`` (0..1), when given and larger, overrides the step fraction — a
    time-limited run passes elapsed / time_limit so its schedule still ends decayed.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    if progress is not None:
        frac = min(1.0, max(frac, progress))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def vocab_counts(parts, vocab_size: int, max_chunks: int | None = None) -> np.ndarray:
    """Frequency of each target id over the cached chunks: corpus tokens plus the
    target's top-1 predictions (float64 [V_target])."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for part in parts:
        n = part.n_done if max_chunks is None else min(part.n_done, max_chunks)
        if n == 0:
            continue
        counts += np.bincount(np.asarray(part.array("tokens")[:n]).reshape(-1), minlength=vocab_size)[:vocab_size]
        top1 = np.asarray(part.array("topk_ids")[:n, :, 0]).reshape(-1)
        counts += np.bincount(top1, minlength=vocab_size)[:vocab_size]
    return counts


class Stopwatch:
    """Wall-clock seconds since construction."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0
