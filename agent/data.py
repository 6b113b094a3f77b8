"""The tenant's ratings: read and validated exactly as the upload API does, then laid out
as the job's rating block (rows: the tenant's users in key order; columns: the job's item
catalogue), split as the coordinator would split a hosted tenant's block."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from algorithms import RatingBlock
from algorithms.data import tenant_split
from algorithms.ingest import Collected, Collector, RowError, UploadRejected, collect

TSV = "text/tab-separated-values"
MEDIA = {".csv": "text/csv", ".tsv": TSV, ".data": TSV, ".dat": "text/csv", ".txt": "text/csv",
         ".json": "application/json", ".parquet": "application/vnd.apache.parquet"}


def media_of(path: Path) -> str:
    """The upload media type a file is read as, from its suffix, ``.gz`` dropped
    (``u.data``: tab; ``.dat``/``.csv``: the delimiter found on the first line)."""
    name = path.name.lower().removesuffix(".gz")
    suffix = name[name.rfind("."):] if "." in name else ""
    try:
        return MEDIA[suffix]
    except KeyError:
        raise ValueError(f"{path}: unknown ratings format {suffix!r}; use .csv, .dat, .tsv "
                         "(or MovieLens u.data), .json or .parquet, gzip-compressed or "
                         "not") from None


def read_file(path: Path | str, scale: tuple[float, float]) -> Collected:
    """A ratings file read by the one ratings reader and validated with the upload API's
    rules (:func:`algorithms.ingest.collect`)."""
    path = Path(path)
    with path.open("rb") as f:
        return collect(f, media_of(path), scale)


def read_sql(url: str, query: str, scale: tuple[float, float]) -> Collected:
    """Rows ``(user, item, rating[, timestamp])`` of a SQL query, validated as an upload's
    rows are (``line`` is the 1-based row number). SQLAlchemy is imported only here."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execute(sa.text(query))
            collector = Collector(scale)
            for n, row in enumerate(result, start=1):
                if len(row) not in (3, 4):
                    collector.add(RowError(n, "row", f"expected 3 or 4 columns, got {len(row)}"))
                    continue
                user, item, rating = (v if isinstance(v, str | int | float) or v is None
                                      else str(v) for v in row[:3])
                stamp = row[3] if len(row) == 4 else None
                collector.add((n, _key(user), _key(item), rating,
                               stamp.isoformat() if hasattr(stamp, "isoformat") else stamp))
            return collector.finish()
    finally:
        engine.dispose()


def _key(value: Any) -> Any:
    """Keys from a database may be integers: the upload API's keys are their text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def checked(collected: Collected, items: list[str]) -> Collected:
    """``collected`` unless a row is invalid or names an item outside the job's catalogue:
    then :class:`UploadRejected` with the upload API's errors."""
    errors, total = collected.with_unknown_items(items)
    if total:
        raise UploadRejected(errors, total=total)
    return collected


def describe(exc: UploadRejected, limit: int = 10) -> str:
    """The rejection as the upload API words it, with the first offending rows."""
    lines = [str(exc)] + [f"  line {e.line}, {e.field}: {e.reason}" for e in exc.errors[:limit]]
    if exc.total > limit:
        lines.append(f"  ... {exc.total - limit} more")
    return "\n".join(lines)


def tenant_block(collected: Collected, items: list[str]) -> tuple[RatingBlock, np.ndarray]:
    """The ratings as the coordinator lays out a hosted tenant's (``store.load_block`` then
    the job snapshot's (user, item) order): rows are the users in key order, columns the
    catalogue ``items`` in the job's order. Returns (block, user keys)."""
    column = {k: j for j, k in enumerate(items)}
    user_keys, rows = np.unique(np.array([collected.user_keys[u] for u in
                                          collected.users.tolist()], dtype=str),
                                return_inverse=True)
    cols = np.array([column[collected.item_keys[i]] for i in collected.items.tolist()],
                    dtype=np.int64)
    vals = np.asarray(collected.values, dtype=np.float64)
    order = np.lexsort((cols, rows))
    block = RatingBlock(rows[order], cols[order], vals[order], len(user_keys), len(items))
    return block, user_keys


def job_split(block: RatingBlock, manifest: dict[str, Any]) -> tuple[RatingBlock, RatingBlock]:
    """(train, test) of this tenant in the job: the coordinator's split of a hosted tenant."""
    return tenant_split(block, manifest["client_index"], manifest["seed"],
                        manifest["test_fraction"], tuple(manifest["scale"]))


def parse_bytes(data: bytes, media: str, scale: tuple[float, float]) -> Collected:
    return collect(io.BytesIO(data), media, scale)
