"""Scale-out through the real service: a MovieLens-10M-shaped set uploaded through the API
into PostgreSQL, then the same training job with 1 and with 2 Celery worker processes.

    python -m bench scale_out                         # 10M ratings, 70k users, 10k items
    python -m bench scale_out --quick                 # 60k ratings, 8 tenants (the tests')
    python -m bench scale_out --ratings 200000 --users 2000 --items 500 --tenants 10

What runs: a fresh PostgreSQL database, ``fedrec serve --workers 2`` (the API), Redis as
the broker (a private queue), ``celery worker --pool=solo`` processes on that queue. The
synthetic set (``algorithms.synthetic.generate_tenant_ratings``: power-law activity and
popularity, MovieLens's star histogram) is split by user into ``--tenants`` tenants, each
uploaded as CSV with its own API key, two uploads at a time (the API's two processes).
Then one FedMC-ADMM job (its defaults, no noise: the tenants opted in) runs ``--rounds``
rounds with ``--per-round`` tenants a round, once with one worker process and once with
two; a round's client steps are separate Celery tasks, so two workers share them.

Printed and written to ``<--out>/scale_out.json`` (default ``bench/results``): upload
seconds and rows/s, each run's round seconds (from the job report), the 2-worker
speed-up, the test RMSE of both runs (identical: the model does not depend on which
worker ran which step), peak RSS of
the API processes, the worker processes, this process and PostgreSQL's backends, CPU
seconds of the workers, and the ratings table's size on disk.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psycopg

from bench import _experiment as E
from bench._server import ADMIN_DSN, fresh_database, serve, stop
from bench.mixed_load import start_worker
from bench.upload_ratings import cpu_seconds

EXPERIMENT = ("Scale-out: an ML-10M-shaped set uploaded through the API, one job with 1 and "
              "2 Celery workers")
REDIS_URL = os.environ.get("FEDREC_BENCH_REDIS", "redis://127.0.0.1:6379/13")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


class PeakMemory(threading.Thread):
    """Samples the summed RSS of each group of processes every 0.2 s; keeps the peaks.

    ``groups`` maps a name to a callable giving the group's pids now (processes come and
    go: PostgreSQL backends, restarted workers)."""

    def __init__(self, groups: dict) -> None:
        super().__init__(daemon=True)
        self.groups, self.peak = groups, dict.fromkeys(groups, 0)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            for name, pids in self.groups.items():
                try:
                    self.peak[name] = max(self.peak[name], sum(map(rss_bytes, pids())))
                except Exception:  # a pid list that could not be read this time
                    continue

    def stop(self) -> dict[str, float]:
        self.halt.set()
        self.join(5)
        return {name: round(v / 2**20, 1) for name, v in self.peak.items()}


def csv_of(block, user_ids, item_keys) -> bytes:
    """A tenant's block as ``user,item,rating`` CSV (vectorised: no per-row Python)."""
    users = user_ids[block.rows].astype(str)
    items = item_keys[block.cols]
    stars = block.vals.astype(np.int64).astype(str)
    lines = np.char.add(np.char.add(np.char.add(np.char.add(users, ","), items), ","), stars)
    return ("user,item,rating\n" + "\n".join(lines.tolist()) + "\n").encode()


def database_pids(database: str):
    def pids() -> list[int]:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                (database,)).fetchall()
        return [r[0] for r in rows]
    return pids


def run_job(api: httpx.Client, args, queue_env: dict, tmp: Path, n_workers: int,
            memory_groups: dict) -> dict:
    """One job with ``n_workers`` solo worker processes; their peak RSS and CPU seconds."""
    workers = [start_worker(queue_env, queue_env["FEDREC_TASK_QUEUE"],
                            tmp / f"worker{n_workers}-{w}.log") for w in range(n_workers)]
    watch = PeakMemory({**memory_groups, "workers": lambda: [w.pid for w in workers]})
    watch.start()
    try:
        body = {"algorithm": "fedmc-admm", "rounds": args.rounds, "per_round": args.per_round,
                "seed": args.seed, "dp": {"mechanism": "none"}, "allow_not_private": True}
        r = api.post("/v1/admin/jobs", json=body)
        if r.status_code != 202:
            raise RuntimeError(f"job refused: {r.status_code} {r.text}")
        job_id, start = r.json()["id"], time.perf_counter()
        deadline = start + args.timeout
        while True:
            job = api.get(f"/v1/admin/jobs/{job_id}").json()
            if job["status"] in ("completed", "failed", "cancelled"):
                break
            if time.perf_counter() > deadline:
                raise RuntimeError(f"job {job_id} did not finish in {args.timeout} s: {job}")
            time.sleep(0.2)
        wall = time.perf_counter() - start
        if job["status"] != "completed":
            raise RuntimeError(f"job {job_id} {job['status']}: {job['error']}")
        cpu = cpu_seconds([w.pid for w in workers])
    finally:
        peaks = watch.stop()
        for w in workers:
            stop(w)
    curve = api.get(f"/v1/admin/jobs/{job_id}/report").json()["curve"]
    seconds = [c["seconds"] for c in curve]
    return {"workers": n_workers, "job_id": job_id, "job_wall_seconds": round(wall, 2),
            "round_seconds": [round(s, 3) for s in seconds],
            "median_round_seconds": round(float(np.median(seconds)), 3),
            "worker_cpu_seconds": round(cpu, 2),
            "test_rmse": [c["test_rmse"] for c in curve], "peak_rss_mib": peaks}


