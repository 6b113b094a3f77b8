"""Admin: tenants and their API keys."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response, status

from app.deps import UNPROCESSABLE, SessionDep, errors, require_admin
from app.idempotency import IdempotencyKey
from app.models import ApiKey, Tenant
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
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
)
from app.services import tenants
from app.services.tenants import privacy_of

router = APIRouter(prefix=API_PREFIX + "/admin/tenants", tags=["admin: tenants"],
                   dependencies=[Depends(require_admin)], responses=errors(401, 429))


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
    created = tenants.create_tenant(session, body, idempotency_key)
    if created.replayed:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotency-Replayed"] = "true"
    response.headers["Location"] = f"{router.prefix}/{created.tenant.id}"
    return created.tenant


@router.get("", response_model=TenantsPublic)
def read_tenants(session: SessionDep) -> TenantsPublic:
    """List all tenants."""
    every = tenants.list_tenants(session)
    return TenantsPublic(data=[TenantPublic.model_validate(t) for t in every],
                         count=len(every))


def _detail(session, tenant: Tenant) -> TenantDetail:
    return TenantDetail(**TenantPublic.model_validate(tenant).model_dump(),
                        privacy=privacy_of(session, tenant))


@router.get("/{tenant_id}", response_model=TenantDetail, responses=errors(404))
def read_tenant(session: SessionDep, tenant_id: PathId) -> TenantDetail:
    """One tenant, with its privacy spend: lifetime against its budget, and per job."""
    return _detail(session, tenants.get_tenant(session, tenant_id))


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
    given = body.model_dump(exclude_unset=True)  # null is refused by the schema (422)
    tenant = tenants.update_tenant(session, request.app, tenant_id, given,
                                   actor(request, x_actor))
    return _detail(session, tenant)


def actor(request: Request, named: str | None) -> str:
    """``admin:<first 12 hex of SHA-256 of the admin token>`` and the ``X-Actor`` given."""
    fingerprint = hashlib.sha256(request.app.state.admin_token.encode()).hexdigest()[:12]
    return f"admin:{fingerprint}" + (f" ({named})" if named else "")


@router.get("/{tenant_id}/audit", response_model=TenantAuditLog, responses=errors(404))
def read_tenant_audit(session: SessionDep, tenant_id: PathId) -> TenantAuditLog:
    """Every change made to the tenant (PATCH), oldest first."""
    rows = tenants.audit_log(session, tenant_id)
    return TenantAuditLog(data=[TenantAuditPublic.model_validate(r) for r in rows],
                          count=len(rows))


@router.post("/{tenant_id}/api-keys", response_model=ApiKeyCreated,
             status_code=status.HTTP_201_CREATED, responses=errors(400, 404))
def create_api_key(session: SessionDep, tenant_id: PathId, response: Response,
                   body: ApiKeyCreate | None = None) -> ApiKeyCreated:
    """Issue an API key; the secret is in this response only."""
    record, key = tenants.create_api_key(session, tenant_id, body.name if body else None)
    response.headers["Location"] = f"{router.prefix}/{tenant_id}/api-keys/{record.id}"
    return ApiKeyCreated(**ApiKeyPublic.model_validate(record).model_dump(), key=key)


@router.get("/{tenant_id}/api-keys", response_model=ApiKeysPublic, responses=errors(404))
def read_api_keys(session: SessionDep, tenant_id: PathId) -> ApiKeysPublic:
    """List a tenant's keys (prefixes only, never secrets)."""
    keys = tenants.api_keys(session, tenant_id)
    return ApiKeysPublic(data=[ApiKeyPublic.model_validate(k) for k in keys], count=len(keys))


@router.get("/{tenant_id}/api-keys/{key_id}", response_model=ApiKeyPublic,
            responses=errors(404))
def read_api_key(session: SessionDep, tenant_id: PathId, key_id: PathId) -> ApiKey:
    """One active key (its prefix, never its secret); a revoked (deleted) key is 404 here
    and stays listed, with ``revoked_at``, in the tenant's key list."""
    return tenants.active_api_key(session, tenant_id, key_id)


@router.delete("/{tenant_id}", response_model=TenantDeleted, responses=errors(404, 409))
def delete_tenant(request: Request, session: SessionDep, tenant_id: PathId) -> TenantDeleted:
    """Delete a tenant with its keys, users, ratings, job data, snapshots and ledger
    (409 while a queued or running job includes it). Items stay, and so do the item
    factors jobs it took part in already released to the other tenants."""
    name, counted = tenants.delete_tenant(session, request.app, tenant_id)
    return TenantDeleted(id=tenant_id, name=name, **counted)


@router.delete("/{tenant_id}/api-keys/{key_id}", response_model=ApiKeyPublic,
               responses=errors(404))
def revoke_api_key(request: Request, session: SessionDep, tenant_id: PathId,
                   key_id: PathId) -> ApiKey:
    """Revoke a key: refused at once by this process, by others within the serving cache."""
    return tenants.revoke_api_key(session, request.app, tenant_id, key_id)

