"""Celery tasks. Each takes ids, loads what it needs, calls pure code and persists."""

from __future__ import annotations

import dataclasses

from celery import shared_task
from sqlalchemy import select
from sqlalchemy.orm import Session

from app import store
from app.db import engine_for
from app.logs import bind
from app.models import Tenant
from app.queue import RECOMPUTE_RATING_STATS, REFRESH_ALL_RATING_STATS
from app.stats import block_statistics


@shared_task(name=RECOMPUTE_RATING_STATS, bind=True)
def recompute_rating_stats(self, tenant_id: int) -> dict:
    """Recompute and store one tenant's rating-block statistics."""
    bind(tenant_id=tenant_id)
    with Session(engine_for(self.app.conf.fedrec_database_url)) as session, session.begin():
        if session.get(Tenant, tenant_id) is None:
            return {"tenant_id": tenant_id, "status": "tenant not found"}
        block, _ = store.load_block(session, tenant_id)
        stats = block_statistics(block)
        store.save_stats(session, tenant_id, stats)
    return {"tenant_id": tenant_id, "status": "stored", **dataclasses.asdict(stats)}


@shared_task(name=REFRESH_ALL_RATING_STATS, bind=True)
def refresh_all_rating_stats(self) -> list[int]:
    """Beat's periodic job: queue a recomputation for every tenant (does not wait)."""
    with Session(engine_for(self.app.conf.fedrec_database_url)) as session:
        tenant_ids = list(session.scalars(select(Tenant.id).order_by(Tenant.id)))
    task = self.app.tasks[RECOMPUTE_RATING_STATS]
    for tenant_id in tenant_ids:
        task.apply_async(args=[tenant_id])
    return tenant_ids
