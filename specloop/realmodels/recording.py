"""The stream recording: the target's side of a prompt stream, recorded once for exact
replays -- its settings, its folder format, and the readers.

Under greedy decoding the target's output does not depend on the draft, so a stream's
target side -- each prompt's greedy continuation and, at every position, the features
the draft heads read and the target's next-token distribution -- can be computed once,
in batches, and any draft / learner / seed replayed against it (docs/design.md,
sections "Replays" and "Recording format"; OnlineSpec Algorithm 1's feedback is the verified positions'
p_target).

The recorder that writes such a folder (`record_stream`, `check_batched`) is
`specloop.realmodels.streams.record`: continuations from the answer-set generator
(`specloop.realmodels.answers.generator.generate_greedy`), features and top-m from the
teacher-forced prefill of `specloop.realmodels.answers.rebuild` (`write_shards`, which
the rebuild from an answer set shares). This module needs numpy only
(`head_feature_layers` reads the head configurations when called).

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
                 "sha256", "seconds"}, ...],
     "answers": str,                         # only when rebuilt from an answer set
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

Integrity: every shard's size and sha256 are in its manifest entry (written with the
shard) and are verified when the recording is opened (`open_recording`) and when a
recording resumes; a damaged or missing shard is refused in one line naming the file and
the command that rebuilds it (`rebuild_command`), and a resumed recording re-does it (the
recorder writes byte-identical shards). Recordings made before checksums were kept
(no ``sha256`` in their entries) are verified by size only. The target's compute dtype
is checked against the stored features too (`check_compute_dtype`): bfloat16 hidden
states keep only 8 significant bits, which their float16 / float32 storage shows.

So for a continuation position i >= L_j, ``tokens[i]`` is the greedy argmax of
position i - 1 (``topm_ids[i - 1, 0]`` up to ties at float16 / recompute precision).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specloop._integrity import DamagedFileError, file_entry, read_json_manifest, verify_listed_file

__all__ = ["DamagedShardError", "read_manifest", "rebuild_command", "verify_shards", "usable_shards",
           "resume_manifest", "redone_note",
           "check_compute_dtype", "recorded_items", "first_difference", "FORMAT_VERSION", "FORMAT_NAME", "FEATURE_DTYPES", "RecordSettings",
           "head_feature_layers", "layer_name", "prompts_fingerprint", "check_settings", "shard_name", "Recording",
           "open_recording", "recording_bytes", "new_manifest", "vocab_size"]

FORMAT_VERSION = 1
FORMAT_NAME = "specloop.stream_record"
FEATURE_DTYPES = ("float16", "float32")     # storage of the features and probabilities


class DamagedShardError(DamagedFileError):
    """A listed shard that is missing or whose size / sha256 differ from the manifest."""


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
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {sorted(FEATURE_DTYPES)}, got {self.feature_dtype!r}")
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


def vocab_size(model) -> int:
    """Rows of a transformers model's LM head (the logits' width), else ``config.vocab_size``."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def new_manifest(settings: RecordSettings, model, eos) -> dict:
    """The manifest of an empty recording of ``settings`` for ``model`` (a transformers
    causal LM) whose continuations end at the token ids ``eos``."""
    config = model.config
    info = {"vocab_size": vocab_size(model), "hidden_size": int(config.hidden_size),
            "num_hidden_layers": int(config.num_hidden_layers), "eos_ids": sorted(int(e) for e in eos)}
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "settings": settings.to_dict(),
            "model": info, "layer_names": {str(x): layer_name(x) for x in settings.layers},
            "shards": [], "complete": False, "total_bytes": 0}


