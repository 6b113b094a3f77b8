"""Memory and time of creating a training job: the API process's share of a large job.

    python -m bench.job_memory                       # 2M ratings, 20k users, 20 tenants
    python -m bench.job_memory --baseline ../other   # also another checkout's code, same data
    python -m bench.job_memory --ratings 10000000 --users 100000 --items 10000 \
        --database fedrec_jobmem_10m                 # keep the filled database, reuse it
    python -m bench.job_memory --worker ...          # the dry round in a Celery worker, as
                                                     # the API runs it with a broker

A fresh PostgreSQL database (127.0.0.1:5432) is filled with a synthetic set
(``algorithms.synthetic.generate_tenant_ratings``) through the service's own upload path
(``app.store.upsert_ratings``, the binary COPY of a CSV upload), one tenant at a time.
Then a new Python process (the code under test, or ``--baseline``'s) opens the database
and calls ``app.training.jobs.create_job`` for one FedMC-ADMM job over every tenant, as
``POST /v1/admin/jobs`` does (``--dp gaussian``: a job with Gaussian noise, whose
creation accounts each tenant's budget). It reports the process's resident memory just before the
call, its peak (VmHWM) after it, and the call's wall and CPU seconds. Runs alternate
between the codes (``--repeats``); the job rows written are the same for both (checked:
equal digests of every stored block). Filling 10M ratings takes long: ``--database NAME``
fills a database of that name once (it is kept, not dropped) and later runs with the same
name and shape reuse it; drop it with ``dropdb NAME`` when done.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, resource, sys, time
from app.db import engine_for
from sqlalchemy.orm import Session
import sqlalchemy as sa

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

url, tenant_ids, dp = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
options = json.loads(sys.argv[4])
if options["no_numba"]:  # as if numba were not installed: the numpy kernels run
    sys.modules["numba"] = None
phases = [("start", status("VmRSS"), status("VmHWM"))]
if not options["no_numba"]:
    import numpy, scipy.sparse, sqlalchemy, psycopg, pydantic
    phases.append(("imports before numba", status("VmRSS"), status("VmHWM")))
    import numba
    phases.append(("import numba", status("VmRSS"), status("VmHWM")))
from app.training.jobs import JobSpec, create_job
from app.training.models import JobClient
import numpy, algorithms.fedmc_admm  # imported before the baseline reading
if options["phases"]:  # RSS and peak as each step of create_job starts and ends
    import functools
    from app import store
    from app.training import jobs, states

    def wrap(module, name):
        f = getattr(module, name, None)
        if f is None:  # not in this code (a --baseline)
            return

        @functools.wraps(f)
        def g(*args, **kwargs):
            phases.append(("> " + name, status("VmRSS"), status("VmHWM")))
            out = f(*args, **kwargs)
            phases.append(("< " + name, status("VmRSS"), status("VmHWM")))
            return out
        setattr(module, name, g)

    for name in ("initialise_server", "_tenant_block", "_dry_run", "release_memory"):
        wrap(jobs, name)
    wrap(states, "new_server")
engine = engine_for(url)
with Session(engine) as s:
    s.execute(sa.text("select 1"))
    s.rollback()
    before = status("VmRSS")
    spec = JobSpec(algorithm="fedmc-admm", tenant_ids=tenant_ids, rounds=5, per_round=10,
                   seed=0, config={}, dp=dp, dry_round_seconds=300.0)  # as the API
    import dataclasses
    remote = bool(options["worker"])
    if remote:  # as the API with a broker: the dry round goes to the worker
        from app.config import Settings
        from app.queue import create_celery_app
        from app.training import dry_round
        celery = create_celery_app(Settings(database_url=url, broker_url=options["worker"][0],
                                            task_queue=options["worker"][1]))
        spec = dataclasses.replace(spec, dry_rounds=dry_round.remote(celery))
    t0, c0 = time.perf_counter(), time.process_time()
    job = create_job(s, spec)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = status("VmHWM")
    digests = [d for (d,) in s.execute(sa.select(JobClient.train_digest).where(
        JobClient.job_id == job.id).order_by(JobClient.client_index))]
print(json.dumps({"rss_before": before, "peak": peak, "wall": wall, "cpu": cpu,
                  "dry_round_in_worker": bool(remote),
                  "rss_after": status("VmRSS"), "job": job.id, "digests": digests,
                  "torch": "torch" in sys.modules, "phases": phases}))
"""


