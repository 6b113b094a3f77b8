"""The FastAPI application factory: ``uvicorn --factory app.main:create_app``."""

from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerDown

from app.config import Settings, get_settings, resolve_admin_token
from app.db import DATABASE_DOWN, make_engine, session_factory
from app.limits import BodyLimit, UploadSlots
from app.routes import agents, health, items, jobs, ratings, recommendations, stats, tenants
from app.security import KeyCache
from app.training.serving import RatingsCache
from app.training.snapshots import FactorCache
from worker.celery_app import create_celery_app

log = logging.getLogger("fedrec")


async def unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 (not a bare 500) when PostgreSQL or the broker cannot be reached; the request's
    transaction was rolled back, so it can be retried (with its Idempotency-Key)."""
    what = "broker" if isinstance(exc, BrokerDown) else "database"
    log.warning("%s unavailable during %s %s: %s", what, request.method, request.url.path, exc)
    return JSONResponse({"detail": f"The {what} is unavailable; retry the request later"},
                        status_code=503, headers={"Retry-After": "5"})


def json_safe(value):
    """``value`` with every NaN or infinity spelt as a string ("NaN", "Infinity",
    "-Infinity"): strict JSON has no such numbers, and echoing one must not become a 500."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 validation-error list, with non-finite inputs echoed as strings."""
    return JSONResponse({"detail": json_safe(jsonable_encoder(exc.errors()))},
                        status_code=422)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API from ``settings`` (default: the environment). Does not migrate."""
    settings = settings or get_settings()
    token, generated = resolve_admin_token(settings)
    if generated:
        log.warning("FEDREC_ADMIN_TOKEN is not set; development admin token for this "
                    "process: %s", token)
    engine = make_engine(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        engine.dispose()

    app = FastAPI(title="fedrec", version="0.1.0", lifespan=lifespan,
                  description="Privacy-focused federated recommender: tenants, items, ratings.")
    app.state.settings, app.state.admin_token, app.state.engine = settings, token, engine
    app.state.sessions = session_factory(engine)
    app.state.celery = create_celery_app(settings)
    app.state.factor_cache = FactorCache(settings.serving_cache_seconds)
    app.state.key_cache = KeyCache(settings.serving_cache_seconds)
    app.state.background_tasks = set()
    app.state.upload_slots = UploadSlots(settings.max_concurrent_uploads)
    app.state.ratings_cache = RatingsCache(settings.serving_cache_seconds)
    app.state.agent_closes = {}  # (job, round) -> when its deadline aggregate was sent
    for module in (health, tenants, items, ratings, stats, jobs, recommendations, agents):
        app.include_router(module.router)
    for exc in (*DATABASE_DOWN, BrokerDown):
        app.add_exception_handler(exc, unavailable)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_middleware(BodyLimit)  # FEDREC_MAX_UPLOAD_BYTES on every route (413)
    return app
