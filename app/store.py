"""Database operations on items and ratings, including the bulk upload path.

PostgreSQL: COPY into a temporary table, then one INSERT ... ON CONFLICT DO UPDATE.
SQLite: an executemany upsert. Both run inside the caller's transaction (the session), so
an upload and its idempotency record commit together or not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from algorithms.block import RatingBlock
from app.ingest import Batch
from app.models import Item, Rating, RatingStats, Tenant, User, utcnow
from app.stats import BlockStats

LOOKUP_CHUNK = 1000


def _insert(session: Session, table):
    """The dialect's INSERT, which offers ``on_conflict_do_update/nothing``."""
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def item_ids(session: Session, keys: Iterable[str]) -> dict[str, int]:
    """Map the catalogue keys among ``keys`` to item ids (unknown keys are absent)."""
    keys = sorted(set(keys))
    found: dict[str, int] = {}
    for start in range(0, len(keys), LOOKUP_CHUNK):
        chunk = keys[start:start + LOOKUP_CHUNK]
        rows = session.execute(sa.select(Item.key, Item.id).where(Item.key.in_(chunk)))
        found.update((key, item_id) for key, item_id in rows)
    return found


def upsert_items(session: Session, items: Sequence[tuple[str, str | None]]) -> None:
    """Insert catalogue items; an existing key gets the new title when one is given."""
    if not items:
        return
    stmt = _insert(session, Item)
    title = sa.func.coalesce(stmt.excluded.title, Item.title)
    stmt = stmt.on_conflict_do_update(index_elements=[Item.key], set_={"title": title})
    session.execute(stmt, [{"key": k, "title": t} for k, t in items])


def create_missing_items(session: Session, keys: Iterable[str]) -> None:
    """Add untitled catalogue items for keys not present yet (auto-create tenants)."""
    rows = [{"key": k} for k in sorted(set(keys))]
    if rows:
        session.execute(_insert(session, Item).on_conflict_do_nothing(), rows)


def upsert_ratings(session: Session, tenant_id: int, batches: Batch | Iterable[Batch],
                   ids: dict[str, int]) -> int:
    """Store ``batches`` (one :class:`Batch` or an iterable of them, consumed once, so that
    a large upload is materialised one batch at a time) for the tenant, creating its users;
    re-uploads update the rating.

    Returns how many ratings changed: inserted, or updated to another value or timestamp
    (a row identical to the stored one is not written). Only a change bumps the tenant's
    ratings version, which is what starts scheduled retraining.
    """
    batches = [batches] if isinstance(batches, Batch) else batches
    if session.get_bind().dialect.name == "postgresql":
        return _copy_upsert(session, tenant_id, batches, ids)
    return sum(_executemany_upsert(session, tenant_id, batch, ids) for batch in batches)


def _rating_upsert(session: Session):
    stmt = _insert(session, Rating)
    return stmt.on_conflict_do_update(
        index_elements=[Rating.user_id, Rating.item_id],
        set_={"value": stmt.excluded.value, "rated_at": stmt.excluded.rated_at},
        where=sa.or_(Rating.value.is_distinct_from(stmt.excluded.value),
                     Rating.rated_at.is_distinct_from(stmt.excluded.rated_at)))


