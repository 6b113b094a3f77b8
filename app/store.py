"""Database operations on items and ratings, including the bulk upload path.

PostgreSQL: a binary COPY built from the upload's columns, straight into ``ratings`` for
users the upload creates, else into a temporary table merged with one INSERT ... ON
CONFLICT DO UPDATE. SQLite: an executemany upsert. Both run inside the caller's
transaction (the session), so an upload and its idempotency record commit together or not
at all.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from algorithms.block import RatingBlock
from algorithms.ingest import NO_TIME, Batch, Collected
from app.models import REGISTERED, UPLOADED, Item, Rating, RatingStats, Tenant, User, utcnow
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
    # an admin's upsert registers the item, also one an upload created before
    stmt = stmt.on_conflict_do_update(index_elements=[Item.key],
                                      set_={"title": title, "origin": REGISTERED})
    session.execute(stmt, [{"key": k, "title": t, "origin": REGISTERED} for k, t in items])


def create_missing_items(session: Session, keys: Iterable[str]) -> None:
    """Add untitled catalogue items for keys not present yet (auto-create tenants), marked
    as created by an upload: differentially private jobs leave them out."""
    rows = [{"key": k, "origin": UPLOADED} for k in sorted(set(keys))]
    if rows:
        session.execute(_insert(session, Item).on_conflict_do_nothing(), rows)


def upsert_ratings(session: Session, tenant_id: int,
                   batches: Collected | Batch | Iterable[Batch], ids: dict[str, int]) -> int:
    """Store an upload's valid rows for the tenant, creating its users; re-uploads update
    the rating. ``batches`` is the :class:`Collected` upload (PostgreSQL writes it with a
    binary COPY straight from its columns), one :class:`Batch`, or an iterable of them
    (consumed once, so that a large upload is materialised one batch at a time).

    Returns how many ratings changed: inserted, or updated to another value or timestamp
    (a row identical to the stored one is not written). Only a change bumps the tenant's
    ratings version, which is what starts scheduled retraining.
    """
    if session.get_bind().dialect.name == "postgresql":
        rows = batches if isinstance(batches, Collected) else Collected.of(batches)
        return _copy_collected(session, tenant_id, rows, ids)
    if isinstance(batches, Collected):
        batches = batches.batches()
    batches = [batches] if isinstance(batches, Batch) else batches
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


COPY_CHUNK = 65_536
"""Rows per binary COPY message (about 2 MB), so the encoded upload is never in memory at once."""
PG_EPOCH_MICROS = 946_684_800_000_000
"""2000-01-01T00:00:00Z, PostgreSQL's binary timestamp origin, in Unix microseconds."""
BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, extension length
BINARY_TRAILER = b"\xff\xff"


def _binary_copy(cursor, table: str, users: np.ndarray, items: np.ndarray,
                 values: np.ndarray, micros: np.ndarray) -> None:
    """COPY (user_id, item_id, value[, rated_at]) rows into ``table`` in PostgreSQL's
    binary format, built with numpy: rows without a timestamp and rows with one go in two
    fixed-width COPYs (rated_at is left NULL by the first)."""
    timed = micros != NO_TIME
    for has_time in (False, True):
        keep = timed if has_time else ~timed
        if not keep.any():
            continue
        fields = [("n", ">i2"), ("lu", ">i4"), ("u", ">i4"), ("li", ">i4"), ("i", ">i4"),
                  ("lv", ">i4"), ("v", ">f8")] + ([("lt", ">i4"), ("t", ">i8")] * has_time)
        columns = "user_id, item_id, value" + ", rated_at" * has_time
        rows = np.flatnonzero(keep)
        with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(BINARY_HEADER)
            for start in range(0, len(rows), COPY_CHUNK):
                part = rows[start:start + COPY_CHUNK]
                record = np.empty(len(part), dtype=np.dtype(fields))
                record["n"], record["lu"], record["li"], record["lv"] = 3 + has_time, 4, 4, 8
                record["u"], record["i"], record["v"] = users[part], items[part], values[part]
                if has_time:
                    record["lt"], record["t"] = 8, micros[part] - PG_EPOCH_MICROS
                copy.write(record.tobytes())
            copy.write(BINARY_TRAILER)


NEW_USERS = ("INSERT INTO users (tenant_id, key) SELECT %s, k FROM unnest(%s::text[]) AS k "
             # in key order, so concurrent uploads creating the same users cannot deadlock
             "ORDER BY k ON CONFLICT (tenant_id, key) DO NOTHING RETURNING key, id")
