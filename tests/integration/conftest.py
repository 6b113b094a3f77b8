"""Real services for integration tests: a fresh PostgreSQL database, a private Redis
queue, and Celery worker processes. With CI or FEDREC_REQUIRE_SERVICES set, a missing
service fails the run (naming it) instead of skipping."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
    yield from service_factory(pg_url, redis_url)


def service_factory(pg_url: str, redis_url: str):
    """(settings, worker factory) on ``pg_url`` and ``redis_url``; stops the workers after."""
    from app.config import Settings

    queue = f"fedrec-it-{uuid.uuid4().hex[:8]}"
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "FEDREC_DATABASE_URL": pg_url, "FEDREC_BROKER_URL": redis_url,
           "FEDREC_TASK_QUEUE": queue, "FEDREC_ADMIN_TOKEN": token,
           "PYTHONPATH": str(ROOT)}
    settings = Settings(database_url=pg_url, broker_url=redis_url, task_queue=queue,
                        admin_token=token)
    workers: list[Worker] = []

    def worker(**extra_env: str) -> Worker:
        w = Worker({**env, **extra_env}, queue).start()
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _missing(what: str) -> None:
    if os.environ.get("CI") or os.environ.get("FEDREC_REQUIRE_SERVICES"):
        pytest.fail(f"{what}; the fault tests need it", pytrace=False)
    pytest.skip(what)


class PrivateRedis:
    """A throw-away ``redis-server`` on its own port, without persistence: a restart loses
    every queued message, as a crashed broker without AOF would."""

    def __init__(self) -> None:
        self.port, self.proc = free_port(), None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._up, 10, "the private Redis to accept connections")

    def _up(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class PrivatePostgres:
    """A throw-away PostgreSQL cluster (initdb into a temporary directory, run as the
    ``postgres`` OS user when we are root) that the fault tests may stop and restart."""

    def __init__(self) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if not bins:
            _missing("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
        self.bin = bins[-1].parent
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="fedrec-pg-"))
        self.data = self.root / "data"
        self.admin = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, str(self.bin / args[0]), *args[1:]], check=check,
                              capture_output=True, text=True, timeout=120)

    def init(self) -> None:
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        conf = (f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                "full_page_writes = off\ntrack_commit_timestamp = on\nmax_connections = 60\n")
        with open(self.data / "postgresql.conf", "a") as f:  # the file stays postgres's
            f.write(conf)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                  check=False)

    def create_database(self) -> str:
        """A new database, migrated to head; returns its SQLAlchemy URL."""
        import psycopg

        from app.db import migrate

        name = f"fedrec_it_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"
        migrate(url)
        return url

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def private_pg():
    """A private PostgreSQL cluster (fsync off, commit timestamps on), removed afterwards."""
    if shutil.which("runuser") is None and os.geteuid() == 0:
        _missing("runuser is needed to run initdb as the postgres user")
    pg = PrivatePostgres()
    try:
        pg.init()
        pg.start()
    except subprocess.CalledProcessError as exc:
        pg.remove()
        _missing(f"could not start a private PostgreSQL: {exc.stderr or exc.stdout}")
    yield pg
    pg.remove()


@pytest.fixture
def private_redis():
    """A private Redis server, stopped afterwards."""
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed")
    redis = PrivateRedis()
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture
def private_services(private_pg, private_redis):
    """:func:`services` on a private PostgreSQL database and a private Redis, which the
    test may restart: (settings, worker factory, pg, redis)."""
    url = private_pg.create_database()
    for settings, worker in service_factory(url, private_redis.url):
        yield settings, worker, private_pg, private_redis
