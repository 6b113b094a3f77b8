"""Out-of-range numbers on every route: 422 naming the field, never a 5xx.

The walk enumerates ``app.openapi()`` like tests/app/test_auth_walk.py, with the right
credentials and that walk's valid bodies, and replaces one number at a time: every integer
path and query parameter, and every integer or number field of a JSON body (nested objects
and lists of integers included), by values a database ``integer`` cannot hold (2^31, 2^63,
-2^63 - 1, 10^30) and every number field by NaN and the infinities. Each such request must be
refused with a 422 whose validation error names the field (its ``loc``), and must write
nothing. The unmodified requests are not 422 (positive control), so the walk cannot pass by
sending requests that are refused for another reason.
"""

from __future__ import annotations

import json

import pytest

from tests.app.test_auth_walk import Walk, bodies, kind_of, operations

HUGE_INTS = (2 ** 31, 2 ** 63, -(2 ** 63) - 1, 10 ** 30)
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e999")


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Walk:
    return Walk(tmp_path_factory.mktemp("range-walk"))


def credentials(walk: Walk, kind: str) -> dict[str, str]:
    return walk.admin if kind == "admin" else {"Authorization": f"Bearer {walk.key}"}


def resolve(schema: dict, components: dict) -> dict:
    """``schema`` with a top-level ``$ref`` (or a single-member ``anyOf`` with null)
    replaced by its target."""
    if "$ref" in schema:
        return resolve(components[schema["$ref"].rsplit("/", 1)[1]], components)
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    return resolve(options[0], components) if len(options) == 1 else schema


def numeric_fields(schema: dict, components: dict, loc: tuple = ()) -> list[tuple]:
    """(loc, type) of every integer or number reachable in a body schema; a list of
    numbers gets the loc of its first element."""
    schema = resolve(schema, components)
    kind = schema.get("type")
    if kind in ("integer", "number"):
        return [(loc, kind)]
    if kind == "array":
        return numeric_fields(schema.get("items", {}), components, (*loc, 0))
    if kind == "object" or "properties" in schema:
        return [field for name, sub in schema.get("properties", {}).items()
                for field in numeric_fields(sub, components, (*loc, name))]
    return []


def replaced(body, loc: tuple, raw: str) -> str:
    """The JSON text of ``body`` with the value at ``loc`` replaced by the literal ``raw``
    (NaN and 1e999 cannot be produced by json.dumps, so a placeholder is substituted)."""
    doc = json.loads(json.dumps(body))
    target = doc
    for part in loc[:-1]:
        if isinstance(part, int):
            while len(target) <= part:
                target.append(0)
        elif part not in target or not isinstance(target[part], dict | list):
            target[part] = [] if isinstance(loc[loc.index(part) + 1], int) else {}
        target = target[part]
    if isinstance(loc[-1], int):
        while len(target) <= loc[-1]:
            target.append(0)
    target[loc[-1]] = "__VALUE__"
    return json.dumps(doc).replace('"__VALUE__"', raw)


def cases(walk: Walk) -> list[tuple]:
    """(method, path template, where, loc, raw value) of every substitution."""
    schema = walk.app.openapi()
    components = schema["components"]["schemas"]
    out = []
    for method, path, op in operations(schema):
        if kind_of(path, op) == "public":
            continue
        for param in op.get("parameters", []):
            if resolve(param["schema"], components).get("type") == "integer":
                out += [(method, path, param["in"], (param["name"],), str(v))
                        for v in HUGE_INTS]
        content = op.get("requestBody", {}).get("content", {}).get("application/json")
        if content and path != "/v1/tenants/{tenant_id}/ratings":  # uploads: row errors below
            for loc, kind in numeric_fields(content["schema"], components):
                values = [str(v) for v in HUGE_INTS] if kind == "integer" else NON_FINITE
                out += [(method, path, "body", loc, v) for v in values]
    return out


def send(walk: Walk, method: str, template: str, where: str, loc: tuple, raw: str):
    params = walk.params()
    query = {}
    if where == "path":
        params[loc[0]] = raw
    elif where == "query":
        query[loc[0]] = raw
    extra = bodies(walk.victim, walk.other).get((method, template), {})
    kwargs = {}
    if where == "body":
        kwargs["content"] = replaced(extra.get("json", {}), loc, raw)
        headers = {"Content-Type": "application/json"}
    else:
        kwargs = {k: v for k, v in extra.items() if k != "headers"}
        headers = extra.get("headers", {})
    op = walk.app.openapi()["paths"][template][method]
    headers = {**headers, **credentials(walk, kind_of(template, op))}
    return walk.client.request(method.upper(), template.format(**params), params=query,
                               headers=headers, **kwargs)


def test_the_walk_reaches_paths_queries_and_nested_bodies(walk):
    found = {(where, loc) for _, _, where, loc, _ in cases(walk)}
    for expected in [("path", ("tenant_id",)), ("path", ("job_id",)), ("path", ("key_id",)),
                     ("query", ("offset",)), ("query", ("limit",)), ("query", ("k",)),
                     ("body", ("seed",)), ("body", ("per_round",)), ("body", ("rounds",)),
                     ("body", ("tenant_ids", 0)), ("body", ("dp", "clip")),
                     ("body", ("privacy_budget",)), ("body", ("rating_min",)),
                     ("body", ("k",))]:
        assert expected in found


def test_every_out_of_range_number_is_a_422_naming_the_field(walk):
    before = walk.client.get(f"/v1/tenants/{walk.victim}/ratings/count",
                             headers={"Authorization": f"Bearer {walk.key}"}).json()
    wrong = []
    for method, path, where, loc, raw in cases(walk):
        response = send(walk, method, path, where, loc, raw)
        errors = response.json().get("errors") if response.headers.get(
            "content-type", "") == "application/problem+json" else None
        locs = [tuple(e["loc"]) for e in errors if "loc" in e] if errors else []
        if response.status_code != 422 or (where, *loc) not in locs:
            wrong.append((method, path, where, loc, raw, response.status_code,
                          response.text[:200]))
    assert wrong == [], "\n".join(map(str, wrong))
    walk.wait_jobs()
    after = walk.client.get(f"/v1/tenants/{walk.victim}/ratings/count",
                            headers={"Authorization": f"Bearer {walk.key}"}).json()
    assert after == before


def test_the_unmodified_requests_are_not_refused_as_invalid(walk):
    """Positive control: with in-range values each operation passes validation."""
    schema = walk.app.openapi()
    for method, path, op in operations(schema):
        kind = kind_of(path, op)
        if kind == "public" or method == "delete":
            continue
        response = walk.call(method, path, credentials(walk, kind))
        assert response.status_code != 422 and response.status_code < 500, (
            method, path, response.text[:200])
    walk.wait_jobs()
