"""A real ``celery worker`` process on a private queue, for the worker tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def celery_worker(database_url: str, redis_url: str, log_path: Path, *options: str,
                  celery_app: str = "worker.celery_app", **env: str):
    """Start ``celery worker`` with ``options`` (default pool: solo) and the extra
    environment ``env`` on a new queue (``celery_app``: the module ``-A`` names); yields
    (queue, process); stops it and removes the queue's keys afterwards."""
    queue = f"fedrec-test-{uuid.uuid4().hex[:8]}"
    full = {**os.environ, "FEDREC_DATABASE_URL": database_url, "FEDREC_BROKER_URL": redis_url,
            "FEDREC_TASK_QUEUE": queue, "PYTHONPATH": str(ROOT), **env}
    full.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", celery_app, "worker",
             *(options or ("--pool=solo",)), "--loglevel=INFO", "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield queue, proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    broker = redis.Redis.from_url(redis_url)
    leftovers = list(broker.scan_iter(f"*{queue}*"))
    if leftovers:
        broker.delete(*leftovers)
