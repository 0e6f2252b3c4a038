"""The progress bars of resumable commands start at the work already done."""
from __future__ import annotations

from specloop.cli._progress import ResumedBar


def test_a_resumed_bar_starts_at_the_finished_count(capsys):
    bar = ResumedBar("answers", quiet=False)
    bar.progress(30, 100)                    # the first call: what the folder already holds
    assert bar.bar.n == 30 and bar.bar.initial == 30 and bar.bar.total == 100
    bar.progress(34, 100)
    assert bar.bar.n == 34
    bar.close()
    assert "34/100" in capsys.readouterr().err
    quiet = ResumedBar("answers", quiet=True)
    quiet.progress(0, 5)
    quiet.close()
