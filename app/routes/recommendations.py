"""Tenant: top-k recommendations for its users, and its training report."""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from app.deps import (
    OwnTenantDep,
    ServingTenantDep,
    SessionDep,
    SettingsDep,
    check_limit,
    errors,
    in_background,
)
from app.models import Tenant
from app.problems import ApiError
from app.routes import API_PREFIX
from app.training import reports
from app.training.models import JobClient, TrainingJob
from app.training.schemas import (
    BatchRecommendationsPublic,
    BatchRecommendationsRequest,
    Recommendation,
    RecommendationsPublic,
    TenantReport,
)
from app.training.serving import (
    Ranked,
    UnknownUser,
    recommend,
    recommend_from_memory,
    refresh_caches,
)

router = APIRouter(prefix=API_PREFIX + "/tenants/{tenant_id}", tags=["tenant: recommendations"],
                   responses=errors(401, 404))
UNKNOWN_USER = "User {!r} not found: no ratings and no factors in this tenant"
NO_JOB = "No training job has included this tenant yet"
K_DOC = "At most FEDREC_MAX_TOP_K (default 1000)."


def _caches(request: Request):
    return request.app.state.factor_cache, request.app.state.ratings_cache


def _public(user: str, ranked: Ranked, k: int, offset: int) -> RecommendationsPublic:
    # built without validation: every value is already of its field's type (str keys and
    # titles from the catalogue, float scores, int ids), and this runs on every request
    data = [Recommendation.model_construct(item=key, title=title, score=score)
            for key, title, score in ranked.items]
    return RecommendationsPublic.model_construct(user=user, source=ranked.source,
                                                 job_id=ranked.job_id, data=data, k=k,
                                                 offset=offset)


@router.get("/users/{user_key}/recommendations", response_model=RecommendationsPublic)
async def read_recommendations(user_key: str, request: Request, tenant: ServingTenantDep,
                               k: Annotated[int, Query(ge=1, description=K_DOC)] = 10,
                               offset: Annotated[int, Query(ge=0, le=100_000)] = 0,
                               include_rated: bool = False) -> Response:
    """Top-k items for one user, excluding those already rated unless include_rated."""
    # Settings from app.state, not SettingsDep: a synchronous dependency costs every
    # request a hop through the threadpool.
    check_limit(("query", "k"), k, request.app.state.settings.max_top_k, "FEDREC_MAX_TOP_K")
    ranked, due = recommend_from_memory(*_caches(request), tenant, user_key, k, offset,
                                        include_rated)
    if ranked is not None and due:  # answer now; re-check snapshot and ratings meanwhile
        def refresh() -> None:
            with request.app.state.sessions() as session:
                refresh_caches(session, *_caches(request), tenant.id)
        in_background(request, refresh)
    request.app.state.metrics.cache.labels("recommendations",
                                           "miss" if ranked is None else "hit").inc()
    if ranked is None and due:  # expired: one re-check of the tenant's caches for all waiting
        def recheck() -> None:
            with request.app.state.sessions() as session:
                refresh_caches(session, *_caches(request), tenant.id)
        await request.app.state.coalesced.run(("serving", tenant.id), recheck)
        ranked, _ = recommend_from_memory(*_caches(request), tenant, user_key, k, offset,
                                          include_rated)
    if ranked is None:  # a cache miss: one threadpool call with its own session
        def load() -> Ranked:
            with request.app.state.sessions() as session:
                return recommend(session, *_caches(request), tenant, user_key, k, offset,
                                 include_rated)
        try:
            ranked = await run_in_threadpool(load)
        except UnknownUser:
            raise ApiError(status.HTTP_404_NOT_FOUND, "user_not_found",
                           UNKNOWN_USER.format(user_key)) from None
    # Serialised here: FastAPI would dump, re-validate and re-encode the response model.
    return Response(_public(user_key, ranked, k, offset).model_dump_json(),
                    media_type="application/json")


@router.post("/recommendations", response_model=BatchRecommendationsPublic,
             responses=errors(400))
def create_batch_recommendations(body: BatchRecommendationsRequest, request: Request,
                                 tenant: OwnTenantDep, session: SessionDep,
                                 settings: SettingsDep) -> BatchRecommendationsPublic:
    """Top-k for many users at once; unknown users are listed in not_found."""
    check_limit(("body", "k"), body.k, settings.max_top_k, "FEDREC_MAX_TOP_K")
    data, missing = [], []
    for user in dict.fromkeys(body.users):
        try:
            ranked = recommend(session, *_caches(request), tenant, user, body.k, 0,
                               body.include_rated)
        except UnknownUser:
            missing.append(user)
            continue
        data.append(_public(user, ranked, body.k, 0))
    return BatchRecommendationsPublic(data=data, not_found=missing)


def _latest_job(session, tenant: Tenant) -> TrainingJob | None:
    return session.scalar(sa.select(TrainingJob).join(
        JobClient, JobClient.job_id == TrainingJob.id).where(JobClient.tenant_id == tenant.id)
        .order_by(TrainingJob.id.desc()).limit(1))


@router.get("/report", response_model=TenantReport)
def read_tenant_report(tenant: OwnTenantDep, session: SessionDep) -> TenantReport:
    """This tenant's curve in its latest job and its privacy spent and remaining."""
    job = _latest_job(session, tenant)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "no_training_job", NO_JOB)
    rounds = reports.curve(session, job.id)
    return TenantReport(tenant_id=tenant.id, job_id=job.id,
                        curve=reports.tenant_curve(rounds, tenant.id),
                        privacy=reports.privacy_of_job(session, job, [tenant.id]),
                        ranking=reports.final_ranking(rounds).get("per_tenant", {})
                        .get(str(tenant.id)))


@router.get("/report/plot.png", response_class=Response,
            responses={200: {"content": {"image/png": {}}}})
def read_tenant_plot(tenant: OwnTenantDep, session: SessionDep) -> Response:
    """PNG plot of this tenant's test RMSE per round in its latest job."""
    job = _latest_job(session, tenant)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "no_training_job", NO_JOB)
    return Response(reports.plot_png(session, job, tenant.id), media_type="image/png")