def main(argv: list[str] | None = None) -> int:
    p = E.parser("scale_out", __doc__, seeds=1)
    p.add_argument("--ratings", type=int, default=10_000_000)
    p.add_argument("--users", type=int, default=70_000)
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the data and the job (one run: --seeds is not used)")
    p.add_argument("--port", type=int, default=8741)
    p.add_argument("--timeout", type=float, default=3600, help="seconds a job may take")
    args = p.parse_args(argv)
    if args.quick:
        args.ratings, args.users, args.items, args.tenants = 60_000, 1_200, 400, 8
        args.rounds, args.per_round = 3, 4
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"scale_out_{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    result: dict = {"shape": {"ratings": args.ratings, "users": args.users,
                              "items": args.items, "tenants": args.tenants},
                    "rounds": args.rounds, "per_round": args.per_round, "seed": args.seed,
                    "load_average_at_start": os.getloadavg()}

    from algorithms.synthetic import generate_tenant_ratings

    start = time.perf_counter()
    data = generate_tenant_ratings(args.users, args.items, args.ratings, args.tenants,
                                   seed=args.seed)
    result["generate_seconds"] = round(time.perf_counter() - start, 1)
    item_keys = np.array([f"i{j}" for j in range(args.items)])
    token = secrets.token_urlsafe(24)
    with fresh_database("fedrec_scaleout") as url:
        database = url.rsplit("/", 1)[1]
        queue = f"scaleout-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token,
               "FEDREC_BROKER_URL": REDIS_URL, "FEDREC_TASK_QUEUE": queue,
               "FEDREC_LOG_LEVEL": "WARNING"}
        server = serve(env, args.port, tmp / "api.log", access_log=False)
        groups = {"api": lambda: [server.pid, *children(server.pid)],
                  "postgres_backends": database_pids(database), "bench": lambda: [os.getpid()]}
        base = f"http://127.0.0.1:{args.port}"
        try:
            with httpx.Client(base_url=base, timeout=600,
                              headers={"Authorization": f"Bearer {token}"}) as api:
                api.put("/v1/admin/items", json={"items": [{"key": k} for k in item_keys]}
                        ).raise_for_status()
                keys = []
                for t in range(args.tenants):
                    tid = api.post("/v1/admin/tenants", json={
                        "name": f"scale-{t}", "privacy_budget": 10.0,
                        "allow_non_private": True}).json()["id"]
                    keys.append((tid, api.post(f"/v1/admin/tenants/{tid}/api-keys",
                                               json={}).json()["key"]))

                def upload(t: int) -> float:
                    body = csv_of(data.blocks[t], data.user_ids[t], item_keys)
                    tid, key = keys[t]
                    began = time.perf_counter()
                    with httpx.Client(base_url=base, timeout=600) as c:
                        c.post(f"/v1/tenants/{tid}/ratings", content=body, headers={
                            "Authorization": f"Bearer {key}", "Content-Type": "text/csv"}
                               ).raise_for_status()
                    return time.perf_counter() - began

                watch = PeakMemory(groups)
                watch.start()
                cpu_before = cpu_seconds([server.pid, *children(server.pid)])
                start = time.perf_counter()
                with ThreadPoolExecutor(2) as pool:
                    per_tenant = list(pool.map(upload, range(args.tenants)))
                upload_wall = time.perf_counter() - start
                result["upload"] = {
                    "seconds": round(upload_wall, 2),
                    "rows_per_second": round(data.n_ratings / upload_wall),
                    "api_cpu_seconds": round(cpu_seconds([server.pid, *children(server.pid)])
                                             - cpu_before, 2),
                    "slowest_tenant_seconds": round(max(per_tenant), 2),
                    "peak_rss_mib": watch.stop()}
                with psycopg.connect(ADMIN_DSN.replace("dbname=test", f"dbname={database}"),
                                     autocommit=True) as conn:
                    rows, size = conn.execute(
                        "SELECT count(*), pg_total_relation_size('ratings') FROM ratings"
                    ).fetchone()
                if rows != data.n_ratings:
                    raise RuntimeError(f"{rows} rows stored, {data.n_ratings} uploaded")
                result["ratings_table_mib"] = round(size / 2**20, 1)
                runs = [run_job(api, args, env, tmp, n, groups) for n in (1, 2)]
        finally:
            stop(server)
    one, two = runs
    result["runs"] = runs
    result["speedup_2_workers"] = round(one["median_round_seconds"]
                                        / two["median_round_seconds"], 2)
    result["same_model"] = one["test_rmse"] == two["test_rmse"]
    result["load_average_at_end"] = os.getloadavg()
    E.write_result(args.out, "scale_out", argv, args.quick, result)
    print(json.dumps(result, indent=2))
    return 0 if result["same_model"] else 1


if __name__ == "__main__":
    sys.exit(main())
