"""Every error answer is RFC 9457 problem details, documented once in the OpenAPI schema.

The walk enumerates ``app.openapi()``: for every operation it provokes the errors any
route can give (405 for a method the path lacks, 401 without credentials, 404 for a
missing resource, 422 for a malformed path parameter, 413 for an oversized body) and
checks each body against the one ``Problem`` schema of the document's components, and
that the status is documented for the operation. A route added later is walked too.
"""

from __future__ import annotations

import re

import jsonschema_rs
import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import migrate
from app.main import create_app
from app.problems import PROBLEM_JSON
from tests.app.conftest import ADMIN_TOKEN

METHODS = ("get", "put", "post", "delete", "patch")
MISSING_ID = 2_000_000_000


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('problems')}/p.db"
    migrate(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN, broker_url=None,
                              max_upload_bytes=1000))
    broken = APIRouter()

    @broken.get("/broken-for-test", include_in_schema=False)
    def boom():
        raise RuntimeError("secret internals")

    app.include_router(broken)
    client = TestClient(app, raise_server_exceptions=False)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    tenant = client.post("/v1/admin/tenants", headers=admin,
                         json={"name": "t", "privacy_budget": 1}).json()["id"]
    key = client.post(f"/v1/admin/tenants/{tenant}/api-keys", headers=admin).json()["key"]
    return app, client, tenant, key


@pytest.fixture(scope="module")
def schema(world):
    return world[0].openapi()


def problem_validator(schema: dict) -> jsonschema_rs.Draft202012Validator:
    root = {"$ref": "#/components/schemas/Problem", "components": schema["components"]}
    return jsonschema_rs.Draft202012Validator(root)


def operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield method, path, op


def refs(node):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def test_every_reference_resolves_in_the_components(schema):
    found = set(refs(schema))
    assert "#/components/schemas/RatingIn" in found  # the upload body's rows
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in schema["components"]["schemas"], ref


def test_every_error_response_is_documented_as_a_problem(schema):
    ops = list(operations(schema))
    assert len(ops) >= 25
    for method, path, op in ops:
        errors = {c: r for c, r in op["responses"].items() if int(c) >= 400}
        assert {"413", "500"} <= set(errors), (method, path)
        if op.get("security"):
            assert "401" in errors, (method, path)
        if op.get("parameters") or op.get("requestBody"):
            assert "422" in errors, (method, path)
        for code, response in errors.items():
            assert response["content"] == {PROBLEM_JSON: {"schema": {
                "$ref": "#/components/schemas/Problem"}}}, (method, path, code)
    problem = schema["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail", "instance",
                                        "code"}
    assert problem["properties"]["detail"]["type"] == "string"


def credentials(path: str, key: str) -> dict:
    token = ADMIN_TOKEN if path.startswith("/v1/admin/") else key
    return {"Authorization": f"Bearer {token}"}


def fill(path: str, tenant: int, **override) -> str:
    values = {"tenant_id": tenant, "user": "u0", "user_key": "u0"}
    return re.sub(r"\{(\w+)\}", lambda m: str(override.get(m.group(1),
                                                           values.get(m.group(1), 1))), path)


def check(validator, schema, response, method, path, status, allowed_undocumented=()):
    """The answer is ``status`` with a problem body valid against the schema, and the
    status is documented for the operation (405 belongs to the path, not to an op)."""
    where = (method, path, response.status_code, response.text[:300])
    assert response.status_code == status, where
    assert response.headers["content-type"] == PROBLEM_JSON, where
    body = response.json()
    validator.validate(body)
    assert body["status"] == status and body["type"] == f"urn:fedrec:problem:{body['code']}"
    assert body["instance"] == response.request.url.path
    op = schema["paths"][path].get(method)
    if op is not None and status not in allowed_undocumented:
        assert str(status) in op["responses"], where
    return body


