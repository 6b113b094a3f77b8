"""Tuning jobs: a search for an algorithm's hyper-parameters on a validation carve-out of
the tenants' training ratings; create, list, read, cancel and resume.

The admin API (:mod:`app.routes.tuning`) calls these; a refusal is an
:class:`app.problems.ApiError` (a refused spec gets the training jobs' codes,
:func:`app.services.jobs.refused`).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from fastapi import FastAPI, status
from sqlalchemy.orm import Session

from app.config import Settings
from app.deps import check_limit
from app.models import Tenant
from app.problems import ApiError
from app.services import newest_first
from app.services.jobs import refused
from app.training.jobs import JobRefused
from app.training.models import LedgerEntry, TuningJob
from app.training.runner import start_tuning
from app.training.schemas import TuningJobCreate, TuningJobPublic
from app.training.tuning import (
    TuningSpec,
    cancel_tuning_job,
    create_tuning_job,
    reopen_tuning_job,
)

log = logging.getLogger("fedrec.training")


def tuning_public(job: TuningJob) -> TuningJobPublic:
    """The tuning job as the API shows it: its trials and, once completed, its result."""
    fields = {name: getattr(job, name) for name in TuningJobPublic.model_fields
              if hasattr(TuningJob, name) and name not in ("scored",)}
    result = job.result or {}
    return TuningJobPublic(**fields, scored=job.scored or [],
                           **{k: result.get(k) for k in (
                               "config", "changed", "chosen_rounds", "validation_rmse",
                               "default_validation_rmse", "validation_ndcg",
                               "default_validation_ndcg", "budget_exhausted", "seconds")})


def create(session: Session, settings: Settings, app: FastAPI,
           body: TuningJobCreate) -> TuningJob:
    """Queue the search (not differentially private: every tenant must allow non-private
    training). A search that could not be enqueued is deleted with its charges."""
    check_limit(("body", "rounds"), body.rounds or 0, settings.max_job_rounds,
                "FEDREC_MAX_JOB_ROUNDS")
    tenant_ids = body.tenant_ids if body.tenant_ids is not None else list(
        session.scalars(sa.select(Tenant.id).order_by(Tenant.id)))
    check_limit(("body", "tenant_ids"), len(tenant_ids), settings.max_job_tenants,
                "FEDREC_MAX_JOB_TENANTS", unit="tenants")
    spec = TuningSpec(algorithm=body.algorithm, tenant_ids=tenant_ids, rounds=body.rounds,
                      per_round=body.per_round, seed=body.seed, config=body.config,
                      test_fraction=body.test_fraction, trials=body.trials, eta=body.eta,
                      budget_seconds=body.budget_seconds, metric=body.metric)
    try:
        job = create_tuning_job(session, spec)
    except JobRefused as exc:
        raise refused(exc) from None
    try:
        start_tuning(app, job.id)
    except BaseException:  # not enqueued: leave nothing behind
        session.rollback()  # its charges go with it: it never ran
        session.execute(sa.delete(LedgerEntry).where(LedgerEntry.tuning_job_id == job.id))
        session.execute(sa.delete(TuningJob).where(TuningJob.id == job.id))
        session.commit()
        raise
    log.info("tuning job %s created: %s over tenants %s", job.id, job.algorithm,
             job.tenant_ids)
    session.refresh(job)
    return job


def list_tuning_jobs(session: Session, limit: int,
                     offset: int) -> tuple[list[TuningJob], int]:
    """A page of tuning jobs, newest first, and how many there are."""
    return newest_first(session, TuningJob, limit, offset)


def get(session: Session, job_id: int) -> TuningJob:
    """The tuning job ``job_id`` (404 ``tuning_job_not_found`` if there is none)."""
    job = session.get(TuningJob, job_id)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "tuning_job_not_found",
                       "Tuning job not found")
    return job


def cancel(session: Session, job_id: int) -> TuningJob:
    """Stop a queued or running search (a running one after its current trial); 409
    ``tuning_job_finished`` when it has finished."""
    job = get(session, job_id)
    if not cancel_tuning_job(session, job):
        raise ApiError(status.HTTP_409_CONFLICT, "tuning_job_finished",
                       f"Tuning job {job_id} is already {job.status}")
    return job


def resume(session: Session, app: FastAPI, job_id: int) -> TuningJob:
    """Start a failed, cancelled or stuck search again from its first trial (the search is
    deterministic given the seed); 409 for a completed one."""
    job = get(session, job_id)
    if not reopen_tuning_job(session, job):
        raise ApiError(status.HTTP_409_CONFLICT, "tuning_job_finished",
                       f"Tuning job {job_id} is completed; nothing to resume")
    start_tuning(app, job.id)
    session.refresh(job)
    return job
