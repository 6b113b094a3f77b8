"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from app.problems import ApiError
from app.schemas import Health, Readiness
from app.services.health import broker_state, database_state

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def read_health() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/ready", response_model=Readiness,
            responses={503: {"description": "A dependency is down: a problem whose "
                                            "``database`` and ``broker`` members say which."}})
def read_ready(request: Request) -> Readiness:
    """The database (and the broker, when configured) answer."""
    database = database_state(request.app.state.engine)
    broker = broker_state(request.app.state.settings.broker_url)
    if database != "ok" or broker.startswith("unreachable"):
        raise ApiError(status.HTTP_503_SERVICE_UNAVAILABLE, "not_ready",
                       f"Not ready: database {database}, broker {broker}",
                       database=database, broker=broker)
    return Readiness(status="ready", database=database, broker=broker)
