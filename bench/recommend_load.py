"""Load test of single-user top-10 recommendations with API-key authentication.

Run from the repository root (needs PostgreSQL at 127.0.0.1:5432 and ``wrk``)::

    python -m bench.recommend_load --duration 30

It creates a fresh PostgreSQL database (dropped afterwards), uploads MovieLens 1M through
the API as one tenant, publishes an ML-1M-sized factor snapshot (rank 20 + biases: the
shape FedMC-ADMM serves) for that tenant, starts ``fedrec serve --workers 2`` (uvicorn with
uvloop and httptools), warms it up for 5 s (reported, not counted), and runs
``wrk -t2 -c32 -d<duration>s --latency`` on loopback,
each request for one of 200 users chosen in rotation. It prints wrk's summary and the
figures for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import httpx
import numpy as np

from bench._server import ROOT, fresh_database, parse_wrk, serve, stop, worker_pids
from bench.upload_ratings import catalogue, new_tenant, ratings_csv


def _publish_snapshot(url: str, tenant_id: int, rank: int, seed: int) -> list[str]:
    """A completed job and a factor snapshot of the tenant's real users and items."""
    import sqlalchemy as sa

    from app.db import make_engine, session_factory
    from app.models import Item, User
    from app.training.models import TrainingJob
    from app.training.pipeline import item_ids_bytes
    from app.training.snapshots import write_snapshot

    sessions = session_factory(make_engine(url))
    rng = np.random.default_rng(seed)
    with sessions() as s:
        users = list(s.scalars(sa.select(User.key).where(User.tenant_id == tenant_id)
                               .order_by(User.key)))
        items = np.fromiter(s.scalars(sa.select(Item.id).order_by(Item.id)), dtype=np.int64)
        job = TrainingJob(status="completed", algorithm="fedmc-admm", config={"rank": rank},
                          dp={"mechanism": "none"}, rounds=1, per_round=1, seed=seed,
                          test_fraction=0.2, tenant_ids=[tenant_id],
                          item_ids=item_ids_bytes(items), current_round=1,
                          ratings_version={})
        s.add(job)
        s.flush()
        a = rng.normal(0, 0.3, (len(users), rank + 3))
        b = rng.normal(0, 0.3, (rank + 3, items.size))
        write_snapshot(s, tenant_id, job, users, a, b)
        s.commit()
    return users


def _wrk_script(path: Path, tenant_id: int, users: list[str], key: str) -> None:
    urls = ", ".join(f'"/tenants/{tenant_id}/users/{u}/recommendations?k=10"' for u in users)
    path.write_text(f"""
local paths = {{{urls}}}
local i = 0
wrk.headers["Authorization"] = "Bearer {key}"
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--rank", type=int, default=20)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--no-access-log", action="store_true",
                        help="run the server without uvicorn's per-request access log")
    parser.add_argument("--profile", type=Path, default=None,
                        help="record a py-spy flame graph of one worker during the run")
    args = parser.parse_args()
    with fresh_database() as url:
        run(args, url)


def run(args: argparse.Namespace, url: str) -> None:
    """Upload, publish, serve and measure (the database is made and dropped by main)."""
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token,
           "FEDREC_BROKER_URL": "", "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    server = None
    log = Path(tempfile.mkstemp(prefix="fedrec-serve-", suffix=".log")[1])
    try:
        server = serve(env, args.port, log, not args.no_access_log)
        base = f"http://127.0.0.1:{args.port}"
        admin = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, timeout=300, headers=admin) as api:
            api.put("/admin/items", json={"items": catalogue()}).raise_for_status()
            tid, key = new_tenant(api, "load")
            api.post(f"/tenants/{tid}/ratings", content=ratings_csv(), headers={
                "Authorization": f"Bearer {key}", "Content-Type": "text/csv"}
                     ).raise_for_status()
        users = _publish_snapshot(url, tid, args.rank, 0)
        rng = np.random.default_rng(1)
        chosen = [users[i] for i in rng.choice(len(users), 200, replace=False)]
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "rotate.lua"
            _wrk_script(script, tid, chosen, key)
            probe = httpx.get(f"{base}/tenants/{tid}/users/{chosen[0]}/recommendations",
                              headers={"Authorization": f"Bearer {key}"}).json()
            assert probe["source"] == "model" and len(probe["data"]) == 10, probe
            wrk = ["wrk", "-t2", "-c32", "--latency", "-s", str(script), base]
            warm = subprocess.run([*wrk, "-d5s"], capture_output=True, text=True,
                                  check=True).stdout
            print("warm-up (5 s, not counted):", parse_wrk(warm))
            spy = None
            if args.profile:
                spy = subprocess.Popen(["py-spy", "record", "-p", worker_pids(server)[0],
                                        "-d", str(args.duration), "-f", "raw", "-o",
                                        str(args.profile)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            out = subprocess.run([*wrk, f"-d{args.duration}s"], capture_output=True,
                                 text=True, check=True).stdout
            if spy is not None:
                spy.wait(60)
        print(out)
        fig = parse_wrk(out)
        print(f"RESULT rps={fig['rps']:.0f} p50={fig['p50_ms']:.2f}ms "
              f"p99={fig['p99_ms']:.2f}ms non2xx={fig['non_2xx']} "
              f"socket_errors={fig['socket_errors']}")
    finally:
        if server is not None:
            stop(server)  # never leave a server (or its database) behind
            print(f"server log: {log} ({log.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
