"""FastAPI dependencies as ``Annotated`` aliases: session, settings, admin, tenant."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.logs import bind
from app.models import ApiKey, Tenant
from app.problems import ApiError
from app.schemas import PathId
from app.security import hash_key, key_prefix, same_secret

admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                          description="The admin token (FEDREC_ADMIN_TOKEN).")
tenant_bearer = HTTPBearer(auto_error=False, scheme_name="TenantApiKey",
                           description="A tenant API key issued by an admin.")
TENANT_NOT_FOUND = "Tenant not found"


def tenant_not_found() -> ApiError:
    """The 404 of a tenant that does not exist, or is not the caller's."""
    return ApiError(status.HTTP_404_NOT_FOUND, "tenant_not_found", TENANT_NOT_FOUND)


ERROR_DESCRIPTIONS = {
    400: "The body could not be decoded.",
    401: "Missing or invalid credentials.",
    404: "Not found (for a tenant route: any tenant but the key's own).",
    409: "Conflicts with the current state.",
    429: "Too many wrong admin tokens from this client (FEDREC_MAX_FAILED_SIGN_INS a "
         "minute); retry after ``Retry-After`` seconds.",
}


UNPROCESSABLE = {422: {"description": "Validation error: ``errors`` names every field at "
                                      "fault, ``detail`` says what is wrong."}}


def errors(*codes: int) -> dict[int | str, dict]:
    """OpenAPI ``responses`` of refusals; their body is a problem (see app/problems.py)."""
    return {code: {"description": ERROR_DESCRIPTIONS[code]} for code in codes}


def _unauthorized(code: str, detail: str) -> HTTPException:
    return ApiError(status.HTTP_401_UNAUTHORIZED, code, detail,
                    headers={"WWW-Authenticate": "Bearer"})


def over_limit(loc: tuple[str, ...], value: int, bound: int, setting: str,
               unit: str = "") -> RequestValidationError:
    """A 422 in FastAPI's validation-error shape for ``value`` above a configured bound."""
    field = loc[-1]
    bounded = f"list at most {bound} {unit}" if unit else f"be at most {bound}"
    msg = f"{field} must {bounded} ({setting}); got {value}"
    kind, ctx = ("too_long", {"max_length": bound}) if unit else ("less_than_equal",
                                                                    {"le": bound})
    return RequestValidationError([{"type": kind, "loc": loc, "msg": msg, "input": value,
                                    "ctx": ctx}])


def check_limit(loc: tuple[str, ...], value: int, bound: int, setting: str,
                unit: str = "") -> None:
    """Raise :func:`over_limit` when ``value > bound``."""
    if value > bound:
        raise over_limit(loc, value, bound, setting, unit)


CONFIGURED_LIMITS = (
    # (where: "query" or a component schema, field, setting, JSON Schema keyword)
    ("query", "limit", "max_page_size", "maximum"),
    ("query", "k", "max_top_k", "maximum"),
    ("JobCreate", "rounds", "max_job_rounds", "maximum"),
    ("JobCreate", "tenant_ids", "max_job_tenants", "maxItems"),
    ("BatchRecommendationsRequest", "k", "max_top_k", "maximum"),
)
"""Bounds set by the settings, enforced with :func:`check_limit` (422 beyond, never a
silent cut) and stated in the OpenAPI document by :func:`document_limits`."""


def document_limits(schema: dict, settings: Settings) -> None:
    """Write the configured bounds (:data:`CONFIGURED_LIMITS`) into the OpenAPI document,
    so it states what this server enforces."""
    components = schema.get("components", {}).get("schemas", {})
    for where, name, setting, keyword in CONFIGURED_LIMITS:
        bound = getattr(settings, setting)
        if where == "query":
            targets = [p["schema"] for item in schema["paths"].values()
                       for op in item.values() if isinstance(op, dict)
                       for p in op.get("parameters", ())
                       if p.get("in") == "query" and p.get("name") == name]
        else:
            prop = components.get(where, {}).get("properties", {}).get(name)
            targets = [] if prop is None else [prop]
        for target in targets:
            for branch in target.get("anyOf", [target]):
                if branch.get("type") in ("integer", "number", "array"):
                    branch[keyword] = min(bound, branch.get(keyword, bound))


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
Credentials = HTTPAuthorizationCredentials | None


TOO_MANY_FAILURES = ("Too many wrong secrets from this client (FEDREC_MAX_FAILED_SIGN_INS "
                     "a minute); retry in {} s")


def client_of(request: Request) -> str:
    """The address a request came from (the proxy's, unless uvicorn trusts its headers)."""
    return request.client.host if request.client else "unknown"


