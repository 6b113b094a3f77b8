"""Parsing and validation of rating uploads. Pure: no HTTP, no SQL.

An upload is JSON ``{"ratings": [{"user", "item", "rating", "timestamp"?}, ...]}`` or CSV
``user,item,rating[,timestamp]`` with an optional header line. Every row is checked before
anything is stored; :class:`UploadRejected` carries every offending row (line, field,
reason). ``line`` is the CSV line number (the header counts) or, for JSON, the 1-based
position in ``ratings``.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import math
from collections.abc import Iterable, Iterator

import numpy as np

MAX_KEY_LENGTH = 255
CSV_HEADERS = (("user", "item", "rating"), ("user", "item", "rating", "timestamp"))


@dataclasses.dataclass(frozen=True)
class RowError:
    """One offending row of an upload."""

    line: int
    field: str
    reason: str


class UploadRejected(Exception):
    """The upload is invalid; nothing may be stored."""

    def __init__(self, errors: list[RowError], message: str | None = None):
        self.errors = sorted(errors, key=lambda e: e.line)
        super().__init__(message or f"{len(errors)} invalid row(s); nothing was stored")


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


def _is_header(fields: list[str]) -> bool:
    return tuple(f.strip().lower() for f in fields) in CSV_HEADERS


def parse_csv(data: bytes, max_rows: int | None = None) -> RawRows:
    """Split a CSV body into raw columns; malformed lines raise :class:`UploadRejected`,
    more than ``max_rows`` data lines :class:`TooManyRows`."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UploadRejected([], f"CSV body is not valid UTF-8 (byte {exc.start})") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    lines, users, items, ratings, stamps = [], [], [], [], []
    errors: list[RowError] = []
    seen = 0
    for number, fields in _csv_rows(rows):
        if not fields or (number == 1 and _is_header(fields)):
            continue
        seen += 1
        if max_rows is not None and seen > max_rows:
            raise TooManyRows(max_rows)
        if len(fields) not in (3, 4):
            errors.append(RowError(number, "row", f"expected 3 or 4 fields, got {len(fields)}"))
            continue
        lines.append(number)
        users.append(fields[0])
        items.append(fields[1])
        ratings.append(fields[2])
        stamps.append(fields[3] if len(fields) == 4 and fields[3] != "" else None)
    if errors:
        raise UploadRejected(errors)
    return RawRows(lines, users, items, ratings, stamps)


