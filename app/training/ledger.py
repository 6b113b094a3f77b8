"""The service's privacy ledger: one row per charged transmission, read back as a
:class:`privacy.ledger.Ledger` (the pure accountant's plain-dict state)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.models import Tenant
from app.training.models import LedgerEntry, TrainingJob
from privacy.accountant import NOT_PRIVATE, Event, compose, spend
from privacy.ledger import (
    BY_AGENT,
    BY_COORDINATOR,
    BY_TUNING,
    Budget,
    Charge,
    Ledger,
    charged_release,
    rebudget,
)

TUNING_NOT_PRIVATE = "not private: tuning used raw ratings"
"""What every later report of a tuned tenant says (its spend is epsilon = infinity)."""


def load_ledger(s: Session, tenant_ids: Iterable[int], job_id: int | None = None,
                lock: bool = False) -> Ledger:
    """Budgets of the tenants and every charge made to them: across all jobs (what budgets
    are checked against), or only those of ``job_id``.

    ``lock``: the tenants' rows are locked first (in id order, until the transaction ends),
    so no other transaction charges them between this read and the caller's charge; the
    charges are read by a second statement, after the lock is held, so they include every
    charge committed before it was granted."""
    ids = list(tenant_ids)
    tenants = s.execute(_LOCKED_BUDGETS if lock else _BUDGETS, {"ids": ids}).all()
    state = Ledger.open({t: Budget(eps, delta, non_private)
                         for t, eps, delta, non_private in tenants}).to_dict()
    if job_id is None:
        rows = s.execute(_CHARGES, {"ids": ids}).all()
    else:
        rows = s.execute(_CHARGES.where(LedgerEntry.job_id == job_id), {"ids": ids}).all()
    # a deleted tenant's budget and charges went with it: the ledger holds those that exist
    events: dict[str, list[Event]] = {str(t): [] for t, *_ in tenants}
    for tenant_id, round_, event in rows:
        events[str(tenant_id)].append(Charge.from_row(event).event)
        state["tenants"][str(tenant_id)]["rounds"].append(int(round_))
    for key, evs in events.items():
        state["tenants"][key]["history"] = [e.as_list() for e in compose(evs)]
    return Ledger.from_dict(state)


_BUDGETS = sa.select(Tenant.id, Tenant.privacy_budget, Tenant.privacy_delta,
                     Tenant.allow_non_private).where(
    Tenant.id.in_(sa.bindparam("ids", expanding=True)))
_LOCKED_BUDGETS = _BUDGETS.order_by(Tenant.id).with_for_update()
_CHARGES = (sa.select(LedgerEntry.tenant_id, LedgerEntry.round, LedgerEntry.event)
            .where(LedgerEntry.tenant_id.in_(sa.bindparam("ids", expanding=True)))
            .order_by(LedgerEntry.id))


def charge_tuning(s: Session, tuning_job_id: int, tenant_ids: list[int]) -> dict[int, str]:
    """Charge a tuning job to every tenant it reads, as epsilon = infinity (its search
    trains and scores on raw ratings), through :func:`privacy.ledger.charged_release`:
    a tenant without the ``allow_non_private`` opt-in is refused and nobody is charged.
    The charges are added to the session (committed with the job by the caller); returns
    {tenant id: refusal} (empty when every tenant was charged)."""
    ledger = load_ledger(s, tenant_ids, lock=True)
    _, charged, refused = charged_release(ledger, tenant_ids, NOT_PRIVATE, 0,
                                          lambda _: None, "tuning job")
    if refused:  # all or nothing: the in-memory charges of the others are dropped
        return refused
    record_charges(s, charged, 0, tuning_job_id=tuning_job_id, by=BY_TUNING,
                   note=TUNING_NOT_PRIVATE)
    return refused


def record_charges(s: Session, charged: Mapping[int, Event], round_: int, *,
                   job_id: int | None = None, tuning_job_id: int | None = None,
                   dp: Mapping[str, Any] | None = None, by: str = BY_COORDINATOR,
                   note: str | None = None) -> None:
    """The service's one ledger writer: one row per tenant that
    :func:`privacy.ledger.charged_release` charged (``charged``: its second result), in
    the one shape :meth:`privacy.ledger.Charge.row`, added to the session so the caller
    commits it in the transaction that stores (or uses) the release it pays for."""
    for tenant_id, event in charged.items():
        s.add(LedgerEntry(tenant_id=tenant_id, job_id=job_id, tuning_job_id=tuning_job_id,
                          round=int(round_), event=Charge(event, dp, by, note).row()))


def tuned_tenants(s: Session, tenant_ids: Iterable[int]) -> dict[str, list[int]]:
    """Tenant id -> the tuning jobs charged to it (each spent epsilon = infinity)."""
    rows = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.tuning_job_id)
                     .where(LedgerEntry.tenant_id.in_(list(tenant_ids)),
                            LedgerEntry.tuning_job_id.is_not(None))
                     .order_by(LedgerEntry.tuning_job_id)).all()
    out: dict[str, list[int]] = {}
    for tenant_id, tuning_id in rows:
        out.setdefault(str(tenant_id), []).append(int(tuning_id))
    return out


def change_budget(s: Session, tenant: Tenant, epsilon_max: float) -> Budget:
    """Set the tenant's ``privacy_budget`` through :func:`privacy.ledger.rebudget` (raises
    :class:`privacy.ledger.BudgetChangeRefused` below its spend); not committed."""
    budget = rebudget(load_ledger(s, [tenant.id]), tenant.id, epsilon_max)
    tenant.privacy_budget = budget.epsilon_max
    return budget


SPEND_NOTE = ("A job's epsilon is stated at the delta it asked for; the budget is kept at "
              "the tenant's own delta, and the same noise has a smaller epsilon at a larger "
              "delta, so the budget is charged the job's epsilon at the budget's delta.")
"""Why a job's requested epsilon and its charge to the budget differ (shown with both)."""


