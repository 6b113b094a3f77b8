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
    go: PostgreSQL backends, restarted workers). :meth:`per_process` gives the peak of
    each single process seen (a group's sum can hide one process's growth)."""

    def __init__(self, groups: dict) -> None:
        super().__init__(daemon=True)
        self.groups, self.peak = groups, dict.fromkeys(groups, 0)
        self.process_peak: dict[str, dict[int, int]] = {name: {} for name in groups}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            for name, pids in self.groups.items():
                try:
                    sizes = {pid: rss_bytes(pid) for pid in pids()}
                except Exception:  # a pid list that could not be read this time
                    continue
                self.peak[name] = max(self.peak[name], sum(sizes.values()))
                seen = self.process_peak[name]
                for pid, size in sizes.items():
                    seen[pid] = max(seen.get(pid, 0), size)

    def stop(self) -> dict[str, float]:
        self.halt.set()
        self.join(5)
        return {name: round(v / 2**20, 1) for name, v in self.peak.items()}

    def per_process(self) -> dict[str, list[float]]:
        """Each group's processes' peak RSS (MiB), largest first (call after stop)."""
        return {name: sorted((round(v / 2**20, 1) for v in seen.values()), reverse=True)
                for name, seen in self.process_peak.items()}


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


class CpuMeter:
    """CPU seconds each group of :class:`PeakMemory`'s groups used between construction and
    :meth:`read` (a process that exits in between takes its seconds with it: read before
    stopping the processes measured)."""

    def __init__(self, groups: dict) -> None:
        self.groups = groups
        self.start = {name: cpu_seconds(pids()) for name, pids in groups.items()}

    def read(self) -> dict[str, float]:
        return {name: round(cpu_seconds(pids()) - self.start[name], 2)
                for name, pids in self.groups.items()}


def run_job(api: httpx.Client, body: dict, queue_env: dict, tmp: Path, n_workers: int,
            memory_groups: dict, timeout: float) -> dict:
    """Job ``body`` run by ``n_workers`` solo worker processes: its wall seconds (from
    creation to a final status), each group's CPU seconds and peak RSS (the workers as
    group ``workers``), each process's peak RSS, and the final job record."""
    workers = [start_worker(queue_env, queue_env["FEDREC_TASK_QUEUE"],
                            tmp / f"worker{n_workers}-{w}-{uuid.uuid4().hex[:4]}.log")
               for w in range(n_workers)]
    groups = {**memory_groups, "workers": lambda: [w.pid for w in workers]}
    watch = PeakMemory(groups)
    watch.start()
    try:
        cpu = CpuMeter(groups)
        start = time.perf_counter()
        r = api.post("/v1/admin/jobs", json=body)
        if r.status_code != 202:
            raise RuntimeError(f"job refused: {r.status_code} {r.text}")
        job_id = r.json()["id"]
        deadline = start + timeout
        while True:
            job = api.get(f"/v1/admin/jobs/{job_id}").json()
            if job["status"] in ("completed", "failed", "cancelled"):
                break
            if time.perf_counter() > deadline:
                raise RuntimeError(f"job {job_id} did not finish in {timeout} s: {job}")
            time.sleep(0.2)
        wall = time.perf_counter() - start
        if job["status"] != "completed":
            raise RuntimeError(f"job {job_id} {job['status']}: {job['error']}")
        used = cpu.read()
    finally:
        peaks = watch.stop()
        for w in workers:
            stop(w)
    return {"workers": n_workers, "job_id": job_id, "job_wall_seconds": round(wall, 2),
            "cpu_seconds": used, "worker_cpu_seconds": used["workers"],
            "peak_rss_mib": peaks, "peak_rss_mib_per_process": watch.per_process(),
            "job": job}


def fedmc_run(api: httpx.Client, args, queue_env: dict, tmp: Path, n_workers: int,
              memory_groups: dict) -> dict:
    """The FedMC-ADMM job of this experiment with ``n_workers`` workers, and its curve."""
    body = {"algorithm": "fedmc-admm", "rounds": args.rounds, "per_round": args.per_round,
            "seed": args.seed, "dp": {"mechanism": "none"}, "allow_not_private": True}
    run = run_job(api, body, queue_env, tmp, n_workers, memory_groups, args.timeout)
    run.pop("job")
    curve = api.get(f"/v1/admin/jobs/{run['job_id']}/report").json()["curve"]
    seconds = [c["seconds"] for c in curve]
    return {**run, "round_seconds": [round(s, 3) for s in seconds],
            "median_round_seconds": round(float(np.median(seconds)), 3),
            "test_rmse": [c["test_rmse"] for c in curve]}


