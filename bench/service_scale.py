"""A Netflix-shaped federation through the whole service: uploaded through the API, trained
by Celery workers, served under wrk; each phase's wall, CPU, peak RSS and database size.

    python -m bench service_scale --shape netflix                # 100,480,507 ratings
    python -m bench service_scale --shape netflix --scale 0.01   # 1/100: 1,004,805 ratings
    python -m bench service_scale --quick                        # 1/1000, short wrk (tests)

The shape (``--shape``: netflix, 480,189 users x 17,770 items, 100,480,507 ratings; or
ml10m) is drawn by ``algorithms.synthetic.generate_tenant_ratings`` (power-law activity
and popularity, MovieLens's star histogram) and split by user into ``--tenants`` tenants
(100). ``--scale`` multiplies the users and the ratings and keeps the whole catalogue, so a
user rates as many items as at full size (about 209 for Netflix) and every item exists.

Phases, each on the real processes: a fresh PostgreSQL database, ``fedrec serve --workers
2`` (the API), Redis as the broker on a private queue, ``celery worker --pool=solo``
processes started per job (``bench.scale_out``'s pieces):

1. upload: every tenant's ratings POSTed as CSV with its own API key by ``--clients``
   parallel clients (the API's two processes take them);
2. one job per algorithm of ``--algorithms`` (dpals: its defaults, user-level DP at
   epsilon 8; ials, the ranking model: its defaults without noise, serving its lists)
   with each worker count of ``--workers`` (1 and 2). Each tenant's upload of a round is
   a dense array of (items + 1) x (rank + 1)^2 doubles (per item the sums of its raters'
   outer products, plus the Gramian), whatever its ratings: ials's default rank 32 makes
   it 155 MB per tenant at 17,770 items. ``--quick`` therefore sets ``--rank 4 --sweeps
   2`` (the same path; an ials round moves 1/40 of the bytes of rank 32);
3. serving: ``wrk -t2 -c32 --latency`` for ``--duration`` s (after a 5 s warm-up, not
   counted) on the top-10 lists of 200 users drawn across the tenants, each request with
   its tenant's key (``bench.recommend_load``'s rotation).

Each phase reports wall seconds, the CPU seconds and peak RSS of the API processes, the
workers and PostgreSQL's backends (summed per group and per process), and the database's
size beside the CSV bytes uploaded (the raw data). Written to
``<--out>/service_scale_<shape>_x<scale>.json``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from bench import _experiment as E
from bench._server import fresh_database, parse_wrk, serve, stop, worker_pids
from bench.recommend_load import wrk_rotation
from bench.scale import SHAPES
from bench.scale_out import (
    REDIS_URL,
    CpuMeter,
    PeakMemory,
    children,
    create_tenants,
    database_pids,
    run_job,
    table_sizes,
    upload_tenants,
)

EXPERIMENT = ("Service at Netflix shape: upload through the API, a dpals and an ials job on "
              "1 and 2 Celery workers, top-10 serving under wrk; wall, CPU, RSS, database size")

#: runs ``--quick`` (tests/test_bench.py leaves it out: it needs the services and minutes)
QUICK_TEST = "tests/test_bench_service_scale.py"

#: per algorithm, the job body beside algorithm and seed: the operator's defaults
JOBS = {
    "dpals": {},  # user-level DP, epsilon 8, delta 1e-6, its rounds (sweeps + 1)
    "ials": {"dp": {"mechanism": "none"}, "allow_not_private": True, "lists": "model"},
}


def _mib(n: int) -> float:
    return round(n / 2**20, 1)


def shape_of(shape: str, scale: float) -> tuple[int, int, int]:
    """(users, items, ratings) of ``shape`` at ``scale``: users and ratings scaled, the
    catalogue whole."""
    users, items, ratings = SHAPES[shape]
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1], not {scale}")
    return max(round(users * scale), 1), items, max(round(ratings * scale), 1)


def job_phase(api: httpx.Client, algorithm: str, seed: int, config: dict, env: dict,
              tmp: Path, n_workers: int, groups: dict, timeout: float) -> dict:
    body = {"algorithm": algorithm, "seed": seed, "config": config, **JOBS[algorithm]}
    run = run_job(api, body, env, tmp, n_workers, groups, timeout)
    job = run.pop("job")
    report = api.get(f"/v1/admin/jobs/{run['job_id']}/report").json()
    curve = report.get("curve") or []
    return {"algorithm": algorithm, **run, "rounds": job["current_round"],
            "round_seconds": [round(c["seconds"], 3) for c in curve if "seconds" in c],
            "final": {k: v for k, v in (curve[-1] if curve else {}).items()
                      if isinstance(v, int | float) and "seconds" not in k}}


def serving_phase(base: str, server: subprocess.Popen, keys: list[tuple[int, str]],
                  data, groups: dict, duration: int, warm: int, seed: int) -> dict:
    """wrk on 200 users' top-10 lists across the tenants (each with its tenant's key)."""
    rng = np.random.default_rng(seed)
    tenants = rng.integers(0, len(keys), 200)
    targets = []
    for t in tenants:
        tid, key = keys[t]
        user = int(rng.choice(data.user_ids[t]))
        targets.append((f"/v1/tenants/{tid}/users/{user}/recommendations?k=10", key))
    probe = httpx.get(base + targets[0][0], headers={"Authorization": f"Bearer {targets[0][1]}"})
    probe.raise_for_status()
    if probe.json()["source"] != "model" or len(probe.json()["data"]) != 10:
        raise RuntimeError(f"serving does not answer from the model: {probe.text[:500]}")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rotate.lua"
        wrk_rotation(script, targets)
        wrk = ["wrk", "-t2", "-c32", "--latency", "-s", str(script)]
        subprocess.run([*wrk, f"-d{warm}s", base], capture_output=True, text=True, check=True)
        workers = [int(p) for p in worker_pids(server)]
        watch = PeakMemory(groups)
        watch.start()
        cpu = CpuMeter({**groups, "api_workers": lambda: workers})
        load = os.getloadavg()[0]
        start = time.perf_counter()
        try:
            out = subprocess.run([*wrk, f"-d{duration}s", base], capture_output=True,
                                 text=True, check=True).stdout
            wall = time.perf_counter() - start
            used = cpu.read()
        finally:
            peaks = watch.stop()
    fig = parse_wrk(out)
    return {**fig, "seconds": round(wall, 2), "load_at_start": round(load, 2),
            "api_cpu_us_per_request": round(used["api_workers"] / max(fig["requests"], 1)
                                            * 1e6, 1),
            "cpu_seconds": used, "peak_rss_mib": peaks,
            "peak_rss_mib_per_process": watch.per_process()}


def main(argv: list[str] | None = None) -> int:
    p = E.parser("service_scale", __doc__, seeds=1)
    p.add_argument("--shape", choices=sorted(SHAPES), default="netflix")
    p.add_argument("--scale", type=float, default=1.0,
                   help="share of the users and ratings (the catalogue stays whole)")
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--clients", type=int, default=2, help="parallel upload clients")
    p.add_argument("--algorithms", default="dpals,ials",
                   help=f"comma-separated, of: {', '.join(JOBS)}")
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    p.add_argument("--duration", type=int, default=30, help="seconds of wrk serving")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the data and the jobs (one run: --seeds is not used)")
    p.add_argument("--port", type=int, default=8170)
    p.add_argument("--timeout", type=float, default=7200, help="seconds a job may take")
    p.add_argument("--rank", type=int, help="every job's config.rank (default: each "
                   "algorithm's own: dpals 4, ials 32)")
    p.add_argument("--sweeps", type=int, help="every job's config.sweeps (default: each "
                   "algorithm's own: dpals 4, ials 8)")
    p.add_argument("--dry-round-seconds", type=float, default=600,
                   help="the API's FEDREC_DRY_ROUND_SECONDS (bound of a job's dry round 1)")
    args = p.parse_args(argv)
    warm = 5
    if args.quick:  # a round's uploads are n_tenants x n_items x (rank + 1)^2 doubles
        args.scale, args.duration, warm, args.rank, args.sweeps = 0.001, 3, 1, 4, 2
    config = {k: v for k, v in (("rank", args.rank), ("sweeps", args.sweeps)) if v}
    algorithms = [a for a in args.algorithms.split(",") if a]
    unknown = set(algorithms) - set(JOBS)
    if unknown:
        raise ValueError(f"unknown algorithm(s) {sorted(unknown)}; choose from {list(JOBS)}")
    worker_counts = [int(w) for w in args.workers.split(",")]
    n_users, n_items, n_ratings = shape_of(args.shape, args.scale)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"service_scale_{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    result: dict = {"shape": {"name": args.shape, "scale": args.scale, "users": n_users,
                              "items": n_items, "ratings": n_ratings, "tenants": args.tenants},
                    "job_config": config, "seed": args.seed,
                    "load_average_at_start": os.getloadavg()}

    from algorithms.synthetic import generate_tenant_ratings

    start = time.perf_counter()
    data = generate_tenant_ratings(n_users, n_items, n_ratings, args.tenants, seed=args.seed)
    result["generate_seconds"] = round(time.perf_counter() - start, 1)
    item_keys = np.array([f"i{j}" for j in range(n_items)])
    token = secrets.token_urlsafe(24)
    with fresh_database("fedrec_svcscale") as url:
        database = url.rsplit("/", 1)[1]
        env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token,
               "FEDREC_BROKER_URL": REDIS_URL,
               "FEDREC_TASK_QUEUE": f"svcscale-{uuid.uuid4().hex[:6]}",
               "FEDREC_LOG_LEVEL": "WARNING",
               # round 1's dry run in the API (numba's first compile included) may pass
               # the 30 s default on a loaded machine or a large tenant
               "FEDREC_DRY_ROUND_SECONDS": str(args.dry_round_seconds)}
        server = serve(env, args.port, tmp / "api.log", access_log=False)
        groups = {"api": lambda: [server.pid, *children(server.pid)],
                  "postgres_backends": database_pids(database)}
        base = f"http://127.0.0.1:{args.port}"
        try:
            with httpx.Client(base_url=base, timeout=600,
                              headers={"Authorization": f"Bearer {token}"}) as api:
                # every job charges its tenants (dpals: epsilon 8 per job)
                keys = create_tenants(api, item_keys, args.tenants, budget=1000.0)
                upload = upload_tenants(base, data, item_keys, keys, groups, args.clients)
                sizes = table_sizes(database)
                if sizes["rows"] != data.n_ratings:
                    raise RuntimeError(f"{sizes['rows']} rows stored, {data.n_ratings} sent")
                upload.update({"ratings_table_mib": _mib(sizes["ratings_table_bytes"]),
                               "database_mib": _mib(sizes["database_bytes"]),
                               "database_over_csv": round(sizes["database_bytes"]
                                                          / upload["csv_bytes"], 2)})
                result["upload"] = upload
                result["jobs"] = [job_phase(api, a, args.seed, config, env, tmp, n,
                                            groups, args.timeout)
                                  for a in algorithms for n in worker_counts]
                if "ials" in algorithms:
                    result["serving"] = serving_phase(base, server, keys, data, groups,
                                                      args.duration, warm, args.seed)
                sizes = table_sizes(database)
                result["database_mib_at_end"] = _mib(sizes["database_bytes"])
                result["database_at_end_over_csv"] = round(
                    sizes["database_bytes"] / upload["csv_bytes"], 2)
        finally:
            stop(server)
    result["load_average_at_end"] = os.getloadavg()
    stem = f"service_scale_{args.shape}_x{args.scale:g}"
    E.write_result(args.out, "service_scale", argv, args.quick, result, stem=stem)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
