"""`specloop generate` refuses bad options in one line with exit code 2, before any
model is loaded. `load_model` is replaced by a
function that fails the test if it is called."""
from __future__ import annotations

import pytest
import torch

from specloop.cli import main
from specloop.realmodels.policy import parse_tree_shape


@pytest.fixture
def no_model(monkeypatch):
    from specloop.realmodels import loading

    def refuse(*args, **kwargs):
        raise AssertionError(f"a model was loaded: {args}")

    monkeypatch.setattr(loading, "load_model", refuse)


def _refused(capsys, *options: str) -> str:
    """Run ``specloop generate`` with ``options``; assert exit 2 and a one-line error."""
    argv = ["generate", *options]
    if "--prompt" not in options:
        argv += ["--prompt", "def square(x):"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("specloop: error:"), err
    return err


@pytest.mark.parametrize("draft", ["eagle3", "hydra", "small-lm"])
def test_tree_deeper_than_its_branching_list_is_refused(no_model, capsys, draft):
    err = _refused(capsys, "--draft", draft, "--tree", "4x2,depth=5")
    assert "depth=5" in err and "4x2x1x1x1" in err


def test_tree_depth_within_the_branching_list_still_parses():
    plan = parse_tree_shape("4x2x1,depth=2")
    assert plan.branching == (4, 2, 1) and plan.max_depth == 2
    with pytest.raises(ValueError, match="deeper"):
        parse_tree_shape("3,depth=2")


def test_zero_max_new_tokens_is_refused_up_front(no_model, capsys):
    assert "--max-new-tokens must be >= 1" in _refused(capsys, "--max-new-tokens", "0")
    assert "--max-new-tokens must be >= 1" in _refused(capsys, "--max-new-tokens", "-3")


def test_bad_device_is_one_line_exit_2(no_model, capsys, monkeypatch):
    assert "unknown device 'bogus'" in _refused(capsys, "--device", "bogus")
    assert "unknown device" in _refused(capsys, "--device", "cuda:x")
    assert "not supported" in _refused(capsys, "--device", "meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available" in _refused(capsys, "--device", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "1 CUDA device" in _refused(capsys, "--device", "cuda:3")


def test_unknown_drafter_lists_the_registered_ones(no_model, capsys):
    err = _refused(capsys, "--draft", "nosuchdrafter")
    assert "unknown drafter 'nosuchdrafter'" in err
    for name in ("ngram", "small-lm", "eagle3", "hydra", "smollm2-135m"):
        assert name in err
    assert "internet" not in err


def test_empty_prompt_and_check_greedy_with_sampling_refused_before_loading(no_model, capsys):
    assert "empty prompt" in _refused(capsys, "--prompt", "   ")
    err = _refused(capsys, "--check-greedy", "--temperature", "0.7")
    assert "--check-greedy" in err and "--temperature 0" in err


def test_sampling_options_refused_before_loading(no_model, capsys):
    assert "top_p" in _refused(capsys, "--temperature", "1", "--top-p", "1.5")
    assert "temperature" in _refused(capsys, "--temperature", "nan")
