"""Parsing and validation of rating uploads. Pure: no HTTP, no SQL.

An upload is JSON ``{"ratings": [{"user", "item", "rating", "timestamp"?}, ...]}`` or CSV
``user,item,rating[,timestamp]`` with an optional header line. Every row is checked before
anything is stored; :class:`UploadRejected` carries the offending rows (line, field,
reason). ``line`` is the CSV line number (the header counts) or, for JSON, the 1-based
position in ``ratings``.

Uploads are read as a stream (:mod:`algorithms.readers`) into a :class:`Collector`, which keeps the
valid rows in compact arrays (keys interned, about 40 bytes a row) and only the first
``keep_errors`` offending rows (the others are counted): a 2M-row upload, valid or not,
never becomes millions of Python objects.
"""

from __future__ import annotations

import array
import dataclasses
import datetime as dt
import io
import itertools
import math
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np

from algorithms.ratings_io import (  # noqa: F401 - the reader's errors, re-exported
    BodyTooLarge,
    RowError,
    UnsupportedMediaType,
    UploadRejected,
)

MAX_KEY_LENGTH = 255
CHUNK_ROWS = 512
"""Rows validated together (vectorised when they are all plain). Kept under the garbage
collector's first threshold (700 allocations), so that a chunk's row tuples are freed
before a collection sees them: with 8192-row chunks, full collections of the server's
heap took a third of the CPU time of a 1M-row upload."""
NO_TIME = -1
"""The microsecond column's "no timestamp" (every accepted time is at or after 1970)."""


