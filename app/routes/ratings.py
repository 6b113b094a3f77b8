"""Tenant: upload, list, count and delete its own ratings."""

from __future__ import annotations

import tempfile
from typing import BinaryIO

from fastapi import APIRouter, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from algorithms.ingest import BodyTooLarge, TooManyRows, UnsupportedMediaType, UploadRejected
from algorithms.readers import MULTIPART, media_type, unwrap_multipart
from app import store
from app.deps import OwnTenantDep, SessionDep, SettingsDep, check_limit, errors
from app.idempotency import IdempotencyKey
from app.limits import too_large
from app.problems import ApiError
from app.routes import API_PREFIX
from app.schemas import (
    Limit,
    Offset,
    RatingPublic,
    RatingsCount,
    RatingsPublic,
    RatingsUpload,
    UploadResult,
    UserRatingsDeleted,
)
from app.services import ratings
from app.uploads import IdempotencyConflict, request_digest, upload_ratings

router = APIRouter(prefix=API_PREFIX + "/tenants/{tenant_id}", tags=["tenant: ratings"],
                   responses=errors(401, 404))


UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": RatingsUpload.model_json_schema()},
    "text/csv": {"schema": {"type": "string", "example": "user,item,rating,timestamp\n"
                                                         "u1,1193,5,978300760\nu1,661,3\n"}},
    "text/tab-separated-values": {"schema": {"type": "string",
                                             "example": "196\t242\t3\t881250949\n"
                                                        "186\t302\t3\t891717742\n"}},
    "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary", "description":
                                "CSV, TSV, JSON or Parquet ratings (gzip-compressed or "
                                "not), read by the part's Content-Type, else its filename's "
                                "extension (.csv, .tsv, .data, .dat, .json, .parquet), else "
                                "its first character."}}}},
}}}


SPOOL_IN_MEMORY = 1 << 20
"""Bodies up to this size stay in memory; larger ones are spooled to a temporary file."""


async def spool_body(request: Request, limit: int, content_type: str) -> tuple[BinaryIO, str]:
    """The body in a (spooled) temporary file, positioned at its start, and its
    :func:`app.uploads.request_hash`; refused with 413 as soon as it is known to exceed
    ``limit`` bytes. The caller closes the file."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
    digest, size = request_digest(content_type), 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            digest.update(chunk)
            spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool, digest.hexdigest()


def rejection(exc: UploadRejected, cap: int) -> ApiError:
    """The 422 of an upload with offending rows: each row's line, field and reason."""
    rows = [{"line": e.line, "field": e.field, "message": e.reason} for e in exc.errors[:cap]]
    return ApiError(status.HTTP_422_UNPROCESSABLE_CONTENT, "upload_rejected", str(exc),
                    errors=rows, omitted=max(0, exc.total - cap))


@router.post("/ratings", response_model=UploadResult, openapi_extra=UPLOAD_BODY, responses={
    413: {"description": "Body over the size limit (decompressed: "
                         "FEDREC_MAX_DECOMPRESSED_BYTES) or more rows than allowed."},
    415: {"description": "Not JSON, CSV, TSV, Parquet or multipart; an unknown "
                         "Content-Encoding; Parquet on a server without pyarrow."},
    429: {"description": "Too many uploads of this tenant in progress; see Retry-After."},
    422: {"description": "Offending rows (``errors``: line, field, message; nothing "
                         "stored), a bad Idempotency-Key, or an invalid path."}})
