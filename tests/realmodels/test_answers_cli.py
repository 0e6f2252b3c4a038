"""``specloop answers generate`` end to end on a tiny model saved with a real tokenizer:
a researcher's JSONL prompt file, and a run killed with SIGKILL that resumes to the
bytes of an uninterrupted one."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.realmodels.decoder_util import one_thread, tiny_llama  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smollm2_float32):
    """A folder holding a tiny random Llama over SmolLM2's vocabulary and its tokenizer
    (chat template included): a ``--target`` path that loads in well under a second."""
    folder = tmp_path_factory.mktemp("tiny-target")
    tokenizer = smollm2_float32.tokenizer
    model = tiny_llama(vocab=len(tokenizer), layers=2, hidden=32, max_positions=512, seed=4)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _prompt_file(path: Path, count: int) -> Path:
    rows = [{"id": f"r{i}", "domain": "even" if i % 2 == 0 else "odd",
             "prompt": f"Please write line {i} of a poem about the number {i * 7}."} for i in range(count)]
    rows[1] = {"id": "r1", "domain": "odd", "messages": [{"role": "system", "content": "Be short."},
                                                        {"role": "user", "content": "Say one word."}]}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _argv(target, prompts_file, out, prompts: int, max_new: int, piece: int) -> list[str]:
    return ["answers", "generate", "--target", str(target), "--datasets", str(prompts_file), "--split", "all",
            "--prompts", str(prompts), "--max-new-tokens", str(max_new), "--piece-size", str(piece),
            "--batch-size", "2", "--out", str(out)]


def test_answers_generate_reads_a_jsonl_prompt_file(tmp_path, tiny_target, capsys):
    from specloop.cli import main
    from specloop.data.prompts import load_prompts
    from specloop.data.streams import encode_prompt
    from specloop.realmodels.answers.answer_set import open_answer_set
    from specloop.realmodels.loading import load_model
    source = _prompt_file(tmp_path / "mine.jsonl", 5)
    assert main(_argv(tiny_target, source, tmp_path / "set", 5, 4, 2) + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["complete"] and result["settings"]["datasets"] == [str(source)]
    answers = open_answer_set(tmp_path / "set")
    records = list(answers.records())
    assert [(r["prompt_id"], r["dataset"]) for r in records] == [
        ("r0", "even"), ("r1", "odd"), ("r2", "even"), ("r3", "odd"), ("r4", "even")]
    tokenizer = load_model(str(tiny_target)).tokenizer
    chat = load_prompts(str(source), "all")[1]
    assert records[1]["prompt"].tolist() == encode_prompt(tokenizer, chat)[-512:]
    assert "Be short." in tokenizer.decode(records[1]["prompt"].tolist())         # the system turn is kept
    assert all(0 < r["answer"].size <= 4 for r in records)


def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_bytes(tmp_path, tiny_target):
    """Two subprocess runs of the same command, the first SIGKILLed once its first piece
    is listed; the pieces equal an uninterrupted run's byte for byte (about 15 s, most
    of it the two interpreters' start-up)."""
    from specloop.cli import main
    source = _prompt_file(tmp_path / "mine.jsonl", 48)
    argv = _argv(tiny_target, source, tmp_path / "whole", 48, 48, 2)
    assert main(argv) == 0                                                # uninterrupted, in process
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "specloop"] + _argv(tiny_target, source, killed, 48, 48, 2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline, listed = time.monotonic() + 120, 0
    while time.monotonic() < deadline and process.poll() is None:
        try:
            listed = len(json.loads((killed / "manifest.json").read_text())["pieces"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            listed = 0
        if listed:
            break
        time.sleep(0.005)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-500:]!r}"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    manifest = json.loads((killed / "manifest.json").read_text())
    assert not manifest["complete"] and 1 <= len(manifest["pieces"]) < 24
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    names = sorted(p.name for p in (tmp_path / "whole").glob("piece-*.npz"))
    assert len(names) == 24 and sorted(p.name for p in killed.glob("piece-*.npz")) == names
    for name in names:
        assert (killed / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    strip = lambda m: [{k: v for k, v in p.items() if k != "seconds"} for p in m["pieces"]]  # noqa: E731
    whole_manifest = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    resumed = json.loads((killed / "manifest.json").read_text())
    assert resumed["complete"] and strip(resumed) == strip(whole_manifest)
    assert resumed["settings"] == whole_manifest["settings"]
