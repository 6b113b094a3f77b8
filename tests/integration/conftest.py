"""Real services for integration tests: a fresh PostgreSQL database, a private Redis
queue, and Celery worker processes. With CI or FEDREC_REQUIRE_SERVICES set, a missing
service fails the run (naming it) instead of skipping."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("FEDREC_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test")
REDIS_URL = os.environ.get("FEDREC_TEST_REDIS", "redis://127.0.0.1:6379/13")


def _require(name: str, host: str, port: int) -> None:
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        msg = f"{name} is not reachable at {host}:{port}"
        if os.environ.get("CI") or os.environ.get("FEDREC_REQUIRE_SERVICES"):
            pytest.fail(f"{msg}; integration tests need it", pytrace=False)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def pg_url():
    """A new PostgreSQL database, migrated to head, dropped afterwards."""
    _require("PostgreSQL", "127.0.0.1", 5432)
    import psycopg

    from app.db import migrate

    name = f"fedrec_it_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    migrate(url)
    yield url
    from app.db import engine_for
    engine_for.cache_clear()
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_url():
    _require("Redis", "127.0.0.1", 6379)
    return REDIS_URL


class Worker:
    """A real ``celery worker`` process consuming a private queue."""

    def __init__(self, env: dict[str, str], queue: str) -> None:
        self.env, self.queue, self.proc = env, queue, None

    def start(self) -> Worker:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker.celery_app", "worker",
             "--pool=solo", "-Q", self.queue, "--loglevel=WARNING", "--without-heartbeat",
             "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-task, acknowledging nothing."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def services(pg_url, redis_url):
    """Settings for an API process and a factory of worker processes sharing one queue."""
    from app.config import Settings

    queue = f"fedrec-it-{uuid.uuid4().hex[:8]}"
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "FEDREC_DATABASE_URL": pg_url, "FEDREC_BROKER_URL": redis_url,
           "FEDREC_TASK_QUEUE": queue, "FEDREC_ADMIN_TOKEN": token,
           "PYTHONPATH": str(ROOT)}
    settings = Settings(database_url=pg_url, broker_url=redis_url, task_queue=queue,
                        admin_token=token)
    workers: list[Worker] = []

    def worker() -> Worker:
        w = Worker(env, queue).start()
        workers.append(w)
        return w

    yield settings, worker
    for w in workers:
        w.stop()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
