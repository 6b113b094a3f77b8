"""Reports of a job: training curves, per-tenant figures, privacy spent, and a PNG plot."""

from __future__ import annotations

import io
import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from algorithms import registry
from app.training.ledger import (
    SPEND_NOTE,
    TUNING_NOT_PRIVATE,
    load_ledger,
    spend_figures,
    tuned_tenants,
)
from app.training.models import JobRound, LedgerEntry, TrainingJob
from app.training.schemas import JobPublic, JobReport, RoundPublic, TenantRoundPublic
from privacy import user_level
from privacy.accountant import Event
from privacy.ledger import Charge
from privacy.threat_model import LEDGER_UNIT, threat_model
from privacy.wrapper import DPSpec, privacy_report


def curve(s: Session, job_id: int) -> list[JobRound]:
    return list(s.scalars(sa.select(JobRound).where(JobRound.job_id == job_id)
                          .order_by(JobRound.round)))


def tenant_curve(rounds: list[JobRound], tenant_id: int) -> list[TenantRoundPublic]:
    key = str(tenant_id)
    return [TenantRoundPublic(round=r.round, **r.per_tenant[key])
            for r in rounds if key in r.per_tenant]


INFINITY = "infinity"
"""How a report writes an unbounded epsilon (JSON has no infinity)."""
NOT_PRIVATE = "not private (epsilon = infinity)"
NOT_PRIVATE_ACCOUNTING = ("none: uploads were sent without a differential privacy guarantee; "
                          "each transmission is charged to the tenant's ledger as epsilon = "
                          "infinity, so no later DP job can include the tenant")


def _eps(value: float) -> float | str:
    return INFINITY if math.isinf(value) else value


def is_private(job: TrainingJob) -> bool:
    """Whether the job's uploads carry a DP guarantee: noise, and an algorithm whose uploads
    do not reveal ratings whatever the noise."""
    from app.training.jobs import has_guarantee

    return has_guarantee(registry.get(job.algorithm), job.dp)


def privacy_of_job(s: Session, job: TrainingJob, tenant_ids: list[int] | None = None
                   ) -> dict[str, Any]:
    """Epsilon each tenant spent in this job, and in all jobs so far against its budget.

    A job without a DP guarantee says so (``guarantee``: "not private (epsilon =
    infinity)") and reports the epsilon of every tenant that transmitted as "infinity".
    """
    ids = tenant_ids if tenant_ids is not None else job.tenant_ids
    ledger = load_ledger(s, ids, job_id=job.id)
    if user_level.is_user_level(job.dp):
        report = user_level.release_report(user_level.from_settings(job.dp), ledger,
                                           _charges(s, job.id, ids))
    elif is_private(job):
        spec = DPSpec(**job.dp)
        report = privacy_report(spec, ledger)
        report["private"] = True
        report["guarantee"] = (f"differentially private: epsilon {report['epsilon_max']:.4g} "
                               f"at delta {spec.delta:.3g} for each tenant's whole rating block")
    else:
        report = _not_private_report(DPSpec(**job.dp), job, ledger)
    _tuned(report, tuned_tenants(s, ids))
    report["stopped_tenants"] = {t: why for t, why in (job.stopped_tenants or {}).items()
                                 if int(t) in ids}
    lifetime = load_ledger(s, ids)
    units = _units(s, ids)
    report["lifetime"] = {t: {**_lifetime(lifetime, t), "unit": units.get(t, "tenant"),
                              "this_job": _json_spend(spend_figures(ledger, t, job.dp))}
                          for t in lifetime.tenants()}
    report["lifetime_unit"] = LEDGER_UNIT
    report["note"] = SPEND_NOTE
    report.pop("budget_epsilon_max", None)  # the lifetime section states budgets per tenant
    return report


def _tuned(report: dict[str, Any], tuned: dict[str, list[int]]) -> None:
    """A report of tenants a tuning job read (charged epsilon = infinity): not private,
    whatever this job's own releases spent; the job's own guarantee is kept apart."""
    if not tuned:
        return
    which = "; ".join(f"tenant {t}: tuning job(s) {', '.join(map(str, ids))}"
                      for t, ids in sorted(tuned.items()))
    report["job_guarantee"] = report.get("guarantee")
    report["guarantee"] = f"{TUNING_NOT_PRIVATE} ({which}): epsilon = infinity"
    report["private"] = False
    report["tuning"] = tuned
    per = report.get("epsilon_per_tenant") or {}
    report["epsilon_per_tenant"] = {t: INFINITY if t in tuned else e for t, e in per.items()}
    report["epsilon_max"] = INFINITY
    if "threat_model" in report:
        model = report["threat_model"]
        report["threat_model"] = threat_model(model["placement"].split("+")[0],
                                              "+" in model["placement"], private=False)


def _charges(s: Session, job_id: int, tenant_ids: list[int]) -> list[tuple[int, int, Event]]:
    """(tenant, round, event) of every charge of the job, in the order they were made."""
    rows = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round, LedgerEntry.event)
                     .where(LedgerEntry.job_id == job_id,
                            LedgerEntry.tenant_id.in_(tenant_ids))
                     .order_by(LedgerEntry.id)).all()
    return [(t, r, Charge.from_row(e).event) for t, r, e in rows]


