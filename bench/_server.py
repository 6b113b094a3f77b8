"""Shared machinery of the load benchmarks: a throw-away PostgreSQL database, ``fedrec
serve --workers 2`` in a subprocess, and wrk's summary parsed into numbers."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


@contextlib.contextmanager
def fresh_database(prefix: str = "fedrec_load") -> Iterator[str]:
    """A new PostgreSQL database migrated to head; yields its SQLAlchemy URL and always
    drops it afterwards (forcibly, so a server left connected cannot keep it alive)."""
    from app.db import migrate

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        migrate(url)
        yield url
    finally:
        from app.db import engine_for
        engine_for.cache_clear()
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def serve(env: dict[str, str], port: int, log: Path, access_log: bool) -> subprocess.Popen:
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


def stop(proc: subprocess.Popen | None, grace: float = 20) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: never leave a process behind."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def worker_pids(server: subprocess.Popen) -> list[str]:
    """The uvicorn worker processes of ``fedrec serve`` (children running spawn_main)."""
    return subprocess.run(["pgrep", "-P", str(server.pid), "-f", "spawn_main"],
                          capture_output=True, text=True).stdout.split()


def parse_wrk(out: str) -> dict[str, float]:
    """Requests/s, requests, p50 and p99 (ms), non-2xx/3xx count and socket errors of
    wrk --latency."""
    def ms(label: str) -> float:
        m = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": int(re.search(r"(\d+) requests in", out).group(1)),
            "p50_ms": ms("50%"), "p99_ms": ms("99%"),
            "non_2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": socket.group(1) if socket else "none"}