def refuse_if_locked_out(request: Request) -> None:
    """429 with ``Retry-After`` while the client is over its wrong-secret bound
    (:class:`app.security.FailedSignIns`), whatever secret it presents now."""
    wait = request.app.state.sign_ins.wait(client_of(request))
    if wait:
        raise ApiError(status.HTTP_429_TOO_MANY_REQUESTS, "too_many_failed_sign_ins",
                       TOO_MANY_FAILURES.format(wait), headers={"Retry-After": str(wait)})


def require_admin(request: Request, creds: Annotated[Credentials, Depends(admin_bearer)]) -> None:
    """401 unless the request carries the admin token; 429 for a client that sent too many
    wrong ones."""
    if creds is None:
        raise _unauthorized("admin_token_required", "Admin token required")
    refuse_if_locked_out(request)
    if not same_secret(creds.credentials, request.app.state.admin_token, hashed=False):
        request.app.state.sign_ins.failed(client_of(request))
        raise _unauthorized("invalid_admin_token", "Invalid admin token")


def verified_tenant(request: Request, session: Session, presented: str,
                     force: bool = False) -> Tenant:
    """The tenant of an unrevoked key (cached per process, see KeyCache); 401 otherwise.
    ``force`` re-verifies against the database even when the key is cached."""
    cache, now = request.app.state.key_cache, time.monotonic()
    digest = hash_key(presented)
    cached = None if force else cache.get(digest, now)
    if cached is not None:
        return cached
    prefix = key_prefix(presented)
    try:
        key = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix)) if prefix else None
        if key is None or key.revoked_at is not None or not same_secret(presented,
                                                                         key.key_hash):
            raise _unauthorized("invalid_api_key", "Invalid API key")
        tenant = session.get(Tenant, key.tenant_id)
    except BaseException:
        cache.drop(digest)
        raise
    session.expunge(tenant)  # a read-only copy, shared by this process's requests
    cache.put(digest, tenant, now)
    return tenant


def current_tenant(request: Request, session: SessionDep,
                   creds: Annotated[Credentials, Depends(tenant_bearer)]) -> Tenant:
    """The tenant owning the presented, unrevoked API key; 401 otherwise (verified keys
    are cached per process for FEDREC_SERVING_CACHE_SECONDS, see KeyCache)."""
    if creds is None:
        raise _unauthorized("api_key_required", "API key required")
    tenant = verified_tenant(request, session, creds.credentials)
    bind(tenant_id=tenant.id)
    return tenant


def in_background(request: Request, fn) -> None:
    """Run ``fn`` in the threadpool without making the request wait; failures are logged
    (a failed key re-verification has already dropped the key from the cache)."""
    tasks = request.app.state.background_tasks

    async def run() -> None:
        try:
            await run_in_threadpool(fn)
        except Exception as exc:  # noqa: BLE001 - logged, the request already answered
            if not isinstance(exc, HTTPException):
                logging.getLogger("fedrec").exception("background refresh failed")

    task = asyncio.get_running_loop().create_task(run())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def serving_tenant(request: Request, tenant_id: PathId,
                         creds: Annotated[Credentials, Depends(tenant_bearer)]) -> Tenant:
    """:func:`own_tenant` for the serving hot path: on the event loop when the key is
    cached, one threadpool call with its own session when it is not."""
    return await key_tenant(request, tenant_id, None if creds is None else creds.credentials)


async def key_tenant(request: Request, tenant_id: int, presented: str | None) -> Tenant:
    """The body of :func:`serving_tenant`, given the bearer credentials (None when the
    request has none): also called by the recommendation route's fast path
    (``app.routes.recommendations.ServingRoute``), which reads the header itself."""
    if presented is None:
        raise _unauthorized("api_key_required", "API key required")
    state = request.app.state

    def verify() -> Tenant:
        with state.sessions() as session:
            return verified_tenant(request, session, presented, force=True)

    digest = hash_key(presented)
    tenant, recheck = state.key_cache.lookup(digest, time.monotonic())
    state.metrics.cache_lookup("api_keys", tenant is not None)
    if tenant is None:  # requests with the same key wait for one verification
        tenant = await state.coalesced.run(("key", digest), verify)
    elif recheck:  # due for re-verification: done in the background, this request proceeds
        in_background(request, verify)
    bind(tenant_id=tenant.id)
    if tenant.id != tenant_id:
        raise tenant_not_found()
    return tenant


TenantDep = Annotated[Tenant, Depends(current_tenant)]


def own_tenant(tenant: TenantDep, tenant_id: PathId) -> Tenant:
    """The caller's tenant when the path names it; 404 (never 403) for any other tenant."""
    if tenant.id != tenant_id:
        raise tenant_not_found()
    return tenant


AdminDep = Annotated[None, Depends(require_admin)]
OwnTenantDep = Annotated[Tenant, Depends(own_tenant)]
ServingTenantDep = Annotated[Tenant, Depends(serving_tenant)]
