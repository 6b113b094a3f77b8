"""``Idempotency-Key`` rules shared by every creating route (jobs, tenants, uploads).

A request carrying a key is answered, when the key was seen before, with what the first
request created, provided the bodies match (their SHA-256, :func:`request_hash`); the
same key with another body is refused, as is a key that is empty or too long. The
record of what a key created is the created row itself (``idempotency_key`` and
``request_hash`` columns: jobs, tenants) or an :class:`app.models.IdempotencyRecord`
(uploads, which create no row of their own).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, TypeVar

import sqlalchemy as sa
from fastapi import Header
from sqlalchemy.orm import Session

MAX_IDEMPOTENCY_KEY = 255
Row = TypeVar("Row")
IdempotencyKey = Annotated[str | None, Header(
    min_length=1, max_length=MAX_IDEMPOTENCY_KEY,
    description="Makes the request safe to retry: a retry with the same key and body "
                "answers what the first one created (header Idempotency-Replayed); the "
                "same key with another body is 422.")]
"""The ``Idempotency-Key`` header parameter of a creating route (422 when empty or longer
than 255 characters, like any invalid field)."""


class IdempotencyError(ValueError):
    """The key is malformed or was used with a different body (an HTTP 422)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def check_key(key: str) -> None:
    """Refuse an empty or over-long key."""
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise IdempotencyError(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} "
                               "characters", "invalid_idempotency_key")


def conflict(key: str, what: str) -> IdempotencyError:
    """The refusal of a key reused with another body for a new ``what``."""
    return IdempotencyError(f"Idempotency-Key {key[:40]!r} was already used with a "
                            f"different request body; use a new key for a new {what}",
                            "idempotency_conflict")


def request_hash(body: dict[str, Any]) -> str:
    """SHA-256 of a request's validated body (canonical JSON): what a replay must match."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def row_for_key(s: Session, model: type[Row], key: str, digest: str, what: str) -> Row | None:
    """The ``model`` row created earlier with ``key`` (its ``idempotency_key`` column), or
    None; :class:`IdempotencyError` for a malformed key or a different body."""
    check_key(key)
    row = s.scalar(sa.select(model).where(model.idempotency_key == key))
    if row is not None and row.request_hash != digest:
        raise conflict(key, what)
    return row
