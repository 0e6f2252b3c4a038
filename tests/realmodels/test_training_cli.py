"""`specloop draft` argument handling and the trainer registry (no training here;
training itself is exercised in test_heads_eagle.py)."""
from __future__ import annotations

import argparse

import pytest

from specloop.cli import build_parser, main
from specloop.realmodels.training.trainer import TrainConfig, get_trainer, register_trainer, trainer_kinds


def test_draft_train_arguments_map_to_train_config():
    from specloop.cli.draft_cmd import _train_config
    args = build_parser().parse_args(["draft", "train", "--kind", "eagle3", "--steps", "7", "--tokens", "5000",
                                      "--ttt-steps", "4", "--vocab-size", "512", "--time-limit", "9"])
    cfg = _train_config(args)
    assert (cfg.kind, cfg.steps, cfg.tokens, cfg.ttt_steps, cfg.draft_vocab_size, cfg.time_limit_s) == \
        ("eagle3", 7, 5000, 4, 512, 9.0)
    quick = _train_config(build_parser().parse_args(["draft", "train", "--kind", "eagle", "--quick"]))
    assert quick.quick and quick.feature_root.endswith("smollm2-135m-quick") and quick.steps < cfg.steps * 100


def test_init_from_pretrained_names_a_folder_with_the_shipped_draft():
    from pathlib import Path

    from specloop.cli.draft_cmd import _train_config
    from specloop.realmodels.heads.common import find_draft, pretrained_path
    cfg = _train_config(build_parser().parse_args(["draft", "train", "--kind", "hydra", "--init-from", "pretrained"]))
    found = find_draft("smollm2-135m", "hydra", cfg.init_from)
    assert found == Path(cfg.init_from) / "draft.safetensors"
    assert found.read_bytes() == pretrained_path("smollm2-135m", "hydra").read_bytes()
    assert main(["draft", "train", "--kind", "hydra", "--target", "no-such-target", "--init-from", "pretrained"]) == 2


def test_draft_train_rejects_unknown_kind_and_bad_values(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["draft", "train", "--kind", "nope"])
    assert exc.value.code == 2
    assert main(["draft", "train", "--kind", "eagle", "--steps", "0"]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err


def test_trainer_registry():
    assert {"eagle", "eagle3", "medusa", "hydra", "small-lm"} <= set(trainer_kinds())
    from specloop.realmodels.training.train_eagle import train_eagle
    assert get_trainer("eagle") is train_eagle and get_trainer("eagle3") is train_eagle
    with pytest.raises(ValueError, match="no trainer"):
        get_trainer("does-not-exist")
    with pytest.raises(ValueError, match="already registered"):
        register_trainer("eagle", lambda config, **kw: {})
    with pytest.raises(ValueError):
        TrainConfig(window=2)
    with pytest.raises(ValueError):
        TrainConfig(lr=float("nan"))
