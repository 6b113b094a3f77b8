"""The one ASGI layer around every HTTP request: its id, its body bound, its timing and its
access line.

Per request, in this order: a request id (``X-Request-ID`` in, or a new one; always echoed
in the response, beside the security headers of :func:`app.security.security_headers`)
bound to the log context (:mod:`app.logs`); the request-body bound
FEDREC_MAX_UPLOAD_BYTES (:mod:`app.limits`: a declared ``Content-Length`` over it is
answered 413 at once, a streamed body is counted as it is read); a NUL character in the
path or query answered 422 (:mod:`app.inputs`); then, once answered (413s
included), its latency into ``fedrec_http_request_duration_seconds`` by route template
(:mod:`app.metrics`) and one ``fedrec.access`` line. An unhandled exception (a bug) is
answered 500 here and not re-raised: re-raised, the server would reset the kept-alive
connection, failing the client's next request on it too.

One layer rather than one middleware per concern: every layer is an extra coroutine per
request and an extra wrapper every response message passes through, and on the serving
hot path each layer costs a measurable share of the event loop (a py-spy profile of
``python -m bench.recommend_load``; docs/benchmarks/service.md).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.inputs import refusal_of_nul
from app.limits import counted, refusal_of_declared
from app.logs import end_context, log_access, new_context, request_id_of
from app.metrics import UNMATCHED, route_template
from app.problems import server_error
from app.security import security_headers


class RequestEdge:
    """ASGI middleware: request id, body bound, request metrics and access log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        token = new_context(request_id=request_id)
        added = [(b"x-request-id", request_id.encode()), *security_headers(scope["path"])]
        started, status, answered = time.perf_counter(), 500, False

        async def sending(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
                message["headers"] = [*message.get("headers", []), *added]
            await send(message)

        state = scope["app"].state
        try:
            limit = state.settings.max_upload_bytes
            refusal = refusal_of_declared(scope, limit) or refusal_of_nul(scope)
            if refusal is not None:
                await refusal(scope, receive, sending)
            else:
                await self.app(scope, counted(receive, limit), sending)
        except Exception as exc:  # a bug: answer 500 here and keep the connection
            if answered:
                raise
            await (await server_error(Request(scope), exc))(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            route = route_template(scope)
            metrics = getattr(state, "metrics", None)
            if metrics is not None:
                metrics.observe_request(scope["method"], route, status, seconds)
            log_access(scope["method"], scope["path"] if route == UNMATCHED else route,
                       status, seconds)
            end_context(token)