# -- files ------------------------------------------------------------------------------
def _write_npz(path: Path, arrays: dict) -> int:
    """Write an uncompressed .npz with fixed member timestamps (byte-identical on a
    rerun) to ``path.tmp``, then rename it over ``path``. Returns its manifest entry's
    ``{"bytes", "sha256"}``."""
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
    return file_entry(path)


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
        ValueError: a setting differs (one line naming each: recorded vs asked), or
            `read_manifest` refuses the manifest.
    """
    if not (Path(out_dir) / "manifest.json").is_file():
        return
    manifest = read_manifest(out_dir)
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


def first_difference(a, b) -> int:
    """Index of the first token where sequences ``a`` and ``b`` differ (the shorter
    one's length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


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


def read_manifest(out_dir) -> dict:
    """The ``manifest.json`` of a recording folder, as the reader and the recorder both
    accept it.

    Raises:
        FileNotFoundError: no manifest. ValueError: unreadable JSON, another format, or
            a format version other than this code's (each one line naming the file).
    """
    path = Path(out_dir) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no stream recording at {Path(out_dir)} (manifest.json missing)")
    manifest = read_json_manifest(path)
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a stream recording (format {manifest.get('format')!r})")
    version = manifest.get("format_version", FORMAT_VERSION)   # manifests before the field: version 1
    if not isinstance(version, int) or version != FORMAT_VERSION:
        raise ValueError(f"{path} has format version {version!r}, this code reads and writes version "
                         f"{FORMAT_VERSION} only")
    if not isinstance(manifest.get("settings"), dict) or not isinstance(manifest.setdefault("shards", []), list):
        raise ValueError(f"{path} is not a complete recording manifest (no settings, or shards not a list)")
    return manifest


def rebuild_command(out_dir, manifest: dict) -> str:
    """The ``specloop stream record`` command line that (re)writes this recording's
    shards into ``out_dir`` (its settings as flags; ``--from-answers`` when it was
    rebuilt from an answer set)."""
    s = manifest["settings"]
    if manifest.get("answers"):
        flags = [f"--from-answers {manifest['answers']}", f"--prompts {s['prompts']}"]
    else:
        flags = [f"--target {s['target']}", f"--dtype {s['dtype']}", f"--datasets {','.join(s['datasets'])}",
                 f"--split {s['split']}", f"--order {s['order']}", f"--prompts {s['prompts']}",
                 f"--max-new-tokens {s['max_new_tokens']}"]
        if s.get("max_prompt_tokens") is not None:
            flags.append(f"--max-prompt-tokens {s['max_prompt_tokens']}")
        if not s.get("chat_template", True):
            flags.append("--raw")
    flags += [f"--top-m {s['top_m']}", f"--batch-size {s['batch_size']}", f"--shard-size {s['shard_size']}",
              f"--feature-dtype {s.get('feature_dtype', 'float16')}", f"--out {out_dir}"]
    return "specloop stream record " + " ".join(flags)


def _redo_hint(out_dir, manifest: dict) -> str:
    return f"rerun `{rebuild_command(out_dir, manifest)}` to redo it (a resume re-does damaged shards)"


def verify_shards(out_dir, manifest: dict) -> None:
    """Check every listed shard against its manifest entry (size, and sha256 when the
    entry has one: recordings made before checksums are checked by size only).

    Raises:
        DamagedShardError: the first missing or damaged shard, in one line naming it
            and the command that rebuilds it.
    """
    for entry in manifest["shards"]:
        verify_listed_file(out_dir, entry, _redo_hint(out_dir, manifest), error=DamagedShardError)


def usable_shards(out_dir, manifest: dict) -> tuple[list[dict], list[str]]:
    """For a resume: (the listed shards that verify, the files of those that do not --
    missing or damaged, to be recorded again)."""
    kept, damaged = [], []
    for entry in manifest["shards"]:
        try:
            verify_listed_file(out_dir, entry, "", error=DamagedShardError)
            kept.append(entry)
        except DamagedShardError:
            damaged.append(entry["file"])
    return kept, damaged


def resume_manifest(out_dir, fresh) -> tuple[dict, dict]:
    """The manifest a recorder resumes from: the folder's (`read_manifest`) with only
    its shards that verify listed, else ``fresh()`` (a new manifest).

    Returns:
        (manifest, redo): ``redo`` maps each missing or damaged shard's file to the
        sha256 its entry had (None when unknown), to be recorded again.
    """
    if not (Path(out_dir) / "manifest.json").is_file():
        return fresh(), {}
    manifest = read_manifest(out_dir)
    listed = {e["file"]: e.get("sha256") for e in manifest["shards"]}
    manifest["shards"], damaged = usable_shards(out_dir, manifest)
    if damaged:
        manifest["complete"] = False
    return manifest, {f: listed[f] for f in damaged}


def redone_note(redo: dict, manifest: dict) -> list[dict]:
    """Per re-recorded shard: ``file`` and ``identical`` (its new sha256 equals the
    damaged one's entry; None when that entry had no sha256)."""
    new = {e["file"]: e.get("sha256") for e in manifest["shards"]}
    return [{"file": f, "identical": None if old is None else new.get(f) == old} for f, old in redo.items()]


def _dtype_layer(layers) -> int | None:
    """The recorded layer whose values show the compute dtype (-1, else the deepest
    non-embedding layer; the embeddings are the checkpoint's values in any dtype)."""
    if -1 in layers:
        return -1
    deep = [x for x in layers if x > 0]
    return max(deep) if deep else None


def check_compute_dtype(recording: "Recording") -> None:
    """Refuse a recording whose manifest's ``dtype`` disagrees with its features.

    A bfloat16 target's hidden states carry 8 significant bits, so stored as float16
    their 3 lowest mantissa bits are 0, stored as float32 their 16 lowest; a float32
    target's are 0 at those bits about 1/8 (1/65536) of the time. Reads one layer of
    the first shard (at most 65,536 values); a recording without a shard or with fewer
    than 256 values of a non-embedding layer is not checked.

    Raises:
        ValueError: the features are of the other compute dtype (one line).
    """
    layer = _dtype_layer(recording.layers)
    if not recording.manifest["shards"] or layer is None:
        return
    entry = recording.manifest["shards"][0]
    with np.load(recording.folder / entry["file"], allow_pickle=False) as data:
        values = np.asarray(data[layer_name(layer)]).reshape(-1)[:65536]
    if values.size < 256:
        return
    if values.dtype == np.float16:
        low = (values.view(np.uint16) & 0x7) == 0
    elif values.dtype == np.float32:
        low = (values.view(np.uint32) & 0xFFFF) == 0
    else:
        raise ValueError(f"{recording.folder / entry['file']}: {layer_name(layer)} is {values.dtype}, not float16 "
                         "or float32")
    shown = "bfloat16" if float(low.mean()) > 0.75 else "float32"
    claimed = recording.settings.get("dtype")
    if claimed != shown:
        raise ValueError(f"{recording.folder / 'manifest.json'} says dtype {claimed!r} but the recorded features "
                         f"were computed in {shown} ({layer_name(layer)} of {entry['file']}); re-record it or "
                         "restore the manifest")


def open_recording(out_dir) -> Recording:
    """Open a recording folder, verifying every listed shard (`verify_shards`) and the
    compute dtype (`check_compute_dtype`).

    Raises:
        FileNotFoundError: no ``manifest.json``. ValueError: as `read_manifest`;
            `DamagedShardError`; a dtype the features contradict.
    """
    folder = Path(out_dir)
    manifest = read_manifest(folder)
    verify_shards(folder, manifest)
    recording = Recording(folder, manifest)
    check_compute_dtype(recording)
    return recording
