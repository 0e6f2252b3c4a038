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
