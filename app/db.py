"""Engines, sessions and migrations. The schema is created only by Alembic (migrations/)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import psycopg
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"

# Errors meaning the database cannot be reached (restarting, network): the API answers
# 503 and worker tasks retry, instead of a bare 500 or a dropped task.
DATABASE_DOWN = (OperationalError, InterfaceError, psycopg.OperationalError)


def normalise_url(url: str) -> str:
    """Route ``postgres://`` and ``postgresql://`` URLs to the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _enable_sqlite_foreign_keys(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.close()


def make_engine(url: str, pool_timeout: float = 30.0) -> Engine:
    """A new engine; SQLite gets foreign keys on and may be shared across threads;
    PostgreSQL's pool raises ``sqlalchemy.exc.TimeoutError`` after ``pool_timeout`` s."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False})
        sa.event.listen(engine, "connect", _enable_sqlite_foreign_keys)
        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_timeout=pool_timeout)


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    """One cached engine per URL (used by Celery tasks, which receive no app state)."""
    return make_engine(url)


def session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(bind=engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at migrations/ and ``url`` (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (creates the schema on a new one)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the database at ``url`` to ``revision``."""
    command.downgrade(alembic_config(url), revision)


def is_postgresql(engine_or_url: Engine | str) -> bool:
    url = engine_or_url if isinstance(engine_or_url, str) else str(engine_or_url.url)
    return normalise_url(url).startswith("postgresql")
