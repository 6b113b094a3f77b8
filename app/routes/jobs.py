"""Admin: create, list, show, cancel and resume training jobs; job reports and plots."""

from __future__ import annotations

import logging
from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError

from app.deps import UNPROCESSABLE, AdminDep, SessionDep, SettingsDep, check_limit, errors
from app.idempotency import IdempotencyKey
from app.logs import bind
from app.models import Tenant
from app.problems import ApiError
from app.routes import API_PREFIX
from app.schemas import Limit, Offset, PathId
from app.training import reports
from app.training.jobs import (
    DEFAULT_RATING,
    JobRefused,
    JobSpec,
    cancel_job,
    create_jobs,
    default_pair,
    discard_job,
    job_for_key,
    plan_jobs,
    request_hash,
)
from app.training.models import TrainingJob
from app.training.runner import resume_job as resume
from app.training.runner import start_job
from app.training.schemas import JobCreate, JobPlanPublic, JobPublic, JobReport, JobsPublic

router = APIRouter(prefix=API_PREFIX + "/admin/jobs", tags=["admin: training"],
                   responses=errors(401, 429))
JOB_NOT_FOUND = "Training job not found"
log = logging.getLogger("fedrec.training")


REFUSALS = (  # (status, start of the message, code) of JobRefused, first match wins
    (409, "privacy budget exceeded", "budget_exceeded"),
    (409, "tenant(s) ", "not_private_refused"),
    (404, "unknown tenant", "tenant_not_found"),
    (422, "Idempotency-Key must be", "invalid_idempotency_key"),
    (422, "Idempotency-Key", "idempotency_conflict"),
    (422, "unknown algorithm", "unknown_algorithm"),
    (422, "tenant ", "no_ratings"),  # "tenant 3 (acme) has no ratings to train on"
    (422, "invalid privacy", "invalid_privacy"),
    (422, "invalid config", "invalid_config"),
    (422, "not tunable", "not_tunable"),
)


def refused(exc: JobRefused) -> ApiError:
    """The problem of a refused job, with a stable code per kind of refusal."""
    code = next((c for s, start, c in REFUSALS
                 if s == exc.status and exc.detail.startswith(start)), "job_refused")
    # a tenant without ratings is the data's state, not the request's fault: 409
    status_code = status.HTTP_409_CONFLICT if code == "no_ratings" else exc.status
    return ApiError(status_code, code, exc.detail)


def _public(job: TrainingJob) -> JobPublic:
    fields = {name: getattr(job, name) for name in JobPublic.model_fields if name != "progress"}
    done = job.status == "completed"  # a job that stopped on validation is done too
    return JobPublic(**fields, progress=1.0 if done else job.current_round / job.rounds)


def _job(session, job_id: int) -> TrainingJob:
    bind(job_id=job_id)
    job = session.get(TrainingJob, job_id)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "job_not_found", JOB_NOT_FOUND)
    return job


def _privacy_settings(body: JobCreate) -> dict | None:
    """The job's privacy request: ``privacy`` (user unit) or ``dp`` (tenant unit) as given;
    None for neither (the default is chosen with the algorithm's config, see
    :func:`app.training.jobs.create_job`)."""
    if body.dp is not None:
        return body.dp.model_dump(exclude_none=True)
    if body.privacy is None:
        return None
    return {"unit": body.privacy.unit, "placement": body.privacy.placement,
            "epsilon": body.privacy.target_epsilon, "delta": body.privacy.delta,
            **({"secure_aggregation": True,
                "dropout_tolerance": body.privacy.dropout_tolerance}
               if body.privacy.secure_aggregation else {})}


REPLAYED = {200: {"model": JobPublic | JobPlanPublic,
                  "description": "A replay: the job created earlier with the same "
                                 "Idempotency-Key and body, as it is now (header "
                                 "Idempotency-Replayed); or, with ?dry_run=true, the plan: "
                                 "each tenant's epsilon before and after, nothing created."},
            503: {"description": "Broker or database unavailable; no job was created."}}


@router.post("", response_model=JobPublic, status_code=status.HTTP_202_ACCEPTED,
             responses={**REPLAYED, **errors(400, 404, 409), **UNPROCESSABLE})
