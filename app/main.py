"""The FastAPI application factory: ``uvicorn --factory app.main:create_app``."""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerDown

from app import problems
from app.cache import Coalesced
from app.config import Settings, get_settings, resolve_admin_token
from app.dashboard import install_dashboard
from app.db import DATABASE_DOWN, make_engine, session_factory
from app.deps import document_limits
from app.edge import RequestEdge
from app.limits import UploadSlots
from app.logs import configure_logging
from app.metrics import Metrics
from app.routes import (
    agents,
    health,
    items,
    jobs,
    metrics,
    ratings,
    recommendations,
    stats,
    tenant_privacy,
    tenants,
    tuning,
)
from app.security import KeyCache
from app.training.serving import RatingsCache
from app.training.snapshots import FactorCache
from privacy.accountant import load_analyses
from worker.celery_app import create_celery_app

log = logging.getLogger("fedrec")


async def unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 (not a bare 500) when PostgreSQL or the broker cannot be reached; the request's
    transaction was rolled back, so it can be retried (with its Idempotency-Key)."""
    what = "broker" if isinstance(exc, BrokerDown) else "database"
    log.warning("%s unavailable during %s %s: %s", what, request.method, request.url.path, exc)
    return problems.problem(request, 503, f"{what}_unavailable",
                            f"The {what} is unavailable; retry the request later",
                            headers={"Retry-After": "5"})


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
    engine = make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if freeze_heap:
            # opacus and torch (seconds, ~100k objects) now rather than in the first
            # request that accounts, and frozen with the rest
            load_analyses()
            gc.collect()
            gc.freeze()
        yield
        engine.dispose()

    app = FastAPI(title="fedrec", version="0.1.0", lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # served offline by app.dashboard
                  description="Privacy-focused federated recommender: tenants, items, ratings.")
    app.state.settings, app.state.admin_token, app.state.engine = settings, token, engine
    app.state.sessions = session_factory(engine)
    app.state.celery = create_celery_app(settings)
    app.state.factor_cache = FactorCache(settings.serving_cache_seconds)
    app.state.key_cache = KeyCache(settings.serving_cache_seconds)
    app.state.background_tasks = set()
    app.state.upload_slots = UploadSlots(settings.max_concurrent_uploads)
    app.state.ratings_cache = RatingsCache(settings.serving_cache_seconds)
    app.state.coalesced = Coalesced()  # one re-check at a time per key (app.cache)
    app.state.agent_closes = {}  # (job, round) -> when its deadline aggregate was sent
    # recommendations first: routes are matched in order, and it is the hot path
    # (each resource router carries the /v1 prefix itself: API_PREFIX in app.routes)
    for module in (recommendations, health, tenants, items, ratings, stats, jobs,
                   tenant_privacy, metrics, agents, tuning):
        app.include_router(module.router)
    app.state.openapi_hooks = [lambda schema: document_limits(schema, settings)]
    problems.install(app)  # every error as problem+json, documented in the OpenAPI
    for exc in (*DATABASE_DOWN, BrokerDown):
        app.add_exception_handler(exc, unavailable)
    install_dashboard(app)  # /docs, /redoc and the /dashboard pages
    # X-Request-ID, FEDREC_MAX_UPLOAD_BYTES on every route (413), the request metrics
    # and the access line, as one layer (app.edge)
    app.add_middleware(RequestEdge)
    app.state.metrics = Metrics(app.state.sessions)
    return app


def create_served_app() -> FastAPI:
    """``fedrec serve``'s factory: :func:`create_app` with its heap frozen once started."""
    return create_app(freeze_heap=True)