def fill(url: str, args: argparse.Namespace) -> list[int]:
    """Tenants with the synthetic set's ratings, written by the upload's own store code."""
    import numpy as np
    from sqlalchemy.orm import Session

    from algorithms.ingest import Batch
    from algorithms.synthetic import generate_tenant_ratings
    from app import store
    from app.db import engine_for
    from app.models import Tenant

    data = generate_tenant_ratings(args.users, args.items, args.ratings, args.tenants, seed=0)
    ids = []
    with Session(engine_for(url)) as s:
        store.upsert_items(s, [(f"i{j}", None) for j in range(args.items)])
        s.commit()
        item_ids = store.item_ids(s, [f"i{j}" for j in range(args.items)])
        for t, block in enumerate(data.blocks):
            tenant = Tenant(name=f"t{t}", rating_min=1.0, rating_max=5.0, privacy_budget=1e9,
                            allow_non_private=True)
            s.add(tenant)
            s.flush()
            users = np.char.add(f"t{t}u", block.rows.astype(str))
            items = np.char.add("i", block.cols.astype(str))
            batch = Batch(users.tolist(), items.tolist(), block.vals.tolist(),
                          [None] * block.nnz, list(range(1, block.nnz + 1)))
            store.upsert_ratings(s, tenant.id, batch, item_ids)
            s.commit()
            ids.append(tenant.id)
    return ids


@contextlib.contextmanager
def kept_database(name: str) -> Iterator[tuple[str, bool]]:
    """The database ``name`` (created and migrated if absent, never dropped); yields its URL
    and whether it already held this bench's tenants."""
    import psycopg

    from app.db import migrate
    from bench._server import ADMIN_DSN

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                              (name,)).fetchone() is not None
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    migrate(url)
    yield url, exists


