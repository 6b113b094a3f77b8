"""An upload end to end: parse, validate, resolve items, store, record idempotency.

Everything happens in one transaction: either every row and the idempotency record are
committed, or nothing is. Errors are domain exceptions; the route maps them to HTTP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from algorithms.ingest import UploadRejected, collect
from app import store
from app.idempotency import IdempotencyError, check_key, conflict
from app.models import IdempotencyRecord, Tenant

IdempotencyConflict = IdempotencyError
"""The key was used before with a different request (or is malformed)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The response of an upload and whether it is a replay of a stored one."""

    status_code: int
    body: dict
    replayed: bool = False


def request_digest(content_type: str):
    """A SHA-256 over the media type, to be updated with the body as it arrives."""
    digest = hashlib.sha256(content_type.split(";", 1)[0].strip().lower().encode())
    digest.update(b"\0")
    return digest


def request_hash(content_type: str, body: bytes) -> str:
    """SHA-256 over the media type and the body: what must match for a replay."""
    digest = request_digest(content_type)
    digest.update(body)
    return digest.hexdigest()


def _replay(session: Session, tenant_id: int, key: str, digest: str) -> Outcome | None:
    record = session.scalar(select(IdempotencyRecord).where(
        IdempotencyRecord.tenant_id == tenant_id, IdempotencyRecord.key == key))
    if record is None:
        return None
    if record.request_hash != digest:
        raise conflict(key, "upload")
    return Outcome(record.status_code, record.response, replayed=True)


def _store(session: Session, tenant: Tenant, body: BinaryIO, content_type: str,
           max_rows: int | None, keep_errors: int | None, reading: dict) -> int:
    collected = collect(body, content_type, (tenant.rating_min, tenant.rating_max),
                        max_rows, keep_errors, **reading)
    items = collected.used_items()
    ids = store.item_ids(session, items)
    if tenant.auto_create_items and len(ids) < len(items):
        store.create_missing_items(session, set(items) - ids.keys())
        ids = store.item_ids(session, items)
    errors, total = collected.with_unknown_items(ids)
    if total:
        raise UploadRejected(errors, total=total)
    if store.upsert_ratings(session, tenant.id, collected, ids):
        store.bump_ratings_version(session, tenant.id)  # only a real change counts
    return len(collected)


def upload_ratings(session: Session, tenant: Tenant, body: bytes | BinaryIO, content_type: str,
                   idempotency_key: str | None, max_rows: int | None = None,
                   digest: str | None = None, keep_errors: int | None = None,
                   content_encoding: str | None = None,
                   max_bytes: int | None = None) -> Outcome:
    """Store an upload atomically, or replay the stored outcome of the same keyed request.

    ``body`` is the bytes or a binary file positioned at their start (then ``digest`` is
    their :func:`request_hash`); it is read as a stream. More than ``max_rows`` rows raise
    :class:`algorithms.ingest.TooManyRows` and store nothing; a rejection lists the first
    ``keep_errors`` offending rows (all when None) and counts the others. A gzip body
    (``content_encoding`` or its magic bytes) is decompressed to at most ``max_bytes``
    (:class:`algorithms.ingest.BodyTooLarge` beyond)."""
    if idempotency_key is not None:
        check_key(idempotency_key)
    if isinstance(body, bytes):
        digest, body = request_hash(content_type, body), io.BytesIO(body)
    if idempotency_key and (done := _replay(session, tenant.id, idempotency_key, digest)):
        return done
    try:
        stored = _store(session, tenant, body, content_type, max_rows, keep_errors,
                        {"content_encoding": content_encoding, "max_bytes": max_bytes})
        outcome = Outcome(200, {"stored": stored})
        if idempotency_key:
            session.add(IdempotencyRecord(tenant_id=tenant.id, key=idempotency_key,
                                          request_hash=digest, status_code=outcome.status_code,
                                          response=outcome.body))
        session.commit()
    except IntegrityError:
        session.rollback()  # a concurrent request with the same key committed first
        done = _replay(session, tenant.id, idempotency_key, digest) if idempotency_key else None
        if done is None:
            raise
        return done
    except BaseException:
        session.rollback()
        raise
    return outcome
