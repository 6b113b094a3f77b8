"""The shared frame of a paper experiment: arguments, result files, the results table.

An experiment is a module ``bench/<name>.py`` that defines

* ``EXPERIMENT``: a one-line description naming the paper and its figure or table, and
* ``main(argv: list[str] | None) -> int``, built on :func:`parser` so it accepts
  ``--quick`` (a size that runs in well under a minute, exercised by ``tests/test_bench.py``),
  ``--seeds`` and ``--out DIR``;
* optionally ``NEEDS_DATA = True`` when it reads the MovieLens folder (the test then skips
  with a message where the folder is absent, and fails under CI).
* optionally ``QUICK_TEST = "tests/<file>.py"`` when its ``--quick`` run needs the
  services and takes minutes: that integration test runs it instead of
  ``tests/test_bench.py``.

It runs from a source checkout as ``python -m bench <name>`` (or ``python -m
bench.<name>``), writes ``<out>/<name>.json`` through :func:`write_result` (figures, the
command, machine and date) and any plot as ``<out>/<name>.png``. Results that have a
published counterpart go in the JSON's ``comparisons`` (see :func:`comparison`);
``python -m bench table --write`` generates BENCHMARKS.md from ``bench/results/``
(:func:`benchmarks_page`), so no figure there is typed by hand; what each experiment
means is on its page, ``docs/benchmarks/<name>.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
PAGES = ROOT / "docs" / "benchmarks"
#: how the lab is run; results written before it left the product name the old command
LAB, OLD_LAB = "python -m bench", "fedrec bench"
#: when this module was first imported: every experiment imports it at start-up
_STARTED = time.monotonic()


def parser(name: str, doc: str | None, seeds: int = 3) -> argparse.ArgumentParser:
    """An argument parser with the options every experiment shares."""
    ap = argparse.ArgumentParser(prog=f"{LAB} {name}",
                                 description=(doc or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a small size that runs in under a minute (used by the tests)")
    ap.add_argument("--seeds", type=int, default=seeds,
                    help=f"number of seeds (0, 1, ...) to average over (default {seeds})")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="folder for <name>.json and <name>.png (default bench/results)")
    return ap


def machine() -> dict[str, Any]:
    """Where and when a figure was measured."""
    try:
        with open("/proc/meminfo") as fh:
            mem_kib = int(fh.readline().split()[1])
    except OSError:
        mem_kib = 0
    return {"date": _dt.date.today().isoformat(), "cores": os.cpu_count(),
            "memory_gib": round(mem_kib / 2**20, 1), "system": platform.system(),
            "machine": platform.machine(), "python": platform.python_version(),
            "load_1min": round(os.getloadavg()[0], 2), "commit": _commit()}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def command(name: str, argv: list[str] | None) -> str:
    """The command line that reproduces a run."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join([LAB, name, *map(shlex.quote, map(str, args))])


def comparison(what: str, metric: str, paper: float | None, values: list[float],
               note: str = "", lower_is_better: bool = True) -> dict[str, Any]:
    """One row of the results table: the paper's figure beside ours over seeds."""
    clean = [float(v) for v in values if v is not None and math.isfinite(v)]
    mean = statistics.fmean(clean) if clean else None
    std = statistics.stdev(clean) if len(clean) > 1 else 0.0 if clean else None
    diff = None if paper is None or mean is None else mean - paper
    return {"what": what, "metric": metric, "paper": paper, "mean": mean, "std": std,
            "runs": len(clean), "diverged": len(values) - len(clean), "diff": diff,
            "lower_is_better": lower_is_better, "note": note}