def create_training_job(body: JobCreate, request: Request, response: Response,
                        session: SessionDep, settings: SettingsDep, _: AdminDep,
                        idempotency_key: IdempotencyKey = None,
                        dry_run: Annotated[bool, Query(description="Plan only: check "
                                                       "and project every tenant's spend, "
                                                       "create nothing.")] = False
                        ) -> JobPublic:
    """Check budgets, snapshot the ratings and start training (409 if over budget).

    With an ``Idempotency-Key``, a retry with the same body returns the job created the
    first time (200, ``Idempotency-Replayed: true``) instead of creating (and paying for)
    another; the same key with another body is 422. A request answered with an error
    (e.g. 503: the broker is down) leaves no job behind, so retrying it is safe.
    """
    digest = request_hash(body.model_dump(mode="json"))
    try:  # a dry run is a plan, never a stored job (whatever key it carries)
        if idempotency_key is not None and not dry_run and (
                done := job_for_key(session, idempotency_key, digest)):
            return _replayed(response, done)
    except JobRefused as exc:
        raise refused(exc) from None
    check_limit(("body", "rounds"), body.rounds, settings.max_job_rounds,
                "FEDREC_MAX_JOB_ROUNDS")
    tenant_ids = body.tenant_ids if body.tenant_ids is not None else list(
        session.scalars(sa.select(Tenant.id).order_by(Tenant.id)))
    check_limit(("body", "tenant_ids"), len(tenant_ids), settings.max_job_tenants,
                "FEDREC_MAX_JOB_TENANTS", unit="tenants")
    if body.privacy is not None and body.dp is not None:
        raise ApiError(422, "privacy_and_dp", "give either privacy (user-level DP) or dp "
                                              "(tenant-level DP), not both")
    dp = _privacy_settings(body)
    spec = JobSpec(algorithm=body.algorithm or DEFAULT_RATING, tenant_ids=tenant_ids,
                   rounds=body.rounds,
                   per_round=body.per_round, seed=body.seed, config=body.config,
                   dp=dp, test_fraction=body.test_fraction,
                   allow_not_private=body.allow_not_private,
                   max_attempts=settings.job_max_attempts, agents=list(body.agents),
                   round_seconds=body.round_seconds, wire=body.wire,
                   rounds_given="rounds" in body.model_fields_set,
                   validation_fraction=body.validation_fraction, lists=body.lists,
                   dry_round_seconds=settings.dry_round_seconds)
    try:
        specs = (default_pair(spec, "rounds" in body.model_fields_set)
                 if body.algorithm is None else [spec])
    except JobRefused as exc:
        raise refused(exc) from None
    if dry_run:
        try:
            plan = plan_jobs(session, specs)
        except JobRefused as exc:
            raise refused(exc) from None
        body = JobPlanPublic(algorithm=plan.algorithm, privacy=plan.privacy,
                             tenants=plan.tenants)
        return JSONResponse(body.model_dump(mode="json"), status_code=status.HTTP_200_OK)
    try:
        job = create_jobs(session, specs,
                          (idempotency_key, digest) if idempotency_key else None)
    except JobRefused as exc:
        raise refused(exc) from None
    except IntegrityError:  # a concurrent request with the same key committed first
        session.rollback()
        try:
            done = job_for_key(session, idempotency_key, digest) if idempotency_key else None
        except JobRefused as exc:
            raise refused(exc) from None
        if done is None:
            raise
        return _replayed(response, done)
    started = [job.id] + ([job.pair_job_id] if job.pair_job_id else [])
    try:
        for job_id in started:
            start_job(request.app, job_id)
    except BaseException:
        for job_id in started:
            _discard(session, job_id)
        raise
    session.refresh(job)
    bind(job_id=job.id)
    log.info("job %s created: %s over tenants %s", job.id, job.algorithm, job.tenant_ids)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return _public(job)


def _replayed(response: Response, job: TrainingJob) -> JobPublic:
    response.status_code = status.HTTP_200_OK
    response.headers["Idempotency-Replayed"] = "true"
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return _public(job)


def _discard(session, job_id: int) -> None:
    """The job could not be enqueued: delete it before the error answer goes out."""
    try:
        discard_job(session, job_id)
    except Exception:  # noqa: BLE001 - the original error is the answer
        log.exception("could not discard job %s after its start failed", job_id)


@router.get("", response_model=JobsPublic)
def read_jobs(session: SessionDep, settings: SettingsDep, _: AdminDep, limit: Limit = 100,
              offset: Offset = 0) -> JobsPublic:
    """Training jobs, newest first."""
    check_limit(("query", "limit"), limit, settings.max_page_size, "FEDREC_MAX_PAGE_SIZE")
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
        raise ApiError(status.HTTP_409_CONFLICT, "job_finished",
                       f"Job {job_id} is already {job.status}")
    return _public(job)


@router.post("/{job_id}/resume", response_model=JobPublic, status_code=202,
             responses=errors(404, 409))
def resume_training_job(job_id: PathId, request: Request, response: Response,
                        session: SessionDep, _: AdminDep) -> JobPublic:
    """Re-send the next round of an interrupted job; completed rounds are kept."""
    job = _job(session, job_id)
    session.commit()
    if not resume(request.app, job_id):
        raise ApiError(status.HTTP_409_CONFLICT, "job_not_resumable",
                       f"Job {job_id} is {job.status}; nothing to resume")
    session.refresh(job)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return _public(job)


@router.get("/{job_id}/report", response_model=JobReport, responses=errors(404))
def read_job_report(job_id: PathId, session: SessionDep, _: AdminDep) -> JobReport:
    """Training curve (overall and per tenant), final figures and privacy spent."""
    job = _job(session, job_id)
    return reports.job_report(session, job, _public(job))


@router.get("/{job_id}/plot.png", response_class=Response,
            responses={200: {"content": {"image/png": {"schema": {
                "type": "string", "format": "binary"}}}}, **errors(404)})
def read_job_plot(job_id: PathId, session: SessionDep, _: AdminDep) -> Response:
    """PNG plot of the test RMSE per round, overall and per tenant."""
    job = _job(session, job_id)
    return Response(reports.plot_png(session, job), media_type="image/png")
