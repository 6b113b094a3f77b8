"""Admin: tuning jobs (``fedrec tune`` on the stored ratings, run by a worker)."""

from __future__ import annotations

import logging

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response, status

from app.deps import UNPROCESSABLE, AdminDep, SessionDep, SettingsDep, check_limit, errors
from app.models import Tenant
from app.problems import ApiError
from app.routes import API_PREFIX
from app.schemas import Limit, Offset, PathId
from app.services.jobs import refused
from app.training.jobs import JobRefused
from app.training.models import LedgerEntry, TuningJob
from app.training.runner import start_tuning
from app.training.schemas import TuningJobCreate, TuningJobPublic, TuningJobsPublic
from app.training.tuning import (
    TuningSpec,
    cancel_tuning_job,
    create_tuning_job,
    reopen_tuning_job,
)

router = APIRouter(prefix=API_PREFIX + "/admin/tuning-jobs", tags=["admin: training"],
                   responses=errors(401, 429))
log = logging.getLogger("fedrec.training")


def _public(job: TuningJob) -> TuningJobPublic:
    fields = {name: getattr(job, name) for name in TuningJobPublic.model_fields
              if hasattr(TuningJob, name) and name not in ("scored",)}
    result = job.result or {}
    return TuningJobPublic(**fields, scored=job.scored or [],
                           **{k: result.get(k) for k in (
                               "config", "changed", "chosen_rounds", "validation_rmse",
                               "default_validation_rmse", "validation_ndcg",
                               "default_validation_ndcg", "budget_exhausted", "seconds")})


@router.post("", response_model=TuningJobPublic, status_code=status.HTTP_202_ACCEPTED,
             responses={**errors(404, 409), **UNPROCESSABLE,
                        503: {"description": "Broker or database unavailable; no tuning "
                                             "job was created."}})
def create_tuning(body: TuningJobCreate, request: Request, response: Response,
                  session: SessionDep, settings: SettingsDep, _: AdminDep) -> TuningJobPublic:
    """Queue a search for the algorithm's hyper-parameters on a validation carve-out of
    the tenants' *training* ratings (split as a training job with the same seed and
    test_fraction; the test part is never read). Not differentially private: every tenant
    must allow non-private training (409 ``not_private_refused``). Poll ``GET`` for the
    trials and, once completed, ``config``: a training job's ``config`` as it is."""
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
        start_tuning(request.app, job.id)
    except BaseException:  # not enqueued: leave nothing behind
        session.rollback()  # its charges go with it: it never ran
        session.execute(sa.delete(LedgerEntry).where(LedgerEntry.tuning_job_id == job.id))
        session.execute(sa.delete(TuningJob).where(TuningJob.id == job.id))
        session.commit()
        raise
    log.info("tuning job %s created: %s over tenants %s", job.id, job.algorithm,
             job.tenant_ids)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    session.refresh(job)
    return _public(job)


@router.get("", response_model=TuningJobsPublic)
def read_tuning_jobs(session: SessionDep, settings: SettingsDep, _: AdminDep,
                     limit: Limit = 100, offset: Offset = 0) -> TuningJobsPublic:
    """Tuning jobs, newest first."""
    check_limit(("query", "limit"), limit, settings.max_page_size, "FEDREC_MAX_PAGE_SIZE")
    jobs = session.scalars(sa.select(TuningJob).order_by(TuningJob.id.desc())
                           .limit(limit).offset(offset)).all()
    count = session.scalar(sa.select(sa.func.count()).select_from(TuningJob))
    return TuningJobsPublic(data=[_public(j) for j in jobs], count=count)


def _tuning_job(session, job_id: int) -> TuningJob:
    job = session.get(TuningJob, job_id)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "tuning_job_not_found",
                       "Tuning job not found")
    return job


@router.get("/{job_id}", response_model=TuningJobPublic, responses=errors(404))
def read_tuning(job_id: PathId, session: SessionDep, _: AdminDep) -> TuningJobPublic:
    """Status, the trials scored so far and, once completed, the chosen config."""
    return _public(_tuning_job(session, job_id))


@router.post("/{job_id}/cancel", response_model=TuningJobPublic, responses=errors(404, 409))
def cancel_tuning(job_id: PathId, session: SessionDep, _: AdminDep) -> TuningJobPublic:
    """Stop a queued or running search (a running one stops after its current trial);
    409 when it has finished."""
    job = _tuning_job(session, job_id)
    if not cancel_tuning_job(session, job):
        raise ApiError(status.HTTP_409_CONFLICT, "tuning_job_finished",
                       f"Tuning job {job_id} is already {job.status}")
    return _public(job)


@router.post("/{job_id}/resume", response_model=TuningJobPublic, status_code=202,
             responses=errors(404, 409))
def resume_tuning(job_id: PathId, request: Request, response: Response,
                  session: SessionDep, _: AdminDep) -> TuningJobPublic:
    """Start a failed, cancelled or stuck search again (from its first trial: the search
    is deterministic given the seed); 409 for a completed one."""
    job = _tuning_job(session, job_id)
    if not reopen_tuning_job(session, job):
        raise ApiError(status.HTTP_409_CONFLICT, "tuning_job_finished",
                       f"Tuning job {job_id} is completed; nothing to resume")
    start_tuning(request.app, job.id)
    session.refresh(job)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return _public(job)