def _user_ids(session: Session, tenant_id: int, keys: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for start in range(0, len(keys), LOOKUP_CHUNK):
        found.update(session.execute(sa.select(User.key, User.id).where(
            User.tenant_id == tenant_id, User.key.in_(keys[start:start + LOOKUP_CHUNK]))).all())
    return found


def _executemany_upsert(session: Session, tenant_id: int, batch: Batch,
                        ids: dict[str, int]) -> int:
    if not len(batch):
        return 0
    keys = sorted(set(batch.users))
    new_users = [{"tenant_id": tenant_id, "key": k} for k in keys]
    session.execute(_insert(session, User).on_conflict_do_nothing(), new_users)
    users = _user_ids(session, tenant_id, keys)
    rows = [{"user_id": users[u], "item_id": ids[i], "value": v, "rated_at": t}
            for u, i, v, t in zip(batch.users, batch.items, batch.values, batch.timestamps,
                                  strict=True)]
    # Core (not ORM bulk) execution: its row count is the number of rows written.
    return int(session.connection().execute(_rating_upsert(session), rows).rowcount)


def _copy_text(value: str) -> str:
    """Escape a value for COPY's text format (keys are printable, so only backslash)."""
    return value.replace("\\", "\\\\")


COPY_UPSERT = [
    "SET LOCAL work_mem = '256MB'",  # sort the batch in memory, not in temporary files
    "CREATE TEMP TABLE fedrec_upload (user_key text, item_id integer, "
    "value double precision, rated_at timestamptz) ON COMMIT DROP",
    None,  # the COPY itself
    # In key order, so concurrent uploads creating the same new users cannot deadlock.
    "INSERT INTO users (tenant_id, key) SELECT DISTINCT %(tenant)s, user_key "
    "FROM fedrec_upload ORDER BY user_key ON CONFLICT (tenant_id, key) DO NOTHING",
    # Sorted by the primary key, so the index is filled in order.
    "INSERT INTO ratings (user_id, item_id, value, rated_at) "
    "SELECT u.id, f.item_id, f.value, f.rated_at FROM fedrec_upload f "
    "JOIN users u ON u.tenant_id = %(tenant)s AND u.key = f.user_key ORDER BY u.id, f.item_id "
    "ON CONFLICT (user_id, item_id) DO UPDATE "
    "SET value = EXCLUDED.value, rated_at = EXCLUDED.rated_at "
    # an identical row is not rewritten, so the statement's row count is the real change
    "WHERE (ratings.value, ratings.rated_at) "
    "IS DISTINCT FROM (EXCLUDED.value, EXCLUDED.rated_at)",
    "DROP TABLE fedrec_upload",
]


CHANGED_BY = COPY_UPSERT.index(None) + 2  # the ratings INSERT: its row count is the change


def _copy_lines(batch: Batch, ids: dict[str, int]) -> str:
    stamps = ["\\N" if t is None else t.isoformat() for t in batch.timestamps]
    return "".join(f"{_copy_text(u)}\t{ids[i]}\t{v!r}\t{t}\n" for u, i, v, t in
                   zip(batch.users, batch.items, batch.values, stamps, strict=True))


def _copy_upsert(session: Session, tenant_id: int, batches: Iterable[Batch],
                 ids: dict[str, int]) -> int:
    """One COPY of every batch into a temporary table, then one upsert: a batch at a time
    in memory, and the users still created in key order (no deadlock between uploads).
    Returns the number of ratings changed (see :func:`upsert_ratings`)."""
    cursor = session.connection().connection.driver_connection.cursor()
    changed = 0
    for n, statement in enumerate(COPY_UPSERT):
        if statement is None:
            with cursor.copy("COPY fedrec_upload FROM STDIN") as copy:
                for batch in batches:
                    copy.write(_copy_lines(batch, ids))
        else:
            cursor.execute(statement, {"tenant": tenant_id})
            changed = cursor.rowcount if n == CHANGED_BY else changed
    return changed


def _ratings_query(tenant_id: int, user_key: str | None):
    query = sa.select(User.key, Item.key, Rating.value, Rating.rated_at).join(
        User, User.id == Rating.user_id).join(Item, Item.id == Rating.item_id).where(
        User.tenant_id == tenant_id)
    return query if user_key is None else query.where(User.key == user_key)


def list_ratings(session: Session, tenant_id: int, user_key: str | None,
                 limit: int, offset: int) -> list[sa.Row]:
    """A page of the tenant's ratings (optionally one user's), in key order."""
    query = _ratings_query(tenant_id, user_key).order_by(User.key, Item.key)
    return list(session.execute(query.limit(limit).offset(offset)))


def count_ratings(session: Session, tenant_id: int, user_key: str | None = None) -> int:
    """How many ratings the tenant (or one of its users) has."""
    query = sa.select(sa.func.count()).select_from(Rating).join(
        User, User.id == Rating.user_id).where(User.tenant_id == tenant_id)
    if user_key is not None:
        query = query.where(User.key == user_key)
    return int(session.scalar(query))


def count_users(session: Session, tenant_id: int) -> int:
    """How many users the tenant has (every stored user has at least one rating)."""
    query = sa.select(sa.func.count()).select_from(User).where(User.tenant_id == tenant_id)
    return int(session.scalar(query))


def delete_user(session: Session, tenant_id: int, user_key: str) -> int | None:
    """Forget one user of the tenant and all their ratings; None if there is no such user."""
    user = session.scalar(sa.select(User).where(User.tenant_id == tenant_id,
                                                User.key == user_key))
    if user is None:
        return None
    deleted = session.execute(sa.delete(Rating).where(Rating.user_id == user.id)).rowcount
    session.delete(user)
    bump_ratings_version(session, tenant_id)
    return int(deleted)


def bump_ratings_version(session: Session, tenant_id: int) -> None:
    """Mark the tenant's ratings as changed (in the caller's transaction): scheduled
    retraining compares this counter with the one a job recorded."""
    session.execute(sa.update(Tenant).where(Tenant.id == tenant_id)
                    .values(ratings_version=Tenant.ratings_version + 1))


def load_block(session: Session, tenant_id: int) -> tuple[RatingBlock, np.ndarray]:
    """The tenant's ratings as a :class:`RatingBlock` and the user key of each row.

    Rows are the tenant's users in key order; columns index the whole catalogue in item-id
    order, so blocks of different tenants share the item axis.
    """
    catalogue = np.fromiter(session.scalars(sa.select(Item.id).order_by(Item.id)), dtype=np.int64)
    rows = session.execute(sa.select(User.key, Rating.item_id, Rating.value).join(
        User, User.id == Rating.user_id).where(User.tenant_id == tenant_id)).all()
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return RatingBlock(empty, empty, empty, 0, len(catalogue)), np.array([], dtype=str)
    users, items, vals = zip(*rows, strict=True)
    user_keys, local = np.unique(np.array(users, dtype=str), return_inverse=True)
    cols = np.searchsorted(catalogue, np.array(items, dtype=np.int64))
    block = RatingBlock(local, cols, np.array(vals), len(user_keys), len(catalogue))
    return block, user_keys


def save_stats(session: Session, tenant_id: int, stats: BlockStats) -> RatingStats:
    """Replace the tenant's stored statistics with ``stats``."""
    record = session.get(RatingStats, tenant_id) or RatingStats(tenant_id=tenant_id)
    for field, value in dataclasses.asdict(stats).items():
        setattr(record, field, value)
    record.computed_at = utcnow()
    session.add(record)
    return record
