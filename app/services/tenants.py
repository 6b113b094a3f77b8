"""Tenants and their API keys: create, read, change (audited), delete; issue, list and
revoke keys; a tenant's privacy spend.

The admin API (:mod:`app.routes.tenants`) and the tenant's own privacy page
(:mod:`app.routes.tenant_privacy`) call these. Changes that make the process's cached
copies of a tenant or its keys stale clear those caches (``app.state``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from fastapi import FastAPI, status
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.deps import tenant_not_found
from app.idempotency import IdempotencyError, request_hash, row_for_key
from app.logs import bind
from app.models import ApiKey, Tenant, TenantAudit, utcnow
from app.problems import ApiError
from app.schemas import TenantCreate, TenantPrivacy
from app.security import generate_key
from app.training.forget import TenantInJob, forget_tenant
from app.training.ledger import change_budget, spend_summary
from privacy.ledger import BudgetChangeRefused

log = logging.getLogger("fedrec")


def get_tenant(session: Session, tenant_id: int) -> Tenant:
    """The tenant ``tenant_id`` (404 ``tenant_not_found`` if there is none)."""
    bind(tenant_id=tenant_id)
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise tenant_not_found()
    return tenant


def list_tenants(session: Session) -> list[Tenant]:
    """Every tenant, in the order they were created."""
    return list(session.scalars(select(Tenant).order_by(Tenant.id)).all())


@dataclasses.dataclass(frozen=True)
class Created:
    """A tenant created, or (``replayed``) the one an Idempotency-Key created before with
    the same body."""

    tenant: Tenant
    replayed: bool = False


def create_tenant(session: Session, body: TenantCreate,
                  idempotency_key: str | None = None) -> Created:
    """Create a tenant (409 ``tenant_name_taken`` for a name in use). With an
    ``idempotency_key``, a retry with the same body returns the tenant created the first
    time; the same key with another body is 422 (the rules of job creation)."""
    digest = request_hash(body.model_dump(mode="json"))
    if idempotency_key is not None and (done := _for_key(session, idempotency_key, digest)):
        return Created(done, replayed=True)
    tenant = Tenant(**body.model_dump(), idempotency_key=idempotency_key,
                    request_hash=digest if idempotency_key is not None else None)
    session.add(tenant)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        if idempotency_key is not None and (done := _for_key(session, idempotency_key,
                                                             digest)):
            return Created(done, replayed=True)  # a concurrent retry committed first
        raise ApiError(status.HTTP_409_CONFLICT, "tenant_name_taken",
                       f"A tenant named {body.name!r} already exists") from None
    return Created(tenant)


def _for_key(session: Session, key: str, digest: str) -> Tenant | None:
    try:
        return row_for_key(session, Tenant, key, digest, "tenant")
    except IdempotencyError as exc:
        raise ApiError(status.HTTP_422_UNPROCESSABLE_CONTENT, exc.code, str(exc)) from None


def privacy_of(session: Session, tenant: Tenant) -> TenantPrivacy:
    """The tenant's spend (app/training/ledger.py) with infinity spelt "infinity"."""
    summary = spend_summary(session, tenant)
    for record in (summary, *summary["jobs"]):
        for name in ("epsilon_spent", "epsilon", "epsilon_at_requested_delta"):
            if name in record and math.isinf(record[name]):
                record[name] = "infinity"
    return TenantPrivacy(**summary)


def update_tenant(session: Session, app: FastAPI, tenant_id: int, given: dict[str, Any],
                  actor: str) -> Tenant:
    """Change the fields ``given``; a budget change goes through the privacy ledger (a
    cut only down to what the tenant has spent: 409 ``budget_below_spend``). Every change
    is recorded in the tenant's audit log with ``actor``."""
    tenant = get_tenant(session, tenant_id)
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
        log.info("tenant %s changed by %s: %s", tenant.id, actor, sorted(changes))
        session.add(TenantAudit(tenant_id=tenant.id, actor=actor, changes=changes))
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            raise ApiError(status.HTTP_409_CONFLICT, "tenant_name_taken",
                           f"A tenant named {given.get('name')!r} already exists") from None
        app.state.key_cache.forget()  # cached copies of the tenant are stale
    return tenant


def audit_log(session: Session, tenant_id: int) -> list[TenantAudit]:
    """Every change made to the tenant, oldest first."""
    get_tenant(session, tenant_id)
    return list(session.scalars(select(TenantAudit).where(TenantAudit.tenant_id == tenant_id)
                                .order_by(TenantAudit.id)).all())


def delete_tenant(session: Session, app: FastAPI, tenant_id: int) -> tuple[str, dict]:
    """Delete a tenant with its keys, users, ratings, job data, snapshots and ledger (409
    ``tenant_in_job`` while an unfinished job includes it); its name and what was deleted,
    counted."""
    tenant = get_tenant(session, tenant_id)
    name = tenant.name
    try:
        counted = forget_tenant(session, tenant)
    except TenantInJob as exc:
        raise ApiError(status.HTTP_409_CONFLICT, "tenant_in_job",
                       f"Tenant {tenant_id} takes part in unfinished jobs {exc.job_ids}; "
                       "cancel them first") from None
    session.commit()
    app.state.key_cache.forget()  # its keys are refused by this process at once
    app.state.factor_cache.forget(tenant_id)
    log.info("tenant %s (%s) deleted: %s", tenant_id, name, counted)
    return name, counted


def create_api_key(session: Session, tenant_id: int,
                   name: str | None = None) -> tuple[ApiKey, str]:
    """Issue a key: the stored record and the secret (never stored, shown once)."""
    get_tenant(session, tenant_id)
    key, prefix, key_hash = generate_key()
    record = ApiKey(tenant_id=tenant_id, prefix=prefix, key_hash=key_hash, name=name)
    session.add(record)
    session.commit()
    return record, key


def api_keys(session: Session, tenant_id: int) -> list[ApiKey]:
    """A tenant's keys, revoked ones included, in the order they were issued."""
    get_tenant(session, tenant_id)
    return list(session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id)
                                .order_by(ApiKey.id)).all())


def get_api_key(session: Session, tenant_id: int, key_id: int) -> ApiKey:
    """The tenant's key ``key_id``, revoked or not (404 ``api_key_not_found``)."""
    key = session.get(ApiKey, key_id)
    if key is None or key.tenant_id != tenant_id:
        raise ApiError(status.HTTP_404_NOT_FOUND, "api_key_not_found", "API key not found")
    return key


def active_api_key(session: Session, tenant_id: int, key_id: int) -> ApiKey:
    """The tenant's unrevoked key ``key_id`` (404 ``api_key_revoked`` for a revoked one)."""
    key = get_api_key(session, tenant_id, key_id)
    if key.revoked_at is not None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "api_key_revoked",
                       f"API key {key_id} was revoked")
    return key


def revoke_api_key(session: Session, app: FastAPI, tenant_id: int, key_id: int) -> ApiKey:
    """Revoke a key: refused at once by this process, by others within the serving cache."""
    key = get_api_key(session, tenant_id, key_id)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.commit()
    app.state.key_cache.forget()
    return key
