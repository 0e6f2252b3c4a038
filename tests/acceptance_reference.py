"""The acceptance regression guard's reference: the shipped heads' acceptance profiles.

    python tests/acceptance_reference.py tests/fixtures/acceptance_heads.json

For every shipped head of the embedded SmolLM2-135M-Instruct target
(``specloop/realmodels/heads/pretrained/``), greedy float32 chain decoding (k = 4) of 8
fixed held-out prompts x 64 new tokens: the mean accepted length (tokens per round)
and each draft position's share P(a >= i) (`specloop.realmodels.heads.acceptance`).
The prompts are the token ids of 8 prompts of the committed held-out answer set
``data/answers/sharegpt-heldout-1200`` (code, writing and chat), so no tokenizer or
dataset package is involved. Each head is fingerprinted by the sha256 of its shipped
file: `tests/realmodels/test_acceptance_regression.py` recomputes the profile and fails
when any value is more than 5 % below this reference, and asks for this script to be
rerun (a deliberate, reviewed change of the fixture) when a shipped head was replaced.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELDOUT = REPO / "data" / "answers" / "sharegpt-heldout-1200"
#: stream indices of the prompts: 3 code, 3 writing, 2 chat (the stream is 400 + 400 + 400)
PROMPT_INDICES = (3, 150, 333, 410, 600, 777, 850, 1100)
KINDS = ("eagle", "eagle3", "hydra", "medusa", "small-lm")
TARGET = "smollm2-135m"
MAX_NEW_TOKENS = 64
DRAFT_LENGTH = 4
#: a value may fall this far (relative) below the reference before the guard fails
TOLERANCE = 0.05


def fixed_prompts() -> list[list[int]]:
    """Token ids of the guard's 8 prompts (stream order of `PROMPT_INDICES`)."""
    from specloop.realmodels.answers.answer_set import open_answer_set
    wanted = set(PROMPT_INDICES)
    found = {}
    for record in open_answer_set(HELDOUT).records():
        if record["stream_index"] in wanted:
            found[record["stream_index"]] = [int(t) for t in record["prompt"]]
    return [found[i] for i in PROMPT_INDICES]


def shipped_head(kind: str) -> Path:
    from specloop.realmodels.heads.common import pretrained_path
    return pretrained_path(TARGET, kind)


def shipped_drafter(target, kind: str, folder: Path):
    """The drafter of the *shipped* head file of ``kind`` (never a trained copy in the
    user's draft cache): the file is copied into ``folder`` and loaded from there."""
    from specloop.realmodels.registry.drafters import make_drafter
    src = shipped_head(kind)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, folder / "draft.safetensors")
    shutil.copyfile(src.with_suffix(".json"), folder / "draft.json")
    return make_drafter(kind, target, checkpoint=str(folder), train_if_missing=False, progress=False)


def profile(target, kind: str, prompts, folder: Path) -> dict:
    from specloop._integrity import file_sha256
    from specloop.realmodels.heads.acceptance import acceptance_profile
    drafter = shipped_drafter(target, kind, folder)
    out = acceptance_profile(target, drafter, prompts, max_new_tokens=MAX_NEW_TOKENS, draft_length=DRAFT_LENGTH)
    return {"head_sha256": file_sha256(shipped_head(kind)), **out}


def reference() -> dict:
    from specloop.realmodels.loading import load_model
    target = load_model(TARGET, dtype="float32")
    prompts = fixed_prompts()
    with tempfile.TemporaryDirectory() as tmp:
        heads = {kind: profile(target, kind, prompts, Path(tmp) / kind) for kind in KINDS}
    return {"target": TARGET, "dtype": "float32", "prompt_indices": list(PROMPT_INDICES),
            "max_new_tokens": MAX_NEW_TOKENS, "draft_length": DRAFT_LENGTH, "tolerance": TOLERANCE, "heads": heads}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/acceptance_reference.py OUT.json")
    Path(sys.argv[1]).write_text(json.dumps(reference(), indent=1) + "\n", encoding="utf-8")
