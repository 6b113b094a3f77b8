"""Every error answer as RFC 9457 problem details (``application/problem+json``).

One body shape for every refusal of every route, whoever raises it::

    {"type": "urn:fedrec:problem:tenant_not_found", "title": "Not Found", "status": 404,
     "detail": "Tenant not found", "instance": "/v1/tenants/7/ratings",
     "code": "tenant_not_found"}

``detail`` is the human message (the one the API always gave); ``code`` is stable and
meant for programs; ``type`` is the URN of the code. Validation errors add
``errors: [{"field", "loc", "message", "type"}]`` (request fields) or
``[{"field", "line", "message"}]`` (rows of an upload) and may add ``omitted``.

The handlers here are global (installed by :func:`install`), so a route added later gets
this shape for free: an ``HTTPException`` without a code gets the generic code of its
status (:data:`GENERIC_CODES`); raise :class:`ApiError` to give a specific one.
:func:`openapi_with_problems` documents the one :class:`Problem` schema on every error
response of every operation.
"""

from __future__ import annotations

import http
import logging
import math
import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.routes import API_PREFIX

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:fedrec:problem:"
log = logging.getLogger("fedrec")

GENERIC_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 409: "conflict", 410: "gone",
    413: "content_too_large", 415: "unsupported_media_type", 422: "validation_error",
    429: "too_many_requests", 500: "internal_error", 503: "unavailable",
}
"""The code of an error raised without one: one per status."""


class FieldProblem(BaseModel):
    """One invalid field (``loc``) of a request, or one offending row (``line``) of an
    upload."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(description="What is wrong, naming the field or row.")
    field: str = Field(description="The field: a dotted path inside its location "
                                   "(e.g. ``rating_min``, ``tenant_ids.0``), or an upload "
                                   "row's column (``user``, ``item``, ``rating``, ...).")
    loc: list[str | int] = Field(default=None, description="Request fields: where the "
                                 "value is, starting with body, query, path or header.")
    type: str = Field(default=None, description="Request fields: the kind of error "
                                                "(e.g. ``less_than_equal``, ``missing``).")
    line: int = Field(default=None, description="Upload rows: the row's line (CSV/TSV) or "
                                                "1-based position in ``ratings`` (JSON).")


class Problem(BaseModel):
    """RFC 9457 problem details: the body of every error answer."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "type": "urn:fedrec:problem:tenant_not_found", "title": "Not Found", "status": 404,
        "detail": "Tenant not found", "instance": "/v1/tenants/7/ratings",
        "code": "tenant_not_found"}]})

    type: str = Field(description="A URI naming the problem: urn:fedrec:problem:<code>.")
    title: str = Field(description="The HTTP status phrase.")
    status: int = Field(ge=400, le=599, description="The HTTP status code.")
    detail: str = Field(description="A human-readable explanation naming the field, row "
                                    "or resource at fault.")
    instance: str = Field(description="The request path.")
    code: str = Field(pattern=r"^[a-z][a-z0-9_]*$",
                      description="A stable, machine-readable error code.")
    errors: list[FieldProblem] = Field(default=None, description="Validation errors: every "
                                       "field or row at fault.")
    omitted: int = Field(default=None, ge=0, description="Upload rejections: offending "
                                                         "rows not listed in ``errors``.")


class ApiError(HTTPException):
    """An ``HTTPException`` with a stable ``code`` and optional problem members."""

    def __init__(self, status_code: int, code: str, detail: str,
                 headers: dict[str, str] | None = None, **members: Any) -> None:
        super().__init__(status_code, detail, headers)
        self.code, self.members = code, members


def _title(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(request: Request, status: int, code: str, detail: str,
                 **members: Any) -> dict[str, Any]:
    """The problem document of an error (``members`` are extensions: errors, omitted...)."""
    body = {"type": TYPE_PREFIX + code, "title": _title(status), "status": status,
            "detail": detail, "instance": request.url.path, "code": code}
    body.update({k: v for k, v in members.items() if v is not None})
    return json_safe(jsonable_encoder(body))


def problem(request: Request, status: int, code: str, detail: str,
            headers: dict[str, str] | None = None, **members: Any) -> JSONResponse:
    """A ``application/problem+json`` response."""
    return JSONResponse(problem_body(request, status, code, detail, **members),
                        status_code=status, headers=headers, media_type=PROBLEM_JSON)


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


def field_of(loc: tuple | list) -> str:
    """The dotted field path of a FastAPI ``loc`` without its location (body, query...)."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header", "cookie")
                 else loc)
    return ".".join(map(str, parts)) or str(loc[0] if loc else "body")


def field_errors(errors: list[dict]) -> list[dict]:
    """FastAPI/pydantic error entries as :class:`FieldProblem` members."""
    return [{"field": field_of(e.get("loc", ())), "loc": list(e.get("loc", ())),
             "message": str(e.get("msg", "")), "type": str(e.get("type", "value_error"))}
            for e in errors]


def validation_detail(errors: list[dict]) -> str:
    """One line naming every invalid field: ``"body.rating_min: <message>; ..."``."""
    parts = []
    for e in errors[:10]:
        loc = ".".join(map(str, e["loc"]))
        parts.append(f"{loc}: {e['message']}" if loc else e["message"])
    more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
    return "; ".join(parts) + more


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Any ``HTTPException`` (raised by a route, a dependency or the router) as a problem."""
    status, headers = exc.status_code, dict(exc.headers or {})
    code = getattr(exc, "code", None)
    members = dict(getattr(exc, "members", {}) or {})
    detail = exc.detail
    if status == 404 and code is None and detail == "Not Found":
        code, detail = "route_not_found", f"No route {request.url.path}"
        versioned = API_PREFIX + request.url.path
        if documented(request, versioned):  # a client of the unversioned API (before 0.2)
            detail += f"; the API is versioned: use {versioned}"
    elif status == 405 and code is None:
        allowed = allowed_methods(request, headers.pop("Allow", ""))
        headers["Allow"] = ", ".join(allowed)
        code = "method_not_allowed"
        detail = f"Method {request.method} is not allowed on {request.url.path}; " \
                 f"allowed: {', '.join(allowed)}"
    if not isinstance(detail, str):  # a route that still raises a structured detail
        members.setdefault("errors", None)
        detail = str(detail)
    return problem(request, status, code or GENERIC_CODES.get(status, f"http_{status}"),
                   detail, headers or None, **members)


def allowed_methods(request: Request, raised: str = "") -> list[str]:
    """Every method documented for the request's path in the OpenAPI document, plus those
    of the router's own ``Allow`` (``raised``): Starlette's lists only the first route
    matching the path, when a path is often served by several."""
    methods = {m.strip().upper() for m in raised.split(",") if m.strip()}
    for item in documented(request, request.url.path):
        methods |= {m.upper() for m in item if m in OPERATIONS}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def documented(request: Request, path: str) -> list[dict]:
    """The OpenAPI path items whose template matches ``path``."""
    found = []
    for template, item in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^}/]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            found.append(item)
    return found


