"""One writer per results folder: a second writer fails at once naming the holder,
the lock dies with its holder, and a grid job on a folder another process is writing
fails instead of appending the same rounds twice."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from specloop._folder_lock import FolderInUseError, folder_lock


def test_second_writer_is_refused_and_the_lock_is_released(tmp_path):
    with folder_lock(tmp_path / "m"):
        with pytest.raises(FolderInUseError, match="another process"):
            with folder_lock(tmp_path / "m"):
                pass
    with folder_lock(tmp_path / "m"):                # released on exit
        pass
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / ".lock").write_text("999999999")   # a dead holder's file blocks nobody
    with folder_lock(tmp_path / "stale"):
        assert (tmp_path / "stale" / ".lock").read_text() != "999999999"
    assert not (tmp_path / "stale" / ".lock").exists()       # a normal exit leaves the folder clean


def test_lock_held_by_another_process_dies_with_it(tmp_path):
    code = ("import sys, time; from specloop._folder_lock import folder_lock\n"
            f"with folder_lock({str(tmp_path / 'm')!r}):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError, match=f"pid {holder.pid}"):
            with folder_lock(tmp_path / "m"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(tmp_path / "m"):                # the kernel dropped the killed holder's lock
        pass


def test_a_grid_job_on_a_folder_being_written_fails(tmp_path):
    from tests.realmodels.scale_util import record_tiny
    from specloop.realmodels.streams.scale import GridSettings, plan_jobs, run_grid
    record_tiny(tmp_path / "rec", count=2)
    jobs = plan_jobs({"p": None}, ["suffix"], chunk=2)
    settings = GridSettings(recording=str(tmp_path / "rec"), out=str(tmp_path / "out"), every=1,
                            num_draft_tokens=3, target_loader="tests.realmodels.scale_util:tiny_target")
    with folder_lock(jobs[0].folder(settings.out) / "suffix"):
        result = run_grid(jobs, settings, backend="serial")[jobs[0]]
    assert isinstance(result, FolderInUseError)
    assert not (jobs[0].folder(settings.out) / "suffix" / "rounds.jsonl").exists()
    assert run_grid(jobs, settings, backend="serial")[jobs[0]]["prompts_done"] == 2


def test_a_second_recorder_on_one_folder_is_refused(tmp_path):
    from tests.realmodels.scale_util import record_tiny
    with folder_lock(tmp_path / "rec"):
        with pytest.raises(FolderInUseError):
            record_tiny(tmp_path / "rec", count=2)
    assert not list((tmp_path / "rec").glob("shard-*.npz"))
    record_tiny(tmp_path / "rec", count=2)
    assert list((tmp_path / "rec").glob("shard-*.npz"))


def test_a_folder_that_is_a_file_is_refused_in_one_line(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    for folder in (afile, afile / "sub"):
        with pytest.raises(ValueError, match="is not a folder"):
            with folder_lock(folder):
                pass
    assert afile.read_text() == "x"
