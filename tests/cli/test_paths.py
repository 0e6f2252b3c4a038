"""Every command's path arguments are checked before any work (`specloop.cli._paths`):
an output that exists as a file, a missing input folder or file, an unwritable folder
is refused in one line with exit 2, and nothing is written."""
from __future__ import annotations

import pytest

from specloop.cli import main
from specloop.cli._paths import check_input_file, check_input_folder, check_output_file, check_output_folder


def test_helpers_accept_good_paths_and_refuse_bad_ones(tmp_path, monkeypatch):
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    check_output_folder(tmp_path / "new" / "deeper")                # missing parents are made later
    check_output_folder(tmp_path)
    check_output_file(tmp_path / "rows.json")
    check_input_folder(tmp_path, "--drafts")
    check_input_file(afile, "--cost-table")
    for value in (None,):
        check_output_folder(value), check_input_folder(value, "--x"), check_input_file(value, "--x")
    cases = [(lambda: check_output_folder(afile), "exists and is not a folder"),
             (lambda: check_output_folder(afile / "sub"), "is a file, so no folder can be made under it"),
             (lambda: check_output_file(tmp_path), "is a folder; give a file name"),
             (lambda: check_input_folder(tmp_path / "none", "--drafts"), "--drafts .*none: no such folder"),
             (lambda: check_input_folder(afile, "--drafts"), "is a file, not a folder"),
             (lambda: check_input_file(tmp_path / "none.json", "--cost-table"), "no such file"),
             (lambda: check_input_file(tmp_path, "--cost-table"), "is a folder, not a file")]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    monkeypatch.setattr("os.access", lambda path, mode: False)     # as a non-root user on a read-only folder
    with pytest.raises(ValueError, match="is not writable"):
        check_output_folder(tmp_path)
    with pytest.raises(ValueError, match="is not writable"):
        check_output_folder(tmp_path / "new")


def _refused(argv, capsys, *needles) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], (argv, err[0])


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


def test_output_folders_that_are_files_are_refused_by_every_command(afile, tmp_path, capsys):
    for argv in (["stream", "record", "--out", str(afile)],
                 ["stream", "record", "--out", str(afile / "sub")],
                 ["stream", "--out", str(afile)],
                 ["stream", "check-replay", str(tmp_path), "--out", str(afile)],
                 ["stream", "scale", str(tmp_path), "--out", str(afile)],
                 ["answers", "generate", "--prompts", "2", "--out", str(afile)],
                 ["draft", "train", "--kind", "hydra", "--out", str(afile)],
                 ["draft", "export", "--kind", "eagle3", "--format", "eagle3", "--out", str(afile)],
                 ["figures", "all", "--out", str(afile)],
                 ["reason", "--out", str(afile)],
                 ["reproduce", "--out", str(afile)],
                 ["ltd", "train", "--out", str(afile)],
                 ["ltd", "eval", "--out", str(afile)],
                 ["ltd", "record", "--out", str(tmp_path), "--replay", str(afile)],
                 ["simulate", "regret-sweep", "--out", str(tmp_path)]):
        _refused(argv, capsys, str(afile) if "regret-sweep" not in argv else "is a folder")
    assert afile.read_text() == "not a folder"


def test_missing_input_folders_are_refused_before_any_model_work(tmp_path, capsys):
    rec, out, missing = tmp_path / "rec", tmp_path / "out", tmp_path / "nonexistent"
    rec.mkdir()
    for argv in (["stream", "scale", str(rec), "--protocol", f"x={missing}", "--out", str(out)],
                 ["stream", "--replay", str(rec), "--drafts", str(missing), "--out", str(out)],
                 ["stream", "check-replay", str(rec), "--drafts", str(missing), "--out", str(out)],
                 ["stream", "--replay", str(missing), "--out", str(out)],
                 ["stream", "check-replay", str(missing)],
                 ["stream", "scale", str(missing), "--out", str(out)],
                 ["stream", "--replay", str(rec), "--cost-table", str(missing), "--out", str(out)],
                 ["stream", "record", "--from-answers", str(missing), "--out", str(out)],
                 ["draft", "train", "--kind", "hydra", "--from-recording", str(missing)],
                 ["draft", "train", "--kind", "hydra", "--init-from", str(missing)],
                 ["draft", "export", "--kind", "eagle3", "--format", "eagle3", "--checkpoint", str(missing),
                  "--out", str(out)],
                 ["ltd", "eval", "--env", "replay", "--tune-replay", str(missing), "--out", str(out)],
                 ["simulate", "chain", "--cost", "table", "--cost-table", str(missing)]):
        _refused(argv, capsys, str(missing))
        assert not out.exists(), argv


def test_every_without_an_answer_set_is_refused(tmp_path, capsys):
    from specloop.cli import main
    out = tmp_path / "rec"
    assert main(["stream", "record", "--every", "2", "--out", str(out)]) == 2
    assert "--from-answers" in capsys.readouterr().err
    assert not out.exists()
