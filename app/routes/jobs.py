"""Admin: create, list, show, cancel and resume training jobs; job reports and plots."""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from app.deps import UNPROCESSABLE, AdminDep, SessionDep, SettingsDep, check_limit, errors
from app.models import Tenant
from app.schemas import Offset, PathId
from app.training import reports
from app.training.jobs import JobRefused, JobSpec, cancel_job, create_job
from app.training.models import TrainingJob
from app.training.runner import resume_job as resume
from app.training.runner import start_job
from app.training.schemas import JobCreate, JobPublic, JobReport, JobsPublic

router = APIRouter(prefix="/admin/jobs", tags=["admin: training"], responses=errors(401))
JOB_NOT_FOUND = "Training job not found"


def _public(job: TrainingJob) -> JobPublic:
    fields = {name: getattr(job, name) for name in JobPublic.model_fields if name != "progress"}
    return JobPublic(**fields, progress=job.current_round / job.rounds)


def _job(session, job_id: int) -> TrainingJob:
    job = session.get(TrainingJob, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, JOB_NOT_FOUND)
    return job


@router.post("", response_model=JobPublic, status_code=status.HTTP_202_ACCEPTED,
             responses={**errors(400, 404, 409), **UNPROCESSABLE})
def create_training_job(body: JobCreate, request: Request, session: SessionDep,
                        settings: SettingsDep, _: AdminDep) -> JobPublic:
    """Check budgets, snapshot the ratings and start training (409 if over budget)."""
    check_limit(("body", "rounds"), body.rounds, settings.max_job_rounds,
                "FEDREC_MAX_JOB_ROUNDS")
    tenant_ids = body.tenant_ids or list(session.scalars(sa.select(Tenant.id)
                                                         .order_by(Tenant.id)))
    check_limit(("body", "tenant_ids"), len(tenant_ids), settings.max_job_tenants,
                "FEDREC_MAX_JOB_TENANTS", unit="tenants")
    spec = JobSpec(algorithm=body.algorithm, tenant_ids=tenant_ids, rounds=body.rounds,
                   per_round=body.per_round, seed=body.seed, config=body.config,
                   dp=body.dp.model_dump(exclude_none=True), test_fraction=body.test_fraction,
                   allow_not_private=body.allow_not_private)
    try:
        job = create_job(session, spec)
    except JobRefused as exc:
        raise HTTPException(exc.status, exc.detail) from None
    start_job(request.app, job.id)
    session.refresh(job)
    return _public(job)


@router.get("", response_model=JobsPublic)
def read_jobs(session: SessionDep, _: AdminDep,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              offset: Offset = 0) -> JobsPublic:
    """Training jobs, newest first."""
    jobs = session.scalars(sa.select(TrainingJob).order_by(TrainingJob.id.desc())
                           .limit(limit).offset(offset)).all()
    count = session.scalar(sa.select(sa.func.count()).select_from(TrainingJob))
    return JobsPublic(data=[_public(j) for j in jobs], count=count)


@router.get("/{job_id}", response_model=JobPublic, responses=errors(404))
def read_job(job_id: PathId, session: SessionDep, _: AdminDep) -> JobPublic:
    """Status, current round, progress and latest metrics of a job."""
    return _public(_job(session, job_id))


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=errors(404, 409))
def cancel_training_job(job_id: PathId, session: SessionDep, _: AdminDep) -> JobPublic:
    """Stop a job after its current round (409 if it already finished)."""
    job = _job(session, job_id)
    if not cancel_job(session, job):
        raise HTTPException(status.HTTP_409_CONFLICT, f"Job {job_id} is already {job.status}")
    return _public(job)


@router.post("/{job_id}/resume", response_model=JobPublic, status_code=202,
             responses=errors(404, 409))
def resume_training_job(job_id: PathId, request: Request, session: SessionDep,
                        _: AdminDep) -> JobPublic:
    """Re-send the next round of an interrupted job; completed rounds are kept."""
    job = _job(session, job_id)
    session.commit()
    if not resume(request.app, job_id):
        raise HTTPException(status.HTTP_409_CONFLICT, f"Job {job_id} is {job.status}; "
                                                      "nothing to resume")
    session.refresh(job)
    return _public(job)


@router.get("/{job_id}/report", response_model=JobReport, responses=errors(404))
def read_job_report(job_id: PathId, session: SessionDep, _: AdminDep) -> JobReport:
    """Training curve (overall and per tenant), final figures and privacy spent."""
    job = _job(session, job_id)
    return reports.job_report(session, job, _public(job))


@router.get("/{job_id}/plot.png", response_class=Response,
            responses={200: {"content": {"image/png": {}}}, **errors(404)})
def read_job_plot(job_id: PathId, session: SessionDep, _: AdminDep) -> Response:
    """PNG plot of the test RMSE per round, overall and per tenant."""
    job = _job(session, job_id)
    return Response(reports.plot_png(session, job), media_type="image/png")
