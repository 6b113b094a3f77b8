"""The shared frame of a paper experiment: arguments, result files, the results table.

An experiment is a module ``bench/<name>.py`` that defines

* ``EXPERIMENT``: a one-line description naming the paper and its figure or table, and
* ``main(argv: list[str] | None) -> int``, built on :func:`parser` so it accepts
  ``--quick`` (a size that runs in well under a minute, exercised by ``tests/test_bench.py``),
  ``--seeds`` and ``--out DIR``;
* optionally ``NEEDS_DATA = True`` when it reads the MovieLens folder (the test then skips
  with a message where the folder is absent, and fails under CI).

It runs as ``fedrec bench <name>`` or ``python -m bench.<name>``, writes
``<out>/<name>.json`` through :func:`write_result` (figures, the command, machine and date)
and any plot as ``<out>/<name>.png``. Results that have a published counterpart go in the
JSON's ``comparisons`` (see :func:`comparison`); ``fedrec bench table --write`` gathers
them from ``bench/results/`` into BENCHMARKS.md, so no figure there is typed by hand.
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
TABLE_START, TABLE_END = "<!-- results-table:start -->", "<!-- results-table:end -->"
#: when this module was first imported: every experiment imports it at start-up
_STARTED = time.monotonic()


def parser(name: str, doc: str | None, seeds: int = 3) -> argparse.ArgumentParser:
    """An argument parser with the options every experiment shares."""
    ap = argparse.ArgumentParser(prog=f"fedrec bench {name}",
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
    return " ".join(["fedrec bench", name, *map(shlex.quote, map(str, args))])


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


def results_table(folder: Path = RESULTS) -> str:
    """A markdown table of every comparison in ``folder``'s full-size results."""
    lines = ["| experiment | setting | metric | paper | fedrec (mean ± std) | runs | diff "
             "| note | command | date |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("quick"):
            continue
        for row in doc.get("comparisons", []):
            runs = f"{row['runs']}" + (f" (+{row['diverged']} diverged)"
                                       if row.get("diverged") else "")
            diff = "" if row["diff"] is None else f"{row['diff']:+.4f}"
            lines.append(" | ".join([
                f"| {doc['experiment']}", row["what"], row["metric"], _fmt(row["paper"]),
                _fmt(row["mean"], row["std"]), runs, diff, row.get("note", ""),
                f"`{doc['command']}`", f"{doc['machine']['date']} |"]))
    return "\n".join(lines)


def run_time_table(folder: Path = RESULTS) -> str:
    """How long each full-size result took: wall and CPU minutes, and the machine's load."""
    lines = ["| result file | command | wall min | CPU min | 1-min load at the end | date |",
             "|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("quick") or "command" not in doc or "machine" not in doc:
            continue  # a quick run, or not an experiment record (e.g. a tune result)
        rt = doc.get("run_time") or {}
        wall, cpu = rt.get("wall_seconds"), rt.get("cpu_seconds")
        lines.append(" | ".join([
            f"| {path.name}", f"`{doc['command']}`",
            "n/a" if wall is None else f"{wall / 60:.1f}",
            "n/a" if cpu is None else f"{cpu / 60:.1f}",
            f"{doc['machine']['load_1min']}", f"{doc['machine']['date']} |"]))
    return "\n".join(lines)


def write_table(benchmarks: Path = ROOT / "BENCHMARKS.md", folder: Path = RESULTS) -> None:
    """Replace the generated table between the markers of BENCHMARKS.md."""
    text = benchmarks.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"{benchmarks} lacks the markers {TABLE_START} ... {TABLE_END}")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    block = (f"{results_table(folder)}\n\nRun time of each result above (CPU minutes are what "
             "an idle machine needs; the wall time stretches with the load; n/a: written "
             "before run times were recorded):\n\n" f"{run_time_table(folder)}")
    benchmarks.write_text(f"{head}{TABLE_START}\n{block}\n{TABLE_END}{tail}")
