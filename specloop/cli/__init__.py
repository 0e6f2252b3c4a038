"""The `specloop` command.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable taking
the parsed namespace and returning an exit code). Exit codes: 0 success, 1 a
check or target failed, 2 bad input (argparse's convention).
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
