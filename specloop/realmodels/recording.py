"""Record the target's side of a prompt stream once (issue 19 s.1), for exact replays.

Under greedy decoding the target's output does not depend on the draft, so a stream's
target side -- each prompt's greedy continuation and, at every position, the features
the draft heads read and the target's next-token distribution -- can be computed once,
in batches, and any draft / learner / seed replayed against it (DESIGN.md, "Engines and
the one round loop"; OnlineSpec Algorithm 1's feedback is the verified positions'
p_target).

Generation (`generate_batch`) follows batch-1 decoding (`DecodeSession`): each
prompt's prefix (all but its last token) is prefilled alone in one forward (up to
`PREFILL_CHUNK` positions; no compute goes to padding), the B caches are merged left-
padded into one, then one forward per step feeds every unfinished row's pending token
(the prompt's last token, then each greedy token); a float 4D additive attention mask
hides the padding (a query always sees itself, so no softmax row is empty) and
position ids count real tokens only (a prompt's first token is at position 0, as in
batch-1 decoding). The hidden states and the top-m distribution of a position come
from the same forward that feeds its token, so every position (prompt and
continuation, the last generated token included) is covered without a second pass. A
row stops at EOS (included) or after ``max_new_tokens`` tokens and leaves the batch
once its last token has been fed (``DynamicCache.batch_select_indices``).

Exactness. In float32 the batched continuation equals batch-1 greedy decoding (tested
with ragged prompts, RoPE and absolute-position models; 16/16 SmolLM2 prompts x 64
tokens in `benchmarks/stream_record_speed.py`). In bfloat16 a row's logits depend on
the batch's shape (CPU GEMM rounding), so batched continuations can leave the batch-1
ones (SmolLM2, batch 8: 5 of 16 prompts, first difference at token 0..33), while batch
size 1 reproduces `SpeculativeDecoder` (k = 0) exactly; the manifest's ``check``
records where a recording diverged.

Recording folder format (``format_version`` 1)
----------------------------------------------
``manifest.json`` (rewritten atomically after every shard)::

    {"format": "specloop.stream_record", "format_version": 1,
     "settings": {target, dtype, datasets [..], split, order, prompts, max_new_tokens,
                  max_prompt_tokens, chat_template, top_m, layers [..], batch_size,
                  shard_size, prompts_sha256, format_version},
     "model": {vocab_size, hidden_size, num_hidden_layers, eos_ids [..]},
     "layer_names": {"2": "hidden_2", ..., "-1": "hidden_last"},
     "shards": [{"file", "first_index", "prompts", "positions", "new_tokens", "bytes",
                 "seconds"}, ...],
     "complete": bool, "total_bytes": int,
     "check": {"stream_indices": [..], "divergent": [{"stream_index", "first_diff"}],
               "matching": int}}             # after the last shard

``settings`` must equal the asked settings for a recording to be resumed
(`check_settings`; ``prompts_sha256`` hashes every prompt's token ids, so another
tokenizer or dataset version is refused too). ``layers`` are indices into
transformers' ``hidden_states`` tuple (0 = embeddings, -1 = last layer after the final
norm), the union of what the heads read (`head_feature_layers`).

``shard-NNNN.npz`` (NNNN = shard number; ``shard_size`` prompts each, the last may be
shorter; an uncompressed zip of ``.npy`` members with fixed timestamps, so a rerun
writes byte-identical files; written to ``*.tmp`` then renamed). For the P prompts of
the shard and their N positions in total (prompt tokens then continuation, prompts
concatenated in stream order):

=================  =================  ==================================================
key                dtype, shape       meaning
=================  =================  ==================================================
offsets            int64 (P + 1,)     prompt j's positions are [offsets[j], offsets[j+1])
prompt_lengths     int32 (P,)         L_j, templated (and truncated) prompt tokens
new_tokens         int32 (P,)         T_j, greedy continuation tokens (EOS included)
stream_index       int64 (P,)         position of the prompt in the stream
dataset            str (P,)           dataset name
prompt_id          str (P,)           the dataset's own id
stop_reason        str (P,)           "eos" or "length"
tokens             int32 (N,)         x_i: prompt ids then the greedy continuation
hidden_<l>         float16* (N, H)    hidden_states[l] at position i (``hidden_last``
                                      for l = -1): the feature of token x_i
topm_ids           int32 (N, m)       the target's top-m tokens after x_<=i, by
                                      decreasing probability
topm_probs         float16* (N, m)    their p_target (float32 softmax of the logits,
                                      temperature 1)
=================  =================  ==================================================

(*) float32 when the settings' ``feature_dtype`` is "float32".

So for a continuation position i >= L_j, ``tokens[i]`` is the greedy argmax of
position i - 1 (``topm_ids[i - 1, 0]`` up to ties at float16 / recompute precision).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from specloop._folder_lock import folder_lock

__all__ = ["recorded_items", "first_difference", "FORMAT_VERSION", "PREFILL_CHUNK", "RecordSettings", "head_feature_layers", "layer_name",
           "generate_batch", "prompts_fingerprint", "check_settings", "record_stream", "Recording",
           "open_recording", "check_batched", "recording_bytes"]

FORMAT_VERSION = 1
FORMAT_NAME = "specloop.stream_record"
PREFILL_CHUNK = 2048           # prompt positions per prefill forward (bounds the logits' memory)


_FEATURE_DTYPES = {"float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class RecordSettings:
    """Everything that decides a recording's content (stored in ``manifest.json``).

    Attributes:
        target: target name (registry name, HF id or path).
        dtype: "float32" or "bfloat16" (the target's compute dtype).
        datasets: dataset names in domain order. split: "heldout" / "warmup" / "all".
        order: "shift" or "interleave". prompts: prompts in the stream.
        max_new_tokens: greedy tokens per prompt (fewer at EOS), >= 1.
        max_prompt_tokens: prompts keep their last this many tokens (None: whole).
        chat_template: whether prompts were chat-templated.
        top_m: tokens of p_target kept per position, >= 1.
        layers: ``hidden_states`` indices recorded (`head_feature_layers`).
        batch_size: prompts per forward (it changes float rounding, hence recorded).
        shard_size: prompts per shard file.
        prompts_sha256: `prompts_fingerprint` of the prompts' token ids.
        feature_dtype: storage of ``hidden_<l>`` and ``topm_probs``: "float16" (the
            default, half the size) or "float32" (the decoder's values up to float32
            rounding). On SmolLM2 both replayed frozen and online Hydra round for
            round (`benchmarks/results/check_replay_sharegpt10*.json`); float32 is
            for targets or heads where float16 rounding may matter. Recordings made
            before this setting are float16.
    """

    target: str
    dtype: str
    datasets: tuple[str, ...]
    split: str
    order: str
    prompts: int
    max_new_tokens: int
    max_prompt_tokens: int | None
    chat_template: bool
    top_m: int
    layers: tuple[int, ...]
    batch_size: int
    shard_size: int
    prompts_sha256: str = ""
    format_version: int = field(default=FORMAT_VERSION)
    feature_dtype: str = "float16"

    def __post_init__(self):
        for name in ("prompts", "max_new_tokens", "top_m", "batch_size", "shard_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.layers:
            raise ValueError("a recording needs at least one hidden-state layer")
        if self.feature_dtype not in _FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {sorted(_FEATURE_DTYPES)}, got {self.feature_dtype!r}")
        object.__setattr__(self, "datasets", tuple(self.datasets))
        object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["datasets"], out["layers"] = list(self.datasets), list(self.layers)
        return out


def head_feature_layers(config) -> tuple[int, ...]:
    """The ``hidden_states`` indices some draft head reads for a target of this
    transformers ``config``: the three layers an EAGLE-3 head fuses
    (`EagleConfig.from_target`, Li et al. 2025: 2, L//2, L-3) and the last layer
    EAGLE, Hydra and Medusa read (their ``needs_target_hidden``). Ascending, -1 last."""
    from specloop.realmodels.heads.eagle import EagleConfig
    from specloop.realmodels.heads.head_drafting import HydraDrafter, MedusaDrafter
    vocab = int(config.vocab_size)
    wanted = set(EagleConfig.from_target(config, "eagle3", vocab).feature_layers)
    wanted |= set(EagleConfig.from_target(config, "eagle", vocab).feature_layers)
    wanted |= set(HydraDrafter.needs_target_hidden) | set(MedusaDrafter.needs_target_hidden)
    n = int(config.num_hidden_layers)
    norm = {n if layer == -1 else layer for layer in wanted}           # -1 and n are the same tensor
    return tuple(sorted(x for x in norm if x != n)) + ((-1,) if n in norm else ())


def layer_name(layer: int) -> str:
    """Shard key of a layer: ``hidden_last`` for -1, else ``hidden_<layer>``."""
    return "hidden_last" if int(layer) == -1 else f"hidden_{int(layer)}"


def prompts_fingerprint(prompts) -> str:
    """sha256 (hex) of the prompts' token ids (a list of int sequences)."""
    digest = hashlib.sha256()
    for ids in prompts:
        digest.update(np.asarray(list(ids), dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


# -- batched greedy generation --------------------------------------------------------
def _batch_mask(valid: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Float additive mask (B, 1, n, S) for the last n of S cached positions:
    causal over valid (non-pad) keys; a query also always sees itself."""
    total = valid.shape[1]
    query = torch.arange(total - n, total)[:, None]
    key = torch.arange(total)[None, :]
    visible = (valid[:, None, :] & (key <= query)[None]) | (key == query)[None]
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


@torch.inference_mode()
def _step(model, cache, ids: torch.Tensor, valid: torch.Tensor, layers, top_m: int,
          store: torch.dtype = torch.float16):
    """Feed ids (B, n) whose key validity is the last n columns of ``valid`` (B, S).
    Returns (hidden: list of ``store`` (B, n, H), top ids int32 (B, n, m),
    top probs ``store`` (B, n, m), argmax int64 (B, n))."""
    from specloop.realmodels.kvcache import _cache_kwarg
    param = next(model.parameters())
    n = ids.shape[1]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)[:, -n:]
    mask = _batch_mask(valid, n, param.dtype).to(param.device)
    out = model(input_ids=ids.to(param.device), attention_mask=mask, position_ids=positions.to(param.device),
                use_cache=True, output_hidden_states=True, **{_cache_kwarg(model): cache})
    logits = out.logits.float()
    if not torch.isfinite(logits).all():
        raise ValueError("the target produced non-finite logits")
    top = torch.topk(torch.softmax(logits, dim=-1), top_m, dim=-1)
    hidden = [out.hidden_states[layer].to(store).cpu() for layer in layers]
    return hidden, top.indices.to(torch.int32).cpu(), top.values.to(store).cpu(), \
        logits.max(-1).indices.cpu()


def _prefill(model, prefix: list[int], layers, top_m: int, store: torch.dtype = torch.float16):
    """Feed a prompt's prefix (all but its last token) into a fresh batch-1 cache, in one
    forward per `PREFILL_CHUNK` positions (as `DecodeSession.prefill` does).
    Returns (cache or None for an empty prefix, per-chunk (hidden list, top ids, top probs))."""
    from specloop.realmodels.kvcache import new_cache
    if not prefix:
        return None, []
    cache, ids, parts = new_cache(), torch.tensor([prefix], dtype=torch.long), []
    valid = torch.ones((1, len(prefix)), dtype=torch.bool)
    for start in range(0, len(prefix), PREFILL_CHUNK):
        stop = min(start + PREFILL_CHUNK, len(prefix))
        hidden, top_ids, top_probs, _ = _step(model, cache, ids[:, start:stop], valid[:, :stop], layers, top_m,
                                              store)
        parts.append(([h[0] for h in hidden], top_ids[0], top_probs[0]))
    return cache, parts


def _merge_caches(caches, lengths: list[int]):
    """Batch-1 caches of ``lengths`` tokens (None for 0) -> one left-padded batch
    cache (zeros at the padding, which the mask hides)."""
    from transformers import DynamicCache

    from specloop.realmodels.kvcache import new_cache
    template = next((c for c in caches if c is not None), None)
    if template is None:
        return new_cache()
    width, merged = max(lengths), []
    for layer in range(len(template.layers)):
        shape = template.layers[layer].keys.shape
        keys, values = [], []
        for cache, n in zip(caches, lengths):
            if cache is None:
                k = v = template.layers[layer].keys.new_zeros((1, shape[1], 0, shape[3]))
            else:
                k, v = cache.layers[layer].keys, cache.layers[layer].values
            keys.append(torch.nn.functional.pad(k, (0, 0, width - n, 0)))
            values.append(torch.nn.functional.pad(v, (0, 0, width - n, 0)))
        merged.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(ddp_cache_data=merged)


def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, eos_ids, layers, top_m: int,
                   feature_dtype: str = "float16") -> list[dict]:
    """Greedy continuations of a batch of prompts and every position's features.

    As batch-1 decoding (`DecodeSession`): each prompt's prefix (all but the last
    token) is prefilled alone (no compute on padding); the caches are merged
    left-padded; then every step feeds each unfinished row's pending token (first the
    prompt's last token, then each greedy token) in one forward; a row whose final
    token has been fed leaves the batch.

    Args:
        model: a transformers causal LM (eval mode). prompts: B token-id lists, each
            non-empty. max_new_tokens: >= 1. eos_ids: ints that end a continuation.
        layers: ``hidden_states`` indices to keep. top_m: tokens of p_target kept.
        feature_dtype: "float16" (default) or "float32": how features and top-m
            probabilities are stored.

    Returns:
        per prompt a dict: ``tokens`` int32 (L + T,), ``new_tokens`` int (T),
        ``stop_reason`` ("eos" / "length"), ``hidden`` list of float16 (L + T, H) per
        layer, ``topm_ids`` int32 (L + T, m), ``topm_probs`` float16 (L + T, m).

    Raises:
        ValueError: empty batch or prompt, max_new_tokens < 1, non-finite logits.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_batch needs a non-empty batch of non-empty prompts")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos, lengths = {int(e) for e in eos_ids}, [len(p) - 1 for p in prompts]
    store = _FEATURE_DTYPES[feature_dtype]
    prefilled = [_prefill(model, list(p[:-1]), layers, top_m, store) for p in prompts]
    parts = [list(chunks) for _, chunks in prefilled]
    cache = _merge_caches([c for c, _ in prefilled], lengths)
    width = max(lengths)
    valid = torch.tensor([[i >= width - n for i in range(width)] for n in lengths], dtype=torch.bool)
    valid = valid.reshape(len(prompts), width)
    pending = [int(p[-1]) for p in prompts]
    generated: list[list[int]] = [[] for _ in prompts]
    finished = [False] * len(prompts)
    active = list(range(len(prompts)))
    while active:                    # every active row has a pending token to feed
        step_ids = torch.tensor([[pending[r]] for r in active], dtype=torch.long)
        valid = torch.cat([valid, torch.ones((len(active), 1), dtype=torch.bool)], dim=1)
        hidden, top_ids, top_probs, argmax = _step(model, cache, step_ids, valid, layers, top_m, store)
        keep = []
        for i, r in enumerate(active):
            parts[r].append(([h[i] for h in hidden], top_ids[i], top_probs[i]))
            if finished[r]:
                continue                                     # its final token is fed: leaves the batch
            pending[r] = int(argmax[i, -1])
            generated[r].append(pending[r])
            finished[r] = pending[r] in eos or len(generated[r]) >= max_new_tokens
            keep.append(i)
        if 0 < len(keep) < len(active):
            cache.batch_select_indices(torch.tensor(keep))
            valid = valid[keep]
        active = [active[i] for i in keep]
    out = []
    for row, prompt in enumerate(prompts):
        chunks = parts[row]
        out.append({
            "tokens": np.asarray(list(prompt) + generated[row], dtype=np.int32),
            "new_tokens": len(generated[row]),
            "stop_reason": "eos" if generated[row][-1] in eos else "length",
            "hidden": [torch.cat([c[0][i] for c in chunks]).numpy() for i in range(len(layers))],
            "topm_ids": torch.cat([c[1] for c in chunks]).numpy(),
            "topm_probs": torch.cat([c[2] for c in chunks]).numpy()})
    return out


# -- files ------------------------------------------------------------------------------
def _write_npz(path: Path, arrays: dict) -> int:
    """Write an uncompressed .npz with fixed member timestamps (byte-identical on a
    rerun) to ``path.tmp``, then rename it over ``path``. Returns the bytes."""
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            archive.writestr(info, buffer.getvalue())
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path.stat().st_size


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def shard_name(number: int) -> str:
    return f"shard-{int(number):04d}.npz"


def _shard_arrays(items, results, layers, dtype=np.float16) -> dict:
    arrays = {"offsets": np.cumsum([0] + [len(r["tokens"]) for r in results]).astype(np.int64),
              "prompt_lengths": np.asarray([len(it.ids) for it in items], np.int32),
              "new_tokens": np.asarray([r["new_tokens"] for r in results], np.int32),
              "stream_index": np.asarray([it.index for it in items], np.int64),
              "dataset": np.asarray([it.dataset for it in items], dtype=str),
              "prompt_id": np.asarray([str(it.prompt_id) for it in items], dtype=str),
              "stop_reason": np.asarray([r["stop_reason"] for r in results], dtype=str),
              "tokens": np.concatenate([r["tokens"] for r in results]).astype(np.int32),
              "topm_ids": np.concatenate([r["topm_ids"] for r in results]).astype(np.int32),
              "topm_probs": np.concatenate([r["topm_probs"] for r in results]).astype(dtype)}
    for i, layer in enumerate(layers):
        arrays[layer_name(layer)] = np.concatenate([r["hidden"][i] for r in results]).astype(dtype)
    return arrays


def check_settings(out_dir, settings: RecordSettings | dict, keys=None) -> None:
    """Refuse to extend a recording made with other settings.

    Args:
        out_dir: the recording folder (no ``manifest.json``: nothing to check).
        settings: the asked `RecordSettings` (or its ``to_dict()``).
        keys: compare only these settings (e.g. those known before the model loads);
            None = all.

    Raises:
        ValueError: a setting differs (one line naming each: recorded vs asked), or the
            folder holds another format.
    """
    path = Path(out_dir) / "manifest.json"
    if not path.is_file():
        return
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a stream recording (format {manifest.get('format')!r})")
    asked = settings.to_dict() if isinstance(settings, RecordSettings) else dict(settings)
    recorded = {"feature_dtype": "float16", **manifest.get("settings", {})}   # older recordings: float16
    names = asked.keys() if keys is None else keys
    differ = {k: (recorded.get(k), asked[k]) for k in names if recorded.get(k) != asked[k]}
    if differ:
        text = ", ".join(f"{k}: recorded {a!r}, asked {b!r}" for k, (a, b) in differ.items())
        raise ValueError(f"{Path(out_dir)} was recorded with other settings ({text}); record into another folder")


def recording_bytes(out_dir) -> int:
    """Bytes of the recording's shards and manifest on disk."""
    folder = Path(out_dir)
    return sum(p.stat().st_size for p in [*folder.glob("shard-*.npz"), folder / "manifest.json"] if p.is_file())


# -- the recorder ---------------------------------------------------------------------
def _vocab_size(model) -> int:
    """Rows of the LM head (the logits' width), else ``config.vocab_size``."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def _model_info(model, eos) -> dict:
    config = model.config
    return {"vocab_size": _vocab_size(model),
            "hidden_size": int(config.hidden_size), "num_hidden_layers": int(config.num_hidden_layers),
            "eos_ids": sorted(int(e) for e in eos)}


def _new_manifest(settings: RecordSettings, model, eos) -> dict:
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "settings": settings.to_dict(),
            "model": _model_info(model, eos), "layer_names": {str(x): layer_name(x) for x in settings.layers},
            "shards": [], "complete": False, "total_bytes": 0}


def record_stream(target, items, out_dir, settings: RecordSettings, *, check_prompts: int = 4,
                  progress=None) -> dict:
    """Record ``items`` into ``out_dir`` (resumable; see the module docstring's format).

    Args:
        target: a `LoadedModel` or a bare transformers causal LM (tokenizer-free: the
            items carry token ids).
        items: `specloop.data.streams.StreamItem` s (``index``, ``dataset``,
            ``prompt_id``, ``ids``) in stream order, ``settings.prompts`` of them.
        out_dir: the recording folder (created). Shards already listed in its manifest
            are kept; a killed recording continues from the first missing shard and
            writes the files an uninterrupted one would.
        settings: `RecordSettings`; an empty ``prompts_sha256`` is filled in from items.
        check_prompts: prompts (spread evenly over the stream) re-decoded batch-1 with
            `SpeculativeDecoder` (k = 0) after the last shard (`check_batched`); 0 = none.
        progress: optional callable(prompts_done, prompts_total) after each batch.

    Returns:
        the manifest (dict), as written.

    Raises:
        ValueError: item count or prompt fingerprint differ from ``settings``; the
            folder was recorded with other settings (`check_settings`); a layer index
            outside the model; top_m above the vocabulary; `FolderInUseError` (a
            ValueError) when another live process is recording into the folder.
    """
    import dataclasses

    from specloop.realmodels.decoder import eos_ids_of
    from specloop.realmodels.loading import LoadedModel
    model = target.model if isinstance(target, LoadedModel) else target     # (a CausalLM has .model too)
    items = list(items)
    if len(items) != settings.prompts:
        raise ValueError(f"settings ask for {settings.prompts} prompts, got {len(items)} items")
    fingerprint = prompts_fingerprint(it.ids for it in items)
    if not settings.prompts_sha256:
        settings = dataclasses.replace(settings, prompts_sha256=fingerprint)
    elif settings.prompts_sha256 != fingerprint:
        raise ValueError("the items' token ids do not match settings.prompts_sha256")
    n_layers = int(model.config.num_hidden_layers)
    if any(not -n_layers - 1 <= x <= n_layers for x in settings.layers):
        raise ValueError(f"layers {settings.layers} outside the target's hidden_states (0..{n_layers})")
    info_vocab = _vocab_size(model)
    if settings.top_m > info_vocab:
        raise ValueError(f"top_m {settings.top_m} exceeds the vocabulary ({info_vocab})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings)
    eos = eos_ids_of(model, target.tokenizer if isinstance(target, LoadedModel) else None)
    with folder_lock(out):                          # one recorder per folder
        return _record_shards(target, model, items, out, settings, eos, check_prompts, progress)


def _record_shards(target, model, items, out: Path, settings: RecordSettings, eos, check_prompts: int,
                   progress) -> dict:
    """`record_stream`'s loop over the missing shards, then the batch-1 check."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.is_file() else _new_manifest(settings, model, eos)
    done = {s["file"]: s for s in manifest["shards"] if (out / s["file"]).is_file()}
    manifest["shards"] = [s for s in manifest["shards"] if s["file"] in done]
    size, total = settings.shard_size, len(items)
    prompts_done = sum(s["prompts"] for s in manifest["shards"])
    if progress is not None:
        progress(prompts_done, total)
    for number, first in enumerate(range(0, total, size)):
        if shard_name(number) in done:
            continue
        shard_items, results, t0 = items[first:first + size], [], time.perf_counter()
        for b in range(0, len(shard_items), settings.batch_size):
            batch = shard_items[b:b + settings.batch_size]
            results += generate_batch(model, [list(it.ids) for it in batch], settings.max_new_tokens, eos,
                                      settings.layers, settings.top_m, settings.feature_dtype)
            prompts_done += len(batch)
            if progress is not None:
                progress(prompts_done, total)
        arrays = _shard_arrays(shard_items, results, settings.layers, np.dtype(settings.feature_dtype))
        nbytes = _write_npz(out / shard_name(number), arrays)
        manifest["shards"].append({"file": shard_name(number), "first_index": first, "prompts": len(shard_items),
                                   "positions": int(arrays["tokens"].size),
                                   "new_tokens": int(arrays["new_tokens"].sum()), "bytes": nbytes,
                                   "seconds": time.perf_counter() - t0})
        manifest["shards"].sort(key=lambda s: s["first_index"])
        manifest["total_bytes"] = recording_bytes(out)
        _write_json(path, manifest)
    manifest["complete"] = True
    if check_prompts and "check" not in manifest:
        indices = _sample_indices(total, check_prompts)
        manifest["check"] = check_batched(target, out, indices, eos)
    _write_json(path, manifest)
    manifest["total_bytes"] = recording_bytes(out)
    _write_json(path, manifest)
    return manifest


def first_difference(a, b) -> int:
    """Index of the first token where sequences ``a`` and ``b`` differ (the shorter
    one's length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _sample_indices(total: int, count: int) -> list[int]:
    """``count`` stream indices spread evenly over ``range(total)`` (unique, ascending)."""
    return sorted({int(round(x)) for x in np.linspace(0, total - 1, min(int(count), total))})


def check_batched(target, out_dir, stream_indices, eos_ids=None) -> dict:
    """Re-decode recorded prompts one at a time and compare with the recording.

    Batch-1 greedy decoding is `SpeculativeDecoder` with no draft and k = 0 (the
    decoder's own prefill, cache and EOS handling), ``max_new_tokens`` of the recording.

    Returns:
        {"stream_indices": [..], "matching": int, "divergent": [{"stream_index",
        "first_diff" (index into the continuation of the first differing token, or
        the shorter length when one is a prefix of the other)}]}.
    """
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.loading import LoadedModel
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.streams.runner import NoDraft
    recording = open_recording(out_dir)
    loaded = target if isinstance(target, LoadedModel) else LoadedModel(target, None, "target", "stream-record")
    eos = recording.manifest["model"]["eos_ids"] if eos_ids is None else sorted(int(e) for e in eos_ids)
    decoder = SpeculativeDecoder(loaded, NoDraft(), policy=FixedDraftPolicy(0), eos_token_id=eos, seed=0)
    max_new = int(recording.settings["max_new_tokens"])
    divergent = []
    for index in stream_indices:
        rec = recording.prompt(int(index))
        prompt = torch.tensor(rec["tokens"][:rec["prompt_length"]], dtype=torch.long)
        batch1 = decoder.generate(prompt, max_new).new_tokens
        recorded = rec["tokens"][rec["prompt_length"]:].tolist()
        if batch1 != recorded:
            divergent.append({"stream_index": int(index), "first_diff": first_difference(batch1, recorded)})
    return {"stream_indices": [int(i) for i in stream_indices], "matching": len(stream_indices) - len(divergent),
            "divergent": divergent}


# -- reading ----------------------------------------------------------------------------
class Recording:
    """A stream recording opened for reading (`open_recording`).

    Attributes:
        folder: the recording folder. manifest: its ``manifest.json``.
        settings: ``manifest["settings"]``. layers: recorded ``hidden_states`` indices.
    """

    def __init__(self, folder: Path, manifest: dict):
        self.folder, self.manifest = folder, manifest
        self.settings = manifest["settings"]
        self.layers = tuple(self.settings["layers"])
        self._cached: tuple[int, dict] | None = None

    @property
    def num_prompts(self) -> int:
        """Prompts in the shards written so far."""
        return sum(s["prompts"] for s in self.manifest["shards"])

    def shard(self, number: int) -> dict:
        """Every array of shard ``number`` (dict name -> numpy array, loaded into memory)."""
        if self._cached is None or self._cached[0] != number:
            with np.load(self.folder / shard_name(number), allow_pickle=False) as data:
                self._cached = (number, {k: data[k] for k in data.files})
        return self._cached[1]

    def prompt(self, stream_index: int) -> dict:
        """One prompt's record: ``tokens`` int32 (L + T,), ``prompt_length`` L,
        ``new_tokens`` T, ``hidden`` {layer: float16 (L + T, H)}, ``topm_ids`` int32
        (L + T, m), ``topm_probs`` float16 (L + T, m), ``dataset``, ``prompt_id``,
        ``stop_reason``.

        Raises:
            IndexError: the stream index is not recorded (yet).
        """
        if not 0 <= int(stream_index) < self.num_prompts:
            raise IndexError(f"stream index {stream_index} not in the recording ({self.num_prompts} prompts)")
        number, j = divmod(int(stream_index), int(self.settings["shard_size"]))
        data = self.shard(number)
        a, b = int(data["offsets"][j]), int(data["offsets"][j + 1])
        return {"tokens": data["tokens"][a:b], "prompt_length": int(data["prompt_lengths"][j]),
                "new_tokens": int(data["new_tokens"][j]),
                "hidden": {layer: data[layer_name(layer)][a:b] for layer in self.layers},
                "topm_ids": data["topm_ids"][a:b], "topm_probs": data["topm_probs"][a:b],
                "dataset": str(data["dataset"][j]), "prompt_id": str(data["prompt_id"][j]),
                "stop_reason": str(data["stop_reason"][j])}


def recorded_items(recording: Recording, limit: int | None = None, every: int = 1) -> list:
    """The recording's prompts as `specloop.data.streams.StreamItem` s (ids = the
    templated prompt tokens; ``index`` = the prompt's index in the recording), in
    stream order: every ``every``-th prompt (0, every, 2 every, ...; a sub-stream
    with the recording's domain order and proportions), the first ``limit`` of them
    (None = all).

    Raises:
        ValueError: ``every`` < 1, ``limit`` < 1 or above the prompts available.
    """
    from specloop.data.streams import StreamItem
    if int(every) < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    total = len(range(0, recording.num_prompts, int(every)))
    count = total if limit is None else int(limit)
    if not 1 <= count <= total:
        raise ValueError(f"asked for {limit} prompts; the recording at {recording.folder} has {total}"
                         + (f" taking every {every}-th" if every != 1 else ""))
    items = []
    for shard in recording.manifest["shards"]:
        if len(items) >= count:
            break
        first = int(shard["first_index"])
        wanted = [j for j in range(shard["prompts"]) if (first + j) % int(every) == 0]
        if not wanted:
            continue
        with np.load(recording.folder / shard["file"], allow_pickle=False) as data:   # only these members
            offsets, lengths, tokens = data["offsets"], data["prompt_lengths"], data["tokens"]
            for j in wanted[: count - len(items)]:
                a = int(offsets[j])
                items.append(StreamItem(int(data["stream_index"][j]), str(data["dataset"][j]),
                                        str(data["prompt_id"][j]), "",
                                        tuple(int(t) for t in tokens[a:a + int(lengths[j])])))
    return items


def open_recording(out_dir) -> Recording:
    """Open a recording folder.

    Raises:
        FileNotFoundError: no ``manifest.json``. ValueError: another format or a newer
            format version.
    """
    folder = Path(out_dir)
    path = folder / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no stream recording at {folder} (manifest.json missing)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a stream recording")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(f"{path} has format version {manifest['format_version']}, this reader knows "
                         f"{FORMAT_VERSION}")
    return Recording(folder, manifest)
