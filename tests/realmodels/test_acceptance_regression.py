"""Regression guard on the shipped heads' acceptance: the mean accepted length and each
draft position's share on 8 fixed held-out prompts x 64 tokens (float32 greedy, chain
k = 4) must not fall more than 5 % below `tests/fixtures/acceptance_heads.json`
(written by ``python tests/acceptance_reference.py``; see that script)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import acceptance_reference as ref  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "acceptance_heads.json"


@pytest.fixture(scope="module")
def fixture():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def prompts():
    return ref.fixed_prompts()


def test_fixture_matches_the_guard_settings(fixture):
    assert fixture["prompt_indices"] == list(ref.PROMPT_INDICES)
    assert (fixture["max_new_tokens"], fixture["draft_length"]) == (ref.MAX_NEW_TOKENS, ref.DRAFT_LENGTH)
    assert sorted(fixture["heads"]) == sorted(ref.KINDS)
    for kind, row in fixture["heads"].items():      # the profile is self-consistent: shares sum to tau - 1
        assert sum(row["per_position"]) == pytest.approx(row["mean_accepted_length"] - 1, abs=1e-9), kind


def _floor(value: float) -> float:
    return value * (1 - ref.TOLERANCE)


@pytest.mark.parametrize("kind", ref.KINDS)
def test_shipped_head_acceptance_does_not_regress(smollm2_float32, fixture, prompts, tmp_path, kind):
    from specloop._integrity import file_sha256
    expected = fixture["heads"][kind]
    assert file_sha256(ref.shipped_head(kind)) == expected["head_sha256"], (
        f"the shipped {kind} head changed: rerun `python tests/acceptance_reference.py {FIXTURE}` and review the diff")
    got = ref.profile(smollm2_float32, kind, prompts, tmp_path / kind)
    assert got["mean_accepted_length"] >= _floor(expected["mean_accepted_length"]), (kind, got, expected)
    for i, (now, was) in enumerate(zip(got["per_position"], expected["per_position"]), start=1):
        assert now >= _floor(was), f"{kind}: draft position {i} share {now:.4f} < 95 % of {was:.4f}"
