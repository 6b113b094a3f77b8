"""The service's privacy ledger: one row per charged transmission, read back as a
:class:`privacy.ledger.Ledger` (the pure accountant's plain-dict state)."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.models import Tenant
from app.training.models import LedgerEntry
from privacy.accountant import Event, compose
from privacy.ledger import Budget, Ledger


def load_ledger(s: Session, tenant_ids: Iterable[int], job_id: int | None = None) -> Ledger:
    """Budgets of the tenants and every charge made to them: across all jobs (what budgets
    are checked against), or only those of ``job_id``."""
    ids = list(tenant_ids)
    tenants = s.scalars(sa.select(Tenant).where(Tenant.id.in_(ids))).all()
    state = Ledger.open({t.id: Budget(t.privacy_budget, t.privacy_delta, t.allow_non_private)
                         for t in tenants}).to_dict()
    query = (sa.select(LedgerEntry.tenant_id, LedgerEntry.round, LedgerEntry.event)
             .where(LedgerEntry.tenant_id.in_(ids)).order_by(LedgerEntry.id))
    if job_id is not None:
        query = query.where(LedgerEntry.job_id == job_id)
    rows = s.execute(query).all()
    events: dict[str, list[Event]] = {str(t): [] for t in ids}
    for tenant_id, round_, event in rows:
        events[str(tenant_id)].append(Event.from_list(event["event"]))
        state["tenants"][str(tenant_id)]["rounds"].append(int(round_))
    for key, evs in events.items():
        state["tenants"][key]["history"] = [e.as_list() for e in compose(evs)]
    return Ledger.from_dict(state)
