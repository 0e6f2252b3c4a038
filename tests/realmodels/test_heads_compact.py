"""Int8 row-wise storage of draft heads: exact layout, error bound, loading, refusals."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specloop.realmodels.heads.common import export_pretrained, load_draft, save_draft
from specloop.realmodels.heads.compact import (INT8_GROUPED, STORAGE_KEY, compact_tensors, expand_tensors,
                                               storage_of)


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {"proj.weight": torch.randn(64, 1100, generator=gen) * 0.05,
            "norm.weight": torch.rand(1100, generator=gen) + 0.5,
            "small.weight": torch.randn(4, 4, generator=gen),
            "d2t": torch.arange(64, dtype=torch.long),
            "zero.weight": torch.zeros(3, 30000)}


def test_large_matrices_become_int8_with_row_scales_and_the_rest_float16():
    packed, metadata = compact_tensors(_tensors(), group_size=0)
    assert metadata == {STORAGE_KEY: INT8_GROUPED}
    assert packed["proj.weight"].dtype == torch.int8 and packed["proj.weight.row_scale"].shape == (64, 1)
    assert packed["zero.weight"].dtype == torch.int8 and torch.equal(packed["zero.weight.row_scale"], torch.zeros(3, 1))
    assert packed["norm.weight"].dtype == torch.float16 and packed["small.weight"].dtype == torch.float16
    assert packed["d2t"].dtype == torch.long
    assert int(packed["proj.weight"].abs().max()) == 127


@pytest.mark.parametrize("group_size", [0, 100, 64])
def test_expanded_weights_are_within_half_a_step_of_the_original(group_size):
    original = _tensors()
    packed, metadata = compact_tensors(original, group_size=group_size)
    expanded = expand_tensors(packed, metadata)
    assert set(expanded) == set(original)
    groups = 11 if group_size == 100 else 1          # 64 does not divide 1100: one scale per row
    assert packed["proj.weight.row_scale"].shape == (64, groups)
    blocks = original["proj.weight"].view(64, groups, -1).abs().amax(dim=2, keepdim=True) / 127
    step = blocks.expand(64, groups, 1100 // groups).reshape(64, 1100)
    error = (expanded["proj.weight"] - original["proj.weight"]).abs()
    assert bool((error <= step / 2 + 1e-7).all())
    assert torch.equal(expanded["zero.weight"], torch.zeros(3, 30000))
    assert expanded["proj.weight"].dtype == torch.float32 and torch.equal(expanded["d2t"], original["d2t"])


def test_load_draft_reads_int8_storage_and_export_pretrained_writes_it(tmp_path, monkeypatch):
    import specloop.realmodels.heads.common as common
    original = _tensors()
    save_draft(original, {"config": {}}, "tiny", "hydra", folder=tmp_path / "run")
    monkeypatch.setattr(common, "pretrained_path", lambda target, kind: tmp_path / "pkg" / f"{target}-{kind}.safetensors")
    out = export_pretrained("tiny", "hydra", folder=tmp_path / "run")
    assert storage_of(out) == INT8_GROUPED
    assert json.loads(out.with_suffix(".json").read_text())["exported_dtype"] == INT8_GROUPED
    assert out.stat().st_size < (tmp_path / "run" / "draft.safetensors").stat().st_size / 3
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "draft.safetensors").write_bytes(out.read_bytes())
    (tmp_path / "copy" / "draft.json").write_text(out.with_suffix(".json").read_text())
    loaded, _ = load_draft("tiny", "hydra", folder=tmp_path / "copy")
    assert torch.allclose(loaded["proj.weight"], original["proj.weight"], atol=float(original["proj.weight"].abs().max()) / 254 + 1e-7)
    half = export_pretrained("tiny", "hydra", folder=tmp_path / "run", storage="float16")
    assert storage_of(half) == "float"
    with pytest.raises(ValueError, match="storage must be"):
        export_pretrained("tiny", "hydra", folder=tmp_path / "run", storage="int4")


def test_refusals_name_the_tensor():
    with pytest.raises(ValueError, match="'a.row_scale'"):
        compact_tensors({"a.row_scale": torch.zeros(4)})
    with pytest.raises(ValueError, match="'w' has non-finite"):
        compact_tensors({"w": torch.full((300, 300), float("nan"))})
    packed, metadata = compact_tensors({"w": torch.ones(300, 300)})
    del packed["w.row_scale"]
    with pytest.raises(ValueError, match="'w' has no row-group scales"):
        expand_tensors(packed, metadata)
    with pytest.raises(ValueError, match="unknown draft storage 'int3'"):
        expand_tensors({}, {STORAGE_KEY: "int3"})


def test_a_plain_file_loads_as_before(tmp_path):
    save_file({"w": torch.ones(2, 2, dtype=torch.float16)}, str(tmp_path / "f.safetensors"))
    assert storage_of(tmp_path / "f.safetensors") == "float"
    assert expand_tensors({"w": torch.ones(2, 2, dtype=torch.float16)}, None)["w"].dtype == torch.float32
def test_the_shipped_heads_are_stored_compactly():
    from specloop.realmodels.heads.common import pretrained_path
    for kind in ("eagle", "eagle3", "hydra", "medusa", "small-lm"):
        path = pretrained_path("smollm2-135m", kind)
        assert storage_of(path) == INT8_GROUPED, f"{path.name} is not in int8 grouped storage"