def _csv_rows(rows) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of a csv reader; a line the csv module refuses (a field
    over its size limit) raises :class:`UploadRejected` naming that line."""
    number = 0
    while True:
        number += 1
        try:
            fields = next(rows)
        except StopIteration:
            return
        except csv.Error as exc:
            raise UploadRejected([RowError(number, "row", f"unreadable CSV: {exc}")]) from None
        yield number, fields


def parse_json(data: bytes, max_rows: int | None = None) -> RawRows:
    """Read ``{"ratings": [...]}``; a body of the wrong shape raises :class:`UploadRejected`,
    more than ``max_rows`` entries :class:`TooManyRows`."""
    try:
        doc = json.loads(data)
    except ValueError as exc:  # invalid JSON or UTF-8, or an integer of > 4300 digits
        raise UploadRejected([], f"body is not valid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise UploadRejected([], "body is not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ratings"), list):
        raise UploadRejected([], 'JSON body must be an object {"ratings": [...]}')
    if max_rows is not None and len(doc["ratings"]) > max_rows:
        raise TooManyRows(max_rows)
    lines, users, items, ratings, stamps = [], [], [], [], []
    errors: list[RowError] = []
    for number, row in enumerate(doc["ratings"], start=1):
        if not isinstance(row, dict):
            errors.append(RowError(number, "row", "must be an object"))
            continue
        unknown = set(row) - {"user", "item", "rating", "timestamp"}
        if unknown:
            names = ", ".join(sorted(map(str, unknown)))
            errors.append(RowError(number, "row", f"unknown field(s): {names}"))
            continue
        lines.append(number)
        users.append(row.get("user"))
        items.append(row.get("item"))
        ratings.append(row.get("rating"))
        stamps.append(row.get("timestamp"))
    if errors:
        raise UploadRejected(errors)
    return RawRows(lines, users, items, ratings, stamps)


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


def validate(raw: RawRows, scale: tuple[float, float]) -> Batch:
    """Check every row and drop exact duplicates; raise :class:`UploadRejected` on any error.

    The same (user, item) twice with the same rating is kept once (the later timestamp
    wins); with different ratings it is an error naming the earlier line. A vectorised
    fast path accepts the common all-valid upload; anything else takes the row-by-row
    path, which lists every offending row.
    """
    batch, errors = check_rows(raw, scale)
    if errors:
        raise UploadRejected(errors)
    return batch


def check_rows(raw: RawRows, scale: tuple[float, float]) -> tuple[Batch, list[RowError]]:
    """The valid, de-duplicated rows of ``raw`` and the errors of the others."""
    fast = _validate_fast(raw, scale)
    return (fast, []) if fast is not None else _validate_rows(raw, scale)


def _fast_keys(values: list[object]) -> list[str] | None:
    if not all(type(v) is str for v in values):
        return None
    keys = [v.strip() for v in values]
    ok = all(0 < len(k) <= MAX_KEY_LENGTH and k.isprintable() for k in keys)
    return keys if ok else None


def _validate_fast(raw: RawRows, scale: tuple[float, float]) -> Batch | None:
    """The all-valid, no-duplicate, no-timestamp upload in vectorised form, else None."""
    if any(t is not None for t in raw.timestamps):
        return None
    users, items = _fast_keys(raw.users), _fast_keys(raw.items)
    if users is None or items is None:
        return None
    if len({u + "\x1f" + i for u, i in zip(users, items, strict=True)}) != len(users):
        return None
    if not all(type(r) in (int, float) or (type(r) is str and "_" not in r)
               for r in raw.ratings):
        return None  # numpy reads "0_4" as 4: such rows take the row-by-row path
    try:
        values = np.asarray(raw.ratings, dtype=np.float64)
    except (ValueError, OverflowError):
        return None
    if not (np.all(np.isfinite(values)) and np.all((values >= scale[0]) & (values <= scale[1]))):
        return None
    return Batch(users, items, values.tolist(), [None] * len(users), list(raw.lines))


def _validate_rows(raw: RawRows, scale: tuple[float, float]) -> tuple[Batch, list[RowError]]:
    errors: list[RowError] = []
    seen: dict[tuple[str, str], int] = {}
    users, items, values, stamps, lines = [], [], [], [], []
    for i, line in enumerate(raw.lines):
        user = _check(errors, line, "user", parse_key, raw.users[i])
        item = _check(errors, line, "item", parse_key, raw.items[i])
        rating = _check(errors, line, "rating", parse_rating, raw.ratings[i], scale)
        stamp = _check(errors, line, "timestamp", parse_timestamp, raw.timestamps[i])
        if user is None or item is None or rating is None:
            continue
        first = seen.setdefault((user, item), len(values))
        if first != len(values):
            if values[first] != rating:
                reason = (f"conflicts with line {lines[first]} for the same user and item "
                          f"({values[first]:g} vs {rating:g})")
                errors.append(RowError(line, "rating", reason))
            elif stamp is not None:
                stamps[first] = stamp
            continue
        users.append(user)
        items.append(item)
        values.append(rating)
        stamps.append(stamp)
        lines.append(line)
    return Batch(users, items, values, stamps, lines), errors


def unknown_item_errors(batch: Batch, known: Iterable[str]) -> list[RowError]:
    """One error per row whose item is not in the catalogue ``known``."""
    known = set(known)
    return [RowError(line, "item", f"item {item!r} is not in the catalogue")
            for line, item in zip(batch.lines, batch.items, strict=True) if item not in known]


def parse_body(data: bytes, content_type: str, max_rows: int | None = None) -> RawRows:
    """Parse a CSV or JSON upload according to its media type (JSON when none is given).

    Raises only :class:`UploadRejected`, :class:`TooManyRows` (over ``max_rows``) and
    :class:`UnsupportedMediaType`, whatever the bytes.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media in ("text/csv", "application/csv"):
        return parse_csv(data, max_rows)
    if media in ("application/json", ""):
        return parse_json(data, max_rows)
    raise UnsupportedMediaType(media)


class UnsupportedMediaType(Exception):
    """The upload is neither JSON nor CSV."""

    def __init__(self, media: str):
        self.media = media
        super().__init__(f"unsupported Content-Type {media!r}; use application/json or text/csv")
