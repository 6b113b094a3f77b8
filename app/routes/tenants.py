"""Admin: tenants and their API keys."""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response, status
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.deps import UNPROCESSABLE, SessionDep, errors, require_admin, tenant_not_found
from app.idempotency import IdempotencyError, IdempotencyKey, request_hash, row_for_key
from app.logs import bind
from app.models import ApiKey, Tenant, TenantAudit, utcnow
from app.problems import ApiError
from app.routes import API_PREFIX
from app.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPublic,
    PathId,
    TenantAuditLog,
    TenantAuditPublic,
    TenantCreate,
    TenantDeleted,
    TenantDetail,
    TenantPrivacy,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
)
from app.security import generate_key
from app.training.forget import TenantInJob, forget_tenant
from app.training.ledger import change_budget, spend_summary
from privacy.ledger import BudgetChangeRefused

log = logging.getLogger("fedrec")
router = APIRouter(prefix=API_PREFIX + "/admin/tenants", tags=["admin: tenants"],
                   dependencies=[Depends(require_admin)], responses=errors(401, 429))


def _tenant(session: SessionDep, tenant_id: int) -> Tenant:
    bind(tenant_id=tenant_id)
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise tenant_not_found()
    return tenant


TENANT_REPLAYED = {200: {"model": TenantPublic, "description": "A replay: the tenant "
                         "created earlier with the same Idempotency-Key and body (header "
                         "Idempotency-Replayed)."}}


@router.post("", response_model=TenantPublic, status_code=status.HTTP_201_CREATED,
             responses={**TENANT_REPLAYED, **errors(400, 409), **UNPROCESSABLE})
def create_tenant(session: SessionDep, body: TenantCreate, response: Response,
                  idempotency_key: IdempotencyKey = None) -> Tenant:
    """Create a tenant (``Location``: its URL).

    With an ``Idempotency-Key``, a retry with the same body returns the tenant created the
    first time (200, ``Idempotency-Replayed: true``); the same key with another body is
    422 (the rules of job creation, app/idempotency.py)."""
    digest = request_hash(body.model_dump(mode="json"))
    if idempotency_key is not None and (done := _for_key(session, idempotency_key, digest)):
        return _replayed(response, done)
    tenant = Tenant(**body.model_dump(), idempotency_key=idempotency_key,
                    request_hash=digest if idempotency_key is not None else None)
    session.add(tenant)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        if idempotency_key is not None and (done := _for_key(session, idempotency_key,
                                                             digest)):
            return _replayed(response, done)  # a concurrent retry committed first
        raise ApiError(status.HTTP_409_CONFLICT, "tenant_name_taken",
                       f"A tenant named {body.name!r} already exists") from None
    response.headers["Location"] = f"{router.prefix}/{tenant.id}"
    return tenant


def _for_key(session, key: str, digest: str) -> Tenant | None:
    try:
        return row_for_key(session, Tenant, key, digest, "tenant")
    except IdempotencyError as exc:
        raise ApiError(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.code, str(exc)) from None


def _replayed(response: Response, tenant: Tenant) -> Tenant:
    response.status_code = status.HTTP_200_OK
    response.headers["Idempotency-Replayed"] = "true"
    response.headers["Location"] = f"{router.prefix}/{tenant.id}"
    return tenant


@router.get("", response_model=TenantsPublic)
def read_tenants(session: SessionDep) -> TenantsPublic:
    """List all tenants."""
    tenants = session.scalars(select(Tenant).order_by(Tenant.id)).all()
    return TenantsPublic(data=[TenantPublic.model_validate(t) for t in tenants],
                         count=len(tenants))


def privacy_public(session, tenant: Tenant) -> TenantPrivacy:
    """The tenant's spend (app/training/ledger.py) with infinity spelt "infinity"."""
    summary = spend_summary(session, tenant)
    for record in (summary, *summary["jobs"]):
        for name in ("epsilon_spent", "epsilon", "epsilon_at_requested_delta"):
            if name in record and math.isinf(record[name]):
                record[name] = "infinity"
    return TenantPrivacy(**summary)


def _detail(session, tenant: Tenant) -> TenantDetail:
    return TenantDetail(**TenantPublic.model_validate(tenant).model_dump(),
                        privacy=privacy_public(session, tenant))


@router.get("/{tenant_id}", response_model=TenantDetail, responses=errors(404))
def read_tenant(session: SessionDep, tenant_id: PathId) -> TenantDetail:
    """One tenant, with its privacy spend: lifetime against its budget, and per job."""
    return _detail(session, _tenant(session, tenant_id))


@router.patch("/{tenant_id}", response_model=TenantDetail,
              responses={**errors(404, 409), **UNPROCESSABLE})
