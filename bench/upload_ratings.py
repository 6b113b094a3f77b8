"""Time uploading MovieLens 1M (1,000,209 ratings) as CSV through the API into PostgreSQL.

Run from the repository root::

    nice -n 10 python -m bench.upload_ratings --repeat 3

It creates a fresh database on the server of ``--server-url`` (dropped afterwards), runs
the migrations, starts ``uvicorn --factory app.main:create_app`` in a subprocess, loads the
catalogue from ``movies.dat`` and then, ``--repeat`` times, creates a tenant and POSTs the
whole CSV (fresh inserts), followed by one re-upload to the last tenant (1M updates). The
timed interval is the HTTP request alone: send, parse, validate, COPY, upsert, commit.

Beside each upload, in the same run and database, it times the floor: PostgreSQL's own
COPY (psycopg ``cursor.copy``, the server parsing the CSV) of the same body into a table of
the same shape, ``copy_floor`` (bigserial key, unique (tenant, user, item), one new tenant
per repeat, so it grows like ``ratings``), then commit. It prints each upload's ratio to
its floor. ``--floor-keys integer`` makes the floor's user and item integer columns (the
default, ``text``, is what the API receives: keys are strings).
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
        response = client.post(f"/v1/tenants/{tenant_id}/ratings", content=body,
                               headers={"Authorization": f"Bearer {key}",
                                        "Content-Type": "text/csv"})
        wall = time.perf_counter() - start
        response.raise_for_status()
        return wall, cpu_seconds(self.pids()) - cpu_before


FLOOR_TABLE = ("CREATE TABLE copy_floor (id bigserial PRIMARY KEY, tenant_id integer NOT NULL, "
               "user_key {keys} NOT NULL, item_key {keys} NOT NULL, value double precision "
               "NOT NULL, rated_at timestamptz, UNIQUE (tenant_id, user_key, item_key))")


def backend_pid(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def copy_floor(conn: psycopg.Connection, tenant: int, body: bytes) -> tuple[float, float]:
    """(wall, CPU of this process + its backend) of PostgreSQL's COPY of ``body`` into
    ``copy_floor`` for ``tenant``, committed."""
    pids = [os.getpid(), backend_pid(conn)]
    cpu_before, start = cpu_seconds(pids), time.perf_counter()
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute(f"ALTER TABLE copy_floor ALTER COLUMN tenant_id SET DEFAULT {tenant:d}")
        with cursor.copy("COPY copy_floor (user_key, item_key, value) FROM STDIN "
                         "(FORMAT csv, HEADER true)") as copy:
            for offset in range(0, len(body), 1 << 20):
                copy.write(body[offset:offset + (1 << 20)])
    return time.perf_counter() - start, cpu_seconds(pids) - cpu_before


def new_tenant(client: httpx.Client, name: str) -> tuple[int, str]:
    tenant = client.post("/v1/admin/tenants", json={"name": name, "privacy_budget": 10.0})
    tenant.raise_for_status()
    key = client.post(f"/v1/admin/tenants/{tenant.json()['id']}/api-keys")
    key.raise_for_status()
    return tenant.json()["id"], key.json()["key"]


def run(url: str, database: str, admin: psycopg.Connection, repeat: int, body: bytes,
        floor_keys: str = "text") -> None:
    token = uuid.uuid4().hex + uuid.uuid4().hex
    server = start_server(url, token, port=8765)
    meter = Meter(server.pid, database, admin)
    floor_conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))
    floor_conn.execute(FLOOR_TABLE.format(keys=floor_keys))
    floor_conn.commit()
    floors = []
    try:
        with httpx.Client(base_url="http://127.0.0.1:8765", timeout=600,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            client.put("/v1/admin/items", json={"items": catalogue()}).raise_for_status()
            inserts = []
            for n in range(repeat):
                tenant_id, key = new_tenant(client, f"bench-{n}")
                first_floor = n % 2 == 0  # alternate the order, so neither always goes first
                if first_floor:
                    floors.append(copy_floor(floor_conn, n + 1, body))
                inserts.append(meter.upload(client, tenant_id, key, body))
                if not first_floor:
                    floors.append(copy_floor(floor_conn, n + 1, body))
                (wall, cpu), (floor_wall, floor_cpu) = inserts[-1], floors[-1]
                print(f"upload {n + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU (1M inserts); "
                      f"COPY floor {floor_wall:.2f} s wall, {floor_cpu:.2f} s CPU; ratio "
                      f"{wall / floor_wall:.2f}x wall, {cpu / floor_cpu:.2f}x CPU "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
            update = meter.upload(client, tenant_id, key, body)
            count = client.get(f"/v1/tenants/{tenant_id}/ratings/count",
                               headers={"Authorization": f"Bearer {key}"}).json()
    finally:
        floor_conn.close()
        server.terminate()
        server.wait(timeout=30)
    walls, cpus = [w for w, _ in inserts], [c for _, c in inserts]
    print(f"rows per upload: {count['count']:,} ({len(body):,} bytes of CSV)")
    print(f"insert upload over {repeat}: wall min {min(walls):.2f} s, median "
          f"{statistics.median(walls):.2f} s; CPU (API + PostgreSQL) min {min(cpus):.2f} s, "
          f"median {statistics.median(cpus):.2f} s")
    ratios = [w / f for (w, _), (f, _) in zip(inserts, floors, strict=True)]
    cpu_ratios = [c / f for (_, c), (_, f) in zip(inserts, floors, strict=True)]
    print(f"COPY floor ({floor_keys} keys) over {repeat}: wall min "
          f"{min(f for f, _ in floors):.2f} s, median {statistics.median(f for f, _ in floors):.2f}"
          f" s; CPU min {min(c for _, c in floors):.2f} s")
    print(f"upload / floor, same repeat: wall median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x); CPU median "
          f"{statistics.median(cpu_ratios):.2f}x; ratio of the minima "
          f"{min(walls) / min(f for f, _ in floors):.2f}x")
    print(f"re-upload (1M updates): wall {update[0]:.2f} s, CPU {update[1]:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="PostgreSQL server (any existing database) to create the bench DB on")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--floor-keys", choices=("text", "integer"), default="text",
                        help="type of the floor table's user and item columns")
    args = parser.parse_args()
    body = ratings_csv()
    name = f"fedrec_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(args.server_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = args.server_url.rsplit("/", 1)[0] + f"/{name}"
        migrate(url)
        run(url, name, admin, args.repeat, body, args.floor_keys)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()
