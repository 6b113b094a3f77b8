"""Shared fixtures: the real PostgreSQL and Redis used by integration tests.

Integration tests (marker ``integration``) need PostgreSQL at 127.0.0.1:5432 and Redis at
127.0.0.1:6379 (override with FEDREC_TEST_PG / FEDREC_TEST_REDIS). Normally they skip, with
the reason, when a service is unreachable. When CI or FEDREC_REQUIRE_SERVICES is set, an
unreachable service FAILS the test instead, naming the service, so CI cannot pass without
having run them.
"""

from __future__ import annotations

import os
import uuid

import pytest

PG_ADMIN = os.environ.get("FEDREC_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_TEST_URL = os.environ.get("FEDREC_TEST_REDIS", "redis://127.0.0.1:6379/14")


def services_required() -> bool:
    """True in CI (or with FEDREC_REQUIRE_SERVICES): missing services fail the run."""
    flag = os.environ.get("FEDREC_REQUIRE_SERVICES", "")
    return bool(os.environ.get("CI")) or flag.lower() not in ("", "0", "false", "no")


def service_unavailable(name: str, where: str, error: Exception) -> None:
    message = f"{name} is unreachable at {where} ({type(error).__name__}: {error})"
    if services_required():
        pytest.fail(f"{message}; CI/FEDREC_REQUIRE_SERVICES requires it for the "
                    "integration tests", pytrace=False)
    pytest.skip(f"{message}; integration test skipped (set CI=1 to make this an error)")


def _server_url(name: str) -> str:
    """The SQLAlchemy URL of database ``name`` on the PG_ADMIN server."""
    from sqlalchemy.engine import make_url

    return make_url(PG_ADMIN).set(drivername="postgresql+psycopg", database=name) \
        .render_as_string(hide_password=False)


def _without_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a libpq "key=value" string: say only that it is one
        return "FEDREC_TEST_PG"


@pytest.fixture(scope="session")
def postgres_admin():
    """An autocommit connection to the PostgreSQL server (fails/skips when it is down)."""
    import psycopg

    try:
        conn = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL", _without_password(PG_ADMIN), exc)
    yield conn
    conn.close()


@pytest.fixture(scope="session")
def make_postgres_db(postgres_admin):
    """Factory of fresh, uniquely named, empty databases; all dropped at session end."""
    created: list[str] = []

    def make() -> str:
        name = f"fedrec_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        postgres_admin.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return _server_url(name)

    yield make
    from app.db import engine_for

    for engine in [engine_for(_server_url(n)) for n in created]:
        engine.dispose()
    engine_for.cache_clear()
    for name in created:
        postgres_admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def migrated_postgres_url(make_postgres_db) -> str:
    """One fresh PostgreSQL database per session, migrated to head."""
    from app.db import migrate

    url = make_postgres_db()
    migrate(url)
    return url


@pytest.fixture(scope="session")
def redis_test_url() -> str:
    """The Redis database reserved for tests (fails/skips when Redis is down)."""
    import redis

    try:
        redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        service_unavailable("Redis", REDIS_TEST_URL, exc)
    return REDIS_TEST_URL
