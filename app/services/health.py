"""Readiness of the service's dependencies, in words: the API's ``/ready`` and the
dashboard's health page both say these."""

from __future__ import annotations

from kombu import Connection
from sqlalchemy import text
from sqlalchemy.engine import Engine


def database_state(engine: Engine) -> str:
    """``"ok"``, or ``"unreachable (<error type>)"``."""
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means not ready; the reason is reported
        return f"unreachable ({type(exc).__name__})"
    return "ok"


def broker_state(url: str | None) -> str:
    """``"ok"``, ``"not configured (...)"`` without a broker, or ``"unreachable (...)"``."""
    if not url:
        return "not configured (tasks run in-process)"
    try:
        with Connection(url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    except Exception as exc:
        return f"unreachable ({type(exc).__name__})"
    return "ok"
