"""Text the database cannot store, refused where a request enters.

PostgreSQL's text and JSON types cannot hold the NUL character (U+0000); SQLite can. So a
NUL anywhere in a request would be stored on one backend and end in a database error (a
500, possibly after part of the work) on the other. The API refuses it up front, with a
422 naming the field, on every backend:

* request bodies: every request schema derives from :class:`Input`, whose validator looks
  through each field's value (nested lists and dicts, keys included);
* URL paths and query strings: :func:`nul_problem`, applied by the request layer
  (:class:`app.edge.RequestEdge`) before any route runs, the dashboard's included.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote

from pydantic import BaseModel, field_validator
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from app.problems import field_errors, problem, validation_detail

NUL_MESSAGE = "contains a NUL character (\\x00), which cannot be stored"


def nul_at(value: Any, where: str = "") -> str | None:
    """The dotted path below ``value`` of the first string (or dict key) holding a NUL
    character: ``""`` for ``value`` itself, None when there is none."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    if isinstance(value, dict):
        items = [(str(k), k) for k in value] + [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None
    for name, inner in items:
        found = nul_at(inner, f"{where}.{name}" if where else name)
        if found is not None:
            return found
    return None


NO_NUL = "^[^\\u0000]*$"
"""The JSON Schema ``pattern`` of a string without NUL characters."""


def _declare_no_nul(schema: dict[str, Any]) -> None:
    """Add :data:`NO_NUL` to every string ``schema`` declares (array items, dict keys and
    values, ``anyOf`` branches included), so the documented schema says what is refused."""
    if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema:
        schema["pattern"] = NO_NUL
    for branch in schema.get("anyOf", ()):
        _declare_no_nul(branch)
    if isinstance(schema.get("items"), dict):
        _declare_no_nul(schema["items"])
    extra = schema.get("additionalProperties")
    if schema.get("type") == "object" and extra not in (None, False):
        schema.setdefault("propertyNames", {"pattern": NO_NUL})
    if isinstance(extra, dict):
        _declare_no_nul(extra)


class Input(BaseModel):
    """Base of every request body: no field may carry a NUL character (422 naming it)."""

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        found = nul_at(value)
        if found is not None:
            raise ValueError(f"{found} {NUL_MESSAGE}" if found else NUL_MESSAGE)
        return value

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):  # noqa: ANN001, ANN206
        schema = handler(core_schema)
        for prop in handler.resolve_ref_schema(schema).get("properties", {}).values():
            _declare_no_nul(prop)
        return schema


def nul_errors(path: str, query_string: bytes) -> list[dict[str, Any]]:
    """The validation errors (FastAPI's shape) of NUL characters in a URL's path or query
    parameters; empty when there are none."""
    errors = []
    if "\x00" in path:
        errors.append({"loc": ["path"], "msg": f"the URL path {NUL_MESSAGE}"})
    if b"\x00" in query_string or b"%00" in query_string:
        for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                errors.append({"loc": ["query", name.replace("\x00", "\\x00")],
                               "msg": f"query parameter {NUL_MESSAGE}"})
        if not errors and "\x00" in unquote(query_string.decode("latin-1")):
            errors.append({"loc": ["query"], "msg": f"the query string {NUL_MESSAGE}"})
    return errors


def refusal_of_nul(scope: Scope) -> Response | None:
    """The 422 answer of a request whose path or query holds a NUL character, else None."""
    errors = nul_errors(scope.get("path", ""), scope.get("query_string", b""))
    if not errors:
        return None
    found = field_errors([{**e, "type": "value_error"} for e in errors])
    return problem(Request(scope), 422, "validation_error", validation_detail(found),
                   errors=found)
