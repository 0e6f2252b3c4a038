"""`specloop.realmodels.streams.results`: the stream's result object and plot as a
library (the CLI and the figure read its return value), with the CLI's defaults."""
from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from specloop.realmodels.streams.runner import BASELINE, StreamConfig
from specloop.realmodels.streams.results import (STREAM_ONLINE_DEFAULTS, StreamRun, plot_stream, serve_stream,
                                                 stream_result)


def _stream_defaults() -> argparse.Namespace:
    from specloop.cli import stream_cmd
    parser = argparse.ArgumentParser()
    stream_cmd.register(parser.add_subparsers())
    return parser.parse_args(["stream"])


def test_online_defaults_are_the_cli_flag_defaults():
    args = _stream_defaults()
    assert STREAM_ONLINE_DEFAULTS == {k: getattr(args, k) for k in STREAM_ONLINE_DEFAULTS}


def test_the_cli_result_is_the_library_result():
    from specloop.cli.stream_cmd import _result
    chunk = {"mean_accepted_length": 2.0, "tokens_per_s": 10.0, "tokens_per_s_with_training": 8.0}
    summary = {"mean_accepted_length": 2.0, "tokens_per_s": 10.0, "tokens_per_s_with_training": 8.0,
               "update_seconds": 1.0, "chunks": [chunk]}
    items = [SimpleNamespace(dataset="humaneval")]
    summaries = {BASELINE: {**summary, "tokens_per_s": 5.0}, "opt-hydra": summary}
    args = SimpleNamespace(target="t", datasets="humaneval", order="shift", drafts="d")
    lib = stream_result(summaries, {}, items, StreamConfig(chunk=1), target="t", datasets="humaneval",
                        order="shift", drafts="d")
    assert _result(summaries, {}, items, StreamConfig(chunk=1), args) == lib
    assert lib["config"]["drafts"] == "d" and lib["methods"]["opt-hydra"]["speedup"] == 2.0
    with pytest.raises(KeyError):
        stream_result({"opt-hydra": summary}, {}, items, StreamConfig(chunk=1), target="t", datasets="x",
                      order="shift")


def test_bad_methods_fail_before_the_target_loads(tmp_path, monkeypatch):
    import specloop.realmodels.loading as loading

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(loading, "load_model", no_load)
    for methods, match in ((("",), "no method"), (("turbo",), "unknown method")):
        with pytest.raises(ValueError, match=match):
            serve_stream(StreamRun(methods=methods, config=StreamConfig(), out=tmp_path, target="t"))


def test_default_target_is_the_registrys_first_name(tmp_path):
    from specloop.realmodels.loading import registry_names
    assert StreamRun(methods=("hydra",), config=StreamConfig(), out=Path(tmp_path)).target == registry_names()[0]


def test_plot_writes_a_png(tmp_path):
    result = {"target": "t", "methods": {"hydra": {"label": "Hydra", "per_chunk": [1.5, 1.6],
                                                   "per_chunk_tokens_per_s": [3.0, 3.1]}},
              "baseline_per_chunk_tokens_per_s": [2.0, 2.0], "stream": ["a", "a", "b", "b"],
              "config": {"chunk": 2, "datasets": "a,b", "order": "shift"}}
    assert plot_stream(result, tmp_path / "x" / "s.png").stat().st_size > 0
