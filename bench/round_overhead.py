"""The service's overhead per training round beyond the algorithm's own compute.

A FedMC-ADMM job (rank 10, N = 10, no DP noise) runs through the service's round pipeline
(:mod:`app.training.pipeline`: start, one client step per sampled tenant, aggregate with
evaluation, every task executed in this process) on a fresh PostgreSQL database; the same
rounds of the same federation (the job's stored blocks, seed and sampling) are then timed
through :func:`algorithms.simulate.simulate` with evaluation every round, as the service
evaluates. Overhead = service seconds per round - simulator seconds per round (medians over
rounds 2..R-1: round 1 pays JIT compilation and first decompressions, the last one
publishes the serving factors). Two federations: MovieLens 1M split into 100 tenants,
10 sampled per round, and a synthetic federation of 1,000 small tenants, 10 per round,
whose overhead must not grow with the 990 tenants that sit the round out.

    nice -n 10 python -m bench.round_overhead [--rounds 8] [--only ml-1m|synthetic]
        [--pg "host=127.0.0.1 port=5432 user=postgres dbname=test"] [--baseline DIR]

``--baseline DIR`` first runs this same file against another checkout's code (e.g. the
main branch before this storage), federation by federation, interleaved with this one, and
prints both: a before/after in one run.

Each federation also prints a floor: the bytes a round must make durable (the sampled
tenants' new local states, their server parts, the shared server state and the global
message, at the sizes the job stored) written and the superseded versions deleted through
plain psycopg, one transaction per tenant as the client steps do: the PostgreSQL CPU no
storage of these states in these tables can go below.

The machine is shared, so wall time is noisy: the CPU columns (this process plus the
PostgreSQL backends serving the database, read from /proc, minus the simulator's CPU) give
the overhead independent of other load. Needs FEDREC_DATA_DIR (MovieLens 1M) and a
PostgreSQL server on this machine; the database it creates is dropped at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time
import uuid

import numpy as np
import sqlalchemy as sa

from algorithms import registry
from algorithms.data import Federation, Ratings, load_movielens
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings

CONFIG = {"rank": 10, "inner_steps": 10}
SEED = 7


def _database(admin: str) -> tuple[str, str]:
    import psycopg

    from app.db import migrate

    name = f"fedrec_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    migrate(url)
    return name, url


def _drop(admin: str, name: str) -> None:
    import psycopg

    from app.db import engine_for

    engine_for.cache_clear()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _load(sessions, ratings: Ratings, n_tenants: int) -> list[int]:
    """Tenants (users dealt round-robin in id order), users, items and ratings, written
    directly (COPY for the ratings: the upload path is not what this measures)."""
    from app.models import Item, Tenant, User

    items = np.unique(ratings.items)
    users = np.unique(ratings.users)
    lo, hi = float(ratings.values.min()), float(ratings.values.max())
    with sessions() as s:
        tenants = [Tenant(name=f"bench-{i}", rating_min=lo, rating_max=hi,
                          privacy_budget=1e9, allow_non_private=True)
                   for i in range(n_tenants)]
        s.add_all(tenants)
        s.flush()
        tids = [t.id for t in tenants]
        s.execute(sa.insert(Item), [{"key": str(i)} for i in items])
        s.execute(sa.insert(User), [{"tenant_id": tids[k % n_tenants], "key": str(u)}
                                    for k, u in enumerate(users)])
        s.flush()
        item_id = dict((k, i) for k, i in s.execute(sa.select(Item.key, Item.id)))
        user_id = dict((k, i) for k, i in s.execute(sa.select(User.key, User.id)))
        buf = io.StringIO()
        for u, i, v in zip(ratings.users.tolist(), ratings.items.tolist(),
                           ratings.values.tolist(), strict=True):
            buf.write(f"{user_id[str(u)]}\t{item_id[str(i)]}\t{v!r}\n")
        raw = s.connection().connection.driver_connection
        with raw.cursor().copy("COPY ratings (user_id, item_id, value) FROM STDIN") as cp:
            cp.write(buf.getvalue())
        s.commit()
    return tids


def _pg_cpu(admin: str, dbname: str) -> float:
    """CPU seconds used so far by the PostgreSQL backends serving ``dbname`` (read from
    /proc: the server runs on this machine; 0 where it cannot be read)."""
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (dbname,))]
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def _service(sessions, tids: list[int], rounds: int, per_round: int,
             pg_cpu=lambda: 0.0, profile=None
             ) -> tuple[int, list[float], list[float], list[float]]:
    """(job id, wall seconds per round, CPU seconds of this process per round, CPU
    seconds of the PostgreSQL backends per round); ``profile`` (a ``cProfile.Profile``)
    records rounds 2..R-1, the rounds the medians are taken over."""
    from app.training import pipeline
    from app.training.jobs import JobSpec, create_job

    with sessions() as s:
        job_id = create_job(s, JobSpec("fedmc-admm", tids, rounds, per_round, SEED, CONFIG,
                                       {"mechanism": "none"})).id
    marks: list[tuple[float, float, float]] = []

    def mark() -> None:
        if profile is not None and len(marks) == rounds - 1:
            profile.disable()  # the last round starts: it publishes, not measured
        pg = pg_cpu()  # before the clocks: the query's own time is not the round's
        marks.append((time.perf_counter(), time.process_time(), pg))
        if profile is not None and len(marks) == 2:
            profile.enable()  # round 2 starts

    class Timed(pipeline.InlineDispatcher):
        def send(self, task: str, *args: int) -> None:
            if task == pipeline.TASK_START:
                mark()
            super().send(task, *args)

    dispatch = Timed(sessions)
    dispatch.send(pipeline.TASK_START, job_id, 1)
    dispatch.drain()
    mark()
    from app.training.models import TrainingJob

    with sessions() as s:
        job = s.get(TrainingJob, job_id)
        assert job.status == "completed" and job.current_round == rounds, (job.status,
                                                                            job.error)
    wall, cpu, pg = ([b[k] - a[k] for a, b in zip(marks, marks[1:], strict=False)]
                     for k in range(3))
    return job_id, wall, cpu, pg


def _federation(sessions, job_id: int, scale: tuple[float, float]) -> Federation:
    from algorithms import RatingBlock
    from app.training.models import JobClient, TrainingJob
    from app.training.pipeline import item_ids_from_bytes

    with sessions() as s:
        job = s.get(TrainingJob, job_id)
        rows = s.execute(sa.select(JobClient.train_block, JobClient.test_block,
                                   JobClient.user_keys).where(JobClient.job_id == job_id)
                         .order_by(JobClient.client_index)).all()
        items = item_ids_from_bytes(job.item_ids)
    return Federation([RatingBlock.from_bytes(r[0]) for r in rows],
                      [RatingBlock.from_bytes(r[1]) for r in rows],
                      [np.array(r[2]) for r in rows], items, scale)


def _compute(fed: Federation, rounds: int, per_round: int) -> tuple[list[float], list[float]]:
    alg = registry.get("fedmc-admm")
    cfg = alg.config(**CONFIG)
    marks = [(time.perf_counter(), time.process_time())]
    simulate(alg, cfg, fed, rounds=rounds, per_round=per_round, seed=SEED, evaluate_every=1,
             on_round=lambda rec: marks.append((time.perf_counter(), time.process_time())))
    return ([b[0] - a[0] for a, b in zip(marks, marks[1:], strict=False)],
            [b[1] - a[1] for a, b in zip(marks, marks[1:], strict=False)])


def _storage(url: str, job_id: int) -> dict[str, int]:
    """Bytes the job keeps in its tables (as PostgreSQL stores them)."""
    import psycopg

    out = {}
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        for table in ("training_jobs", "job_clients", "job_server_parts", "round_uploads"):
            ok = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]
            if ok:
                out[table] = conn.execute(
                    "SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]
    return out


def _pid_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _write_floor(url: str, job_id: int, per_round: int, rounds: int) -> dict[str, float]:
    """The floor under the service's PostgreSQL CPU: the bytes a round must make durable
    written with plain psycopg (no ORM, no other statement), as the round writes them: one
    transaction per sampled tenant inserting a new local state version of the job's
    stored size, then one transaction rewriting that many server parts, the shared server
    state and the global message and deleting the superseded versions. Medians over
    ``rounds`` repetitions: PostgreSQL CPU and this process's CPU, ms per round."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as conn:
        local, part = (int(conn.execute(q, (job_id,)).fetchone()[0] or 0) for q in (
            "SELECT avg(octet_length(state)) FROM job_local_states WHERE job_id = %s",
            "SELECT avg(octet_length(part)) FROM job_server_parts WHERE job_id = %s"))
        shared, glob = conn.execute("SELECT octet_length(server_state), "
                                    "octet_length(global_msg) FROM training_jobs "
                                    "WHERE id = %s", (job_id,)).fetchone()
        conn.execute("CREATE TABLE floor_local (c int, r int, b bytea, PRIMARY KEY (c, r))")
        conn.execute("CREATE TABLE floor_part (c int PRIMARY KEY, b bytea)")
        for t in ("floor_local", "floor_part"):
            conn.execute(f"ALTER TABLE {t} ALTER COLUMN b SET STORAGE EXTERNAL")
        noise = os.urandom(max(local, part, shared or 0, glob or 0) + 1)
        conn.execute("INSERT INTO floor_part SELECT g, %s FROM generate_series(-2, %s) g",
                     (noise[:part], per_round - 1))
        conn.execute("INSERT INTO floor_local SELECT g, 0, %s FROM generate_series(0, %s) g",
                     (noise[:local], per_round - 1))
        conn.commit()
        pid = conn.info.backend_pid
        pg, py = [], []
        for k in range(1, rounds + 1):
            p0, c0 = _pid_cpu(pid), time.process_time()
            for c in range(per_round):
                conn.execute("INSERT INTO floor_local VALUES (%s, %s, %s)",
                             (c, k, noise[k:k + local]))
                conn.commit()
            for c in range(per_round):
                conn.execute("UPDATE floor_part SET b = %s WHERE c = %s", (noise[k:k + part], c))
            conn.execute("UPDATE floor_part SET b = %s WHERE c = -1", (noise[:shared or 0],))
            conn.execute("UPDATE floor_part SET b = %s WHERE c = -2", (noise[:glob or 0],))
            conn.execute("DELETE FROM floor_local WHERE r < %s", (k,))
            conn.commit()
            pg.append(_pid_cpu(pid) - p0)
            py.append(time.process_time() - c0)
    return {"floor_pg_cpu_ms": 1e3 * statistics.median(pg),
            "floor_client_cpu_ms": 1e3 * statistics.median(py),
            "local_bytes": local, "part_bytes": part}