def write_result(out: Path, name: str, argv: list[str] | None, quick: bool,
                 payload: dict[str, Any], stem: str | None = None) -> Path:
    """Write ``<out>/<stem>.json`` (``stem`` defaults to ``name``; another stem keeps a
    variant such as ``--paper-size`` beside the default run) with the payload, the
    command and the machine."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {"experiment": name, "command": command(name, argv), "quick": quick,
           "machine": machine(), "run_time": run_time(), **payload}
    path = out / f"{stem or name}.json"
    path.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    return path


def run_time() -> dict[str, float]:
    """Wall and CPU seconds of this run so far (CPU: this process and its waited-for children).

    On a busy machine the wall time stretches with the load while the CPU time hardly
    moves, so the CPU time is what says how long the run takes on an idle machine.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    return {"wall_seconds": round(time.monotonic() - _STARTED, 1),
            "cpu_seconds": round(cpu, 1)}


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Lay out, write and close a matplotlib figure (every experiment's PNG)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _fmt(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"
    return f"{text} ± {std:.4f}" if std else text


def shown_command(command: str) -> str:
    """``command`` as it runs today (a result written as ``fedrec bench X`` runs as
    ``python -m bench X``)."""
    return LAB + command[len(OLD_LAB):] if command.startswith(OLD_LAB + " ") else command


def _experiment_cell(name: str) -> str:
    """The experiment's name, linked to its page when it has one."""
    page = PAGES / f"{name}.md"
    return f"[{name}](docs/benchmarks/{name}.md)" if page.exists() else name


def _producer(stem: str) -> str:
    """The bench module that writes result file ``stem`` (its longest-named prefix), else
    ``stem``."""
    modules = sorted((p.stem for p in Path(__file__).parent.glob("[!_]*.py")), key=len,
                     reverse=True)
    return next((m for m in modules if stem == m or stem.startswith(m + "_")), stem)


def _results(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every full-size experiment record in ``folder`` (not quick runs, not JSON lines)."""
    docs = [(path, json.loads(path.read_text())) for path in sorted(folder.glob("*.json"))]
    return [(path, doc) for path, doc in docs if not doc.get("quick")]


def results_table(folder: Path = RESULTS) -> str:
    """A markdown table of every comparison in ``folder``'s full-size results."""
    lines = ["| experiment | setting | metric | paper | fedrec (mean ± std) | runs | diff "
             "| note | command | date |", "|---|---|---|---|---|---|---|---|---|---|"]
    for _, doc in _results(folder):
        for row in doc.get("comparisons", []):
            runs = f"{row['runs']}" + (f" (+{row['diverged']} diverged)"
                                       if row.get("diverged") else "")
            diff = "" if row["diff"] is None else f"{row['diff']:+.4f}"
            lines.append(" | ".join([
                f"| {_experiment_cell(doc['experiment'])}", row["what"], row["metric"],
                _fmt(row["paper"]), _fmt(row["mean"], row["std"]), runs, diff,
                row.get("note", ""), f"`{shown_command(doc['command'])}`",
                f"{doc['machine']['date']} |"]))
    return "\n".join(lines)


def other_results_table(folder: Path = RESULTS) -> str:
    """The result files that hold no paper comparison (measurements of fedrec alone:
    audits, costs, load, rankings, tuning runs): where they are and what wrote them."""
    lines = ["| result file | experiment | command | date |", "|---|---|---|---|"]
    for path, doc in _results(folder):
        if doc.get("comparisons"):
            continue
        name = doc.get("experiment") or _producer(path.stem)
        command = f"`{shown_command(doc['command'])}`" if "command" in doc else \
            f"`{LAB}.{name}` (see its page)"
        date = (doc.get("machine") or {}).get("date", "n/a")
        lines.append(f"| [{path.name}](bench/results/{path.name}) | "
                     f"{_experiment_cell(name)} | {command} | {date} |")
    for path in sorted(folder.glob("*.jsonl")):
        name = _producer(path.stem)
        lines.append(f"| [{path.name}](bench/results/{path.name}) | "
                     f"{_experiment_cell(name)} | `{LAB}.{name}` (one JSON line a "
                     "run; see its page) | n/a |")
    return "\n".join(lines)


def ranking_table(folder: Path = RESULTS) -> str:
    """Every row of the top-k ranking results (``ranking_<data>.json``, written by
    ``bench/ranking.py``): the lists' precision, recall and NDCG@k, catalogue coverage,
    the share of top-k slots on items with fewer than 5 training ratings, and the fit's
    wall seconds, beside the popularity rows of the same split."""
    lines = ["| data | row | P@10 | R@10 | NDCG@10 | coverage | top-10 slots on items with "
             "< 5 training ratings | seconds | command |", "|---|---|---|---|---|---|---|---|---|"]
    for _path, doc in _results(folder):
        if doc.get("experiment") != "ranking" or not doc.get("rows"):
            continue
        for row in doc["rows"]:
            lines.append(" | ".join([
                f"| {row['data']}", row["row"] + ("" if row.get("popularity_prior") is None
                                                  else f" (prior {row['popularity_prior']:g})"),
                f"{row['precision_at_k']:.4f}",
                f"{row['recall_at_k']:.4f}", f"{row['ndcg_at_k']:.4f}",
                f"{row['coverage']:.3f}", f"{100 * row['rare_slot_share']:.2f}%",
                f"{row['seconds']:.1f}", f"`{shown_command(doc['command'])}` |"]))
    return "\n".join(lines)


def run_time_table(folder: Path = RESULTS) -> str:
    """How long each full-size result took: wall and CPU minutes, and the machine's load."""
    lines = ["| result file | command | wall min | CPU min | 1-min load at the end | date |",
             "|---|---|---|---|---|---|"]
    for path, doc in _results(folder):
        if "command" not in doc or "machine" not in doc:
            continue  # not an experiment record (e.g. a tune result)
        rt = doc.get("run_time") or {}
        wall, cpu = rt.get("wall_seconds"), rt.get("cpu_seconds")
        lines.append(" | ".join([
            f"| {path.name}", f"`{shown_command(doc['command'])}`",
            "n/a" if wall is None else f"{wall / 60:.1f}",
            "n/a" if cpu is None else f"{cpu / 60:.1f}",
            f"{doc['machine']['load_1min']}", f"{doc['machine']['date']} |"]))
    return "\n".join(lines)


def benchmarks_page(folder: Path = RESULTS) -> str:
    """BENCHMARKS.md: every figure of ``folder``'s full-size results, with its command."""
    return f"""# Benchmarks

Generated by `{LAB} table --write` from `bench/results/*.json`; do not edit by hand
(`tests/test_bench.py` fails when this file differs from a fresh generation). Every row
names the command that produced it, run from a source checkout of fedrec (`bench/` is the
lab: it is not part of the installed package). What each experiment measures and what its
result means: [docs/benchmarks/](docs/benchmarks/index.md).

## fedrec beside the papers

`paper`: the published figure; `fedrec`: the mean ± standard deviation over the runs
(seeds); `diff`: fedrec minus paper.

{results_table(folder)}

## Results without a published counterpart

Measurements of fedrec alone (audits, costs, load, ranking lists, tuning runs); their
figures are in the file and on the experiment's page.

{other_results_table(folder)}

## Top-k ranking

The protocol of `algorithms/ranking.py` (80/20 split seed 0, 100 tenants, k = 10, a
held-out rating at or above 62.5% of the scale relevant, training items excluded; delta
1e-6 for the DP rows, one noise draw each); seconds are wall time of the fit on a shared
machine (compare rows of one data set only). What the rows mean:
[docs/benchmarks/ranking.md](docs/benchmarks/ranking.md).

{ranking_table(folder)}

## Run time

CPU minutes are what an idle machine needs; the wall time stretches with the load; n/a:
written before run times were recorded.

{run_time_table(folder)}
"""


def write_table(benchmarks: Path = BENCHMARKS, folder: Path = RESULTS) -> None:
    """Write BENCHMARKS.md afresh from ``folder``'s results (:func:`benchmarks_page`)."""
    benchmarks.write_text(benchmarks_page(folder))
