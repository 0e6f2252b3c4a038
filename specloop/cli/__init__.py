"""The `specloop` command.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable taking
the parsed namespace and returning an exit code). Exit codes: 0 success, 1 a
check or target failed, 2 bad input (argparse's convention). docs/cli.md lists every
command and its flags.

Modules:

* `theory_cmd`          -- ``specloop theory optimal-k|check``.
* `simulate_cmd`        -- ``specloop simulate chain|tree``.
* `simulate_online_cmd` -- ``specloop simulate online|regret-sweep``.
* `figures_cmd`         -- ``specloop figures all|NAME ...``.
* `reproduce_cmd`       -- ``specloop reproduce``: every part, and report.md.
* `generate_cmd`        -- ``specloop generate``: one prompt with a real target.
* `draft_cmd`           -- ``specloop draft train|features|export``: offline draft training, export.
* `stream_cmd`          -- ``specloop stream``: a real prompt stream, frozen and online drafts.
* `stream_record_cmd`   -- ``specloop stream record``: the target's side of a stream, once.
* `stream_check_cmd`    -- ``specloop stream check-replay``: a replay against the real decoder.
* `stream_scale_cmd`    -- ``specloop stream scale``: the online-at-scale grid.
* `_online_flags`       -- the online-adaptation flags shared by the stream commands.
* `_paths`              -- up-front checks of path arguments (refused in one line before any work).
* `_progress`           -- progress bars of resumable commands.
* `answers_cmd`         -- ``specloop answers generate|info``: answer sets.
* `ltd_cmd`             -- ``specloop ltd record|train|eval``.
* `ltd_replay_cmd`      -- back ends of ``ltd record`` and ``ltd train|eval --env replay``.
* `reason_cmd`          -- ``specloop reason``: Lookahead Reasoning and Online-LR.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command modules, in help order. Add a module here to add a command.
COMMAND_MODULES = [
    "specloop.cli.theory_cmd",
    "specloop.cli.figures_cmd",
    "specloop.cli.reproduce_cmd",
    "specloop.cli.simulate_cmd",
    "specloop.cli.ltd_cmd",
    "specloop.cli.draft_cmd",
    "specloop.cli.generate_cmd",
    "specloop.cli.stream_cmd",
    "specloop.cli.answers_cmd",
    "specloop.cli.reason_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specloop",
        description="Speculative decoding whose drafts learn from the verifier.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"specloop: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
