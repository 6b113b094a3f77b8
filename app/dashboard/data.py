"""What the dashboard pages show, read with the service's own functions (ledger, reports,
serving, job creation): nothing here re-implements a rule of the API."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.models import Rating, Tenant, User
from app.training.ledger import load_ledger
from app.training.models import JobClient, LedgerEntry, TrainingJob


@dataclasses.dataclass(frozen=True)
class Budget:
    spent: float  # may be inf (a non-private job included the tenant)
    total: float

    @property
    def remaining(self) -> float:
        return max(0.0, self.total - self.spent) if math.isfinite(self.spent) else 0.0

    @property
    def percent(self) -> float:
        """Share spent, 0-100, for the bar."""
        if not math.isfinite(self.spent):
            return 100.0
        return min(100.0, 100.0 * self.spent / self.total) if self.total > 0 else 100.0


def budgets(s: Session, tenant_ids: list[int]) -> dict[int, Budget]:
    """Each tenant's lifetime epsilon spent (at its budget's delta) against its budget."""
    if not tenant_ids:
        return {}
    ledger = load_ledger(s, tenant_ids)
    return {int(t): Budget(ledger.spent(t).epsilon, ledger.budget(t).epsilon_max)
            for t in ledger.tenants()}


_BY_VERSION: dict[tuple, tuple[int, Any]] = {}
"""(engine, what, tenant) -> (the tenant's ratings_version, value): every upload or
deletion bumps the version, so a tenant's counts and histogram are read once per change."""


def _versions(s: Session, tenant_ids: list[int] | None) -> dict[int, int]:
    q = sa.select(Tenant.id, Tenant.ratings_version)
    if tenant_ids is not None:
        q = q.where(Tenant.id.in_(tenant_ids))
    return dict(s.execute(q).all())


def _cached(s: Session, what: str, versions: dict[int, int], load) -> dict[int, Any]:
    """``load(stale ids) -> {id: value}`` for the tenants whose version changed."""
    engine = id(s.get_bind())
    out, stale = {}, []
    for t, v in versions.items():
        hit = _BY_VERSION.get((engine, what, t))
        if hit is not None and hit[0] == v:
            out[t] = hit[1]
        else:
            stale.append(t)
    if stale:
        fresh = load(stale)
        if len(_BY_VERSION) > 100_000:
            _BY_VERSION.clear()
        for t in stale:
            out[t] = fresh.get(t, _EMPTY[what])
            _BY_VERSION[(engine, what, t)] = (versions[t], out[t])
    return out


_EMPTY: dict[str, Any] = {"counts": {"ratings": 0, "users": 0, "items": 0}, "histogram": []}


def counts(s: Session, tenant_ids: list[int] | None = None) -> dict[int, dict[str, int]]:
    """tenant id -> ratings, users with a rating, distinct items rated."""
    def load(ids: list[int]) -> dict[int, dict[str, int]]:
        q = (sa.select(User.tenant_id, sa.func.count(),
                       sa.func.count(sa.distinct(Rating.user_id)),
                       sa.func.count(sa.distinct(Rating.item_id)))
             .join(User, User.id == Rating.user_id).where(User.tenant_id.in_(ids))
             .group_by(User.tenant_id))
        return {t: {"ratings": r, "users": u, "items": i} for t, r, u, i in s.execute(q)}

    return _cached(s, "counts", _versions(s, tenant_ids), load)


def histogram(s: Session, tenant_id: int) -> list[tuple[float, int]]:
    """(rating value, count) of the tenant's ratings, by value (up to 50 distinct values)."""
    def load(ids: list[int]) -> dict[int, list[tuple[float, int]]]:
        rows = s.execute(sa.select(Rating.value, sa.func.count()).join(
            User, User.id == Rating.user_id).where(User.tenant_id == ids[0])
            .group_by(Rating.value).order_by(Rating.value).limit(51)).all()
        return {ids[0]: [(float(v), int(c)) for v, c in rows]}

    return _cached(s, "histogram", _versions(s, [tenant_id]), load)[tenant_id]


def last_jobs(s: Session, tenant_ids: list[int]) -> dict[int, TrainingJob]:
    """Each tenant's newest job."""
    rows = s.execute(sa.select(JobClient.tenant_id, sa.func.max(JobClient.job_id))
                     .where(JobClient.tenant_id.in_(tenant_ids))
                     .group_by(JobClient.tenant_id)).all()
    jobs = {j.id: j for j in s.scalars(sa.select(TrainingJob).where(
        TrainingJob.id.in_([j for _, j in rows])))}
    return {t: jobs[j] for t, j in rows if j in jobs}


def jobs_of_tenant(s: Session, tenant_id: int) -> list[TrainingJob]:
    """Jobs the tenant took part in, newest first."""
    return list(s.scalars(sa.select(TrainingJob).join(
        JobClient, JobClient.job_id == TrainingJob.id).where(JobClient.tenant_id == tenant_id)
        .order_by(TrainingJob.id.desc()).limit(50)))


def charges_per_job(s: Session, tenant_id: int) -> dict[int, int]:
    """job id -> how many transmissions were charged to the tenant's ledger in it."""
    rows = s.execute(sa.select(LedgerEntry.job_id, sa.func.count())
                     .where(LedgerEntry.tenant_id == tenant_id)
                     .group_by(LedgerEntry.job_id)).all()
    return dict(rows)


def all_tenants(s: Session) -> list[Tenant]:
    return list(s.scalars(sa.select(Tenant).order_by(Tenant.id)))


def epsilon_text(value: Any) -> str:
    if value in (None, ""):
        return "—"
    if value == "infinity" or (isinstance(value, float) and math.isinf(value)):
        return "∞ (not private)"
    return f"{float(value):.3g}"


def settings_words(dp: dict[str, Any]) -> str:
    """A job's privacy settings (as stored, noise solved) in a few words."""
    if dp.get("unit") == "user":
        return (f"user-level DP, ε {dp.get('epsilon'):g} at δ {dp.get('delta'):.0e} per user, "
                f"noise placed {dp.get('placement')}, {dp.get('releases')} releases over "
                f"{dp.get('n_users')} users")
    if dp.get("mechanism") == "none":
        return "not private: uploads sent without noise"
    noise = dp.get("noise_multiplier") or dp.get("noise_scale")
    return (f"tenant-level DP, {dp.get('mechanism')} noise ×{noise} on uploads clipped to "
            f"{dp.get('clip')}")


def plain_privacy(report: dict[str, Any]) -> list[str]:
    """The privacy report of a job as sentences."""
    out = [report.get("guarantee", "").capitalize() + "."]
    if not report.get("private"):
        if report.get("reason"):
            out.append(f"Why: {report['reason']}.")
        out.append(f"Accounting: {report.get('accounting', '')}.")
        return out
    unit = report.get("unit") or "tenant"
    if unit == "user":
        out.append("Protected unit: one user account of one tenant, i.e. all ratings of "
                   "that account; adding or removing any one account changes what is "
                   "released only within epsilon (a person with accounts in k tenants is "
                   "k units).")
    else:
        out.append("Protected unit: a tenant's whole block of ratings.")
    placement = report.get("placement")
    if placement:
        out.append("Noise is added " + ("once, to the sum of the tenants' bounded "
                                        "contributions (central)." if placement == "central"
                                        else "by each tenant before it sends anything."))
    if report.get("adversary"):
        out.append(f"Adversary: {report['adversary']}.")
    if report.get("accounting"):
        out.append(f"Accounting: {report['accounting']}.")
    stopped = report.get("stopped_tenants") or {}
    for tenant, why in stopped.items():
        out.append(f"Tenant {tenant} stopped transmitting: {why}.")
    return out + threat_sentences(report)


def threat_sentences(report: dict[str, Any]) -> list[str]:
    """The report's threat model (privacy.threat_model) as one sentence per adversary."""
    model = report.get("threat_model") or {}
    def eps(value: Any) -> str:
        numeric = isinstance(value, int | float) or value == "infinity"
        return epsilon_text(value) if numeric else str(value)

    return [f"Against {row['adversary']}: learns {row['learns']} "
            f"(epsilon: {eps(row['epsilon'])})." for row in model.get("adversaries", [])]
