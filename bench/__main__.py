"""The lab's entry point, run from a source checkout (``bench/`` is not in the wheel):

    python -m bench list                      # every experiment, one line each
    python -m bench <name> [--quick] [...]    # run it; options: python -m bench <name> --help
    python -m bench table [--write]           # the results table from bench/results/;
                                              # --write regenerates BENCHMARKS.md

An experiment is a module of the ``bench`` package that defines ``EXPERIMENT`` (see
``bench/_experiment.py``); results go to ``bench/results/<name>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

import bench


def experiments() -> dict[str, ModuleType]:
    """Every module of ``bench`` that declares ``EXPERIMENT``, by name."""
    found = {}
    for info in pkgutil.iter_modules(bench.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{info.name}")
        if isinstance(getattr(module, "EXPERIMENT", None), str):
            found[info.name] = module
    return dict(sorted(found.items()))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="an experiment name, 'list' or 'table'")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the experiment")
    return p


def run(experiment: str, rest: list[str]) -> int:
    if experiment == "list":
        for name, module in experiments().items():
            print(f"{name:28s} {module.EXPERIMENT}")
        return 0
    if experiment == "table":
        from bench import _experiment

        if rest == ["--write"]:
            _experiment.write_table()
            print("BENCHMARKS.md: regenerated from bench/results/")
        elif rest:
            raise ValueError(f"table takes only --write, not {' '.join(rest)!r}")
        else:
            print(_experiment.benchmarks_page(), end="")
        return 0
    found = experiments()
    if experiment not in found:
        raise ValueError(f"unknown experiment {experiment!r}; "
                         f"choose from: {', '.join(found)} (or list, table)")
    from app.commands.output import runs_bar

    with runs_bar(f"bench {experiment}"):  # on a terminal: each run's rounds
        return int(found[experiment].main(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args.experiment, args.args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m bench {args.experiment}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