def job_spend(s: Session, tenant_id: int, job_id: int, job_dp: dict | None) -> dict:
    """One job's spend of one tenant, side by side (:func:`spend_figures`)."""
    ledger = load_ledger(s, [tenant_id], job_id=job_id)
    return {"job_id": job_id, **spend_figures(ledger, tenant_id, job_dp)}


def spend_figures(job_ledger: Ledger, tenant: int | str, job_dp: dict | None) -> dict:
    """A job's spend of a tenant (``job_ledger``: its charges of that job), side by side:
    what the job asked for (``requested_epsilon``: a user-level job's target, None for the
    tenant unit; ``requested_delta``), its epsilon at that delta, and the charge to the
    budget (``epsilon``, at ``budget_delta``)."""
    charged = job_ledger.spent(tenant)
    dp = job_dp or {}
    delta = dp.get("delta")
    at_request = charged.epsilon if delta is None or not charged.transmissions else \
        spend(job_ledger.history(tenant), float(delta)).epsilon
    return {"requested_epsilon": dp.get("epsilon") if dp.get("unit") == "user" else None,
            "requested_delta": delta, "epsilon_at_requested_delta": at_request,
            "epsilon": charged.epsilon, "budget_delta": job_ledger.budget(tenant).delta,
            "transmissions": charged.transmissions}


def spend_summary(s: Session, tenant: Tenant) -> dict:
    """The tenant's lifetime spend against its budget and its spend in each job that
    charged it (epsilon composed at the budget's delta; infinity after a noise-free job)."""
    ledger = load_ledger(s, [tenant.id])
    spent, budget = ledger.spent(tenant.id), ledger.budget(tenant.id)
    job_ids = s.scalars(sa.select(LedgerEntry.job_id).where(  # tuning rows have no job
        LedgerEntry.tenant_id == tenant.id, LedgerEntry.job_id.is_not(None))
        .distinct().order_by(LedgerEntry.job_id)).all()
    dps = dict(s.execute(sa.select(TrainingJob.id, TrainingJob.dp)
                         .where(TrainingJob.id.in_(job_ids))).all()) if job_ids else {}
    jobs = [job_spend(s, tenant.id, job_id, dps.get(job_id)) for job_id in job_ids]
    return {"tenant_id": tenant.id, "note": SPEND_NOTE, "epsilon_spent": spent.epsilon,
            "epsilon_max": budget.epsilon_max,
            "epsilon_remaining": max(0.0, budget.epsilon_max - spent.epsilon),
            "delta": budget.delta, "private": math.isfinite(spent.epsilon),
            "transmissions": spent.transmissions, "jobs": jobs}


def charge_received(s: Session, job_id: int, tenant_id: int, round_: int, event: Event,
                    dp: Mapping[str, Any], note: str | None = None) -> str | None:
    """Charge a release a tenant privatised itself (an agent's upload or masked input)
    through :func:`privacy.ledger.charged_release`, under the tenant's lock
    (:func:`load_ledger`), as a hosted tenant's release is charged: the row
    (:func:`record_charges`, by the agent, with ``note``) is added, not committed.
    Returns why the tenant's budget refuses it (nothing added; the caller must not use
    the release), or None."""
    ledger = load_ledger(s, [tenant_id], lock=True)
    _, charged, refused = charged_release(ledger, [tenant_id], event, round_, lambda _: None)
    if refused:
        return refused[tenant_id]
    record_charges(s, charged, round_, job_id=job_id, dp=dp, by=BY_AGENT, note=note)
    return None
