"""Tenant: its own privacy spend (lifetime, remaining, per job)."""

from __future__ import annotations

from fastapi import APIRouter

from app.deps import OwnTenantDep, SessionDep, errors
from app.routes import API_PREFIX
from app.schemas import TenantPrivacy
from app.services.tenants import privacy_of

router = APIRouter(prefix=API_PREFIX + "/tenants/{tenant_id}", tags=["tenant: privacy"],
                   responses=errors(401, 404))


@router.get("/privacy", response_model=TenantPrivacy)
def read_privacy(tenant: OwnTenantDep, session: SessionDep) -> TenantPrivacy:
    """The epsilon this tenant has spent over all jobs, what remains of its budget, and
    what each job spent (404 for any tenant but the key's own)."""
    return privacy_of(session, tenant)