def filled_tenants(url: str, args: argparse.Namespace) -> list[int] | None:
    """The tenant ids of a database this bench filled with the same shape, else None."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from app.db import engine_for
    from app.models import Rating, Tenant

    with Session(engine_for(url)) as s:
        ids = list(s.scalars(sa.select(Tenant.id).where(Tenant.name.like("t%"))
                             .order_by(Tenant.id)))
        n = s.scalar(sa.select(sa.func.count()).select_from(Rating))
    return ids if len(ids) == args.tenants and n == args.ratings else None


def discard(url: str, job_id: int) -> None:
    """Delete the job a run created: queued, it holds its tenants' reservations, and a
    non-private one would leave them no budget for a private run on the same database."""
    from sqlalchemy.orm import Session

    from app.db import engine_for
    from app.training.jobs import discard_job

    with Session(engine_for(url)) as s:
        discard_job(s, job_id)


#: ``--dp``: the job's privacy settings (a Gaussian job accounts while it is created)
DP = {"none": {"mechanism": "none"},
      "gaussian": {"mechanism": "gaussian", "noise_multiplier": 1.0}}


def child(code: Path, url: str, tenant_ids: list[int], dp: dict,
          options: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    options = {"phases": False, "no_numba": False, "worker": None, **(options or {})}
    # a code without the dry-round task (an older --baseline) runs the round in-process
    where = options["worker"] if (code / "app" / "training" / "dry_round.py").exists() else None
    options = {**options, "worker": where}
    with worker(code, url, where) as peak_of_worker:
        out = subprocess.run([sys.executable, "-c", CHILD, url, json.dumps(tenant_ids),
                              json.dumps(dp), json.dumps(options)],
                             cwd=code, env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"create_job failed in {code}:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["worker_peak"] = peak_of_worker()
    return result


@contextlib.contextmanager
def worker(code: Path, url: str, where: list[str] | None):
    """A ``celery worker`` (solo pool) of ``code`` on the broker and queue ``where``, for
    the dry round (``--worker``); yields a function reading its peak RSS (VmHWM; None
    without a worker)."""
    if where is None:
        yield lambda: None
        return
    env = {**os.environ, "PYTHONPATH": str(code), "FEDREC_DATABASE_URL": url,
           "FEDREC_BROKER_URL": where[0], "FEDREC_TASK_QUEUE": where[1]}
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "worker.celery_app",
                             "worker", "--pool=solo", "--loglevel=WARNING",
                             "--without-gossip", "--without-mingle", "--without-heartbeat"],
                            cwd=code, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    from app.config import Settings
    from app.queue import create_celery_app

    control = create_celery_app(Settings(database_url=url, broker_url=where[0],
                                         task_queue=where[1])).control
    deadline = time.monotonic() + 120
    while not control.ping(timeout=1.0):  # ready: the job's wall time is not its start
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"the worker of {code} did not start")

    def peak() -> int | None:
        with open(f"/proc/{proc.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("VmHWM:"))

    try:
        yield peak
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ratings", type=int, default=2_000_000)
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--items", type=int, default=5_000)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--baseline", type=Path, help="another checkout to compare, same data")
    p.add_argument("--database", help="fill (once) and keep a database of this name")
    p.add_argument("--dp", choices=sorted(DP), default="none",
                   help="the job's privacy: none, or Gaussian noise (accounted at creation)")
    p.add_argument("--phases", action="store_true",
                   help="also print the RSS and peak as each step of create_job starts and "
                        "ends (the imports, each tenant's read, the dry round, each trim)")
    p.add_argument("--worker", action="store_true",
                   help="run the dry round in a Celery worker (solo pool, Redis at "
                        "127.0.0.1:6379/12), as the API does with a broker; a code without "
                        "that path (an older --baseline) runs it in-process")
    p.add_argument("--no-numba", action="store_true",
                   help="run the code as if numba were not installed (its numpy kernels)")
    p.add_argument("--out", type=Path,
                   help="also write the runs to this JSON file (the results table's "
                        "bench/results/job_memory.json: `python -m bench table --write`)")
    args = p.parse_args(argv)

    from bench._server import fresh_database

    codes = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    database = (kept_database(args.database) if args.database
                else fresh_database("fedrec_jobmem"))
    with database as opened:
        url = opened[0] if args.database else opened
        t0 = time.perf_counter()
        tenant_ids = filled_tenants(url, args) if args.database and opened[1] else None
        if args.database and opened[1] and tenant_ids is None:
            sys.exit(f"{args.database} holds another shape or an interrupted fill: "
                     f"dropdb {args.database} and run again")
        if tenant_ids is not None:
            print(f"reusing {args.database}: {args.ratings:,} ratings, {args.tenants} tenants",
                  flush=True)
        else:
            tenant_ids = fill(url, args)
            print(f"filled {args.ratings:,} ratings, {args.tenants} tenants in "
                  f"{time.perf_counter() - t0:.1f} s (load {os.getloadavg()[0]:.1f})",
                  flush=True)
        runs: dict[str, list[dict]] = {name: [] for name, _ in codes}
        for n in range(args.repeats):
            for name, code in (codes if n % 2 == 0 else codes[::-1]):
                where = (["redis://127.0.0.1:6379/12", f"fedrec-jobmem-{os.getpid()}"]
                         if args.worker else None)
                r = child(code, url, tenant_ids, DP[args.dp],
                          {"phases": args.phases, "no_numba": args.no_numba,
                           "worker": where})
                discard(url, r["job"])
                r["load"] = os.getloadavg()[0]
                runs[name].append(r)
                print(f"{name:8s} create_job: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU, "
                      f"RSS before {r['rss_before'] / 2**20:.0f} MiB, peak "
                      f"{r['peak'] / 2**20:.0f} MiB (+{(r['peak'] - r['rss_before']) / 2**20:.0f}"
                      f" MiB), after {r['rss_after'] / 2**20:.0f} MiB"
                      f"{', torch imported' if r['torch'] else ''}, load {r['load']:.1f}"
                      + (f"; dry round in a worker, whose peak was "
                         f"{r['worker_peak'] / 2**20:.0f} MiB" if r.get("dry_round_in_worker")
                         else ""), flush=True)
                if args.phases:
                    for what, rss, hwm in r["phases"]:
                        print(f"    {what:28s} RSS {rss / 2**20:6.1f} MiB, peak "
                              f"{hwm / 2**20:6.1f} MiB", flush=True)
        if args.baseline:
            assert runs["this"][0]["digests"] == runs["baseline"][0]["digests"], (
                "the two codes stored different blocks")
            print("stored blocks: identical digests in both codes")
    if args.out:
        from bench._experiment import write_result

        shape = {k: getattr(args, k) for k in ("ratings", "users", "items", "tenants", "dp")}
        summary = {name: {"peak_mib_max": max(r["peak"] for r in rs) / 2**20,
                          "rss_before_mib": min(r["rss_before"] for r in rs) / 2**20,
                          "rss_after_mib_max": max(r["rss_after"] for r in rs) / 2**20,
                          "wall_seconds_min": min(r["wall"] for r in rs),
                          "cpu_seconds_min": min(r["cpu"] for r in rs),
                          "dry_round_in_worker": any(r.get("dry_round_in_worker") for r in rs),
                          "worker_peak_mib_max": max((r.get("worker_peak") or 0 for r in rs),
                                                     default=0) / 2**20,
                          "load_averages": [r["load"] for r in rs]}
                   for name, rs in runs.items()}
        write_result(args.out.parent, "job_memory", argv, False,
                     {"setup": shape, "summary": summary,
                      "runs": {name: [{k: v for k, v in r.items() if k != "digests"}
                                      for r in rs] for name, rs in runs.items()}},
                     stem=args.out.stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
