"""``fedrec bench``: run one of the papers' experiments, list them, or build the table.

    fedrec bench list                      # every experiment, one line each
    fedrec bench <name> [--quick] [...]    # run it; options: fedrec bench <name> --help
    fedrec bench table [--write]           # paper vs fedrec table from bench/results/

An experiment is a module of the ``bench`` package that defines ``EXPERIMENT`` (see
``bench/_experiment.py``); results go to ``bench/results/<name>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from types import ModuleType


def experiments() -> dict[str, ModuleType]:
    """Every module of ``bench`` that declares ``EXPERIMENT``, by name."""
    import bench

    found = {}
    for info in pkgutil.iter_modules(bench.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{info.name}")
        if isinstance(getattr(module, "EXPERIMENT", None), str):
            found[info.name] = module
    return dict(sorted(found.items()))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run the papers' experiments (fedrec bench list)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="an experiment name, 'list' or 'table'")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the experiment")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.experiment == "list":
        for name, module in experiments().items():
            print(f"{name:28s} {module.EXPERIMENT}")
        return 0
    if args.experiment == "table":
        from bench import _experiment

        if args.args == ["--write"]:
            _experiment.write_table()
            print("BENCHMARKS.md: results table rewritten from bench/results/")
        else:
            print(_experiment.results_table())
        return 0
    found = experiments()
    if args.experiment not in found:
        raise ValueError(f"unknown experiment {args.experiment!r}; "
                         f"choose from: {', '.join(found)} (or list, table)")
    from app.commands.output import runs_bar

    with runs_bar(f"bench {args.experiment}"):  # on a terminal: each run's rounds
        return int(found[args.experiment].main(args.args) or 0)
