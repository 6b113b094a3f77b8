"""Training jobs: create (or plan, or replay), read, cancel and resume.

The admin API (:mod:`app.routes.jobs`) and the dashboard's job pages call these; a job is
refused with :class:`app.problems.ApiError` (:func:`refused` gives each kind of
:class:`app.training.jobs.JobRefused` its stable code).
"""

from __future__ import annotations

import dataclasses
import logging

import sqlalchemy as sa
from fastapi import FastAPI, status
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.config import Settings
from app.deps import check_limit
from app.logs import bind
from app.models import Tenant
from app.problems import ApiError
from app.services import newest_first
from app.training import dry_round
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
from app.training.schemas import JobCreate, JobPlanPublic, JobPublic

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
    (503, "", "dry_round_unavailable"),  # no worker or no slot answered the dry round
)


def refused(exc: JobRefused) -> ApiError:
    """The problem of a refused job, with a stable code per kind of refusal."""
    code = next((c for s, start, c in REFUSALS
                 if s == exc.status and exc.detail.startswith(start)), "job_refused")
    # a tenant without ratings is the data's state, not the request's fault: 409
    status_code = status.HTTP_409_CONFLICT if code == "no_ratings" else exc.status
    return ApiError(status_code, code, exc.detail,
                    headers={"Retry-After": "5"} if status_code == 503 else None)


def job_public(job: TrainingJob) -> JobPublic:
    """The job as the API shows it, with its progress (1.0 once completed)."""
    fields = {name: getattr(job, name) for name in JobPublic.model_fields if name != "progress"}
    done = job.status == "completed"  # a job that stopped on validation is done too
    return JobPublic(**fields, progress=1.0 if done else job.current_round / job.rounds)


def get_job(session: Session, job_id: int) -> TrainingJob:
    """The job ``job_id`` (404 ``job_not_found`` if there is none)."""
    bind(job_id=job_id)
    job = session.get(TrainingJob, job_id)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "job_not_found", JOB_NOT_FOUND)
    return job


def privacy_settings(body: JobCreate) -> dict | None:
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


@dataclasses.dataclass(frozen=True)
class Created:
    """A job created and started, or (``replayed``) the one an Idempotency-Key created
    before with the same body."""

    job: TrainingJob
    replayed: bool = False


def create_job(session: Session, settings: Settings, app: FastAPI, body: JobCreate,
               idempotency_key: str | None = None,
               dry_run: bool = False) -> Created | JobPlanPublic:
    """Check budgets, snapshot the ratings and start training; with ``dry_run``, only the
    plan (each tenant's epsilon before and after), nothing created.

    With an ``idempotency_key``, a retry with the same body returns the job created the
    first time instead of creating (and paying for) another. A job that could not be
    enqueued is deleted before the error propagates, so retrying is safe.
    """
    digest = request_hash(body.model_dump(mode="json"))
    try:  # a dry run is a plan, never a stored job (whatever key it carries)
        if idempotency_key is not None and not dry_run and (
                done := job_for_key(session, idempotency_key, digest)):
            return Created(done, replayed=True)
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
    spec = JobSpec(algorithm=body.algorithm or DEFAULT_RATING, tenant_ids=tenant_ids,
                   rounds=body.rounds,
                   per_round=body.per_round, seed=body.seed, config=body.config,
                   dp=privacy_settings(body), test_fraction=body.test_fraction,
                   allow_not_private=body.allow_not_private,
                   max_attempts=settings.job_max_attempts, agents=list(body.agents),
                   round_seconds=body.round_seconds, wire=body.wire,
                   rounds_given="rounds" in body.model_fields_set,
                   validation_fraction=body.validation_fraction, lists=body.lists,
                   dry_round_seconds=settings.dry_round_seconds,
                   dry_rounds=None if app.state.celery.conf.task_always_eager
                   else dry_round.remote(app.state.celery))
    try:
        specs = (default_pair(spec, "rounds" in body.model_fields_set)
                 if body.algorithm is None else [spec])
        if dry_run:
            plan = plan_jobs(session, specs)
            return JobPlanPublic(algorithm=plan.algorithm, privacy=plan.privacy,
                                 tenants=plan.tenants)
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
        return Created(done, replayed=True)
    started = [job.id] + ([job.pair_job_id] if job.pair_job_id else [])
    try:
        for job_id in started:
            start_job(app, job_id)
    except BaseException:
        for job_id in started:
            _discard(session, job_id)
        raise
    session.refresh(job)
    bind(job_id=job.id)
    log.info("job %s created: %s over tenants %s", job.id, job.algorithm, job.tenant_ids)
    return Created(job)


def _discard(session: Session, job_id: int) -> None:
    """The job could not be enqueued: delete it before the error answer goes out."""
    try:
        discard_job(session, job_id)
    except Exception:  # noqa: BLE001 - the original error is the answer
        log.exception("could not discard job %s after its start failed", job_id)


def list_jobs(session: Session, limit: int, offset: int) -> tuple[list[TrainingJob], int]:
    """A page of training jobs, newest first, and how many there are."""
    return newest_first(session, TrainingJob, limit, offset)


def cancel(session: Session, job_id: int) -> TrainingJob:
    """Stop a job after its current round (409 ``job_finished`` if it already finished)."""
    job = get_job(session, job_id)
    if not cancel_job(session, job):
        raise ApiError(status.HTTP_409_CONFLICT, "job_finished",
                       f"Job {job_id} is already {job.status}")
    return job


def resume_job(session: Session, app: FastAPI, job_id: int) -> TrainingJob:
    """Re-send the next round of an interrupted job; completed rounds are kept (409
    ``job_not_resumable`` when there is nothing to resume)."""
    job = get_job(session, job_id)
    session.commit()
    if not resume(app, job_id):
        raise ApiError(status.HTTP_409_CONFLICT, "job_not_resumable",
                       f"Job {job_id} is {job.status}; nothing to resume")
    session.refresh(job)
    return job