OPERATIONS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's request-validation errors (and the API's own limit checks) as a 422."""
    errors = field_errors(exc.errors())
    return problem(request, 422, "validation_error", validation_detail(errors),
                   errors=errors)


async def server_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug: 500 with no internals in the body (the traceback goes to the log)."""
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return problem(request, 500, "internal_error",
                   "Internal server error; the request was not completed")


def install(app: FastAPI) -> None:
    """Install the handlers and the OpenAPI documentation of problems on ``app``."""
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(Exception, server_error)
    app.openapi = lambda: openapi_with_problems(app)


# -- OpenAPI ------------------------------------------------------------------------------

COMPONENTS = "#/components/schemas/"
PROBLEM_REF = {"$ref": COMPONENTS + "Problem"}
ALWAYS = {"500": "Internal error (a bug); nothing was done.",
          "413": "The request body exceeds FEDREC_MAX_UPLOAD_BYTES."}
DESCRIPTIONS = {"400": "The body could not be decoded.",
                "401": "Missing or invalid credentials.",
                "404": "Not found (for a tenant route: any tenant but the key's own).",
                "422": "Validation error: ``errors`` names every field at fault.",
                "503": "The database or the broker is unavailable; retry later."}


def _hoist(node: Any, defs: dict) -> Any:
    """``node`` with every nested ``$defs`` moved into ``defs`` and ``#/$defs/X``
    references pointed at the components."""
    if isinstance(node, dict):
        for name, schema in node.pop("$defs", {}).items():
            defs[name] = _hoist(schema, defs)
        return {k: (COMPONENTS + v.split("/")[-1]
                    if k == "$ref" and isinstance(v, str) and v.startswith("#/$defs/")
                    else _hoist(v, defs)) for k, v in node.items()}
    if isinstance(node, list):
        return [_hoist(v, defs) for v in node]
    return node


def problem_schemas() -> dict[str, dict]:
    """The components of :class:`Problem` (and :class:`FieldProblem`)."""
    schema = Problem.model_json_schema(ref_template=COMPONENTS + "{model}")
    defs = schema.pop("$defs", {})
    return {"Problem": schema, **defs}


def openapi_with_problems(app: FastAPI) -> dict:
    """The OpenAPI document with every error response (4xx/5xx) of every operation as
    ``application/problem+json`` with the :class:`Problem` schema, the 413 and 500 every
    route can answer, and no reference outside the components."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    defs: dict = {}
    schema["paths"] = _hoist(schema["paths"], defs)
    components.update(_hoist(components, defs))
    components.update(defs)
    components.update(problem_schemas())
    for item in schema["paths"].values():
        for op in item.values():
            responses = op.setdefault("responses", {})
            for code, text in ALWAYS.items():
                responses.setdefault(code, {"description": text})
            if "requestBody" in op:  # a body that is not valid JSON (or not a form)
                responses.setdefault("400", {"description": DESCRIPTIONS["400"]})
            for code, response in responses.items():
                if code.isdigit() and int(code) >= 400 and not response.get("x-not-problem"):
                    response["content"] = {PROBLEM_JSON: {"schema": PROBLEM_REF}}
                    if response.get("description") in ("Validation Error", None, ""):
                        response["description"] = DESCRIPTIONS.get(code, _title(int(code)))
    for hook in getattr(app.state, "openapi_hooks", ()):
        hook(schema)
    for unused in ("HTTPValidationError", "ValidationError"):
        if not _referenced(schema, COMPONENTS + unused):
            components.pop(unused, None)
    app.openapi_schema = schema
    return schema


def _referenced(node: Any, ref: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == ref or any(_referenced(v, ref) for v in node.values())
    if isinstance(node, list):
        return any(_referenced(v, ref) for v in node)
    return False
