"""benchmarks/online_confirm.py: the default chunks (each domain's end), and one check
on a tiny recorded target: the real decoder and the replay agree round for round for
the adapted and the frozen draft, and the gains are computed from the rows."""
from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.online_confirm import check_chunk, default_chunks

from .decoder_util import one_thread  # noqa: F401
from .test_train_from_recording import _config, _record, target  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def test_default_chunks_are_the_chunks_holding_each_domains_last_prompt():
    domains = ["code"] * 67 + ["writing"] * 67 + ["chat"] * 66
    assert default_chunks(domains, 20) == [3, 6]          # prompts 66 and 133; chat has no next chunk
    assert default_chunks(["a"] * 10 + ["b"] * 10, 5) == [1]
    assert default_chunks(["a"] * 8, 4) == []


def test_check_chunk_real_decoder_equals_the_replay(target, tmp_path):
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.online_heldout import apply_snapshot
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.realmodels.training.trainer import get_trainer
    folder = _record(target, tmp_path / "rec")
    get_trainer("hydra")(_config("hydra", folder, tmp_path / "head", steps=40), loaded=target, progress=False)
    rec = open_recording(folder)
    items = recorded_items(rec)
    shifted = None

    def make():
        nonlocal shifted
        frozen = make_drafter("hydra", target, checkpoint=str(tmp_path / "head"), train_if_missing=False,
                              progress=False)
        adapted = make_drafter("hydra", target, checkpoint=str(tmp_path / "head"), train_if_missing=False,
                               progress=False)
        if shifted is None:
            gen = torch.Generator().manual_seed(0)
            shifted = [p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for p in adapted.parameters()]
        apply_snapshot(adapted, shifted)
        return {"adapted": adapted, "frozen": frozen}

    args = argparse.Namespace(num_draft_tokens=3, repeats=2, max_new_tokens=rec.settings["max_new_tokens"])
    positions = list(range(min(4, len(items))))
    row = check_chunk(rec, target, make, items, positions, args)
    for name in ("adapted", "frozen"):
        assert row[name]["rounds"] == row[name]["matching_rounds"] > 0
        assert row[name]["tau_real"] == pytest.approx(row[name]["tau_replay"])
        assert len(row[name]["tokens_per_s_per_prompt"]) == 2 * len(positions)
    tau = {n: sum(p["tokens"] for p in row[n]["per_prompt"]) / sum(p["rounds"] for p in row[n]["per_prompt"])
           for n in ("adapted", "frozen")}
    assert tau["adapted"] == pytest.approx(row["adapted"]["tau_real"])
    assert row["gain"]["n"] == len(positions)
    lo, hi = row["speed_gain_ci"]
    assert lo <= row["speed_gain"] <= hi
