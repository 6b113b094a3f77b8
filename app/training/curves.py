"""What a job's training-curve chart shows, shared by the dashboard's SVG and the PNG
endpoints: the curves by tenant name, the noise-free reference job when there is one, the
RMSE of predicting each tenant's training mean (the level any model must beat), and a
title that states the privacy guarantee (epsilon)."""

from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np
import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.orm import Session

from algorithms.block import RatingBlock
from app.models import Tenant
from app.training import reports
from app.training.models import JobClient, TrainingJob

METRICS = {"test_rmse": "test RMSE", "test_mae": "test MAE"}
NOISE_FREE_SUFFIX = "-noise-free"
"""``fedrec demo`` trains the noise-free comparison on copies of the tenants named so."""


@dataclasses.dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[int, float]]
    kind: str  # "overall" | "tenant" | "reference"


@dataclasses.dataclass(frozen=True)
class Chart:
    title: str
    metric: str  # a key of METRICS
    series: list[Series]
    baseline: float | None
    """The metric of predicting each tenant's training mean on its test ratings."""
    reference_job_id: int | None

    @property
    def y_label(self) -> str:
        return METRICS[self.metric]

    def y_range(self) -> tuple[float, float]:
        """From just below the lowest curve (the noise-free one when drawn) to just above
        the mean-prediction baseline, so noise is seen against what a model must beat."""
        values = [v for s in self.series for _, v in s.points if math.isfinite(v)]
        if self.baseline is not None:
            values.append(self.baseline)
        if not values:
            return 0.0, 1.0
        lo, hi = min(values), max(values)
        pad = max(hi - lo, 0.05 * max(abs(hi), 1e-9)) * 0.12
        return max(0.0, lo - pad), hi + pad


_BASELINES: dict[tuple, dict[str, tuple[float, float, int]]] = {}
_LOCK = threading.Lock()


def mean_baselines(s: Session, job: TrainingJob) -> dict[str, tuple[float, float, int]]:
    """tenant id -> (RMSE, MAE, test ratings) of predicting the tenant's training mean on
    its test ratings, plus ``"all"`` pooled over tenants. A job's blocks never change, so
    this is computed once per job and process."""
    key = (id(s.get_bind()), job.id, job.created_at)
    with _LOCK:
        if key in _BASELINES:
            return _BASELINES[key]
    clients = s.scalars(sa.select(JobClient).where(JobClient.job_id == job.id).options(
        orm.undefer(JobClient.train_block), orm.undefer(JobClient.test_block))).all()
    out, sq, ab, n = {}, 0.0, 0.0, 0
    for c in clients:
        train, test = RatingBlock.from_bytes(c.train_block), RatingBlock.from_bytes(c.test_block)
        if not train.nnz or not test.nnz:
            continue
        err = test.vals - float(train.vals.mean())
        out[str(c.tenant_id)] = (float(np.sqrt(np.mean(err ** 2))), float(np.mean(np.abs(err))),
                                 int(test.nnz))
        sq, ab, n = sq + float(np.sum(err ** 2)), ab + float(np.sum(np.abs(err))), n + test.nnz
    if n:
        out["all"] = (math.sqrt(sq / n), ab / n, n)
    with _LOCK:
        if len(_BASELINES) > 256:
            _BASELINES.clear()
        _BASELINES[key] = out
    return out


def tenant_names(s: Session, ids) -> dict[int, str]:
    return dict(s.execute(sa.select(Tenant.id, Tenant.name).where(Tenant.id.in_(list(ids)))).all())


def reference_job(s: Session, job: TrainingJob) -> TrainingJob | None:
    """The newest completed job without noise, same algorithm and rounds, over copies of
    this job's tenants named ``<name>-noise-free``; None for a job that is not private."""
    if not reports.is_private(job):
        return None
    want = {n + NOISE_FREE_SUFFIX for n in tenant_names(s, job.tenant_ids).values()}
    candidates = s.scalars(sa.select(TrainingJob).where(
        TrainingJob.status == "completed", TrainingJob.algorithm == job.algorithm,
        TrainingJob.rounds == job.rounds, TrainingJob.id != job.id)
        .order_by(TrainingJob.id.desc()).limit(50)).all()
    for other in candidates:
        if other.dp.get("mechanism") != "none":
            continue
        if set(tenant_names(s, other.tenant_ids).values()) == want:
            return other
    return None


def privacy_title(report: dict) -> str:
    """The job's guarantee in a few words: epsilon, delta, unit."""
    if not report.get("private"):
        return "not private (ε = ∞)"
    eps = report.get("target_epsilon", report.get("epsilon_max"))
    eps_text = "∞" if eps == reports.INFINITY else f"{float(eps):.3g}"
    unit = report.get("unit") or "tenant"
    return f"ε = {eps_text}, δ = {report.get('delta'):.0e}, {unit} level"


def job_chart(s: Session, job: TrainingJob, metric: str = "test_rmse",
              tenant_id: int | None = None, report: dict | None = None) -> Chart:
    """The chart of ``metric`` for the whole job (overall + each tenant) or one tenant."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}")
    if report is None:
        report = reports.privacy_of_job(s, job, None if tenant_id is None else [tenant_id])
    names = tenant_names(s, job.tenant_ids)
    rounds = reports.curve(s, job.id)
    series: list[Series] = []
    tenants = job.tenant_ids if tenant_id is None else [tenant_id]
    for t in tenants[:12]:
        pts = [(p.round, getattr(p, metric)) for p in reports.tenant_curve(rounds, t)
               if getattr(p, metric) is not None]
        series.append(Series(names.get(t, f"tenant {t}"), pts, "tenant"))
    if tenant_id is None:
        series.append(Series("all tenants", [(r.round, getattr(r, metric)) for r in rounds
                                             if getattr(r, metric) is not None], "overall"))
    ref = reference_job(s, job)
    if ref is not None:
        ref_rounds = reports.curve(s, ref.id)
        if tenant_id is None:
            pts = [(r.round, getattr(r, metric)) for r in ref_rounds
                   if getattr(r, metric) is not None]
        else:
            ref_names = {v: k for k, v in tenant_names(s, ref.tenant_ids).items()}
            copy = ref_names.get(names.get(tenant_id, "") + NOISE_FREE_SUFFIX)
            pts = [] if copy is None else [
                (p.round, getattr(p, metric)) for p in reports.tenant_curve(ref_rounds, copy)
                if getattr(p, metric) is not None]
        if pts:
            series.append(Series(f"without noise (job {ref.id})", pts, "reference"))
    base = mean_baselines(s, job).get("all" if tenant_id is None else str(tenant_id))
    baseline = None if base is None else base[0 if metric == "test_rmse" else 1]
    who = "all tenants" if tenant_id is None else names.get(tenant_id, f"tenant {tenant_id}")
    label = METRICS[metric]
    title = (f"{label[0].upper()}{label[1:]}, job {job.id} ({job.algorithm}), {who}: "
             f"{privacy_title(report)}")
    return Chart(title, metric, series, baseline, None if ref is None else ref.id)
