"""One log format for the API, the Celery worker and beat: ``text`` or ``json``
(FEDREC_LOG_FORMAT, or ``fedrec --log-format``).

Every record carries the context it was logged in: ``request_id`` (the ``X-Request-ID``
header, or a new one, echoed in the response), ``tenant_id`` and ``job_id`` once a route
or task knows them, ``task_id`` in a worker. A JSON line looks like::

    {"ts": "2026-11-24T04:30:00.123Z", "level": "INFO", "logger": "fedrec.access",
     "message": "GET /v1/tenants/{tenant_id}/ratings 200 4.1ms", "request_id": "9f0c...",
     "tenant_id": 3}
"""

from __future__ import annotations

import contextvars
import datetime as dt
import itertools
import json
import logging
import logging.config
import os
import re
from typing import Any

from starlette.types import Scope

FORMATS = ("text", "json")
CONTEXT_FIELDS = ("request_id", "tenant_id", "job_id", "task_id")
_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fedrec_log_context", default=None)
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
access_log = logging.getLogger("fedrec.access")


def bind(**fields: Any) -> None:
    """Add ``fields`` to the current request's or task's log context (visible to the
    threadpool too: the context holds one shared dict per request)."""
    current = _context.get()
    if current is None:
        _context.set({**fields})
    else:
        current.update(fields)


def new_context(**fields: Any) -> contextvars.Token:
    return _context.set(dict(fields))


def context() -> dict[str, Any]:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    """Copy the log context onto every record (``record.request_id`` ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get() or {}
        for name in CONTEXT_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, ctx.get(name))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, dt.UTC)
        line: dict[str, Any] = {"ts": stamp.isoformat(timespec="milliseconds")
                                .replace("+00:00", "Z"), "level": record.levelname,
                                "logger": record.name, "message": record.getMessage()}
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s%(ctx)s")

    def format(self, record: logging.LogRecord) -> str:
        pairs = [f"{n}={getattr(record, n)}" for n in CONTEXT_FIELDS
                 if getattr(record, n, None) is not None]
        record.ctx = f" [{' '.join(pairs)}]" if pairs else ""
        return super().format(record)


REROUTED = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "celery.task",
            "celery.worker", "celery.beat", "celery.app.trace")
"""Loggers that come with handlers of their own: emptied, so they log through the root's."""


def logging_config(fmt: str = "text", level: int = logging.INFO,
                   access_log: bool = True) -> dict[str, Any]:
    """:func:`configure_logging`'s set-up as a :func:`logging.config.dictConfig` document.
    ``fedrec serve`` hands it to uvicorn (``log_config``), which applies it in every
    worker process it starts (a worker is a new interpreter: the serving process's own
    set-up does not reach it); ``access_log=False`` silences the ``fedrec.access`` lines."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    loggers: dict[str, dict] = {name: {"handlers": [], "propagate": True} for name in REROUTED}
    if not access_log:
        loggers["fedrec.access"] = {"level": "WARNING"}
    return {"version": 1, "disable_existing_loggers": False,
            "filters": {"context": {"()": ContextFilter}},
            "formatters": {"fedrec": {"()": JsonFormatter if fmt == "json" else TextFormatter}},
            "handlers": {"fedrec": {"class": "logging.StreamHandler", "formatter": "fedrec",
                                    "filters": ["context"]}},
            "root": {"handlers": ["fedrec"], "level": level}, "loggers": loggers}


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """Route every logger (fedrec, uvicorn, celery...) through one handler on the
    root logger in ``fmt``; idempotent."""
    logging.config.dictConfig(logging_config(fmt, level))


_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def _new_id_prefix() -> None:  # a forked worker must not repeat its parent's ids
    global _ID_PREFIX, _ID_COUNTER
    _ID_PREFIX, _ID_COUNTER = os.urandom(8).hex(), itertools.count(1)


os.register_at_fork(after_in_child=_new_id_prefix)


def new_request_id() -> str:
    """A 32-hex-digit id unique across processes: a random per-process prefix and a
    counter (a uuid4 per request costs a system call for randomness nobody needs)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def request_id_of(scope: Scope) -> str:
    """The request's ``X-Request-ID`` when it is well-formed (the last one sent), else a
    new id."""
    given = b""
    for name, value in scope.get("headers") or ():
        if name == b"x-request-id":
            given = value
    text = given.decode("latin-1")
    return text if REQUEST_ID.match(text) else new_request_id()


def log_access(method: str, path: str, status: int, seconds: float) -> None:
    """The access line of one request (``path`` is the route's template when it matched)."""
    access_log.info("%s %s %s %.1fms", method, path, status, seconds * 1000)


def end_context(token: contextvars.Token) -> None:
    _context.reset(token)