def create_tenants(api: httpx.Client, item_keys, n_tenants: int,
                   budget: float = 10.0) -> list[tuple[int, str]]:
    """The catalogue ``item_keys`` and ``n_tenants`` tenants (non-private training allowed,
    privacy budget ``budget``), each with an API key: [(tenant id, key)]."""
    api.put("/v1/admin/items", json={"items": [{"key": k} for k in item_keys]}
            ).raise_for_status()
    keys = []
    for t in range(n_tenants):
        tid = api.post("/v1/admin/tenants", json={
            "name": f"scale-{t}", "privacy_budget": budget,
            "allow_non_private": True}).json()["id"]
        keys.append((tid, api.post(f"/v1/admin/tenants/{tid}/api-keys",
                                   json={}).json()["key"]))
    return keys


def upload_tenants(base: str, data, item_keys, keys: list[tuple[int, str]],
                   groups: dict, parallel: int = 2) -> dict:
    """Every tenant's block POSTed as CSV with its own key, ``parallel`` uploads at a time:
    wall seconds, rows/s, CSV bytes, each group's CPU seconds and peak RSS."""
    sizes = []

    def upload(t: int) -> float:
        body = csv_of(data.blocks[t], data.user_ids[t], item_keys)
        sizes.append(len(body))
        tid, key = keys[t]
        began = time.perf_counter()
        with httpx.Client(base_url=base, timeout=3600) as c:
            c.post(f"/v1/tenants/{tid}/ratings", content=body, headers={
                "Authorization": f"Bearer {key}", "Content-Type": "text/csv"}
                   ).raise_for_status()
        return time.perf_counter() - began

    watch = PeakMemory(groups)
    watch.start()
    cpu = CpuMeter(groups)
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(parallel) as pool:
            per_tenant = list(pool.map(upload, range(len(keys))))
        wall = time.perf_counter() - start
        used = cpu.read()
    finally:
        peaks = watch.stop()
    return {"seconds": round(wall, 2), "rows_per_second": round(data.n_ratings / wall),
            "parallel_clients": parallel, "csv_bytes": sum(sizes),
            "api_cpu_seconds": used.get("api"), "cpu_seconds": used,
            "slowest_tenant_seconds": round(max(per_tenant), 2),
            "peak_rss_mib": peaks, "peak_rss_mib_per_process": watch.per_process()}


def table_sizes(database: str) -> dict:
    """Rows of ``ratings``, its size on disk with indexes, and the whole database's."""
    with psycopg.connect(ADMIN_DSN.replace("dbname=test", f"dbname={database}"),
                         autocommit=True) as conn:
        rows, size, total = conn.execute(
            "SELECT count(*), pg_total_relation_size('ratings'), "
            "pg_database_size(current_database()) FROM ratings").fetchone()
    return {"rows": rows, "ratings_table_bytes": size, "database_bytes": total}


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
               "FEDREC_LOG_LEVEL": "WARNING",
               # a job's dry round 1 in the API may pass the 30 s default on a busy machine
               "FEDREC_DRY_ROUND_SECONDS": "600"}
        server = serve(env, args.port, tmp / "api.log", access_log=False)
        groups = {"api": lambda: [server.pid, *children(server.pid)],
                  "postgres_backends": database_pids(database), "bench": lambda: [os.getpid()]}
        base = f"http://127.0.0.1:{args.port}"
        try:
            with httpx.Client(base_url=base, timeout=600,
                              headers={"Authorization": f"Bearer {token}"}) as api:
                keys = create_tenants(api, item_keys, args.tenants)
                result["upload"] = upload_tenants(base, data, item_keys, keys, groups)
                sizes = table_sizes(database)
                if sizes["rows"] != data.n_ratings:
                    raise RuntimeError(f"{sizes['rows']} rows stored, {data.n_ratings} uploaded")
                result["ratings_table_mib"] = round(sizes["ratings_table_bytes"] / 2**20, 1)
                runs = [fedmc_run(api, args, env, tmp, n, groups) for n in (1, 2)]
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