def test_every_route_answers_its_errors_with_valid_problems(world, schema):
    app, client, tenant, key = world
    validator = problem_validator(schema)
    seen = set()
    for path, item in schema["paths"].items():
        documented = {m.upper() for m in item if m in METHODS}
        # 405: a method the path does not have; Allow lists every documented one
        absent = next(m for m in ("PATCH", "PUT", "DELETE", "POST") if m not in documented)
        response = client.request(absent, fill(path, tenant), headers=credentials(path, key))
        body = check(validator, schema, response, absent.lower(), path, 405)
        assert documented <= set(response.headers["allow"].split(", ")), (path, response.headers)
        assert body["code"] == "method_not_allowed"
        seen.add(405)
        for method in documented:
            op = item[method.lower()]
            url = fill(path, tenant)
            if op.get("security"):
                body = check(validator, schema, client.request(method, url), method.lower(),
                             path, 401)
                assert body["code"] in ("admin_token_required", "api_key_required")
                seen.add(401)
            ids = [n for n in re.findall(r"\{(\w+)\}", path) if n.endswith("_id")]
            if ids:
                bad = fill(path, tenant, **{ids[-1]: "not-a-number"})
                body = check(validator, schema, client.request(
                    method, bad, headers=credentials(path, key)), method.lower(), path, 422)
                assert body["errors"][0]["loc"] == ["path", ids[-1]], body
                assert ids[-1] in body["detail"]
                missing = fill(path, tenant, **{ids[-1]: MISSING_ID})
                body = {"json": {}} if method in ("PATCH", "PUT") else {}  # a valid body
                response = client.request(method, missing, headers=credentials(path, key),
                                          **body)
                body = check(validator, schema, response, method.lower(), path, 404)
                assert body["code"].endswith("not_found"), body
                seen |= {404, 422}
            if method in ("POST", "PUT", "PATCH"):
                response = client.request(method, url, content=b"x" * 1001, headers={
                    **credentials(path, key), "Content-Type": "application/json"})
                body = check(validator, schema, response, method.lower(), path, 413)
                assert body["code"] == "body_too_large"
                seen.add(413)
    assert seen == {401, 404, 405, 413, 422}


def test_unknown_routes_and_server_errors_are_problems_without_internals(world, schema):
    _, client, _, _ = world
    validator = problem_validator(schema)
    missing = client.get("/no/such/route")
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM_JSON
    validator.validate(missing.json())
    assert missing.json()["code"] == "route_not_found"
    assert "versioned" not in missing.json()["detail"]
    # A client of the unversioned paths is told where the route went, not redirected.
    old = client.post("/admin/tenants", json={"name": "x", "privacy_budget": 1})
    assert old.status_code == 404 and old.json()["code"] == "route_not_found"
    assert old.json()["detail"] == ("No route /admin/tenants; the API is versioned: "
                                    "use /v1/admin/tenants")
    old = client.get("/tenants/7/users/u1/recommendations")
    assert old.json()["detail"].endswith("use /v1/tenants/7/users/u1/recommendations")
    assert client.get("/v1/health").status_code == 404  # probes stay unversioned
    assert client.get("/health").status_code == 200
    boom = client.get("/broken-for-test")
    assert boom.status_code == 500 and boom.headers["content-type"] == PROBLEM_JSON
    validator.validate(boom.json())
    assert boom.json()["code"] == "internal_error"
    assert "secret internals" not in boom.text and "Traceback" not in boom.text


def test_validation_errors_name_every_field_in_detail_and_errors(world, schema):
    _, client, _, _ = world
    response = client.post("/v1/admin/tenants", headers=credentials("/v1/admin/", ""),
                           json={"name": "", "privacy_budget": -1})
    body = check(problem_validator(schema), schema, response, "post", "/v1/admin/tenants", 422)
    assert body["code"] == "validation_error"
    assert {e["field"] for e in body["errors"]} == {"name", "privacy_budget"}
    assert "body.name: " in body["detail"] and "body.privacy_budget: " in body["detail"]
    for error in body["errors"]:
        assert error["loc"][0] == "body" and error["message"] and error["type"]


def test_a_problem_schema_violation_is_detected(schema):
    """The validator of the walk does refuse a body of the old shape."""
    with pytest.raises(jsonschema_rs.ValidationError):
        problem_validator(schema).validate({"detail": "Tenant not found"})
    with pytest.raises(jsonschema_rs.ValidationError):
        problem_validator(schema).validate({
            "type": "urn:fedrec:problem:x", "title": "Not Found", "status": 404,
            "detail": ["a", "list"], "instance": "/", "code": "x"})
