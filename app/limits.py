"""The request-body size bound of every route (FEDREC_MAX_UPLOAD_BYTES), applied by the
request layer (:class:`app.edge.RequestEdge`).

A declared ``Content-Length`` over the bound is refused before anything is read; a chunked
body is counted while it streams and refused as soon as it passes the bound. Either way the
answer is a 413 with :data:`TOO_LARGE`, through FastAPI's ``HTTPException`` handling.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

from fastapi import status
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope

from app.problems import ApiError, problem

TOO_LARGE = "Request body exceeds the upload limit of {} bytes (FEDREC_MAX_UPLOAD_BYTES)"


def too_large(limit: int) -> ApiError:
    """The 413 of a body over ``limit`` bytes."""
    return ApiError(status.HTTP_413_CONTENT_TOO_LARGE, "body_too_large", TOO_LARGE.format(limit))


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` when it is a plain number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


TOO_MANY_UPLOADS = ("{} uploads of this tenant are already in progress "
                    "(FEDREC_MAX_CONCURRENT_UPLOADS); retry when one has finished")
UPLOAD_RETRY_SECONDS = 5
TOO_MANY_POLLS = ("{} round requests of this tenant's agents are already in progress "
                  "(FEDREC_MAX_AGENT_POLLS); retry when one has answered")


class UploadSlots:
    """At most ``limit`` uploads (or other requests: ``code`` and ``detail``, a format of
    the limit) per tenant at once in this process (429 beyond)."""

    def __init__(self, limit: int, code: str = "too_many_uploads",
                 detail: str = TOO_MANY_UPLOADS) -> None:
        self.limit, self.code, self.detail = limit, code, detail
        self._lock = threading.Lock()
        self._active: collections.Counter[int] = collections.Counter()

    @contextlib.contextmanager
    def slot(self, tenant_id: int) -> Iterator[None]:
        """Hold one of the tenant's slots for the duration of the block."""
        with self._lock:
            if self._active[tenant_id] >= self.limit:
                raise ApiError(status.HTTP_429_TOO_MANY_REQUESTS, self.code,
                               self.detail.format(self.limit),
                               headers={"Retry-After": str(UPLOAD_RETRY_SECONDS)})
            self._active[tenant_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._active[tenant_id] -= 1
                if not self._active[tenant_id]:
                    del self._active[tenant_id]


def refusal_of_declared(scope: Scope, limit: int) -> Response | None:
    """The 413 answer of a request whose declared ``Content-Length`` is over ``limit``
    (refused before anything is read), else None."""
    declared = declared_length(scope)
    if declared is None or declared <= limit:
        return None
    return problem(Request(scope), status.HTTP_413_CONTENT_TOO_LARGE, "body_too_large",
                   TOO_LARGE.format(limit))


def counted(receive: Receive, limit: int) -> Receive:
    """``receive`` raising :func:`too_large` as soon as the body read passes ``limit``
    bytes (a chunked body has no declared length)."""
    seen = 0

    async def receive_counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise too_large(limit)
        return message

    return receive_counted
