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
import re
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import psycopg

from bench.upload_ratings import catalogue, new_tenant, ratings_csv

ROOT = Path(__file__).resolve().parents[1]
ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


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


def _serve(env: dict[str, str], port: int, log: Path, access_log: bool) -> subprocess.Popen:
    """``fedrec serve --workers 2``; its output goes to a file (an unread pipe would fill
    up and block the workers)."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port",
                                 str(port), "--workers", "2", "--no-migrate",
                                 *([] if access_log else ["--no-access-log"])], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fedrec serve did not start: " + log.read_text()[-2000:])


def _parse(out: str) -> dict[str, float]:
    def ms(label: str) -> float:
        m = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": ms("50%"), "p99_ms": ms("99%"),
            "non_2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": socket.group(1) if socket else "none"}


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

    from app.db import migrate

    name = f"fedrec_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token,
           "FEDREC_BROKER_URL": "", "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    server = None
    log = Path(tempfile.mkstemp(prefix="fedrec-serve-", suffix=".log")[1])
    try:
        migrate(url)
        server = _serve(env, args.port, log, not args.no_access_log)
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
            print("warm-up (5 s, not counted):", _parse(warm))
            spy = None
            if args.profile:
                worker = subprocess.run(["pgrep", "-P", str(server.pid), "-f", "spawn_main"],
                                        capture_output=True,
                                        text=True).stdout.split()[0]
                spy = subprocess.Popen(["py-spy", "record", "-p", worker, "-d",
                                        str(args.duration), "-f", "raw", "-o",
                                        str(args.profile)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            out = subprocess.run([*wrk, f"-d{args.duration}s"], capture_output=True,
                                 text=True, check=True).stdout
            if spy is not None:
                spy.wait(60)
        print(out)
        fig = _parse(out)
        print(f"RESULT rps={fig['rps']:.0f} p50={fig['p50_ms']:.2f}ms "
              f"p99={fig['p99_ms']:.2f}ms non2xx={fig['non_2xx']} "
              f"socket_errors={fig['socket_errors']}")
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()  # never leave a server (or its database) behind
                server.wait(10)
            print(f"server log: {log} ({log.stat().st_size} bytes)")
        from app.db import engine_for
        engine_for.cache_clear()
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