def update_tenant(request: Request, session: SessionDep, tenant_id: PathId,
                  body: TenantUpdate,
                  x_actor: Annotated[str | None, Header(max_length=200, description=(
                      "Who makes the change (recorded in the audit log with the admin "
                      "token's fingerprint)."))] = None) -> TenantDetail:
    """Change a tenant's name, budget or opt-ins; only the fields given change.

    A budget change goes through the privacy ledger: a raise is allowed, a cut only down
    to what the tenant has already spent (409 otherwise). Every change is recorded in the
    tenant's audit log (who, when, old and new values: ``GET .../audit``)."""
    tenant = _tenant(session, tenant_id)
    given = body.model_dump(exclude_unset=True)  # null is refused by the schema (422)
    changes = {k: {"old": getattr(tenant, k), "new": v} for k, v in given.items()
               if getattr(tenant, k) != v}
    if "privacy_budget" in changes:
        try:
            change_budget(session, tenant, given["privacy_budget"])
        except BudgetChangeRefused as exc:
            raise ApiError(status.HTTP_409_CONFLICT, "budget_below_spend", str(exc)) from None
    for name, change in changes.items():
        if name != "privacy_budget":
            setattr(tenant, name, change["new"])
    if changes:
        log.info("tenant %s changed by %s: %s", tenant.id, actor(request, x_actor),
                 sorted(changes))
        session.add(TenantAudit(tenant_id=tenant.id, actor=actor(request, x_actor),
                                changes=changes))
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            raise ApiError(status.HTTP_409_CONFLICT, "tenant_name_taken",
                           f"A tenant named {given.get('name')!r} already exists") from None
        request.app.state.key_cache.forget()  # cached copies of the tenant are stale
    return _detail(session, tenant)


def actor(request: Request, named: str | None) -> str:
    """``admin:<first 12 hex of SHA-256 of the admin token>`` and the ``X-Actor`` given."""
    fingerprint = hashlib.sha256(request.app.state.admin_token.encode()).hexdigest()[:12]
    return f"admin:{fingerprint}" + (f" ({named})" if named else "")


@router.get("/{tenant_id}/audit", response_model=TenantAuditLog, responses=errors(404))
def read_tenant_audit(session: SessionDep, tenant_id: PathId) -> TenantAuditLog:
    """Every change made to the tenant (PATCH), oldest first."""
    _tenant(session, tenant_id)
    rows = session.scalars(select(TenantAudit).where(TenantAudit.tenant_id == tenant_id)
                           .order_by(TenantAudit.id)).all()
    return TenantAuditLog(data=[TenantAuditPublic.model_validate(r) for r in rows],
                          count=len(rows))


@router.post("/{tenant_id}/api-keys", response_model=ApiKeyCreated,
             status_code=status.HTTP_201_CREATED, responses=errors(400, 404))
def create_api_key(session: SessionDep, tenant_id: PathId, response: Response,
                   body: ApiKeyCreate | None = None) -> ApiKeyCreated:
    """Issue an API key; the secret is in this response only."""
    _tenant(session, tenant_id)
    key, prefix, key_hash = generate_key()
    record = ApiKey(tenant_id=tenant_id, prefix=prefix, key_hash=key_hash,
                    name=body.name if body else None)
    session.add(record)
    session.commit()
    response.headers["Location"] = f"{router.prefix}/{tenant_id}/api-keys/{record.id}"
    return ApiKeyCreated(**ApiKeyPublic.model_validate(record).model_dump(), key=key)


@router.get("/{tenant_id}/api-keys", response_model=ApiKeysPublic, responses=errors(404))
def read_api_keys(session: SessionDep, tenant_id: PathId) -> ApiKeysPublic:
    """List a tenant's keys (prefixes only, never secrets)."""
    _tenant(session, tenant_id)
    keys = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id)
                           .order_by(ApiKey.id)).all()
    return ApiKeysPublic(data=[ApiKeyPublic.model_validate(k) for k in keys], count=len(keys))


def _key(session, tenant_id: int, key_id: int) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None or key.tenant_id != tenant_id:
        raise ApiError(status.HTTP_404_NOT_FOUND, "api_key_not_found", "API key not found")
    return key


@router.get("/{tenant_id}/api-keys/{key_id}", response_model=ApiKeyPublic,
            responses=errors(404))
def read_api_key(session: SessionDep, tenant_id: PathId, key_id: PathId) -> ApiKey:
    """One active key (its prefix, never its secret); a revoked (deleted) key is 404 here
    and stays listed, with ``revoked_at``, in the tenant's key list."""
    key = _key(session, tenant_id, key_id)
    if key.revoked_at is not None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "api_key_revoked",
                       f"API key {key_id} was revoked")
    return key


@router.delete("/{tenant_id}", response_model=TenantDeleted, responses=errors(404, 409))
def delete_tenant(request: Request, session: SessionDep, tenant_id: PathId) -> TenantDeleted:
    """Delete a tenant with its keys, users, ratings, job data, snapshots and ledger
    (409 while a queued or running job includes it). Items stay, and so do the item
    factors jobs it took part in already released to the other tenants."""
    tenant = _tenant(session, tenant_id)
    name = tenant.name
    try:
        counted = forget_tenant(session, tenant)
    except TenantInJob as exc:
        raise ApiError(status.HTTP_409_CONFLICT, "tenant_in_job",
                       f"Tenant {tenant_id} takes part in unfinished jobs {exc.job_ids}; "
                       "cancel them first") from None
    session.commit()
    request.app.state.key_cache.forget()  # its keys are refused by this process at once
    request.app.state.factor_cache.forget(tenant_id)
    log.info("tenant %s (%s) deleted: %s", tenant_id, name, counted)
    return TenantDeleted(id=tenant_id, name=name, **counted)


@router.delete("/{tenant_id}/api-keys/{key_id}", response_model=ApiKeyPublic,
               responses=errors(404))
def revoke_api_key(request: Request, session: SessionDep, tenant_id: PathId,
                   key_id: PathId) -> ApiKey:
    """Revoke a key: refused at once by this process, by others within the serving cache."""
    key = _key(session, tenant_id, key_id)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.commit()
    request.app.state.key_cache.forget()
    return key

