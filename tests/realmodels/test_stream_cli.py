"""`specloop stream` end to end on SmolLM2-135M with its saved Hydra draft (slow)."""
import contextlib
import io
import json

import pytest

from specloop.cli import main


@pytest.mark.slow
def test_stream_command_json_and_resume(tmp_path):
    argv = ["stream", "--method", "hydra,opt-hydra", "--datasets", "humaneval,ifbench", "--prompts", "2",
            "--chunk", "1", "--max-new-tokens", "6", "--json", "--out", str(tmp_path)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    result = json.loads(buf.getvalue())
    assert set(result["methods"]) == {"hydra", "opt-hydra"}
    for m in result["methods"].values():
        assert m["mean_accepted_length"] >= 1.0 and m["speedup"] > 0 and m["speedup_with_training"] > 0
        assert len(m["per_chunk"]) == 2
    assert result["stream"] == ["humaneval", "ifbench"]
    assert (tmp_path / "stream.png").stat().st_size > 0
    buf2 = io.StringIO()
    with contextlib.redirect_stdout(buf2):   # a rerun resumes: nothing left to serve, same numbers
        assert main(argv) == 0
    again = json.loads(buf2.getvalue())
    assert again["methods"]["opt-hydra"]["per_chunk"] == result["methods"]["opt-hydra"]["per_chunk"]


def test_stream_command_rejects_bad_input(tmp_path, capsys):
    assert main(["stream", "--method", "turbo", "--out", str(tmp_path)]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["stream", "--chunk", "0", "--out", str(tmp_path)]) == 2
    assert "--chunk" in capsys.readouterr().err


def test_stream_split_all_serves_every_row_of_a_users_prompt_file(tmp_path, capsys):
    rows = [{"prompt": f"Write a haiku about the number {i}.", "id": f"r{i}"} for i in range(4)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    argv = ["stream", "--method", "hydra", "--datasets", str(path), "--prompts", "4", "--chunk", "2",
            "--max-new-tokens", "4", "--json", "--out", str(tmp_path / "out")]
    assert main(argv) == 2                          # held-out split (the default): 1 of 4 rows
    assert "every 4th row is held out" in capsys.readouterr().err
    assert main(argv + ["--split", "all"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["split"] == "all" and result["config"]["prompts"] == 4
    assert len(result["stream"]) == 4 and result["methods"]["hydra"]["mean_accepted_length"] >= 1.0
