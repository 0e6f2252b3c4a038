"""Draft-head training data read from a stream recording: the target's own greedy answers.

A stream recording (`specloop.realmodels.recording`) already holds, at every
position of every prompt, the features the heads read (``hidden_<layer>``, float16)
and the target's top-m next-token distribution, and its continuation tokens are the
target's own greedy answers. Training on them is self-distillation -- the data
Medusa-2 (Cai et al. 2024, Sec. 2.3.2), EAGLE (Li et al. 2024) and HASS / EAGLE-3
(Li et al. 2025) report as much better than fixed text -- and needs no target forward.

Positions and labels (the feature-cache convention, `features`): at position j of a
prompt of L templated tokens occupying recording positions [a, b) the recording has
x_j, the features of x_j and p_target(. | x_<=j), the distribution of x_{j+1}.

* A *label position* j carries the target's prediction of x_{j+1}. ``positions =
  "continuation"`` (default) keeps j in [a + L - 1, b - 2]: every x_{j+1} is one of the
  target's own greedy tokens (the last recorded position, whose next token was never
  fed, is dropped). ``"all"`` keeps j in [a, b - 2] (prompt positions too).
* Hard labels (default): the target's greedy next token, i.e. the recorded x_{j+1} at
  continuation positions (``tokens[j + 1]``) and the recorded top-1 (``topm_ids[j, 0]``)
  at prompt positions; as a one-token distribution of probability 1, so every
  trainer's existing distillation loss becomes cross-entropy on it. Soft labels
  (``soft_targets``): the recorded top-m ids and p_target (float16 -> float32).
* Windows (EAGLE / EAGLE-3 / small LM) and anchors (Medusa / Hydra) never cross a
  prompt boundary: each prompt was its own context when recorded. A window that would
  run past its prompt is right-padded; padded and unlabelled positions are masked out
  of losses and metrics (`trainer.Batch.valid`; zero label weight for `distill_loss`).
* Validation: prompts whose stream index is a multiple of `VAL_EVERY` (deterministic,
  every domain of a domain-ordered stream represented) never enter training.

Only the shards listed in ``manifest.json`` are read (a recording still being written
can be trained on), each memory-mapped in place (`npz_memmaps`; shards are uncompressed
zips), never written.
"""
from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["POSITION_MODES", "VAL_EVERY", "npz_memmaps", "head_layers", "check_recording", "RecordingSplit",
           "open_recording_splits", "open_eval_split", "recording_note"]

POSITION_MODES = ("continuation", "all")
VAL_EVERY = 10                 # prompts with stream_index % VAL_EVERY == 0 are held out
_SMALL = ("tokens", "offsets", "prompt_lengths", "stream_index")


