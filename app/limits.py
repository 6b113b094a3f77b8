"""The request-body size bound of every route (FEDREC_MAX_UPLOAD_BYTES), as ASGI middleware.

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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class UploadSlots:
    """At most ``limit`` uploads per tenant at once in this process (429 beyond)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._active: collections.Counter[int] = collections.Counter()

    @contextlib.contextmanager
    def slot(self, tenant_id: int) -> Iterator[None]:
        """Hold one of the tenant's slots for the duration of the block."""
        with self._lock:
            if self._active[tenant_id] >= self.limit:
                raise ApiError(status.HTTP_429_TOO_MANY_REQUESTS, "too_many_uploads",
                               TOO_MANY_UPLOADS.format(self.limit),
                               headers={"Retry-After": str(UPLOAD_RETRY_SECONDS)})
            self._active[tenant_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._active[tenant_id] -= 1
                if not self._active[tenant_id]:
                    del self._active[tenant_id]


class BodyLimit:
    """Refuse request bodies over ``app.state.settings.max_upload_bytes`` with 413."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = scope["app"].state.settings.max_upload_bytes
        declared, seen = declared_length(scope), 0
        if declared is not None and declared > limit:
            response = problem(Request(scope), status.HTTP_413_CONTENT_TOO_LARGE,
                               "body_too_large", TOO_LARGE.format(limit))
            await response(scope, receive, send)
            return

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit)
            return message

        await self.app(scope, counted, send)