def run(label: str, ratings: Ratings, n_tenants: int, per_round: int, rounds: int,
        admin: str, profile: str | None = None) -> dict:
    """One federation's row; ``profile``: also write a cProfile of the service's rounds
    2..R-1 to this file (``python -m pstats FILE``)."""
    import cProfile

    from app.db import engine_for, session_factory

    name, url = _database(admin)
    try:
        sessions = session_factory(engine_for(url))
        tids = _load(sessions, ratings, n_tenants)
        prof = cProfile.Profile() if profile else None
        job_id, wall, cpu, pg = _service(sessions, tids, rounds, per_round,
                                         lambda: _pg_cpu(admin, name), prof)
        if prof is not None:
            prof.dump_stats(profile)
        fed = _federation(sessions, job_id, (float(ratings.values.min()),
                                             float(ratings.values.max())))
        c_wall, c_cpu = _compute(fed, rounds, per_round)
        sizes = _storage(url, job_id)
        floor = _write_floor(url, job_id, per_round, max(3, rounds))
    finally:
        _drop(admin, name)
    mid = slice(1, rounds - 1)
    med = statistics.median
    row = {"federation": label, "tenants": n_tenants, "per_round": per_round,
           "ratings": len(ratings), "rounds": rounds,
           "service_ms": 1e3 * med(wall[mid]), "compute_ms": 1e3 * med(c_wall[mid]),
           "service_cpu_ms": 1e3 * med(cpu[mid]), "compute_cpu_ms": 1e3 * med(c_cpu[mid]),
           "overhead_ms": 1e3 * med([w - c for w, c in zip(wall[mid], c_wall[mid],
                                                             strict=True)]),
           "pg_cpu_ms": 1e3 * med(pg[mid]),
           "overhead_cpu_ms": 1e3 * med([a + p - c for a, p, c in zip(
               cpu[mid], pg[mid], c_cpu[mid], strict=True)]),
           "storage_bytes": sizes, **floor, "load": os.getloadavg()[0]}
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--only", choices=["ml-1m", "synthetic"])
    p.add_argument("--pg", default=os.environ.get(
        "FEDREC_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test"))
    p.add_argument("--baseline", metavar="DIR",
                   help="also run against the code of this checkout (before/after)")
    p.add_argument("--profile", metavar="FILE",
                   help="cProfile the service's rounds 2..R-1 of ml-1m into FILE (pstats); "
                        "profiling slows the rounds it records")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (round 1 and the last are left out)")
    rows = []
    for label in ("ml-1m", "synthetic"):
        if args.only not in (None, label):
            continue
        if args.baseline:
            rows.append(_baseline(args.baseline, label, args.rounds, args.pg))
        if label == "ml-1m":
            rows.append(run("ml-1m", load_movielens("ml-1m"), 100, 10, args.rounds, args.pg,
                            args.profile))
        else:
            synth = generate_ratings(10_000, 300, 200_000, rank=5, seed=0)
            rows.append(run("synthetic", synth, 1000, 10, args.rounds, args.pg))
    if args.json:
        print(json.dumps(rows))
        return
    print("wall: service and simulator seconds per round; CPU: this process (service "
          "steps / simulator) and the PostgreSQL backends; medians over rounds 2..R-1")
    print(f"{'federation':<17} {'tenants':>7} {'/round':>6} {'svc wall':>8} "
          f"{'alg wall':>8} {'overhead':>8} | {'svc CPU':>7} {'PG CPU':>6} {'alg CPU':>7} "
          f"{'overhead':>8} {'load':>5}")
    for r in rows:
        print(f"{r['federation'] + r.get('code', ''):<17} {r['tenants']:>7} {r['per_round']:>6} "
              f"{r['service_ms']:>8.1f} {r['compute_ms']:>8.1f} {r['overhead_ms']:>8.1f} | "
              f"{r['service_cpu_ms']:>7.1f} {r['pg_cpu_ms']:>6.1f} {r['compute_cpu_ms']:>7.1f} "
              f"{r['overhead_cpu_ms']:>8.1f} {r['load']:>5.2f}")
    for r in rows:
        print(f"{r['federation']}{r.get('code', '')}: bytes in the job's tables after it "
              f"(dead rows included) {r['storage_bytes']}")
    for r in rows:
        if "floor_pg_cpu_ms" in r:
            print(f"{r['federation']}{r.get('code', '')}: floor, the round's durable bytes "
                  f"alone ({r['per_round']} local states of {r['local_bytes']:,} B, as many "
                  f"server parts of {r['part_bytes']:,} B, shared state and global message) "
                  f"through plain psycopg: PostgreSQL CPU {r['floor_pg_cpu_ms']:.1f} ms + "
                  f"client CPU {r['floor_client_cpu_ms']:.1f} ms per round")


def _baseline(checkout: str, label: str, rounds: int, admin: str) -> dict:
    """This benchmark's row for ``label`` run on the code of ``checkout``."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--only", label,
                          "--rounds", str(rounds), "--pg", admin], env=env, cwd=checkout,
                         check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])[0]
    row["code"] = " (base)"
    return row


if __name__ == "__main__":
    main()
