"""Privacy spend reserved by accepted training jobs.

A job is accepted only if every tenant can afford its plan on top of what the tenant has
spent *and* what the other queued or running jobs still plan to charge it: without that,
two jobs each within budget on their own could both be accepted and together overspend
it (their charges would then be refused mid-run). Each job stores its plan as
``TrainingJob.reserved`` (tenant id -> the planned events, in order); what is still
reserved is the plan minus the transmissions the job has already charged the tenant. A
job that is completed, failed or cancelled reserves nothing. The charge path
(:func:`privacy.ledger.charged_release`) still checks every release against the budget.

Two creations racing on one tenant are settled after they commit (:func:`confirm`):
under the tenant's lock, each re-checks its plan against the budget left by every other
reservation, and the one that no longer fits is withdrawn (409), so at most the jobs the
budget holds survive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.training.ledger import load_ledger
from app.training.models import LedgerEntry, TrainingJob
from privacy.accountant import NONE, Event, spend
from privacy.ledger import Ledger

ACTIVE = ("queued", "running")


def as_reserved(plan: Mapping[str, Sequence[Event]]) -> dict[str, list[list]]:
    """The JSON a job stores: tenant id -> planned events as lists."""
    return {str(t): [e.as_list() for e in events] for t, events in plan.items()}


def remaining(events: Sequence[Event], used: int) -> list[Event]:
    """``events`` without their first ``used`` transmissions (what is still to charge)."""
    out = []
    for e in events:
        skip = min(used, e.count)
        used -= skip
        if e.count > skip:
            out.append(e.times(e.count - skip))
    return out


def reserved_for(s: Session, tenant_ids: Iterable[int], exclude: int | None = None
                 ) -> dict[str, list[Event]]:
    """What the queued and running jobs (but ``exclude``) still reserve of each tenant."""
    ids = [str(t) for t in tenant_ids]
    q = sa.select(TrainingJob.id, TrainingJob.reserved).where(
        TrainingJob.status.in_(ACTIVE), TrainingJob.reserved.is_not(None))
    jobs = [(j, r) for j, r in s.execute(q).all() if j != exclude
            and any(t in r for t in ids)]
    used = dict(((j, t), n) for j, t, n in s.execute(
        sa.select(LedgerEntry.job_id, LedgerEntry.tenant_id, sa.func.count())
        .where(LedgerEntry.job_id.in_([j for j, _ in jobs]))
        .group_by(LedgerEntry.job_id, LedgerEntry.tenant_id)).all()) if jobs else {}
    out: dict[str, list[Event]] = {t: [] for t in ids}
    for job_id, plan in jobs:
        for t in ids:
            events = [Event.from_list(e) for e in plan.get(t, [])]
            out[t] += remaining(events, used.get((job_id, int(t)), 0))
    return out


def budget_ledger(s: Session, tenant_ids: Sequence[int], exclude: int | None = None,
                  lock: bool = False) -> Ledger:
    """The tenants' ledger with every other active job's reservation counted as spent:
    what a new plan is checked against."""
    return load_ledger(s, tenant_ids, lock=lock).with_reserved(
        reserved_for(s, tenant_ids, exclude))


def over_budget(s: Session, job: TrainingJob) -> str | None:
    """Under the tenants' lock: why ``job``'s reservation no longer fits next to every
    other active job's (naming the first tenant over), or None."""
    plan = {t: [Event.from_list(e) for e in evs] for t, evs in (job.reserved or {}).items()}
    if not plan:
        return None
    ledger = budget_ledger(s, [int(t) for t in plan], exclude=job.id, lock=True)
    for t, events in plan.items():
        if any(e.mechanism == NONE for e in events):
            continue  # a non-private plan is bound by the tenant's opt-in, not by epsilon
        after = spend(ledger.history(t) + events, ledger.budget(t).delta).epsilon
        cap = ledger.budget(t).epsilon_max
        if after > cap:
            return (f"privacy budget exceeded: tenant {t} would spend epsilon {after:.4g} "
                    f"with the spend other accepted jobs reserved > epsilon_max {cap:.4g} "
                    "(a concurrent job reserved it first)")
    return None
