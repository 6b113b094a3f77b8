"""The ``fedrec`` command line. Each sub-command lives in :mod:`app.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

# One module per sub-command; each exposes register(subparsers) and sets func=run(args)->int.
COMMANDS = [
    "app.commands.simulate",
    "app.commands.serve",
    "app.commands.migrate",
    "app.commands.demo",
    "app.commands.cluster",
    "app.commands.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedrec", description="Privacy-focused federated recommender.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fedrec {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
