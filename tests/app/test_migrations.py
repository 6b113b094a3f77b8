"""The schema comes only from Alembic, on SQLite and (integration) PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app import models
from app.db import downgrade, make_engine, migrate

ROOT = Path(__file__).resolve().parents[2]
FOUNDATION = {"tenants", "api_keys", "items", "users", "ratings", "idempotency_records",
              "rating_stats"}


def _foundation_diffs(url: str) -> list:
    """Differences between app.models and the migrated database, on this issue's tables.

    Later migrations may add columns (e.g. training fields on tenants); only what the
    models declare and the database lacks or types differently counts here.
    """
    engine = make_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diffs = compare_metadata(ctx, models.Base.metadata)
    engine.dispose()
    flat = [d for group in diffs for d in (group if isinstance(group, list) else [group])]
    return [d for d in flat if not d[0].startswith("remove")
            and any(t in str(d) for t in FOUNDATION)]


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    names = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    return names


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def empty_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/m.db"
    return request.getfixturevalue("make_postgres_db")()


def test_upgrade_creates_the_models_schema_and_downgrade_removes_it(empty_url):
    migrate(empty_url)
    assert FOUNDATION <= _tables(empty_url)
    assert _foundation_diffs(empty_url) == []
    downgrade(empty_url, "base")
    assert _tables(empty_url) == {"alembic_version"}
    migrate(empty_url)
    assert FOUNDATION <= _tables(empty_url)


def test_alembic_cli_from_the_repository_root(empty_url):
    env = {**os.environ, "DATABASE_URL": empty_url}
    env.pop("FEDREC_DATABASE_URL", None)
    result = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert FOUNDATION <= _tables(empty_url)


def test_unique_rating_per_user_and_item_is_enforced_by_the_database(sqlite_url):
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO tenants (name, rating_min, rating_max, "
                             "privacy_budget, created_at) VALUES ('t', 1, 5, 1, '2020-01-01')"))
        conn.execute(sa.text("INSERT INTO users (tenant_id, key) VALUES (1, 'u')"))
        conn.execute(sa.text("INSERT INTO ratings (user_id, item_id, value) VALUES (1, 1, 3)"))
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO ratings (user_id, item_id, value) VALUES (1, 1, 4)"))
    engine.dispose()
