"""Admin: create, list, show, cancel and resume training jobs; job reports and plots."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse

from app.deps import UNPROCESSABLE, AdminDep, SessionDep, SettingsDep, check_limit, errors
from app.idempotency import IdempotencyKey
from app.routes import API_PREFIX
from app.schemas import Limit, Offset, PathId
from app.services import jobs
from app.services.jobs import job_public
from app.training import reports
from app.training.schemas import JobCreate, JobPlanPublic, JobPublic, JobReport, JobsPublic

router = APIRouter(prefix=API_PREFIX + "/admin/jobs", tags=["admin: training"],
                   responses=errors(401, 429))


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
    out = jobs.create_job(session, settings, request.app, body, idempotency_key, dry_run)
    if isinstance(out, JobPlanPublic):
        return JSONResponse(out.model_dump(mode="json"), status_code=status.HTTP_200_OK)
    if out.replayed:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotency-Replayed"] = "true"
    response.headers["Location"] = f"{router.prefix}/{out.job.id}"
    return job_public(out.job)


@router.get("", response_model=JobsPublic)
def read_jobs(session: SessionDep, settings: SettingsDep, _: AdminDep, limit: Limit = 100,
              offset: Offset = 0) -> JobsPublic:
    """Training jobs, newest first."""
    check_limit(("query", "limit"), limit, settings.max_page_size, "FEDREC_MAX_PAGE_SIZE")
    page, count = jobs.list_jobs(session, limit, offset)
    return JobsPublic(data=[job_public(j) for j in page], count=count)


@router.get("/{job_id}", response_model=JobPublic, responses=errors(404))
def read_job(job_id: PathId, session: SessionDep, _: AdminDep) -> JobPublic:
    """Status, current round, progress and latest metrics of a job."""
    return job_public(jobs.get_job(session, job_id))


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=errors(404, 409))
def cancel_training_job(job_id: PathId, session: SessionDep, _: AdminDep) -> JobPublic:
    """Stop a job after its current round (409 if it already finished)."""
    return job_public(jobs.cancel(session, job_id))


@router.post("/{job_id}/resume", response_model=JobPublic, status_code=202,
             responses=errors(404, 409))
def resume_training_job(job_id: PathId, request: Request, response: Response,
                        session: SessionDep, _: AdminDep) -> JobPublic:
    """Re-send the next round of an interrupted job; completed rounds are kept."""
    job = jobs.resume_job(session, request.app, job_id)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return job_public(job)


@router.get("/{job_id}/report", response_model=JobReport, responses=errors(404))
def read_job_report(job_id: PathId, session: SessionDep, _: AdminDep) -> JobReport:
    """Training curve (overall and per tenant), final figures and privacy spent."""
    job = jobs.get_job(session, job_id)
    return reports.job_report(session, job, job_public(job))


@router.get("/{job_id}/plot.png", response_class=Response,
            responses={200: {"content": {"image/png": {"schema": {
                "type": "string", "format": "binary"}}}}, **errors(404)})
def read_job_plot(job_id: PathId, session: SessionDep, _: AdminDep) -> Response:
    """PNG plot of the test RMSE per round, overall and per tenant."""
    job = jobs.get_job(session, job_id)
    return Response(reports.plot_png(session, job), media_type="image/png")
