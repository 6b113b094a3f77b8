"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from kombu import Connection
from sqlalchemy import text

from app.problems import ApiError
from app.schemas import Health, Readiness

router = APIRouter(tags=["health"])


def _database_state(request: Request) -> str:
    try:
        with request.app.state.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means not ready; the reason is reported
        return f"unreachable ({type(exc).__name__})"
    return "ok"


def _broker_state(request: Request) -> str:
    url = request.app.state.settings.broker_url
    if not url:
        return "not configured (tasks run in-process)"
    try:
        with Connection(url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    except Exception as exc:
        return f"unreachable ({type(exc).__name__})"
    return "ok"


@router.get("/health", response_model=Health)
def read_health() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/ready", response_model=Readiness,
            responses={503: {"description": "A dependency is down: a problem whose "
                                            "``database`` and ``broker`` members say which."}})
def read_ready(request: Request) -> Readiness:
    """The database (and the broker, when configured) answer."""
    database, broker = _database_state(request), _broker_state(request)
    if database != "ok" or broker.startswith("unreachable"):
        raise ApiError(status.HTTP_503_SERVICE_UNAVAILABLE, "not_ready",
                       f"Not ready: database {database}, broker {broker}",
                       database=database, broker=broker)
    return Readiness(status="ready", database=database, broker=broker)