async def create_ratings(request: Request, tenant: OwnTenantDep, session: SessionDep,
                         settings: SettingsDep,
                         idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Upload ratings as JSON, delimited text (``,`` ``;`` tab or ``::``, found on the first
    line: MovieLens ``u.data`` and ML-1M ``ratings.dat`` as they are; decimal commas when
    the delimiter is not a comma), Parquet, or a multipart form's ``file`` (``curl -F
    file=@u.data``), gzip-compressed or not (magic bytes or ``Content-Encoding: gzip``);
    all rows are stored or none.

    The body is read as a stream in bounded memory; at most FEDREC_MAX_CONCURRENT_UPLOADS
    uploads of one tenant run at once in a process (429 with Retry-After beyond)."""
    content_type = request.headers.get("content-type", "")
    reading = {"content_encoding": request.headers.get("content-encoding"),
               "max_bytes": settings.max_decompressed_bytes}
    with request.app.state.upload_slots.slot(tenant.id):
        body, digest = await spool_body(request, settings.max_upload_bytes, content_type)
        with body:
            if media_type(content_type) != MULTIPART:
                return await _upload(session, settings, tenant, body, digest, content_type,
                                     idempotency_key, request.app.state.metrics, reading)
            with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as part:
                try:
                    media, digest = await run_in_threadpool(_unwrap, body, content_type, part)
                except UploadRejected as exc:
                    raise rejection(exc, settings.max_reported_errors) from None
                return await _upload(session, settings, tenant, part, digest, media,
                                     idempotency_key, request.app.state.metrics,
                                     dict(reading, content_encoding=None))


def _unwrap(body: BinaryIO, content_type: str, part: BinaryIO) -> tuple[str, str]:
    """The media type of a multipart body's file (copied into ``part``) and its digest:
    over the file, not the form, so a retry (with a new random boundary) still matches."""
    media = unwrap_multipart(body, content_type, part)
    digest = request_digest(media)
    while chunk := part.read(1 << 20):
        digest.update(chunk)
    part.seek(0)
    return media, digest.hexdigest()


async def _upload(session, settings, tenant, body: BinaryIO, digest: str, content_type: str,
                  idempotency_key: str | None, metrics, reading: dict) -> JSONResponse:
    """Parse, check and store the spooled body in the threadpool; domain errors to HTTP."""
    try:
        return await _store(session, settings, tenant, body, digest, content_type,
                            idempotency_key, metrics, reading)
    except ApiError as exc:
        metrics.uploads.labels(exc.code).inc()
        raise


async def _store(session, settings, tenant, body: BinaryIO, digest: str, content_type: str,
                 idempotency_key: str | None, metrics, reading: dict) -> JSONResponse:
    try:
        outcome = await run_in_threadpool(upload_ratings, session, tenant, body, content_type,
                                          idempotency_key, settings.max_upload_rows, digest,
                                          settings.max_reported_errors, **reading)
    except UploadRejected as exc:
        raise rejection(exc, settings.max_reported_errors) from None
    except IdempotencyConflict as exc:
        raise ApiError(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.code, str(exc)) from None
    except TooManyRows as exc:
        raise ApiError(status.HTTP_413_CONTENT_TOO_LARGE, "too_many_rows", str(exc)) from None
    except BodyTooLarge as exc:
        raise ApiError(status.HTTP_413_CONTENT_TOO_LARGE, "decompressed_too_large",
                       str(exc)) from None
    except UnsupportedMediaType as exc:
        raise ApiError(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                       str(exc)) from None
    headers = {"Idempotency-Replayed": "true"} if outcome.replayed else {}
    metrics.uploads.labels("replayed" if outcome.replayed else "stored").inc()
    if not outcome.replayed:
        metrics.rows.inc(outcome.body.get("stored", 0))
    return JSONResponse(outcome.body, status_code=outcome.status_code, headers=headers)


@router.get("/ratings", response_model=RatingsPublic)
def read_ratings(tenant: OwnTenantDep, session: SessionDep, settings: SettingsDep,
                 user: str | None = None, offset: Offset = 0,
                 limit: Limit = 100) -> RatingsPublic:
    """A page of the tenant's ratings (one user's with ``?user=``); ``count`` is the total."""
    check_limit(("query", "limit"), limit, settings.max_page_size, "FEDREC_MAX_PAGE_SIZE")
    rows = store.list_ratings(session, tenant.id, user, limit,
                              offset)
    data = [RatingPublic(user=u, item=i, rating=v, timestamp=t) for u, i, v, t in rows]
    return RatingsPublic(data=data, count=store.count_ratings(session, tenant.id, user))


@router.get("/ratings/count", response_model=RatingsCount)
def count_ratings(tenant: OwnTenantDep, session: SessionDep) -> RatingsCount:
    """How many ratings and distinct users the tenant has."""
    return RatingsCount(count=store.count_ratings(session, tenant.id),
                        users=store.count_users(session, tenant.id))


@router.delete("/users/{user}/ratings", response_model=UserRatingsDeleted,
               response_model_exclude_none=True,
               responses={202: {"model": UserRatingsDeleted,
                                "description": "an agent tenant: its agent forgets the user"}})
def delete_user_ratings(request: Request, response: Response, tenant: OwnTenantDep,
                        session: SessionDep, user: str) -> UserRatingsDeleted:
    """Forget a user: their ratings, and their rows in trained snapshots, job data and
    rating statistics (recomputed in the background; repeatable: 0 deleted when the user
    was forgotten before). For an agent tenant (``fedrec agent``; the coordinator holds no
    ratings of it) the request is recorded for its agent, which forgets the user on the
    tenant's machine when it next polls: 202 with ``agent`` true. So is the request of a
    tenant that holds no ratings here yet, as an agent tenant before its first job: its
    agent leaves the user out from the first job it joins."""
    deleted, agent = ratings.forget(session, request.app.state.celery, tenant.id, user)
    if agent:
        response.status_code = status.HTTP_202_ACCEPTED
    return UserRatingsDeleted(user=user, deleted=deleted, agent=agent or None)