def npz_memmaps(path: str | Path, names) -> dict[str, np.ndarray]:
    """Read-only memmaps of members of an uncompressed ``.npz`` (no copy into memory).

    Args:
        path: the ``.npz`` file. names: member names without ``.npy``.

    Returns:
        name -> numpy memmap with the member's dtype and shape.

    Raises:
        KeyError: a member is missing. ValueError: a member is compressed.
    """
    path, out = Path(path), {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as fh:
        for name in names:
            info = archive.getinfo(f"{name}.npy")
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{path}: member {name} is compressed; cannot memory-map it")
            fh.seek(info.header_offset)
            local = fh.read(30)                          # ZIP local file header
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            fh.seek(info.header_offset + 30 + name_len + extra_len)
            version = np.lib.format.read_magic(fh)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(fh)
            out[name] = np.memmap(path, dtype=dtype, mode="r", offset=fh.tell(), shape=shape,
                                  order="F" if fortran else "C")
    return out


def _norm_layer(layer: int, num_layers: int) -> int:
    return -1 if int(layer) in (-1, num_layers) else int(layer)


def head_layers(kind: str, target_config) -> tuple[int, ...]:
    """``hidden_states`` indices a draft of ``kind`` reads (-1 = last layer): EAGLE-3's
    three fused layers (and the last, for its feature bookkeeping), the last layer for
    EAGLE / Medusa / Hydra, none for a small LM (tokens only)."""
    from specloop.realmodels.heads.eagle import EagleConfig
    n = int(target_config.num_hidden_layers)
    if kind in ("eagle", "eagle3"):
        wanted = set(EagleConfig.from_target(target_config, kind, 1).feature_layers) | {-1}
    elif kind in ("medusa", "hydra"):
        wanted = {-1}
    elif kind == "small-lm":
        wanted = set()
    else:
        raise ValueError(f"no recording layout for draft kind {kind!r}")
    return tuple(sorted({_norm_layer(x, n) for x in wanted}, key=lambda x: (x == -1, x)))


def check_recording(recording, target_name: str, target_model, kind: str) -> None:
    """Refuse a recording the head cannot train on.

    Raises:
        ValueError: recorded by another target (name, vocabulary, width or depth), or
            missing a ``hidden_states`` layer ``kind`` reads, or no shard written yet.
    """
    settings, info = recording.settings, recording.manifest.get("model", {})
    where = recording.folder
    if settings.get("target") != target_name:
        raise ValueError(f"{where} was recorded with target {settings.get('target')!r}, "
                         f"not {target_name!r}; record the warm-up split with this target")
    config = target_model.config
    vocab = int(target_model.get_output_embeddings().weight.shape[0])
    mine = {"vocab_size": vocab, "hidden_size": int(config.hidden_size),
            "num_hidden_layers": int(config.num_hidden_layers)}
    differ = {k: (info.get(k), v) for k, v in mine.items() if info.get(k) != v}
    if differ:
        text = ", ".join(f"{k} recorded {a}, target {b}" for k, (a, b) in differ.items())
        raise ValueError(f"{where} was recorded by another model than target {target_name!r} ({text})")
    n = int(config.num_hidden_layers)
    have = {_norm_layer(x, n) for x in recording.layers}
    missing = [x for x in head_layers(kind, config) if x not in have]
    if missing:
        raise ValueError(f"{where} lacks hidden_states layer(s) {missing} that a {kind} draft reads "
                         f"(recorded: {sorted(have)})")
    if not recording.manifest.get("shards"):
        raise ValueError(f"{where} has no finished shard yet")


@dataclass
class _Shard:
    """One recorded shard: small arrays in memory, big ones memory-mapped."""

    tokens: np.ndarray            # int32 (N,)
    hidden: dict                  # layer -> float16 memmap (N, H)
    topm_ids: np.ndarray          # int32 memmap (N, m)
    topm_probs: np.ndarray        # float16 memmap (N, m)
    hard: np.ndarray              # int64 (N,): the target's greedy next token (see module docstring)
    starts: np.ndarray            # int64 (P,): first position of each prompt
    stops: np.ndarray             # int64 (P,)
    labelled: np.ndarray          # bool (N,): label positions of the chosen mode, both splits
    is_val: np.ndarray            # bool (N,): position of a held-out prompt
    answer_starts: np.ndarray     # int64 (P,): first greedy answer position of each prompt (a + L)


def _open_shard(folder: Path, entry: dict, layers, positions: str) -> _Shard:
    path = folder / entry["file"]
    with np.load(path, allow_pickle=False) as data:
        small = {k: np.asarray(data[k]) for k in _SMALL}
    maps = npz_memmaps(path, ["topm_ids", "topm_probs"] + [_layer_key(x) for x in layers])
    offsets, lengths = small["offsets"].astype(np.int64), small["prompt_lengths"].astype(np.int64)
    starts, stops, n = offsets[:-1], offsets[1:], int(offsets[-1])
    tokens = small["tokens"]
    hard = np.asarray(maps["topm_ids"][:, 0], dtype=np.int64)
    labelled, is_val = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for a, b, length, index in zip(starts, stops, lengths, small["stream_index"]):
        cont = a + length - 1                           # first position predicting a greedy token
        hard[cont:b - 1] = tokens[cont + 1:b]           # the recorded greedy tokens themselves
        labelled[(cont if positions == "continuation" else a):b - 1] = True
        is_val[a:b] = int(index) % VAL_EVERY == 0
    return _Shard(tokens, {x: maps[_layer_key(x)] for x in layers}, maps["topm_ids"], maps["topm_probs"],
                  hard, starts, stops, labelled, is_val, starts + lengths)


def _layer_key(layer: int) -> str:
    from specloop.realmodels.recording import layer_name
    return layer_name(layer)


class RecordingSplit:
    """The training or the held-out prompts of one or more recordings, as the
    trainers read them (see the module docstring for positions and labels).

    Attributes:
        name: "train" or "val". layers: hidden-state layers loaded (-1 = last).
        soft_targets: labels are the recorded top-m (else the greedy token).
        top_m: label width K (1 for hard labels).
        positions: number of label positions in this split.
    """

    def __init__(self, shards: list[_Shard], name: str, layers, soft_targets: bool, top_m: int):
        self.shards, self.name, self.layers = shards, name, tuple(layers)
        self.soft_targets, self.top_m = bool(soft_targets), int(top_m) if soft_targets else 1
        want_val = name == "val"
        self._label_pos = [np.flatnonzero(s.labelled & (s.is_val == want_val)) for s in shards]
        self.positions = int(sum(p.size for p in self._label_pos))
        self.max_tokens_seen = self.positions          # the Medusa / Hydra report's "cached" count
        if self.positions == 0:
            raise ValueError(f"the recording has no {name} label positions (prompts with stream index % "
                             f"{VAL_EVERY} == 0 are held out; record more prompts)")

    # -- labels and raw slices ---------------------------------------------------------
    def _labels(self, shard: _Shard, idx: np.ndarray):
        """(ids int64 (..., K), probs float32 (..., K), valid bool (...)) at positions idx."""
        mine = shard.labelled[idx] & (shard.is_val[idx] == (self.name == "val"))
        if self.soft_targets:
            ids = np.asarray(shard.topm_ids[idx, : self.top_m], dtype=np.int64)
            probs = np.asarray(shard.topm_probs[idx, : self.top_m], dtype=np.float32)
        else:
            ids, probs = shard.hard[idx][..., None], np.ones(idx.shape + (1,), dtype=np.float32)
        return ids, probs, mine

    def _prompt_of(self, shard: _Shard, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        which = np.searchsorted(shard.starts, pos, side="right") - 1
        return shard.starts[which], shard.stops[which]

    def _draw(self, rng: np.random.Generator, count: int, pools=None) -> list[tuple[int, np.ndarray]]:
        """``count`` positions uniform over ``pools`` (default: the label positions),
        grouped by shard: [(shard number, sorted positions)]."""
        pools = self._label_pos if pools is None else pools
        sizes = np.array([p.size for p in pools], dtype=np.float64)
        picks = np.sort(rng.integers(0, int(sizes.sum()), size=count))
        edges = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        out = []
        for k, pool in enumerate(pools):
            mine = picks[(picks >= edges[k]) & (picks < edges[k + 1])] - edges[k]
            if mine.size:
                out.append((k, pool[mine]))
        return out

    def _windows(self, starts: list[tuple[int, int, int]], width: int):
        """Padded windows (shard, start, stop) -> tokens (B, W), features {layer: (B, W, H)},
        ids (B, W, K), probs (B, W, K), valid (B, W) as numpy arrays."""
        count, k = len(starts), self.top_m
        tokens = np.zeros((count, width), dtype=np.int64)
        ids = np.zeros((count, width, k), dtype=np.int64)
        probs = np.zeros((count, width, k), dtype=np.float32)
        valid = np.zeros((count, width), dtype=bool)
        feats = {x: None for x in self.layers}
        for r, (number, s, e) in enumerate(starts):
            shard, n = self.shards[number], e - s
            idx = np.arange(s, e)
            tokens[r, :n] = shard.tokens[s:e]
            ids[r, :n], probs[r, :n], valid[r, :n] = self._labels(shard, idx)
            for x in self.layers:
                block = shard.hidden[x]
                if feats[x] is None:
                    feats[x] = np.zeros((count, width, block.shape[1]), dtype=np.float32)
                feats[x][r, :n] = block[s:e]
        return tokens, feats, ids, probs, valid

    def _window_starts(self, rng: np.random.Generator, count: int, width: int, min_lead: int):
        """Windows around uniformly drawn label positions j: start max(a, j - o), o
        uniform in [min_lead, width - 1], stop at the prompt's end."""
        out = []
        for number, pos in self._draw(rng, count):
            a, b = self._prompt_of(self.shards[number], pos)
            lead = rng.integers(min_lead, width, size=pos.size)
            s = np.maximum(a, pos - lead)
            out += [(number, int(x), int(min(y, x + width))) for x, y in zip(s, b)]
        order = rng.permutation(len(out))
        return [out[i] for i in order]

    # -- EAGLE / EAGLE-3 (trainer.Batch windows) ---------------------------------------
    def _batch(self, windows, width: int):
        from specloop.realmodels.training.trainer import Batch
        tokens, feats, ids, probs, valid = self._windows(windows, width)
        return Batch({x: torch.from_numpy(f) for x, f in feats.items()}, torch.from_numpy(tokens),
                     torch.from_numpy(ids), torch.from_numpy(probs), torch.from_numpy(valid))

    def window_sampler(self, window: int, batch_size: int, seed: int = 0) -> "_WindowSampler":
        """A `trainer.FeatureBatcher` stand-in: ``sample()`` -> `trainer.Batch` of
        ``batch_size`` windows of ``window`` positions (with ``valid``)."""
        return _WindowSampler(self, window, batch_size, seed)

    def iterate_all(self, part_index: int = 0, limit: int | None = None):
        """Deterministic evaluation pass: one `trainer.Batch` per prompt (the whole
        prompt: its prompt and continuation positions), the first ``limit`` prompts."""
        done = 0
        for number, shard in enumerate(self.shards):
            for a, b in zip(shard.starts, shard.stops):
                if shard.is_val[a] != (self.name == "val") or not shard.labelled[a:b].any():
                    continue
                if limit is not None and done >= limit:
                    return
                done += 1
                yield self._batch([(number, int(a), int(b))], int(b - a))

    # -- Medusa / Hydra (head_data.HeadBatch anchors) ----------------------------------
    def anchor_pools(self, horizon: int) -> list[np.ndarray]:
        """Anchors t whose labels t+1 .. t+horizon are all label positions of this split
        inside t's prompt."""
        pools = []
        for shard in self.shards:
            mine = (shard.labelled & (shard.is_val == (self.name == "val"))).astype(np.int64)
            cs = np.concatenate([[0], np.cumsum(mine)])
            t = np.arange(max(0, mine.size - horizon))
            ok = cs[t + horizon + 1] - cs[t + 1] == horizon
            first = np.zeros(mine.size + 1, dtype=bool)
            first[shard.starts] = True
            pools.append(t[ok & ~first[t + 1]])
        return pools

    def head_tensors(self, rng: np.random.Generator, horizon: int, count: int, pools=None) -> tuple:
        """The fields of a `head_data.HeadBatch` (h, tokens, target_hidden, topk_ids,
        topk_probs) for ``count`` anchors drawn uniformly (Medusa / Hydra)."""
        pools = self.anchor_pools(horizon) if pools is None else pools
        if sum(p.size for p in pools) == 0:
            raise ValueError(f"no {self.name} prompt has {horizon + 1} consecutive labelled positions")
        return self._anchor_tensors(self._draw(rng, count, pools), horizon)

    def _anchor_tensors(self, groups, horizon: int) -> tuple:
        parts = []
        for number, t in groups:
            shard = self.shards[number]
            cols = t[:, None] + np.arange(1, horizon + 1)[None, :]
            ids, probs, _ = self._labels(shard, cols)
            last = shard.hidden[-1]
            parts.append((np.asarray(last[t], dtype=np.float32), shard.tokens[cols].astype(np.int64),
                          np.asarray(last[cols.reshape(-1)], dtype=np.float32).reshape(cols.shape + (-1,)),
                          ids, probs))
        return tuple(torch.from_numpy(np.concatenate([p[i] for p in parts])) for i in range(5))

    # -- epochs: every item once per epoch (`epoch_loop`) ------------------------------
    def epoch_anchors(self, horizon: int) -> np.ndarray:
        """int64 (n, 2): every Medusa / Hydra anchor (shard number, position) of
        `anchor_pools`, in recording order; an epoch visits each once."""
        rows = [np.stack([np.full(t.size, k, dtype=np.int64), t.astype(np.int64)], 1)
                for k, t in enumerate(self.anchor_pools(horizon))]
        out = np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)
        if out.shape[0] == 0:
            raise ValueError(f"no {self.name} prompt has {horizon + 1} consecutive labelled positions")
        return out

    def anchor_batch(self, rows: np.ndarray, horizon: int) -> tuple:
        """The `head_data.HeadBatch` fields of anchors ``rows`` (from `epoch_anchors`)."""
        order = np.lexsort((rows[:, 1], rows[:, 0]))            # shard-sorted: memmap locality
        rows = rows[order]
        groups = [(int(k), rows[rows[:, 0] == k, 1]) for k in np.unique(rows[:, 0])]
        return self._anchor_tensors(groups, horizon)

    def epoch_windows(self, width: int) -> np.ndarray:
        """int64 (n, 3): EAGLE windows (shard number, start, stop) tiling each prompt
        with stride ``width - 1`` (window positions 1 .. width-1 carry the labels the
        TTT loss reads, so each label position but a prompt's first is in exactly one
        window), keeping windows with a label position of this split."""
        if width < 3:
            raise ValueError(f"window must be >= 3 positions, got {width}")
        want_val, rows = self.name == "val", []
        for number, shard in enumerate(self.shards):
            mine = np.concatenate([[0], np.cumsum(shard.labelled & (shard.is_val == want_val))])
            for a, b in zip(shard.starts, shard.stops):
                s = np.arange(a, max(a, b - 1), width - 1, dtype=np.int64)
                e = np.minimum(s + width, b)
                keep = mine[e] - mine[s + 1] > 0
                rows += [(number, int(x), int(y)) for x, y in zip(s[keep], e[keep])]
        if not rows:
            raise ValueError(f"no {self.name} window has a label position")
        return np.asarray(rows, dtype=np.int64)

    def window_batch(self, rows: np.ndarray, width: int):
        """A `trainer.Batch` of windows ``rows`` (from `epoch_windows`), right-padded to ``width``."""
        return self._batch([tuple(int(v) for v in r) for r in rows], width)

    # -- small LM (token windows) -----------------------------------------------------
    def lm_windows(self, width: int, count: int, rng: np.random.Generator):
        """(tokens (B, W) int64, ids (B, W, K) int64, probs (B, W, K) float32) windows
        for a small-LM draft; unlabelled and padded positions get zero label weight."""
        tokens, _, ids, probs, valid = self._windows(self._window_starts(rng, count, width, 0), width)
        probs[~valid] = 0.0
        return torch.from_numpy(tokens), torch.from_numpy(ids), torch.from_numpy(probs)

    # -- vocabulary -------------------------------------------------------------------
    def vocab_counts(self, vocab_size: int) -> np.ndarray:
        """float64 (V,): token frequencies of this split's prompts plus its labels'
        top-1 (the `trainer.vocab_counts` recipe)."""
        counts = np.zeros(vocab_size, dtype=np.float64)
        for shard, pos in zip(self.shards, self._label_pos):
            rows = shard.is_val == (self.name == "val")
            counts += np.bincount(shard.tokens[rows], minlength=vocab_size)[:vocab_size]
            counts += np.bincount(shard.hard[pos], minlength=vocab_size)[:vocab_size]
        return counts

    def answer_counts(self, vocab_size: int) -> np.ndarray:
        """float64 (V,): counts of the target's greedy answer tokens of this split's
        prompts (the answer sets' own target tokens: positions a + L .. b - 1)."""
        counts = np.zeros(vocab_size, dtype=np.float64)
        want_val = self.name == "val"
        for shard in self.shards:
            for a, first, b in zip(shard.starts, shard.answer_starts, shard.stops):
                if shard.is_val[a] == want_val and first < b:
                    counts += np.bincount(shard.tokens[first:b], minlength=vocab_size)[:vocab_size]
        return counts

    def top1_labels(self) -> np.ndarray:
        """int64: the target's greedy next token at every label position of this split."""
        return np.concatenate([shard.hard[pos] for shard, pos in zip(self.shards, self._label_pos)])


class _WindowSampler:
    """EAGLE windows from a `RecordingSplit` (the `trainer.FeatureBatcher` interface)."""

    def __init__(self, split: RecordingSplit, window: int, batch_size: int, seed: int):
        if window < 3:
            raise ValueError(f"window must be >= 3 positions, got {window}")
        self.split, self.window, self.batch_size = split, int(window), int(batch_size)
        self.rng = np.random.default_rng(seed)
        self.positions = split.positions

    def sample(self):
        # lead >= 1: the label position is never a window's first position (ttt_loss reads labels 1..T)
        starts = self.split._window_starts(self.rng, self.batch_size, self.window, 1)
        return self.split._batch(starts, self.window)

    def iterate_all(self, part_index: int = 0, limit: int | None = None):
        return self.split.iterate_all(part_index, limit)


def open_recording_splits(folders, target_name: str, target_model, kind: str, *,
                          positions: str = "continuation", soft_targets: bool = False):
    """Training and held-out splits of one or more recordings.

    Args:
        folders: recording folders (each `recording.open_recording`).
        target_name: the target's name (must equal each recording's ``target``).
        target_model: the target (transformers causal LM) the draft is built for.
        kind: draft kind (decides the layers read, `head_layers`).
        positions: "continuation" (the target's answers) or "all" (prompts too).
        soft_targets: recorded top-m distribution as the label (else the greedy token).

    Returns:
        (train `RecordingSplit`, val `RecordingSplit`, note dict for ``train_config``).

    Raises:
        ValueError: bad ``positions``, no folder, `check_recording` refusals, a split
            without labels. FileNotFoundError: a folder without ``manifest.json``.
    """
    from specloop.realmodels.recording import open_recording
    if positions not in POSITION_MODES:
        raise ValueError(f"recording positions must be one of {POSITION_MODES}, got {positions!r}")
    folders = [str(f) for f in ([folders] if isinstance(folders, (str, Path)) else folders)]
    if not folders:
        raise ValueError("no recording given")
    layers = head_layers(kind, target_model.config)
    recordings = [open_recording(f) for f in folders]
    for rec in recordings:
        check_recording(rec, target_name, target_model, kind)
    top_m = min(int(rec.settings["top_m"]) for rec in recordings)
    shards = [_open_shard(rec.folder, entry, layers, positions) for rec in recordings
              for entry in rec.manifest["shards"]]
    train = RecordingSplit(shards, "train", layers, soft_targets, top_m)
    val = RecordingSplit(shards, "val", layers, soft_targets, top_m)
    return train, val, recording_note(recordings, shards, positions, soft_targets, train, val)


def open_eval_split(folders, target_name: str, target_model, kind: str, *, positions: str = "continuation",
                    soft_targets: bool = False) -> RecordingSplit:
    """Every prompt of one or more recordings of held-out prompts (``--eval-answers``)
    as one "val" `RecordingSplit` (no `VAL_EVERY` rule: none of them is trained on).

    Raises:
        as `open_recording_splits`.
    """
    from specloop.realmodels.recording import open_recording
    folders = [str(f) for f in ([folders] if isinstance(folders, (str, Path)) else folders)]
    if not folders:
        raise ValueError("no evaluation recording given")
    layers = head_layers(kind, target_model.config)
    recordings = [open_recording(f) for f in folders]
    for rec in recordings:
        check_recording(rec, target_name, target_model, kind)
    top_m = min(int(rec.settings["top_m"]) for rec in recordings)
    shards = [_open_shard(rec.folder, entry, layers, positions) for rec in recordings
              for entry in rec.manifest["shards"]]
    for shard in shards:
        shard.is_val[:] = True
    return RecordingSplit(shards, "val", layers, soft_targets, top_m)


def recording_note(recordings, shards, positions: str, soft_targets: bool, train, val) -> dict:
    """What ``train_config["recording_data"]`` says about the data: per recording its
    path, target, dtype, settings sha256 and prompts_sha256, shards and prompts read;
    the position mode, label kind, held-out rule and label positions per split."""
    per, k = [], 0
    for rec in recordings:
        n_shards = len(rec.manifest["shards"])
        per.append({"path": str(Path(rec.folder).resolve()), "target": rec.settings.get("target"),
                    "dtype": rec.settings.get("dtype"), "datasets": rec.settings.get("datasets"),
                    "split": rec.settings.get("split"),
                    "settings_sha256": hashlib.sha256(json.dumps(rec.settings, sort_keys=True).encode()).hexdigest(),
                    "prompts_sha256": rec.settings.get("prompts_sha256"), "shards": n_shards,
                    "prompts": int(sum(s.starts.size for s in shards[k:k + n_shards]))})
        k += n_shards
    return {"recordings": per, "positions": positions,
            "labels": f"soft top-{train.top_m}" if soft_targets else "hard greedy token",
            "val_rule": f"stream_index % {VAL_EVERY} == 0", "train_label_positions": train.positions,
            "val_label_positions": val.positions}
