"""Tenant: the rating-block statistics computed by the Celery task."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from app.deps import OwnTenantDep, SessionDep, errors
from app.models import RatingStats
from app.problems import ApiError
from app.queue import RECOMPUTE_RATING_STATS, enqueue
from app.routes import API_PREFIX
from app.schemas import RatingStatsPublic, TaskEnqueued

router = APIRouter(prefix=API_PREFIX + "/tenants/{tenant_id}/stats", tags=["tenant: statistics"],
                   responses=errors(401, 404))


@router.post("", response_model=TaskEnqueued, status_code=status.HTTP_202_ACCEPTED)
def create_stats_task(request: Request, response: Response, tenant: OwnTenantDep,
                      session: SessionDep) -> TaskEnqueued:
    """Recompute the statistics in the background (in-process when no broker is set)."""
    session.commit()  # end the read transaction: the task writes through its own session
    task_id, state = enqueue(request.app.state.celery, RECOMPUTE_RATING_STATS, [tenant.id])
    response.headers["Location"] = f"{API_PREFIX}/tenants/{tenant.id}/stats"  # the result
    return TaskEnqueued(task_id=task_id, status=state)


@router.get("", response_model=RatingStatsPublic)
def read_stats(tenant: OwnTenantDep, session: SessionDep) -> RatingStats:
    """The last computed statistics."""
    stats = session.get(RatingStats, tenant.id)
    if stats is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "stats_not_computed",
                            "Statistics not computed yet; POST to this URL to compute them")
    return stats
