"""Admin: tuning jobs (``fedrec tune`` on the stored ratings, run by a worker)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from app.deps import UNPROCESSABLE, AdminDep, SessionDep, SettingsDep, check_limit, errors
from app.routes import API_PREFIX
from app.schemas import Limit, Offset, PathId
from app.services import tuning
from app.services.tuning import tuning_public
from app.training.schemas import TuningJobCreate, TuningJobPublic, TuningJobsPublic

router = APIRouter(prefix=API_PREFIX + "/admin/tuning-jobs", tags=["admin: training"],
                   responses=errors(401, 429))


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
    job = tuning.create(session, settings, request.app, body)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return tuning_public(job)


@router.get("", response_model=TuningJobsPublic)
def read_tuning_jobs(session: SessionDep, settings: SettingsDep, _: AdminDep,
                     limit: Limit = 100, offset: Offset = 0) -> TuningJobsPublic:
    """Tuning jobs, newest first."""
    check_limit(("query", "limit"), limit, settings.max_page_size, "FEDREC_MAX_PAGE_SIZE")
    page, count = tuning.list_tuning_jobs(session, limit, offset)
    return TuningJobsPublic(data=[tuning_public(j) for j in page], count=count)


@router.get("/{job_id}", response_model=TuningJobPublic, responses=errors(404))
def read_tuning(job_id: PathId, session: SessionDep, _: AdminDep) -> TuningJobPublic:
    """Status, the trials scored so far and, once completed, the chosen config."""
    return tuning_public(tuning.get(session, job_id))


@router.post("/{job_id}/cancel", response_model=TuningJobPublic, responses=errors(404, 409))
def cancel_tuning(job_id: PathId, session: SessionDep, _: AdminDep) -> TuningJobPublic:
    """Stop a queued or running search (a running one stops after its current trial);
    409 when it has finished."""
    return tuning_public(tuning.cancel(session, job_id))


@router.post("/{job_id}/resume", response_model=TuningJobPublic, status_code=202,
             responses=errors(404, 409))
def resume_tuning(job_id: PathId, request: Request, response: Response,
                  session: SessionDep, _: AdminDep) -> TuningJobPublic:
    """Start a failed, cancelled or stuck search again (from its first trial: the search
    is deterministic given the seed); 409 for a completed one."""
    job = tuning.resume(session, request.app, job_id)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return tuning_public(job)
