"""The ``fedrec`` command line. Each sub-command lives in :mod:`app.commands`."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys

# One module per sub-command; each exposes register(subparsers) and sets func=run(args)->int.
# The help line is repeated here so that `fedrec --help` (and a command's own run) imports
# only what it needs: a command's module is imported when it is the one chosen, or for the
# full parser (tests/test_cli.py checks that these lines equal the modules' own).
COMMANDS = {
    "simulate": ("app.commands.simulate", "simulate a federation in-process on a ratings file"),
    "tune": ("app.commands.tune",
             "choose hyper-parameters on a validation carve-out of the training ratings"),
    "serve": ("app.commands.serve", "run the HTTP API (migrates the database first)"),
    "migrate": ("app.commands.migrate", "create or upgrade the database schema"),
    "demo": ("app.commands.demo", "run the whole product end to end on embedded defaults"),
    "cluster": ("app.commands.cluster", "federated ONMF clustering on synthetic data"),
    "doctor": ("app.commands.doctor", "check the database, migrations, broker, workers and beat"),
    "agent": ("agent.cli", "run a tenant agent: train where the data is"),
    "agent-demo": ("app.commands.agent_demo",
                   "a coordinator for tenant agents, with its tenants and job set up"),
    "admin": ("app.commands.admin", "manage tenants, API keys, items and jobs over the API"),
    "jobs": ("app.commands.admin", "training jobs (as 'fedrec admin jobs')"),
}
ALL = "*"
#: commands that left the product, with what to run instead
MOVED = {"bench": "benchmarks run from a source checkout of fedrec as `python -m bench "
                  "list|<name>|table` (they are not part of the installed package)"}
#: the two kinds of model, as ``fedrec --help`` ends (docs/explanation/ranking-vs-rating.md
#: says the same, word for word: tests/test_cli.py checks it)
MODEL_KINDS = (
    "Two kinds of model. Ranking models (ials, dp-ials) learn which items users choose and "
    "serve the top-k lists; they are tuned and stopped by NDCG@10 and reported by precision "
    "and NDCG@10 beside a most-popular list. Rating models (fedmc-admm, fedmavg, rfrec, "
    "dpals, ...) predict rating values and feed the RMSE reports; they are tuned and "
    "stopped by RMSE. The default job trains one of each (dp-ials for the lists, dpals for "
    "the ratings); a model that loses to popularity on held-out data does not serve lists.")


GLOBAL_OPTIONS = {"--url": "1", "--token": "1", "--json": "?"}
"""Options a command shares with its siblings (the API commands' service, credential and
JSON output): accepted anywhere on the line, before or after the sub-commands; "?": the
value is optional (``--json`` alone means stdout)."""
_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)")


def suggestion(word: str, candidates) -> str:
    """" (did you mean X?)" for the closest of ``candidates`` to ``word``, else ""."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class FedrecParser(argparse.ArgumentParser):
    """A parser whose errors suggest the closest sub-command or option."""

    def error(self, message: str):
        found = _CHOICE.search(message)
        if found:
            choices = re.findall(r"'([^']*)'", found["choices"])
            message += suggestion(found["word"], choices)
        super().error(message)

    def unrecognized(self, extras: list[str]):
        """Refuse ``extras`` with this (sub-)command's usage, suggesting close options."""
        options = [o for a in self._actions for o in a.option_strings]
        hints = [f"{e}{suggestion(e.split('=', 1)[0], options)}" for e in extras]
        self.error("unrecognized arguments: " + " ".join(hints))


class CommandParser(FedrecParser):
    """A sub-command's parser. A command whose options depend on an earlier choice sets
    ``late_options(parser, args)``: it runs on the command's own arguments just before they
    are parsed, so ``fedrec simulate --algorithm X --help`` lists X's options only."""

    late_options = None

    def parse_known_args(self, args=None, namespace=None):
        if self.late_options is not None:
            self.late_options(self, sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("fedrec")
    except PackageNotFoundError:  # a source tree that was not installed
        return "unknown (not installed)"


def build_parser(command: str = ALL) -> argparse.ArgumentParser:
    """The whole command line (``command`` ALL), or one whose only full sub-command is
    ``command``: the others are listed by name and help line, their modules not imported."""
    parser = FedrecParser(
        prog="fedrec", description="Privacy-focused federated recommender. The API "
        "commands' --url, --token and --json may be given anywhere on the line; --json "
        "alone writes JSON to stdout.", epilog=MODEL_KINDS)
    parser.add_argument("--version", action="version", version=f"fedrec {version()}")
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="log lines as text or JSON objects (default: FEDREC_LOG_FORMAT, "
                             "else text); applies to serve and to the commands' own logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CommandParser)
    if command in COMMANDS:  # its module first: it may register more than one command
        importlib.import_module(COMMANDS[command][0]).register(sub)
    for name, (module, help_line) in COMMANDS.items():
        if name in sub.choices:
            continue
        if command == ALL:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_line, add_help=False)
    return parser


def chosen_command(argv: list[str]) -> str | None:
    """The sub-command named in ``argv`` (after the global options), if any."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option == "--log-format" and rest:
            rest.pop(0)
        elif GLOBAL_OPTIONS.get(option) == "1" and rest:
            rest.pop(0)
        elif GLOBAL_OPTIONS.get(option) == "?" and rest and rest[0] not in COMMANDS \
                and not rest[0].startswith("-"):
            rest.pop(0)
    return rest[0] if rest else None


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                None)


def _takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    action = parser._option_string_actions.get(option)
    return action is not None and action.nargs not in (0, "?") and "=" not in option


def _global(argv: list[str], i: int, sub) -> list[str]:
    """The global option at ``argv[i]`` with its value, if it has one."""
    token = argv[i]
    if "=" in token or i + 1 >= len(argv):
        return [token]
    following = argv[i + 1]
    if GLOBAL_OPTIONS[token] == "?" and (following.startswith("-") or following in sub.choices):
        return [token]
    return [token, following]


def arrange(parser: argparse.ArgumentParser, argv: list[str]
            ) -> tuple[list[str], argparse.ArgumentParser]:
    """``argv`` with the :data:`GLOBAL_OPTIONS` given before the last sub-command moved
    after it (where argparse reads them), and the parser of that last sub-command."""
    out, moved, current, i = [], [], parser, 0
    while i < len(argv):
        token, sub = argv[i], _subcommands(current)
        if sub is None:  # the leaf: the rest is its own
            out += argv[i:]
            break
        if token.split("=", 1)[0] in GLOBAL_OPTIONS:
            taken = _global(argv, i, sub)
            moved += taken
            i += len(taken)
            continue
        out.append(token)
        i += 1
        if token.startswith("-"):
            if _takes_value(current, token) and i < len(argv):
                out.append(argv[i])
                i += 1
        elif token in sub.choices:
            current = sub.choices[token]
        else:
            out += argv[i:]
            break
    return out + moved, current


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line parsed: global options anywhere, unknown options refused by the
    sub-command they were given to, with the closest option suggested."""
    parser = build_parser(chosen_command(argv) or "")
    argv, leaf = arrange(parser, argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        leaf.unrecognized(extras)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["agent"]:  # a tenant's machine: none of the server's modules
        from agent.cli import main as agent_main

        return agent_main(argv)
    if chosen_command(argv) in MOVED:
        print(f"fedrec {chosen_command(argv)}: {MOVED[chosen_command(argv)]}", file=sys.stderr)
        return 2
    args = parse(argv)
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