LOCK_USERS = ("SELECT key, id FROM users WHERE tenant_id = %s AND key = ANY(%s) "
              "ORDER BY key FOR KEY SHARE")
STAGE = ("CREATE TEMP TABLE fedrec_upload (user_id integer, item_id integer, "
         "value double precision, rated_at timestamptz) ON COMMIT DROP")
MERGE = ("INSERT INTO ratings (user_id, item_id, value, rated_at) "
         "SELECT user_id, item_id, value, rated_at FROM fedrec_upload ORDER BY user_id, item_id "
         "ON CONFLICT (user_id, item_id) DO UPDATE "
         "SET value = EXCLUDED.value, rated_at = EXCLUDED.rated_at "
         # an identical row is not rewritten, so the statement's row count is the real change
         "WHERE (ratings.value, ratings.rated_at) "
         "IS DISTINCT FROM (EXCLUDED.value, EXCLUDED.rated_at)")


def _lock_users(cursor, tenant_id: int, keys: list[str]) -> tuple[dict[str, int], set[str]]:
    """(id of each key, keys created here): creates the missing users of the tenant and
    locks the existing ones ``FOR KEY SHARE`` until commit, what a foreign key's check
    would lock, once per user instead of once per rating. A user deleted meanwhile (by a
    transaction that held it) is created again."""
    found: dict[str, int] = {}
    created: set[str] = set()
    missing = keys
    while missing:
        cursor.execute(NEW_USERS, (tenant_id, missing))
        new = dict(cursor.fetchall())
        found.update(new)
        created.update(new)
        old = [k for k in missing if k not in new]
        if old:
            cursor.execute(LOCK_USERS, (tenant_id, old))
            found.update(cursor.fetchall())
        missing = [k for k in old if k not in found]
    return found, created


def _copy_collected(session: Session, tenant_id: int, rows: Collected,
                    ids: dict[str, int]) -> int:
    """Store a collected upload on PostgreSQL; returns the number of ratings changed.

    The users are created first (one statement, in key order). Users that this
    transaction created can have no stored ratings, and no other transaction can add any
    before it commits, so their rows are copied straight into ``ratings`` (the COPY floor).
    Rows of users that existed before are copied into a temporary table and merged with
    one ``INSERT ... ON CONFLICT DO UPDATE``. Rows go in (user id, item id) order, so the
    primary-key index is filled in order. Rows are de-duplicated by the collector, so no
    (user, item) comes twice.
    """
    if not len(rows):
        return 0
    cursor = session.connection().connection.driver_connection.cursor()
    used = np.unique(rows.users).tolist()
    keys = [rows.user_keys[u] for u in used]
    found, created = _lock_users(cursor, tenant_id, keys)
    user_id = np.zeros(len(rows.user_keys), dtype=np.int64)
    is_new = np.zeros(len(rows.user_keys), dtype=bool)
    user_id[used] = [found[k] for k in keys]
    is_new[used] = [k in created for k in keys]
    item_id = np.array([ids.get(k, -1) for k in rows.item_keys], dtype=np.int64)
    users, items = user_id[rows.users], item_id[rows.items]
    order = np.lexsort((items, users))
    users, items = users[order], items[order]
    values, micros, fresh = rows.values[order], rows.micros[order], is_new[rows.users][order]
    del order
    if fresh.all():
        _binary_copy(cursor, "ratings", users, items, values, micros)
        return len(users)
    changed = int(fresh.sum())
    if changed:
        _binary_copy(cursor, "ratings", users[fresh], items[fresh], values[fresh],
                     micros[fresh])
    stale = ~fresh
    cursor.execute("SET LOCAL work_mem = '256MB'")  # sort the staged rows in memory
    cursor.execute(STAGE)
    _binary_copy(cursor, "fedrec_upload", users[stale], items[stale], values[stale],
                 micros[stale])
    cursor.execute(MERGE)
    changed += cursor.rowcount
    cursor.execute("DROP TABLE fedrec_upload")
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
    """Forget one user of the tenant and all their ratings; None if there is no such user.

    The user row is locked first (ratings have no foreign key): an upload writing to the
    user holds ``FOR KEY SHARE`` on it until it commits, so either the upload's ratings are
    committed before they are deleted here, or the upload waits and creates the user anew.
    """
    user = session.scalar(sa.select(User).where(User.tenant_id == tenant_id,
                                                User.key == user_key).with_for_update())
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


