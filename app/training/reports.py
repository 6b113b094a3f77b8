"""Reports of a job: training curves, per-tenant figures, privacy spent, and a PNG plot."""

from __future__ import annotations

import io
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.training.ledger import load_ledger
from app.training.models import JobRound, TrainingJob
from app.training.schemas import JobPublic, JobReport, RoundPublic, TenantRoundPublic
from privacy.wrapper import DPSpec, privacy_report


def curve(s: Session, job_id: int) -> list[JobRound]:
    return list(s.scalars(sa.select(JobRound).where(JobRound.job_id == job_id)
                          .order_by(JobRound.round)))


def tenant_curve(rounds: list[JobRound], tenant_id: int) -> list[TenantRoundPublic]:
    key = str(tenant_id)
    return [TenantRoundPublic(round=r.round, **r.per_tenant[key])
            for r in rounds if key in r.per_tenant]


def privacy_of_job(s: Session, job: TrainingJob, tenant_ids: list[int] | None = None
                   ) -> dict[str, Any]:
    """Epsilon each tenant spent in this job, and in all jobs so far against its budget."""
    ids = tenant_ids if tenant_ids is not None else job.tenant_ids
    spec = DPSpec(**job.dp)
    report = privacy_report(spec, load_ledger(s, ids, job_id=job.id))
    report["stopped_tenants"] = {t: why for t, why in (job.stopped_tenants or {}).items()
                                 if int(t) in ids}
    if spec.mechanism != "none":
        lifetime = load_ledger(s, ids)
        report["lifetime"] = {t: {"epsilon_spent": lifetime.spent(t).epsilon,
                                  "epsilon_max": lifetime.budget(t).epsilon_max,
                                  "epsilon_remaining": lifetime.budget(t).epsilon_max
                                  - lifetime.spent(t).epsilon,
                                  "delta": lifetime.budget(t).delta}
                              for t in lifetime.tenants()}
    report.pop("budget_epsilon_max", None)  # the lifetime section states budgets per tenant
    return report


def job_report(s: Session, job: TrainingJob, public: JobPublic) -> JobReport:
    rounds = curve(s, job.id)
    return JobReport(
        job=public,
        curve=[RoundPublic.model_validate(r, from_attributes=True) for r in rounds],
        per_tenant={str(t): tenant_curve(rounds, t) for t in job.tenant_ids},
        privacy=privacy_of_job(s, job))


def plot_png(s: Session, job: TrainingJob, tenant_id: int | None = None) -> bytes:
    """Test RMSE per round: overall plus each tenant (or one tenant only)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rounds = curve(s, job.id)
    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.add_subplot()
    tenants = job.tenant_ids if tenant_id is None else [tenant_id]
    for t in tenants[:20]:
        pts = tenant_curve(rounds, t)
        ax.plot([p.round for p in pts], [p.test_rmse for p in pts], lw=1, alpha=0.6,
                label=f"tenant {t}")
    if tenant_id is None:
        ax.plot([r.round for r in rounds], [r.test_rmse for r in rounds], "k-", lw=2.5,
                label="all tenants")
    ax.set_xlabel("round")
    ax.set_ylabel("test RMSE")
    ax.set_title(f"job {job.id}: {job.algorithm}, DP {job.dp.get('mechanism')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
