"""Tenant: top-k recommendations for its users, and its training report."""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param

from algorithms.registry import model_kind
from app.deps import (
    OwnTenantDep,
    ServingTenantDep,
    SessionDep,
    SettingsDep,
    check_limit,
    errors,
    in_background,
    key_tenant,
)
from app.models import Tenant
from app.problems import ApiError
from app.routes import API_PREFIX
from app.schemas import MAX_DB_INT
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
MAX_OFFSET = 100_000
K_DOC = "At most FEDREC_MAX_TOP_K (default 1000)."


def _caches(request: Request):
    return request.app.state.factor_cache, request.app.state.ratings_cache


def _public(user: str, ranked: Ranked, k: int, offset: int) -> RecommendationsPublic:
    # built without validation: every value is already of its field's type (str keys and
    # titles from the catalogue, float scores, int ids), and this runs on every request
    data = [Recommendation.model_construct(item=key, title=title, score=score)
            for key, title, score in ranked.items]
    kind = None if ranked.model is None else (
        "popularity" if ranked.model == "popularity" else model_kind(ranked.model))
    return RecommendationsPublic.model_construct(user=user, source=ranked.source,
                                                 job_id=ranked.job_id, data=data, k=k,
                                                 offset=offset, private=ranked.private,
                                                 privacy=ranked.privacy, model=ranked.model,
                                                 model_kind=kind, reason=ranked.reason)


async def _answer(request: Request, tenant: Tenant, user_key: str, k: int, offset: int,
                  include_rated: bool) -> Response:
    """The top-k answer of :func:`read_recommendations` once its inputs are read, whichever
    way they were (FastAPI's dependency resolution or :class:`ServingRoute`'s fast path)."""
    state = request.app.state
    # Settings from app.state, not SettingsDep: a synchronous dependency costs every
    # request a hop through the threadpool.
    check_limit(("query", "k"), k, state.settings.max_top_k, "FEDREC_MAX_TOP_K")
    caches = state.factor_cache, state.ratings_cache
    ranked, due = recommend_from_memory(*caches, tenant, user_key, k, offset, include_rated)
    if ranked is not None and due:  # answer now; re-check snapshot and ratings meanwhile
        def refresh() -> None:
            with state.sessions() as session:
                refresh_caches(session, *caches, tenant.id)
        in_background(request, refresh)
    state.metrics.cache_lookup("recommendations", ranked is not None)
    if ranked is None and due:  # expired: one re-check of the tenant's caches for all waiting
        def recheck() -> None:
            with state.sessions() as session:
                refresh_caches(session, *caches, tenant.id)
        await state.coalesced.run(("serving", tenant.id), recheck)
        ranked, _ = recommend_from_memory(*caches, tenant, user_key, k, offset, include_rated)
    if ranked is None:  # a cache miss: one threadpool call with its own session
        def load() -> Ranked:
            with state.sessions() as session:
                return recommend(session, *caches, tenant, user_key, k, offset, include_rated)
        try:
            ranked = await run_in_threadpool(load)
        except UnknownUser:
            raise ApiError(status.HTTP_404_NOT_FOUND, "user_not_found",
                           UNKNOWN_USER.format(user_key)) from None
    # Serialised here: FastAPI would dump, re-validate and re-encode the response model.
    return Response(_public(user_key, ranked, k, offset).model_dump_json(),
                    media_type="application/json")


def _plain_int(text: str | bytes, low: int, high: int) -> int | None:
    """``text`` as an int when it is plain ASCII decimal (no sign, space or leading zero)
    within [low, high]; None for anything else, which FastAPI then reads and validates."""
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()) or (
            len(text) > 1 and text[0] in (48, "0")):
        return None
    value = int(text)
    return value if low <= value <= high else None


_QUERY = {b"k": 1, b"offset": 2, b"include_rated": 3}
_FLAGS = {b"true": True, b"false": False}