def _not_private_report(spec: DPSpec, job: TrainingJob, ledger) -> dict[str, Any]:
    why = ("dp mechanism 'none': uploads sent without noise" if spec.mechanism == "none"
           else f"{job.algorithm}: its uploads reveal ratings whatever the noise")
    spends = {t: ledger.spent(t) for t in ledger.tenants()}
    return {"mechanism": spec.mechanism, "private": False, "guarantee": NOT_PRIVATE,
            "reason": why, "accounting": NOT_PRIVATE_ACCOUNTING, "delta": None, "unit": None,
            "threat_model": threat_model("tenant", private=False),
            "epsilon_per_tenant": {t: _eps(sp.epsilon) for t, sp in spends.items()},
            "epsilon_max": _eps(max((sp.epsilon for sp in spends.values()), default=0.0)),
            "transmissions_per_tenant": {t: sp.transmissions for t, sp in spends.items()}}


def _units(s: Session, tenant_ids: list[int]) -> dict[str, str]:
    """The unit each tenant's lifetime spend is a guarantee for: "user" once any release
    charged to it protected users only (composed with tenant-level charges that is still
    a user-level bound, but no longer one for the tenant's whole block), else "tenant"."""
    rows = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.event)
                     .where(LedgerEntry.tenant_id.in_(tenant_ids))).all()
    return {str(t): "user" for t, e in rows
            if user_level.is_user_level(Charge.from_row(e).dp or {})}


def _json_spend(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: _eps(v) if k.startswith("epsilon") else v for k, v in figures.items()}


def _lifetime(ledger, tenant: str) -> dict[str, Any]:
    spent, budget = ledger.spent(tenant).epsilon, ledger.budget(tenant)
    return {"epsilon_spent": _eps(spent), "epsilon_max": _eps(budget.epsilon_max),
            "epsilon_remaining": max(0.0, budget.epsilon_max - spent)
            if math.isfinite(spent) else 0.0,
            "delta": budget.delta, "private": math.isfinite(spent),
            "allow_non_private": budget.allow_not_private}


def final_ranking(rounds: list[JobRound]) -> dict[str, Any]:
    """The ranking metrics stored with the final round ({} before the job completes)."""
    return next((r.ranking for r in reversed(rounds) if r.ranking), None) or {}


def job_report(s: Session, job: TrainingJob, public: JobPublic) -> JobReport:
    rounds = curve(s, job.id)
    ranking = final_ranking(rounds)
    return JobReport(
        job=public,
        curve=[RoundPublic.model_validate(r, from_attributes=True) for r in rounds],
        per_tenant={str(t): tenant_curve(rounds, t) for t in job.tenant_ids},
        privacy=privacy_of_job(s, job), ranking=ranking.get("overall"),
        ranking_per_tenant={t: v for t, v in ranking.get("per_tenant", {}).items()
                            if int(t) in job.tenant_ids},
        popularity=(ranking.get("popularity") or {}).get("overall"),
        models=models_of(s, job))


def models_of(s: Session, job: TrainingJob) -> dict[str, Any]:
    """Which model produced the lists and which the predicted ratings (RMSE) of ``job``
    and the job created with it: a ranking model serves the lists unless popularity beat
    it on held-out data; a rating model's predictions feed the RMSE report."""
    pair = s.get(TrainingJob, job.pair_job_id) if job.pair_job_id else None
    jobs = [job] + ([pair] if pair is not None else [])
    ranking = next((j for j in jobs if j.model_kind == "ranking"), None)
    rating = next((j for j in jobs if j.model_kind == "rating"), None)
    return {"lists": lists_source(ranking or job),
            "ratings": None if rating is None else {
                "job_id": rating.id, "algorithm": rating.algorithm, "model_kind": "rating"}}


def lists_source(job: TrainingJob) -> dict[str, Any]:
    """Who serves ``job``'s lists: its model, or popularity with the reason (before the
    job completes: its model, undecided)."""
    decision = job.serving or {}
    source = decision.get("lists", "model")
    return {"job_id": job.id, "algorithm": job.algorithm, "model_kind": job.model_kind,
            "source": source,
            "served_by": job.algorithm if source == "model" else "popularity",
            "reason": decision.get("reason", "decided when the job completes")}


def _plain(text: str) -> str:
    """``text`` shown as written: matplotlib reads ``$...$`` as mathematical markup, and
    a tenant named ``$\\notacommand{$`` would otherwise fail the whole plot."""
    return text.replace("$", r"\$")


def plot_png(s: Session, job: TrainingJob, tenant_id: int | None = None) -> bytes:
    """Test RMSE per round: overall plus each tenant by name (or one tenant only), with the
    noise-free reference job and the mean-prediction baseline drawn in, epsilon in the
    title, and the y-axis spanning those references (see :mod:`app.training.curves`)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from app.training.curves import job_chart

    chart = job_chart(s, job, "test_rmse", tenant_id)
    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.add_subplot()
    style = {"tenant": {"lw": 1, "alpha": 0.6}, "overall": {"color": "k", "lw": 2.5},
             "reference": {"color": "tab:green", "lw": 2, "ls": "--"}}
    for series in chart.series:
        ax.plot([p[0] for p in series.points], [p[1] for p in series.points],
                label=_plain(series.label), **style[series.kind])
    if chart.baseline is not None:
        ax.axhline(chart.baseline, color="tab:red", lw=1.2, ls=":",
                   label=f"predict the mean ({chart.baseline:.3f})")
    ax.set_ylim(*chart.y_range())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(chart.y_label)
    ax.set_title(_plain(chart.title), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
