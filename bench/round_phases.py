"""Where the service's round goes: CPU per pipeline step and per phase, no profiler.

Runs the job of :mod:`bench.round_overhead` (FedMC-ADMM, rank 10, N = 10, no noise) on a
fresh PostgreSQL database and reports, per round (means over rounds 2..R-1), each task's
thread CPU, process CPU and its PostgreSQL backends' CPU, then the thread CPU
(``time.thread_time``) spent in each phase of the pipeline (:mod:`app.training.pipeline`,
:mod:`app.training.states`, the session's commits). Phases nest: a phase's time includes
the phases it calls.

    nice -n 10 python -m bench.round_phases [--federation ml-1m|synthetic] [--rounds 7]
        [--tenants N] [--pg "host=127.0.0.1 port=5432 user=postgres dbname=test"]

Needs FEDREC_DATA_DIR (MovieLens 1M) for ``ml-1m``; the database it creates is dropped.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import time

from sqlalchemy.orm import Session

from algorithms.data import load_movielens
from algorithms.synthetic import generate_ratings
from bench import round_overhead as ro

PIPELINE = ["_client_of", "_release", "round_complete", "client_round", "_evaluate",
            "_active_job", "_release_central", "server_round", "scrub_job_clients",
            "_selected", "_block"]
STATES = ["stage_local", "stage_upload", "load_uploads", "load_locals", "load_server",
          "save_server", "commit_locals", "store_global", "load_global"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--federation", choices=["ml-1m", "synthetic"], default="ml-1m")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--tenants", type=int, help="default: 100 (ml-1m), 1,000 (synthetic)")
    p.add_argument("--pg", default=os.environ.get(
        "FEDREC_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test"))
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (round 1 and the last are left out)")
    from app.db import engine_for, session_factory
    from app.training import pipeline, states
    from app.training.jobs import JobSpec, create_job
    from privacy.release import UploadRelease

    if args.federation == "ml-1m":
        ratings, tenants = load_movielens("ml-1m"), args.tenants or 100
    else:
        ratings = generate_ratings(10_000, 300, 200_000, rank=5, seed=0)
        tenants = args.tenants or 1000
    spent: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    on = [False]

    def timed(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def run(*a, **k):
            if not on[0]:
                return f(*a, **k)
            t0 = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.thread_time() - t0
                calls[label] += 1

        setattr(owner, name, run)

    originals = [(pipeline, n, getattr(pipeline, n)) for n in PIPELINE] + \
        [(states, n, getattr(states, n)) for n in STATES] + \
        [(Session, n, getattr(Session, n)) for n in ("commit", "close")] + \
        [(UploadRelease, "__call__", UploadRelease.__call__)]  # inside client_round
    for owner, name, _ in originals:
        timed(owner, name, name if owner is pipeline else
              f"{owner.__name__.rsplit('.', 1)[-1]}.{name}")
    name, url = ro._database(args.pg)
    tasks: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    try:
        sessions = session_factory(engine_for(url))
        tids = ro._load(sessions, ratings, tenants)
        with sessions() as s:
            job_id = create_job(s, JobSpec("fedmc-admm", tids, args.rounds, 10, ro.SEED,
                                           ro.CONFIG, {"mechanism": "none"})).id

        class Timed(pipeline.InlineDispatcher):
            def drain(self) -> None:
                while self._queue:
                    task, targs = self._queue.popleft()
                    on[0] = 2 <= targs[1] <= args.rounds - 1
                    pg0 = ro._pg_cpu(args.pg, name)
                    c0, t0 = time.process_time(), time.thread_time()
                    pipeline.TASKS[task](self.sessions, self, *targs)
                    t1, c1 = time.thread_time(), time.process_time()
                    pg1 = ro._pg_cpu(args.pg, name)
                    if on[0]:
                        row = tasks[task.rsplit(".", 1)[-1]]
                        row[0] += t1 - t0
                        row[1] += c1 - c0
                        row[2] += pg1 - pg0
                    on[0] = False

        dispatch = Timed(sessions)
        dispatch.send(pipeline.TASK_START, job_id, 1)
        dispatch.drain()
    finally:
        for owner, attr, f in originals:
            setattr(owner, attr, f)
        ro._drop(args.pg, name)
    n = args.rounds - 2
    print(f"{args.federation}, {tenants} tenants, 10 per round: ms per round "
          f"(rounds 2..{args.rounds - 1}), load {os.getloadavg()[0]:.2f}")
    print(f"  {'task':<28} {'thread':>8} {'process':>8} {'PG':>8}")
    for task, (t, c, g) in tasks.items():
        print(f"  {task:<28} {1e3 * t / n:>8.1f} {1e3 * c / n:>8.1f} {1e3 * g / n:>8.1f}")
    print(f"  {'phase (thread CPU)':<28} {'ms':>8} {'calls':>8}")
    for label in sorted(spent, key=lambda k: -spent[k]):
        print(f"  {label:<28} {1e3 * spent[label] / n:>8.1f} {calls[label] / n:>8.1f}")


if __name__ == "__main__":
    main()