def _plain_inputs(scope) -> tuple[int, str, str, int, int, bool] | None:
    """(tenant id, user key, bearer credentials, k, offset, include_rated) of a request to
    :func:`read_recommendations` whose inputs are plain: a ``Bearer`` authorization, the
    tenant id and each query parameter given at most once, in plain decimal (or ``true``/
    ``false``) within its bounds, nothing percent-encoded, no other query parameter. None
    otherwise: such a request goes through FastAPI, which gives the same answer to a plain
    request and the validation error, 401 or default of anything else."""
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
            break
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not credentials or scheme.lower() != "bearer":
        return None
    params = scope["path_params"]
    tenant_id = _plain_int(params["tenant_id"], 1, MAX_DB_INT)
    if tenant_id is None:
        return None
    values: list = [None, 10, 0, False]  # the defaults of read_recommendations
    query = scope["query_string"]
    if query:
        if b"%" in query or b"+" in query:
            return None
        given = set()
        for pair in query.split(b"&"):
            name, _, value = pair.partition(b"=")
            slot = _QUERY.get(name)
            if slot is None or slot in given:
                return None
            given.add(slot)
            value = (_FLAGS.get(value) if slot == 3 else
                     _plain_int(value, 1 if slot == 1 else 0, MAX_OFFSET if slot == 2
                                else MAX_DB_INT))
            if value is None:
                return None
            values[slot] = value
    return tenant_id, params["user_key"], credentials, values[1], values[2], values[3]


class ServingRoute(APIRoute):
    """The route of :func:`read_recommendations` with a fast path: a request with plain
    inputs (:func:`_plain_inputs`) is answered from its raw header, path and query, without
    FastAPI's dependency resolution (the ``HTTPBearer`` sub-dependency, the path and three
    query parameters: about a tenth of the event loop's time per request in the profile),
    by the same :func:`app.deps.key_tenant` and :func:`_answer` the declared route calls.
    The declared route (its dependencies, parameters, security scheme) still makes the
    OpenAPI document and answers every other request."""

    def get_route_handler(self):
        declared = super().get_route_handler()

        async def handler(request: Request) -> Response:
            plain = _plain_inputs(request.scope)
            if plain is None:
                return await declared(request)
            tenant_id, user_key, credentials, k, offset, include_rated = plain
            tenant = await key_tenant(request, tenant_id, credentials)
            return await _answer(request, tenant, user_key, k, offset, include_rated)

        return handler


async def read_recommendations(user_key: str, request: Request, tenant: ServingTenantDep,
                               k: Annotated[int, Query(ge=1, description=K_DOC)] = 10,
                               offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
                               include_rated: bool = False) -> Response:
    """Top-k items for one user, excluding those already rated unless include_rated."""
    return await _answer(request, tenant, user_key, k, offset, include_rated)


# the hot path: routes are matched in order, so it is the module's first
router.add_api_route("/users/{user_key}/recommendations", read_recommendations,
                     methods=["GET"], response_model=RecommendationsPublic,
                     route_class_override=ServingRoute)


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
    final = reports.final_ranking(rounds)
    return TenantReport(tenant_id=tenant.id, job_id=job.id,
                        curve=reports.tenant_curve(rounds, tenant.id),
                        privacy=reports.privacy_of_job(session, job, [tenant.id]),
                        ranking=final.get("per_tenant", {}).get(str(tenant.id)),
                        popularity=(final.get("popularity") or {}).get("per_tenant", {})
                        .get(str(tenant.id)),
                        models=reports.models_of(session, job))


@router.get("/report/plot.png", response_class=Response,
            responses={200: {"content": {"image/png": {"schema": {
                "type": "string", "format": "binary"}}}}})
def read_tenant_plot(tenant: OwnTenantDep, session: SessionDep) -> Response:
    """PNG plot of this tenant's test RMSE per round in its latest job."""
    job = _latest_job(session, tenant)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "no_training_job", NO_JOB)
    return Response(reports.plot_png(session, job, tenant.id), media_type="image/png")
