"""The FastAPI application factory: ``uvicorn --factory app.main:create_app``."""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from kombu.exceptions import OperationalError as BrokerDown
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app import problems
from app.cache import Coalesced
from app.config import Settings, get_settings, resolve_admin_token
from app.dashboard import install_dashboard
from app.db import DATABASE_DOWN, make_engine, session_factory
from app.deps import document_limits
from app.edge import RequestEdge
from app.limits import TOO_MANY_POLLS, UploadSlots
from app.logs import configure_logging
from app.metrics import Metrics
from app.queue import create_celery_app
from app.routes import (
    agents,
    health,
    items,
    jobs,
    metrics,
    model,
    ratings,
    recommendations,
    stats,
    tenant_privacy,
    tenants,
    tuning,
)
from app.security import FailedSignIns, KeyCache
from app.training.serving import RatingsCache
from app.training.snapshots import FactorCache

log = logging.getLogger("fedrec")


async def unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 (not a bare 500) when PostgreSQL or the broker cannot be reached; the request's
    transaction was rolled back, so it can be retried (with its Idempotency-Key)."""
    what = "broker" if isinstance(exc, BrokerDown) else "database"
    log.warning("%s unavailable during %s %s: %s", what, request.method, request.url.path, exc)
    return problems.problem(request, 503, f"{what}_unavailable",
                            f"The {what} is unavailable; retry the request later",
                            headers={"Retry-After": "5"})


async def busy(request: Request, exc: Exception) -> JSONResponse:
    """503 with ``Retry-After`` (not a 500) when every pooled database connection stayed
    taken for FEDREC_DATABASE_POOL_TIMEOUT: the request changed nothing and can be retried."""
    log.warning("database pool exhausted during %s %s: %s", request.method, request.url.path,
                exc)
    return problems.problem(request, 503, "database_busy",
                            "Every database connection is in use; retry the request later",
                            headers={"Retry-After": "2"})


def create_app(settings: Settings | None = None, *, freeze_heap: bool = False) -> FastAPI:
    """Build the API from ``settings`` (default: the environment). Does not migrate.

    ``freeze_heap`` (``fedrec serve``, :func:`create_served_app`): once started, move every
    object then alive out of the garbage collector's reach (``gc.freeze``). The app's ~180k
    long-lived objects (modules, routes, schemas, SQLAlchemy metadata) are otherwise walked
    by every full collection: about 0.1 to 0.4 s per collection on the 2-core machine, a
    pause every request in flight waits out. Not for processes that build many apps
    (tests): frozen objects are never collected."""
    settings = settings or get_settings()
    if settings.log_format == "json":  # text: leave the host's (uvicorn's, pytest's) setup
        configure_logging("json")
    token, generated = resolve_admin_token(settings)
    if generated:
        log.warning("FEDREC_ADMIN_TOKEN is not set; development admin token for this "
                    "process: %s", token)
    engine = make_engine(settings.database_url, settings.database_pool_timeout)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if freeze_heap:
            gc.collect()
            gc.freeze()
        yield
        engine.dispose()

    app = FastAPI(title="fedrec", version="0.1.0", lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # served offline by app.dashboard
                  description="Privacy-focused federated recommender: tenants, items, ratings.",
                  generate_unique_id_function=operation_id)
    app.state.settings, app.state.admin_token, app.state.engine = settings, token, engine
    app.state.sessions = session_factory(engine)
    app.state.celery = create_celery_app(settings)
    app.state.factor_cache = FactorCache(settings.serving_cache_seconds)
    app.state.key_cache = KeyCache(settings.serving_cache_seconds)
    app.state.sign_ins = FailedSignIns(settings.max_failed_sign_ins)
    app.state.background_tasks = set()
    app.state.upload_slots = UploadSlots(settings.max_concurrent_uploads)
    app.state.agent_polls = UploadSlots(settings.max_agent_polls, "too_many_requests",
                                        TOO_MANY_POLLS)
    app.state.ratings_cache = RatingsCache(settings.serving_cache_seconds)
    app.state.coalesced = Coalesced()  # one re-check at a time per key (app.cache)
    app.state.agent_closes = {}  # (job, round) -> when its deadline aggregate was sent
    # recommendations first: routes are matched in order, and it is the hot path
    # (each resource router carries the /v1 prefix itself: API_PREFIX in app.routes)
    for module in (recommendations, health, tenants, items, ratings, stats, jobs,
                   tenant_privacy, metrics, agents, tuning, model):
        app.include_router(module.router)
    app.state.openapi_hooks = [lambda schema: document_limits(schema, settings)]
    problems.install(app)  # every error as problem+json, documented in the OpenAPI
    for exc in (*DATABASE_DOWN, BrokerDown):
        app.add_exception_handler(exc, unavailable)
    app.add_exception_handler(PoolTimeout, busy)
    install_dashboard(app)  # /docs, /redoc and the /dashboard pages
    # X-Request-ID, FEDREC_MAX_UPLOAD_BYTES on every route (413), the request metrics
    # and the access line, as one layer (app.edge)
    app.add_middleware(RequestEdge)
    app.state.metrics = Metrics(app.state.sessions)
    return app


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI ``operationId``: its function's name (``create_tenant``, not
    FastAPI's default ``create_tenant_v1_admin_tenants_post``), so that a client generated
    from the schema has functions named as the routes are; the tag groups them. Function
    names are unique across the routers (tests/app/test_generated_client.py checks)."""
    return route.name


def create_served_app() -> FastAPI:
    """``fedrec serve``'s factory: :func:`create_app` with its heap frozen once started."""
    return create_app(freeze_heap=True)
