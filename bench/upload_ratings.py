"""Time uploading MovieLens 1M (1,000,209 ratings) as CSV through the API into PostgreSQL.

Run from the repository root::

    nice -n 10 python -m bench.upload_ratings --repeat 3

It creates a fresh database on the server of ``--server-url`` (dropped afterwards), runs
the migrations, starts ``uvicorn --factory app.main:create_app`` in a subprocess, loads the
catalogue from ``movies.dat`` and then, ``--repeat`` times, creates a tenant and POSTs the
whole CSV (fresh inserts), followed by one re-upload to the last tenant (1M updates). The
timed interval is the HTTP request alone: send, parse, validate, COPY, upsert, commit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from algorithms.data import data_dir, load_movielens
from app.db import migrate

ROOT = Path(__file__).resolve().parents[1]


def ratings_csv() -> bytes:
    """ML-1M as ``user,item,rating`` CSV with a header line."""
    r = load_movielens("ml-1m")
    lines = [f"{u},{i},{v:g}\n" for u, i, v in zip(r.users.tolist(), r.items.tolist(),
                                                   r.values.tolist(), strict=True)]
    return ("user,item,rating\n" + "".join(lines)).encode()


def catalogue() -> list[dict]:
    """The ML-1M movies as catalogue items (key = MovieID)."""
    text = (data_dir() / "ml-1m" / "movies.dat").read_text(encoding="latin-1")
    rows = [line.split("::") for line in text.splitlines() if line]
    return [{"key": movie, "title": title} for movie, title, _genres in rows]


def start_server(url: str, token: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token}
    env.pop("REDIS_URL", None)
    env.pop("FEDREC_BROKER_URL", None)
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app",
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env)
    for _ in range(100):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.terminate()
    raise RuntimeError("the API did not start")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time consumed so far by the processes ``pids`` (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall time, and CPU time of the API process plus its PostgreSQL backends.

    CPU time does not grow when other jobs compete for the cores, so it shows the cost
    of an upload on a busy machine better than wall time does.
    """

    def __init__(self, server_pid: int, database: str, admin: psycopg.Connection):
        self.server_pid, self.database, self.admin = server_pid, database, admin

    def pids(self) -> list[int]:
        rows = self.admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                  (self.database,)).fetchall()
        return [self.server_pid] + [r[0] for r in rows]

    def upload(self, client: httpx.Client, tenant_id: int, key: str,
               body: bytes) -> tuple[float, float]:
        cpu_before, start = cpu_seconds(self.pids()), time.perf_counter()
        response = client.post(f"/tenants/{tenant_id}/ratings", content=body,
                               headers={"Authorization": f"Bearer {key}",
                                        "Content-Type": "text/csv"})
        wall = time.perf_counter() - start
        response.raise_for_status()
        return wall, cpu_seconds(self.pids()) - cpu_before


def new_tenant(client: httpx.Client, name: str) -> tuple[int, str]:
    tenant = client.post("/admin/tenants", json={"name": name, "privacy_budget": 10.0})
    tenant.raise_for_status()
    key = client.post(f"/admin/tenants/{tenant.json()['id']}/api-keys")
    key.raise_for_status()
    return tenant.json()["id"], key.json()["key"]


def run(url: str, database: str, admin: psycopg.Connection, repeat: int, body: bytes) -> None:
    token = uuid.uuid4().hex + uuid.uuid4().hex
    server = start_server(url, token, port=8765)
    meter = Meter(server.pid, database, admin)
    try:
        with httpx.Client(base_url="http://127.0.0.1:8765", timeout=600,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            client.put("/admin/items", json={"items": catalogue()}).raise_for_status()
            inserts = []
            for n in range(repeat):
                tenant_id, key = new_tenant(client, f"bench-{n}")
                inserts.append(meter.upload(client, tenant_id, key, body))
                print(f"upload {n + 1}: {inserts[-1][0]:.2f} s wall, {inserts[-1][1]:.2f} s CPU "
                      f"(1M inserts; load average {os.getloadavg()[0]:.1f})", flush=True)
            update = meter.upload(client, tenant_id, key, body)
            count = client.get(f"/tenants/{tenant_id}/ratings/count",
                               headers={"Authorization": f"Bearer {key}"}).json()
    finally:
        server.terminate()
        server.wait(timeout=30)
    walls, cpus = [w for w, _ in inserts], [c for _, c in inserts]
    print(f"rows per upload: {count['count']:,} ({len(body):,} bytes of CSV)")
    print(f"insert upload over {repeat}: wall min {min(walls):.2f} s, median "
          f"{statistics.median(walls):.2f} s; CPU (API + PostgreSQL) min {min(cpus):.2f} s, "
          f"median {statistics.median(cpus):.2f} s")
    print(f"re-upload (1M updates): wall {update[0]:.2f} s, CPU {update[1]:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="PostgreSQL server (any existing database) to create the bench DB on")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    body = ratings_csv()
    name = f"fedrec_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(args.server_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = args.server_url.rsplit("/", 1)[0] + f"/{name}"
        migrate(url)
        run(url, name, admin, args.repeat, body)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()
