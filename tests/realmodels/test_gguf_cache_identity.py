"""The GGUF conversion cache is keyed and checked by the source's identity:
a different, or a corrupt, file with the same name never
reuses an earlier conversion. Small hand-written GGUF v3 files; the conversion
itself is replaced by a stub that records what it converted (no model is built)."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch

from specloop.realmodels import loading


def _gguf(path, name: str, data: bytes, *, tensors: int = 1) -> None:
    """A minimal GGUF v3: one string metadata entry, ``tensors`` 1-D f32 tensors."""
    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, tensors, 2)
    out += string("general.name") + struct.pack("<I", 8) + string(name)
    out += string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + string("a") + string("b")
    for i in range(tensors):
        out += string(f"t{i}") + struct.pack("<IQIQ", 1, len(data) // 4, 0, 0)
    out += b"\0" * (-len(out) % 32)
    path.write_bytes(out + data)


@pytest.fixture
def conversions(monkeypatch, tmp_path):
    """Stub transformers' GGUF reading: the 'model' saves the GGUF's bytes, a file
    too short to hold a header raises as the real reader does; returns the list of
    converted paths."""
    import transformers
    done = []

    class Saved:
        def __init__(self, payload, filename):
            self.payload, self.filename = payload, filename
            self.config = transformers.PretrainedConfig()

        def save_pretrained(self, folder, **_):
            (Path(folder) / self.filename).write_bytes(self.payload)

    def read(folder, gguf_file, **_):
        path = Path(folder) / gguf_file
        data = path.read_bytes()
        if len(data) < 64:
            raise struct.error("unpack requires a buffer of 8 bytes")
        return path, data

    def model(folder, gguf_file=None, **kwargs):
        if gguf_file is None:             # load_model reading the cache folder
            module = torch.nn.Linear(1, 1)
            module.payload = (Path(folder) / "weights.bin").read_bytes()
            return module
        path, data = read(folder, gguf_file)
        done.append(path)
        return Saved(data, "weights.bin")

    def tokenizer(folder, gguf_file=None, **kwargs):
        if gguf_file is None:
            return None
        return Saved(read(folder, gguf_file)[1][:8], "tokenizer.json")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setenv("SPECLOOP_CACHE", str(tmp_path / "cache"))
    return done


def test_identity_parses_the_index_and_tells_files_apart(tmp_path):
    from specloop.realmodels.loading import gguf_identity
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    _gguf(a, "m", b"\1" * 4096)
    _gguf(b, "m", b"\1" * 4096)
    _gguf(c, "m", b"\1" * 4095 + b"\2")          # same size, header and index; last data byte differs
    ida = gguf_identity(a)
    assert ida == gguf_identity(b) and ida["method"].startswith("gguf-index") and ida["size"] == a.stat().st_size
    assert gguf_identity(c) != ida
    _gguf(b, "other", b"\1" * 4096)              # another header
    assert gguf_identity(b) != ida
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(a.read_bytes()[:40])   # cut inside the metadata: hashed whole
    assert gguf_identity(truncated)["method"] == "sha256"


def test_same_name_other_file_is_converted_again(conversions, tmp_path):
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    first, second = tmp_path / "one" / "mymodel.gguf", tmp_path / "two" / "mymodel.gguf"
    _gguf(first, "first", b"\1" * 256)
    _gguf(second, "second", b"\2" * 256)
    cache1 = loading._resolve_source(str(first), None)
    assert loading._resolve_source(str(first), None) == cache1 and conversions == [first.resolve()]
    cache2 = loading._resolve_source(str(second), None)
    assert conversions == [first.resolve(), second.resolve()]
    assert (cache2 / "weights.bin").read_bytes() == second.read_bytes() != (cache1 / "weights.bin").read_bytes()
    assert (cache1 / "weights.bin").read_bytes() == first.read_bytes()      # both conversions kept
    assert loading.load_model(str(second)).model.payload == second.read_bytes()
    assert loading.load_model(str(first)).model.payload == first.read_bytes()
    assert len(conversions) == 2


def test_explicit_cache_dir_is_checked_on_every_load(conversions, tmp_path):
    src, cache = tmp_path / "mymodel.gguf", tmp_path / "explicit"
    _gguf(src, "first", b"\1" * 256)
    assert loading._resolve_source(str(src), cache) == cache
    _gguf(src, "second", b"\2" * 256)             # the file is replaced in place
    loading._resolve_source(str(src), cache)
    assert len(conversions) == 2 and (cache / "weights.bin").read_bytes() == src.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".explicit.")]   # no stale copy left
    src.write_bytes(b"GGUF" + b"\3\0\0\0" + b"\xff" * 8)   # corrupt, same name: no reuse
    for _ in range(2):
        with pytest.raises(ValueError, match="corrupt"):
            loading._resolve_source(str(src), cache)


def test_registry_model_is_checked_against_its_source(conversions, monkeypatch, tmp_path):
    src = tmp_path / "pkg" / "model.gguf"
    src.parent.mkdir()
    _gguf(src, "v1", b"\1" * 256)
    spec = loading.ModelSpec("fake-model", lambda cache: src, "pip install fake")
    monkeypatch.setitem(loading.REGISTRY, "fake-model", spec)
    cache = loading._resolve_source("fake-model", None)
    assert loading._resolve_source("fake-model", None) == cache and len(conversions) == 1
    _gguf(src, "v2", b"\2" * 256)                 # the package was upgraded
    assert loading._resolve_source("fake-model", None) == cache and len(conversions) == 2
    assert (cache / "weights.bin").read_bytes() == src.read_bytes()


def test_legacy_marker_adopted_only_for_the_unchanged_same_file(conversions, tmp_path):
    src, cache = tmp_path / "m.gguf", tmp_path / "legacy"
    _gguf(src, "m", b"\1" * 256)
    cache.mkdir()
    (cache / "weights.bin").write_bytes(b"old")
    marker = cache / "specloop_cache.json"
    marker.write_text(json.dumps({"gguf": str(src.resolve())}))
    os.utime(src, (1, 1))                        # the file predates the conversion
    assert loading._resolve_source(str(src), cache) == cache and conversions == []
    assert json.loads(marker.read_text())["source"] == loading.gguf_identity(src)
    marker.write_text(json.dumps({"gguf": str(src.resolve())}))
    os.utime(marker, (1, 1))
    os.utime(src, (2, 2))                        # now the file is newer than the conversion
    loading._resolve_source(str(src), cache)
    assert conversions == [src.resolve()]
