"""Where a command's JSON goes (``--json FILE`` or ``--json -``) and its progress bars.

``--json -`` writes the JSON document, and nothing else, to stdout: the command's human
output goes to stderr meanwhile. Progress bars (rich) are drawn on stderr only when it is
a terminal, so pipes, logs, CI and ``--json -`` output never hold them.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedrec.client import progress_enabled

STDOUT = "-"


def is_stdout(target: Path | str | None) -> bool:
    return target is not None and str(target) == STDOUT


@contextlib.contextmanager
def json_output(target: Path | str | None) -> Iterator[Callable[[Any], None]]:
    """Yields ``write(document)``: to the file ``target``, to stdout for ``-`` (the block's
    other prints go to stderr), nowhere for None."""
    if not is_stdout(target):
        def write_file(document: Any) -> None:
            if target is not None:
                Path(target).write_text(json.dumps(document, indent=2))
        yield write_file
        return
    real = sys.stdout

    def write_stdout(document: Any) -> None:
        real.write(json.dumps(document, indent=2) + "\n")
        real.flush()
    with contextlib.redirect_stdout(sys.stderr):
        yield write_stdout


class RoundsBar:
    """A rich progress bar of rounds on stderr (a no-op off a terminal):
    ``bar.update(done, text)`` after each round, ``bar.close()`` at the end."""

    def __init__(self, total: int, label: str = "rounds") -> None:
        self.progress = None
        if not progress_enabled():
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[text]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
        self.task = self.progress.add_task(label, total=total, text="")
        self.progress.start()

    def update(self, done: int, text: str = "", total: int | None = None) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done, text=text,
                                 **({"total": total} if total is not None else {}))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


@contextlib.contextmanager
def runs_bar(label: str) -> Iterator[None]:
    """A :class:`RoundsBar` following every training run driven inside the block
    (:func:`algorithms.simulate.watch_rounds`): the run's number, its round and latest
    test RMSE. Off a terminal nothing is drawn and nothing is watched."""
    if not progress_enabled():
        yield
        return
    import math

    from algorithms.simulate import watch_rounds

    bar, state = RoundsBar(1, label), {"runs": 0, "last": 0}

    def seen(k: int, rounds: int, record: Any) -> None:
        if k <= state["last"] or state["runs"] == 0:
            state["runs"] += 1
        state["last"] = k
        rmse = getattr(record, "test_rmse", None)
        text = f"run {state['runs']}" + (f"  test RMSE {rmse:.4f}" if isinstance(
            rmse, float) and math.isfinite(rmse) else "")
        bar.update(k, text, total=rounds)
    try:
        with watch_rounds(seen):
            yield
    finally:
        bar.close()


def _num(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:.3f}"


def spend_line(lifetime: dict[str, Any]) -> str:
    """A tenant's spend side by side: the job's epsilon at the delta it asked for, the same
    spend at the budget's delta, and the budget (spent and remaining at its delta)."""
    job = lifetime["this_job"]
    asked = "" if job["requested_epsilon"] is None else \
        f"requested {job['requested_epsilon']:g}, "
    return (f"{asked}spent {_num(job['epsilon_at_requested_delta'])} at delta "
            f"{job['requested_delta']:g} = {_num(job['epsilon'])} at the budget's delta "
            f"{job['budget_delta']:g}; budget {_num(lifetime['epsilon_max'])}: spent "
            f"{_num(lifetime['epsilon_spent'])}, remaining "
            f"{_num(lifetime['epsilon_remaining'])}")
