"""The ``fedrec`` command line. Each sub-command lives in :mod:`app.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# One module per sub-command; each exposes register(subparsers) and sets func=run(args)->int.
COMMANDS = [
    "app.commands.simulate",
    "app.commands.tune",
    "app.commands.serve",
    "app.commands.migrate",
    "app.commands.demo",
    "app.commands.cluster",
    "app.commands.bench",
    "app.commands.doctor",
    "agent.cli",
    "app.commands.agent_demo",
    "app.commands.admin",
]


class CommandParser(argparse.ArgumentParser):
    """A sub-command's parser. A command whose options depend on an earlier choice sets
    ``late_options(parser, args)``: it runs on the command's own arguments just before they
    are parsed, so ``fedrec simulate --algorithm X --help`` lists X's options only."""

    late_options = None

    def parse_known_args(self, args=None, namespace=None):
        if self.late_options is not None:
            self.late_options(self, sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedrec", description="Privacy-focused federated recommender.")
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="log lines as text or JSON objects (default: FEDREC_LOG_FORMAT, "
                             "else text); applies to serve and to the commands' own logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CommandParser)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["agent"]:  # a tenant's machine: none of the server's modules
        from agent.cli import main as agent_main

        return agent_main(argv)
    args = build_parser().parse_args(argv)
    if args.log_format is not None:  # before any command reads the settings
        os.environ["FEDREC_LOG_FORMAT"] = args.log_format
        from app.config import get_settings

        get_settings.cache_clear()
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fedrec {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