class TooManyRows(Exception):
    """The upload has more rows than allowed; nothing may be stored."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"Upload exceeds the limit of {limit} rows (FEDREC_MAX_UPLOAD_ROWS)")


@dataclasses.dataclass(frozen=True)
class RawRows:
    """Unvalidated columns of an upload, one entry per row; ``lines`` numbers them."""

    lines: list[int]
    users: list[object]
    items: list[object]
    ratings: list[object]
    timestamps: list[object]


@dataclasses.dataclass(frozen=True)
class Batch:
    """Validated, de-duplicated ratings ready to store (parallel lists)."""

    users: list[str]
    items: list[str]
    values: list[float]
    timestamps: list[dt.datetime | None]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.values)


def parse_key(value: object) -> str:
    """An external user or item key: a non-empty string (or integer) without control chars."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError("must be a string or an integer" if value is not None else "is missing")
    key = str(value).strip()
    if not key:
        raise ValueError("must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"longer than {MAX_KEY_LENGTH} characters")
    if not key.isprintable():
        raise ValueError("contains control characters")
    return key


def as_given(value: object) -> str:
    """``value`` as the client wrote it (numbers by their shortest round-trip form), at
    most 40 characters: error messages echo this, never a rounded ``:g`` rendering."""
    text = value.strip() if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _to_float(value: str | int | float) -> float:
    """``float(value)`` without Python's literal conveniences: ``0_4`` is not 4."""
    if isinstance(value, str) and "_" in value:
        raise ValueError(f"{as_given(value)!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{as_given(value)!r} is not a number") from None


def parse_rating(value: object, scale: tuple[float, float]) -> float:
    """A finite number inside the tenant's rating scale [min, max]."""
    if value is None:
        raise ValueError("is missing")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a number")
    try:
        rating = _to_float(value)
    except OverflowError:  # an integer too large for a float
        raise ValueError("is too large") from None
    if not math.isfinite(rating):
        raise ValueError("must be a finite number (NaN and infinity are rejected)")
    if not scale[0] <= rating <= scale[1]:
        raise ValueError(f"{as_given(value)} is outside the tenant's scale "
                         f"[{scale[0]:g}, {scale[1]:g}]")
    return rating


EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
END_SECONDS = 253_402_300_800
"""10000-01-01T00:00:00Z in Unix seconds (``LATEST.timestamp()`` rounds up to it)."""
TIME_RANGE = "1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z"


def parse_timestamp(value: object) -> dt.datetime | None:
    """Unix seconds (number or numeric string) or ISO 8601, as UTC; naive times are taken
    as UTC. Only instants from 1970 to 9999 (UTC) are accepted: an offset that moves a time
    past year 9999 or before year 1 could be stored but never read back."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be Unix seconds or an ISO 8601 string")
    if isinstance(value, str) and "_" in value:
        raise ValueError(f"{as_given(value)!r} is not Unix seconds or ISO 8601")
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    except OverflowError:  # an integer too large for a float
        raise ValueError("is out of range") from None
    out_of_range = ValueError(f"{as_given(value)} is out of range ({TIME_RANGE})")
    if seconds is not None:
        if not math.isfinite(seconds):
            raise ValueError(f"{as_given(value)!r} is not Unix seconds or ISO 8601")
        if not 0 <= seconds < END_SECONDS:
            raise out_of_range
        return dt.datetime.fromtimestamp(seconds, dt.UTC)
    try:
        stamp = dt.datetime.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{as_given(value)!r} is not Unix seconds or ISO 8601") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    try:
        stamp = stamp.astimezone(dt.UTC)
    except OverflowError:  # the offset moves it before year 1 or after year 9999
        raise out_of_range from None
    if not EARLIEST <= stamp <= LATEST:
        raise out_of_range
    return stamp


def _check(errors: list[RowError], line: int, field: str, parse, *args):
    try:
        return parse(*args)
    except ValueError as exc:
        errors.append(RowError(line, field, f"{field} {exc}"))
        return None


class ErrorLog:
    """The first ``keep`` errors appended (all when ``keep`` is None) and how many there were:
    an upload with a million offending rows costs a hundred RowErrors, not a million."""

    def __init__(self, keep: int | None = None):
        self.keep, self.kept, self.total = keep, [], 0

    def append(self, error: RowError) -> None:
        self.total += 1
        if self.keep is None or len(self.kept) < self.keep:
            self.kept.append(error)


def _first(errors: list[RowError], keep: int | None) -> list[RowError]:
    """The first ``keep`` of ``errors`` in line order (stable within a line)."""
    ordered = sorted(errors, key=lambda e: e.line)
    return ordered if keep is None else ordered[:keep]


def _fast_keys(values: tuple[object, ...]) -> list[str] | None:
    """The stripped keys when every one is a plain valid key, else None (C-level checks:
    a joined string is printable exactly when each of its parts is)."""
    if set(map(type, values)) != {str}:
        return None
    keys = list(map(str.strip, values))
    lengths = list(map(len, keys))
    if min(lengths) > 0 and max(lengths) <= MAX_KEY_LENGTH and "".join(keys).isprintable():
        return keys
    return None


def _fast_values(ratings: tuple[object, ...], scale: tuple[float, float]) -> np.ndarray | None:
    """The ratings as floats when every one is a plain in-scale number, else None."""
    types = set(map(type, ratings))
    if not types <= {int, float, str}:
        return None
    if str in types and "_" in "".join(ratings if types == {str} else map(str, ratings)):
        return None  # float() reads "0_4" as 4: such rows take the row-by-row path
    try:  # float() as in parse_rating, mapped in C
        values = np.fromiter(map(float, ratings), dtype=np.float64, count=len(ratings))
    except (ValueError, OverflowError):
        return None
    ok = np.all(np.isfinite(values)) and np.all((values >= scale[0]) & (values <= scale[1]))
    return values if ok else None


def _micros(stamp: dt.datetime | None) -> int:
    return NO_TIME if stamp is None else (stamp - EARLIEST) // dt.timedelta(microseconds=1)


def _stamp(micros: int) -> dt.datetime | None:
    return None if micros == NO_TIME else EARLIEST + dt.timedelta(microseconds=int(micros))


def _number(value: float) -> str:
    """``value`` short (``:g``) when that is exact, else in full."""
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)


class Collector:
    """Validates rows as they stream in and keeps the valid ones in compact columns.

    Rows are checked in chunks of :data:`CHUNK_ROWS`: a vectorised fast path accepts a
    chunk of plain rows (string keys, numeric in-scale ratings, no timestamps); any other
    chunk takes the row-by-row path, which reports every offending row. More than
    ``max_rows`` rows raise :class:`TooManyRows` at once.
    """

    def __init__(self, scale: tuple[float, float], keep_errors: int | None = None,
                 max_rows: int | None = None, fast: bool = True):
        self.scale, self.max_rows, self.fast = scale, max_rows, fast
        self.log, self.rows = ErrorLog(keep_errors), 0
        self.user_index: dict[str, int] = {}
        self.item_index: dict[str, int] = {}
        self.users, self.items, self.lines = (array.array("i") for _ in range(3))
        self.values, self.micros = array.array("d"), array.array("q")
        self._pending: list[tuple] = []

    def add_all(self, rows: Iterable[tuple | RowError]) -> Collector:
        """Add every row of ``rows``, a chunk at a time (what :meth:`add` does row by row,
        without a Python call per row). A chunk never reads past the first row over
        ``max_rows``, so :class:`TooManyRows` is raised where :meth:`add` would raise it."""
        rows = iter(rows)
        while True:
            size = CHUNK_ROWS - len(self._pending)
            if self.max_rows is not None:
                size = min(size, self.max_rows + 1 - self.rows)
            chunk = list(itertools.islice(rows, max(size, 1)))
            if not chunk:
                return self
            if RowError in set(map(type, chunk)):
                for row in chunk:
                    self.add(row)
                continue
            self.rows += len(chunk)
            if self.max_rows is not None and self.rows > self.max_rows:
                raise TooManyRows(self.max_rows)
            self._pending.extend(chunk)
            if len(self._pending) >= CHUNK_ROWS:
                self._flush()

    def add(self, row: tuple | RowError) -> None:
        """One raw row ``(line, user, item, rating, timestamp)`` or a reader's RowError."""
        self.rows += 1
        if self.max_rows is not None and self.rows > self.max_rows:
            raise TooManyRows(self.max_rows)
        if isinstance(row, RowError):
            self._flush()  # keep the error log in line order
            self.log.append(row)
            return
        self._pending.append(row)
        if len(self._pending) >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        rows, self._pending = self._pending, []
        if rows and not (self.fast and self._add_fast(rows)):
            self._add_rows(rows)

    def _intern(self, index: dict[str, int], keys: list[str]) -> list[int]:
        """The index of each key, new keys numbered in order of first appearance."""
        new = [k for k in dict.fromkeys(keys) if k not in index]
        index.update(zip(new, range(len(index), len(index) + len(new)), strict=True))
        return list(map(index.__getitem__, keys))

    def _add_fast(self, rows: list[tuple]) -> bool:
        lines, users, items, ratings, stamps = zip(*rows, strict=True)
        if stamps.count(None) != len(stamps):
            return False
        users, items = _fast_keys(users), _fast_keys(items)
        values = None if users is None or items is None else _fast_values(ratings, self.scale)
        if values is None:
            return False
        self.users.extend(self._intern(self.user_index, users))
        self.items.extend(self._intern(self.item_index, items))
        self.values.frombytes(values.tobytes())
        self.micros.extend([NO_TIME] * len(rows))
        self.lines.extend(lines)
        return True

    def _add_rows(self, rows: list[tuple]) -> None:
        log = self.log
        for line, user, item, rating, stamp in rows:
            user = _check(log, line, "user", parse_key, user)
            item = _check(log, line, "item", parse_key, item)
            rating = _check(log, line, "rating", parse_rating, rating, self.scale)
            stamp = _check(log, line, "timestamp", parse_timestamp, stamp)
            if user is None or item is None or rating is None:
                continue
            self.users.append(self.user_index.setdefault(user, len(self.user_index)))
            self.items.append(self.item_index.setdefault(item, len(self.item_index)))
            self.values.append(rating)
            self.micros.append(_micros(stamp))
            self.lines.append(line)

    def finish(self) -> Collected:
        """The valid rows with exact duplicates merged, and every error (see
        :func:`_merge_duplicates`). The collector's columns are handed over (or, with
        duplicates, replaced one at a time by their kept rows)."""
        self._flush()
        names = (("users", np.int32), ("items", np.int32), ("values", np.float64),
                 ("micros", np.int64), ("lines", np.int32))
        cols = {name: np.frombuffer(getattr(self, name), dtype=dtype) for name, dtype in names}
        keep, conflicts, n_conflicts = _merge_duplicates(cols, self.log.keep)
        if keep is not None:
            for name, _ in names:  # one column at a time, so only one is ever doubled
                cols[name] = cols[name][keep]
                setattr(self, name, None)
        return Collected(list(self.user_index), list(self.item_index), **cols,
                         errors=_first(self.log.kept + conflicts, self.log.keep),
                         total_errors=self.log.total + n_conflicts, keep_errors=self.log.keep)


def _merge_duplicates(cols: dict[str, np.ndarray], keep_errors: int | None
                      ) -> tuple[np.ndarray | None, list[RowError], int]:
    """(rows to keep or None for all, first conflict errors, number of conflicts).

    The same (user, item) twice with the same rating is kept once (the later timestamp
    wins, in ``cols["micros"]``); with different ratings the later row is an error naming
    the earlier line. Temporary arrays are int32 where they can be (2M rows: 8 MB each).
    """
    users, items, values = cols["users"], cols["items"], cols["values"]
    micros, lines = cols["micros"], cols["lines"]
    keys = (users.astype(np.int64) << 32) | items
    order = np.argsort(keys, kind="stable").astype(np.int32)  # a group stays in line order
    keys = keys[order]
    later = np.empty(len(keys), dtype=bool)
    later[:1] = False
    np.equal(keys[1:], keys[:-1], out=later[1:])
    del keys
    if not later.any():
        return None, [], 0
    starts, dup_at = np.flatnonzero(~later), np.flatnonzero(later)
    firsts = order[starts[np.searchsorted(starts, dup_at, side="right") - 1]]
    dups = order[dup_at]
    del dup_at
    conflict = values[dups] != values[firsts]
    rows, of = dups[conflict], firsts[conflict]
    by_line = np.argsort(rows, kind="stable")[:keep_errors]
    errors = [RowError(int(lines[j]), "rating", f"conflicts with line {int(lines[f])} for the "
                       f"same user and item ({_number(values[f])} vs {_number(values[j])})")
              for j, f in zip(rows[by_line], of[by_line], strict=True)]
    timed = ~conflict & (micros[dups] != NO_TIME)
    for j, f in zip(dups[timed].tolist(), firsts[timed].tolist(), strict=True):
        micros[f] = micros[j]  # in line order within each group: the last one wins
    return np.sort(order[starts]), errors, int(conflict.sum())


@dataclasses.dataclass(eq=False)
class Collected:
    """The valid, de-duplicated rows of an upload as columns (``users`` and ``items``
    index ``user_keys`` and ``item_keys``), and its errors: the first ``keep_errors`` in
    ``errors`` (all when None), ``total_errors`` in all."""

    user_keys: list[str]
    item_keys: list[str]
    users: np.ndarray
    items: np.ndarray
    values: np.ndarray
    micros: np.ndarray
    lines: np.ndarray
    errors: list[RowError]
    total_errors: int
    keep_errors: int | None = None

    def __len__(self) -> int:
        return len(self.values)

    def used_items(self) -> list[str]:
        """The distinct item keys of the valid rows."""
        return [self.item_keys[i] for i in np.unique(self.items).tolist()]

    def with_unknown_items(self, known: Iterable[str]) -> tuple[list[RowError], int]:
        """(first errors, number of errors) once rows whose item is not in ``known`` are
        added as errors."""
        known = set(known)
        ok = np.array([k in known for k in self.item_keys], dtype=bool)
        bad = np.flatnonzero(~ok[self.items]) if len(self.item_keys) else np.zeros(0, int)
        unknown = [RowError(int(self.lines[j]), "item",
                            f"item {self.item_keys[self.items[j]]!r} is not in the catalogue")
                   for j in bad[:self.keep_errors].tolist()]
        return _first(self.errors + unknown, self.keep_errors), self.total_errors + len(bad)

    def batches(self, size: int = 50_000) -> Iterator[Batch]:
        """The rows as :class:`Batch` objects of at most ``size`` rows, in line order."""
        for start in range(0, len(self), size):
            part = slice(start, start + size)
            yield Batch([self.user_keys[u] for u in self.users[part].tolist()],
                        [self.item_keys[i] for i in self.items[part].tolist()],
                        self.values[part].tolist(),
                        [_stamp(m) for m in self.micros[part].tolist()],
                        self.lines[part].tolist())

    @classmethod
    def of(cls, batches: Batch | Iterable[Batch]) -> Collected:
        """Valid, de-duplicated :class:`Batch` rows as columns (no errors)."""
        batches = [batches] if isinstance(batches, Batch) else list(batches)
        user_index: dict[str, int] = {}
        item_index: dict[str, int] = {}
        cols: tuple[list, ...] = ([], [], [], [], [])
        for b in batches:
            cols[0].extend(user_index.setdefault(u, len(user_index)) for u in b.users)
            cols[1].extend(item_index.setdefault(i, len(item_index)) for i in b.items)
            cols[2].extend(b.values)
            cols[3].extend(map(_micros, b.timestamps))
            cols[4].extend(b.lines)
        dtypes = (np.int32, np.int32, np.float64, np.int64, np.int32)
        arrays = [np.array(c, dtype=d) for c, d in zip(cols, dtypes, strict=True)]
        return cls(list(user_index), list(item_index), *arrays, errors=[], total_errors=0)

    def batch(self) -> Batch:
        """All rows as one :class:`Batch`."""
        return next(self.batches(max(1, len(self))), Batch([], [], [], [], []))


def collect(stream: BinaryIO, content_type: str, scale: tuple[float, float],
            max_rows: int | None = None, keep_errors: int | None = None,
            content_encoding: str | None = None, max_bytes: int | None = None) -> Collected:
    """Read, validate and de-duplicate an upload body from ``stream`` in bounded memory
    (gzip undone, its decompressed size capped at ``max_bytes``).

    Raises :class:`UploadRejected` (unreadable body), :class:`TooManyRows`,
    :class:`BodyTooLarge` and :class:`UnsupportedMediaType`; offending rows are in the
    result's errors.
    """
    from algorithms.ratings_io import read_rows

    rows = read_rows(stream, content_type, content_encoding, max_bytes)
    return Collector(scale, keep_errors, max_rows).add_all(rows).finish()


def _raw(rows: Iterator[tuple | RowError], max_rows: int | None) -> RawRows:
    """Every row of a reader as :class:`RawRows`; a row of the wrong structure raises
    :class:`UploadRejected` (listing all of them), more than ``max_rows``
    :class:`TooManyRows`."""
    out: tuple[list, ...] = ([], [], [], [], [])
    errors = []
    for n, row in enumerate(rows, start=1):
        if max_rows is not None and n > max_rows:
            raise TooManyRows(max_rows)
        if isinstance(row, RowError):
            errors.append(row)
            continue
        for column, value in zip(out, row, strict=True):
            column.append(value)
    if errors:
        raise UploadRejected(errors)
    return RawRows(*out)


def parse_csv(data: bytes, max_rows: int | None = None) -> RawRows:
    """The raw rows of a whole CSV body (see :func:`algorithms.readers.csv_rows`)."""
    from algorithms.readers import csv_rows

    return _raw(csv_rows(io.BytesIO(data)), max_rows)


def parse_json(data: bytes, max_rows: int | None = None) -> RawRows:
    """The raw rows of a whole JSON body (see :func:`algorithms.readers.json_rows`)."""
    from algorithms.readers import json_rows

    return _raw(json_rows(io.BytesIO(data)), max_rows)


def parse_body(data: bytes, content_type: str, max_rows: int | None = None) -> RawRows:
    """Parse a CSV or JSON upload according to its media type (JSON when none is given).

    Raises only :class:`UploadRejected`, :class:`TooManyRows` (over ``max_rows``) and
    :class:`UnsupportedMediaType`, whatever the bytes.
    """
    from algorithms.readers import read_rows

    return _raw(read_rows(io.BytesIO(data), content_type), max_rows)


def _rows_of(raw: RawRows) -> Iterator[tuple]:
    return zip(raw.lines, raw.users, raw.items, raw.ratings, raw.timestamps, strict=True)


def check_rows(raw: RawRows, scale: tuple[float, float]) -> tuple[Batch, list[RowError]]:
    """The valid, de-duplicated rows of ``raw`` and the errors of the others."""
    collected = Collector(scale).add_all(_rows_of(raw)).finish()
    return collected.batch(), collected.errors


def _validate_rows(raw: RawRows, scale: tuple[float, float]) -> tuple[Batch, list[RowError]]:
    """:func:`check_rows` without the vectorised fast path (what the fast path must match)."""
    collected = Collector(scale, fast=False).add_all(_rows_of(raw)).finish()
    return collected.batch(), collected.errors


def validate(raw: RawRows, scale: tuple[float, float]) -> Batch:
    """Check every row and drop exact duplicates; raise :class:`UploadRejected` on any error.

    The same (user, item) twice with the same rating is kept once (the later timestamp
    wins); with different ratings it is an error naming the earlier line.
    """
    batch, errors = check_rows(raw, scale)
    if errors:
        raise UploadRejected(errors)
    return batch