LOAD_CHUNK = 16_384
"""Ratings fetched per batch when a tenant's block is read: the rows arrive as Python
tuples, so only a batch of them is ever alive, never the whole tenant's (a batch of 65,536
rows took about 10 MiB more at its peak than one of 16,384, for the same read time)."""


def catalogue_ids(session: Session, registered_only: bool = False) -> np.ndarray:
    """The catalogue's item ids in id order: all, or only the items an admin registered
    (what a differentially private job trains on: public by construction)."""
    query = sa.select(Item.id).order_by(Item.id)
    if registered_only:
        query = query.where(Item.origin == REGISTERED)
    return np.fromiter(session.scalars(query), dtype=np.int64)


def load_block(session: Session, tenant_id: int, registered_only: bool = False,
               catalogue: np.ndarray | None = None) -> tuple[RatingBlock, np.ndarray]:
    """The tenant's ratings as a :class:`RatingBlock` and the user key of each row.

    Rows are the tenant's users (those with ratings) in key order; columns index the whole
    catalogue in item-id order, so blocks of different tenants share the item axis. Read
    in batches of :data:`LOAD_CHUNK` rows into numpy columns, so memory is the block's
    arrays and not a Python object per rating. ``registered_only``: the catalogue is the
    registered items (:func:`catalogue_ids`) and ratings of other items are left out.
    ``catalogue``: columns index these item ids (sorted), read earlier by another process,
    and ratings of items not among them (added since) are left out.
    """
    given = catalogue is not None
    if catalogue is None:
        catalogue = catalogue_ids(session, registered_only)
    query = (sa.select(Rating.user_id, Rating.item_id, Rating.value)
             .join(User, User.id == Rating.user_id).where(User.tenant_id == tenant_id)
             .execution_options(yield_per=LOAD_CHUNK))
    if registered_only:
        query = query.join(Item, Item.id == Rating.item_id).where(Item.origin == REGISTERED)
    # a Row is no tuple to numpy (np.array of a list of them takes the slow per-object
    # path, 25x slower): its values are chained into one flat float array instead, split
    # at once into the three columns, each joined on its own (the whole block is never
    # held twice)
    users, items, values = [], [], []
    for part in session.execute(query).partitions():
        flat = np.fromiter(itertools.chain.from_iterable(part), dtype=np.float64,
                           count=3 * len(part)).reshape(-1, 3)
        del part
        users.append(flat[:, 0].astype(np.int64))
        items.append(flat[:, 1].astype(np.int64))
        values.append(flat[:, 2].copy())
    user_ids, item_ids, vals = (_joined(c, dtype) for c, dtype in (
        (users, np.int64), (items, np.int64), (values, np.float64)))
    if given and not (listed := np.isin(item_ids, catalogue)).all():
        # items created after the given catalogue was read
        user_ids, item_ids, vals = user_ids[listed], item_ids[listed], vals[listed]
    named = dict(session.execute(sa.select(User.id, User.key).where(
        User.tenant_id == tenant_id)).all())
    present = np.unique(user_ids)
    gone = [u for u in present.tolist() if u not in named]
    if gone:  # forgotten between the two reads (no snapshot isolation): deletion wins
        kept = ~np.isin(user_ids, gone)
        user_ids, item_ids, vals = user_ids[kept], item_ids[kept], vals[kept]
        present = np.setdiff1d(present, gone)
    if not len(present):
        empty = np.zeros(0, dtype=np.int64)
        return RatingBlock(empty, empty, empty, 0, len(catalogue)), np.array([], dtype=str)
    keys = np.array([named[u] for u in present.tolist()], dtype=str)
    order = np.argsort(keys, kind="stable")  # keys are unique: the order np.unique gives
    local_of = np.empty(len(present), dtype=np.int64)
    local_of[order] = np.arange(len(present))
    rows = local_of[np.searchsorted(present, user_ids)]
    del user_ids
    cols = np.searchsorted(catalogue, item_ids)
    del item_ids
    block = RatingBlock(rows, cols, vals, len(present), len(catalogue))
    return block, keys[order]


def _joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """``np.concatenate(parts)``, emptying ``parts`` as it goes (an empty ``dtype`` array
    for none)."""
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    parts.clear()
    return out


def save_stats(session: Session, tenant_id: int, stats: BlockStats) -> RatingStats:
    """Replace the tenant's stored statistics with ``stats``."""
    record = session.get(RatingStats, tenant_id) or RatingStats(tenant_id=tenant_id)
    for field, value in dataclasses.asdict(stats).items():
        setattr(record, field, value)
    record.computed_at = utcnow()
    session.add(record)
    return record
