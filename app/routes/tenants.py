"""Admin: tenants and their API keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, status
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.deps import SessionDep, errors, require_admin, tenant_not_found
from app.models import ApiKey, Tenant, utcnow
from app.problems import ApiError
from app.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPublic,
    PathId,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
)
from app.security import generate_key

router = APIRouter(prefix="/admin/tenants", tags=["admin: tenants"],
                   dependencies=[Depends(require_admin)], responses=errors(401))


def _tenant(session: SessionDep, tenant_id: int) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise tenant_not_found()
    return tenant


@router.post("", response_model=TenantPublic, status_code=status.HTTP_201_CREATED,
             responses=errors(400, 409))
def create_tenant(session: SessionDep, body: TenantCreate) -> Tenant:
    """Create a tenant."""
    tenant = Tenant(**body.model_dump())
    session.add(tenant)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ApiError(status.HTTP_409_CONFLICT, "tenant_name_taken",
                       f"A tenant named {body.name!r} already exists") from None
    return tenant


@router.get("", response_model=TenantsPublic)
def read_tenants(session: SessionDep) -> TenantsPublic:
    """List all tenants."""
    tenants = session.scalars(select(Tenant).order_by(Tenant.id)).all()
    return TenantsPublic(data=[TenantPublic.model_validate(t) for t in tenants],
                         count=len(tenants))


@router.get("/{tenant_id}", response_model=TenantPublic, responses=errors(404))
def read_tenant(session: SessionDep, tenant_id: PathId) -> Tenant:
    """One tenant."""
    return _tenant(session, tenant_id)


@router.post("/{tenant_id}/api-keys", response_model=ApiKeyCreated,
             status_code=status.HTTP_201_CREATED, responses=errors(400, 404))
def create_api_key(session: SessionDep, tenant_id: PathId,
                   body: ApiKeyCreate | None = None) -> ApiKeyCreated:
    """Issue an API key; the secret is in this response only."""
    _tenant(session, tenant_id)
    key, prefix, key_hash = generate_key()
    record = ApiKey(tenant_id=tenant_id, prefix=prefix, key_hash=key_hash,
                    name=body.name if body else None)
    session.add(record)
    session.commit()
    return ApiKeyCreated(**ApiKeyPublic.model_validate(record).model_dump(), key=key)


@router.get("/{tenant_id}/api-keys", response_model=ApiKeysPublic, responses=errors(404))
def read_api_keys(session: SessionDep, tenant_id: PathId) -> ApiKeysPublic:
    """List a tenant's keys (prefixes only, never secrets)."""
    _tenant(session, tenant_id)
    keys = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id)
                           .order_by(ApiKey.id)).all()
    return ApiKeysPublic(data=[ApiKeyPublic.model_validate(k) for k in keys], count=len(keys))


@router.delete("/{tenant_id}/api-keys/{key_id}", response_model=ApiKeyPublic,
               responses=errors(404))
def revoke_api_key(request: Request, session: SessionDep, tenant_id: PathId,
                   key_id: PathId) -> ApiKey:
    """Revoke a key: refused at once by this process, by others within the serving cache."""
    key = session.get(ApiKey, key_id)
    if key is None or key.tenant_id != tenant_id:
        raise ApiError(status.HTTP_404_NOT_FOUND, "api_key_not_found", "API key not found")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.commit()
    request.app.state.key_cache.forget()
    return key

