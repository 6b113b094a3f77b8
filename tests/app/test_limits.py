"""Configured bounds (app/config.py): each is accepted exactly at the bound and refused one
past it, with a 413 (body, rows) or a 422 (k, rounds, tenants) whose detail names the field,
the bound and the setting; a refused request changes nothing."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from app.config import Settings
from tests.app.conftest import make_api, refusal
from tests.training_helpers import make_tenants, submit_job, wait_job

BYTES = 200


def answer(response) -> tuple:
    """(status, code, detail, errors) of a refusal."""
    return (*refusal(response), response.json().get("errors"))


def too_large(limit: int) -> tuple:
    return ("body_too_large", f"Request body exceeds the upload limit of {limit} bytes "
                              "(FEDREC_MAX_UPLOAD_BYTES)", None)


def over(loc: list, value: int, bound: int, setting: str, kind: str = "less_than_equal",
         bounded: str = "") -> tuple:
    field = loc[-1]
    msg = f"{field} must {bounded or f'be at most {bound}'} ({setting}); got {value}"
    return ("validation_error", f"{'.'.join(loc)}: {msg}",
            [{"field": field, "loc": loc, "message": msg, "type": kind}])


def test_defaults_keep_the_former_hard_coded_bounds():
    s = Settings(_env_file=None)
    assert (s.max_job_rounds, s.max_top_k, s.max_job_tenants, s.max_upload_rows,
            s.max_upload_bytes) == (10_000, 1000, 1000, 2_000_000, 64 * 1024 * 1024)
    for name in ("max_job_rounds", "max_top_k", "max_job_tenants", "max_upload_rows"):
        with pytest.raises(ValidationError):
            Settings(**{name: 0})


@pytest.fixture
def small_body(sqlite_url):
    return make_api(sqlite_url, max_upload_bytes=BYTES)


def padded_items(size: int) -> bytes:
    """A valid PUT /admin/items body of exactly ``size`` bytes (JSON padded with spaces)."""
    body = json.dumps({"items": [{"key": "m1"}]}).encode()
    return body[:-1] + b" " * (size - len(body)) + b"}"


@pytest.mark.parametrize("chunked", [False, True])
def test_every_route_bounds_the_body(small_body, chunked):
    client, admin = small_body.client, small_body.admin

    def put(body: bytes):
        content = iter([body[:50], body[50:]]) if chunked else body  # no Content-Length
        return client.put("/v1/admin/items", content=content,
                          headers={**admin, "Content-Type": "application/json"})

    at = put(padded_items(BYTES))
    assert (at.status_code, at.json()) == (200, {"upserted": 1})
    past = put(padded_items(BYTES + 1).replace(b"m1", b"m2"))
    assert answer(past) == (413, *too_large(BYTES))
    keys = [i["key"] for i in client.get("/v1/admin/items", headers=admin).json()["data"]]
    assert keys == ["m1"]


def test_upload_body_bound_is_exact(small_body):
    small_body.items("m1")
    tenant_id, key = small_body.tenant()
    text = "user,item,rating\nu1,m1,4\nu2,m1,3\n"
    at = text + "\n" * (BYTES - len(text))  # blank lines are skipped by the parser
    assert len(at.encode()) == BYTES
    ok = small_body.upload_csv(tenant_id, key, at)
    assert (ok.status_code, ok.json()) == (200, {"stored": 2})
    refused = small_body.upload_csv(tenant_id, key, "u3,m1,5\n" + at)
    assert answer(refused) == (413, *too_large(BYTES))
    assert small_body.ratings(tenant_id, key) == [("u1", "m1", 4.0), ("u2", "m1", 3.0)]


@pytest.fixture
def small_rows(sqlite_url):
    return make_api(sqlite_url, max_upload_rows=3)


ROWS_DETAIL = ("too_many_rows", "Upload exceeds the limit of 3 rows (FEDREC_MAX_UPLOAD_ROWS)",
               None)


def test_csv_rows_bound_is_exact(small_rows):
    small_rows.items("m1", "m2", "m3", "m4")
    tenant_id, key = small_rows.tenant()
    ok = small_rows.upload_csv(tenant_id, key, "user,item,rating\nu1,m1,1\n\nu1,m2,2\nu1,m3,3\n")
    assert (ok.status_code, ok.json()) == (200, {"stored": 3})  # header, blank: not rows
    refused = small_rows.upload_csv(tenant_id, key, "u2,m1,1\nu2,m2,2\nu2,m3,3\nu2,m4,4\n")
    assert answer(refused) == (413, *ROWS_DETAIL)
    assert small_rows.ratings(tenant_id, key) == [
        ("u1", "m1", 1.0), ("u1", "m2", 2.0), ("u1", "m3", 3.0)]


def test_json_rows_bound_is_exact(small_rows):
    small_rows.items("m1", "m2", "m3", "m4")
    tenant_id, key = small_rows.tenant()
    rows = [{"user": "u1", "item": f"m{i}", "rating": i} for i in range(1, 5)]
    url = f"/v1/tenants/{tenant_id}/ratings"
    refused = small_rows.client.post(url, json={"ratings": rows}, headers=key)
    assert answer(refused) == (413, *ROWS_DETAIL)
    assert small_rows.ratings(tenant_id, key) == []
    ok = small_rows.client.post(url, json={"ratings": rows[:3]}, headers=key)
    assert (ok.status_code, ok.json()) == (200, {"stored": 3})


@pytest.fixture
def small_jobs(sqlite_url):
    api = make_api(sqlite_url, max_job_rounds=3, max_job_tenants=2, max_top_k=3)
    api.client.headers["Authorization"] = api.admin["Authorization"]
    return api


def job_count(api) -> int:
    return api.client.get("/v1/admin/jobs").json()["count"]


def test_rounds_bound_is_exact(small_jobs):
    client = small_jobs.client
    (a, _), (b, _) = make_tenants(client, n=2)
    refused = submit_job(client, rounds=4)
    assert answer(refused) == (
        422, *over(["body", "rounds"], 4, 3, "FEDREC_MAX_JOB_ROUNDS"))
    assert job_count(small_jobs) == 0
    ok = submit_job(client, rounds=3)
    assert ok.status_code == 202, ok.text
    job = wait_job(client, ok.json()["id"])
    assert (job["status"], job["current_round"], job["tenant_ids"]) == ("completed", 3, [a, b])


def test_tenants_bound_is_exact(small_jobs):
    client = small_jobs.client
    (a, _), (b, _), (c, _) = make_tenants(client, n=3)
    for listed in ([a, b, c], None):  # explicit, or all tenants by default
        refused = submit_job(client, tenant_ids=listed, rounds=1)
        assert answer(refused) == (422, *over(["body", "tenant_ids"], 3, 2,
                                              "FEDREC_MAX_JOB_TENANTS", "too_long",
                                              "list at most 2 tenants"))
    assert job_count(small_jobs) == 0
    ok = submit_job(client, tenant_ids=[a, c], rounds=1)
    assert ok.status_code == 202, ok.text
    assert wait_job(client, ok.json()["id"])["tenant_ids"] == [a, c]


def test_top_k_bound_is_exact(small_jobs):
    client = small_jobs.client
    (tenant_id, key), _ = make_tenants(client, n=2)
    auth = {"Authorization": f"Bearer {key}"}
    url = f"/v1/tenants/{tenant_id}/users/u0/recommendations"
    ok = client.get(url, params={"k": 3}, headers=auth)
    assert ok.status_code == 200, ok.text
    assert ok.json()["k"] == 3 and len(ok.json()["data"]) == 3
    refused = client.get(url, params={"k": 4}, headers=auth)
    assert answer(refused) == (
        422, *over(["query", "k"], 4, 3, "FEDREC_MAX_TOP_K"))
    batch = f"/v1/tenants/{tenant_id}/recommendations"
    ok = client.post(batch, json={"users": ["u0"], "k": 3}, headers=auth)
    assert ok.status_code == 200 and len(ok.json()["data"][0]["data"]) == 3
    refused = client.post(batch, json={"users": ["u0"], "k": 4}, headers=auth)
    assert answer(refused) == (
        422, *over(["body", "k"], 4, 3, "FEDREC_MAX_TOP_K"))


def test_over_limit_k_is_refused_only_after_authentication(small_jobs):
    client = small_jobs.client
    (tenant_id, _), _ = make_tenants(client, n=2)
    response = client.get(f"/v1/tenants/{tenant_id}/users/u0/recommendations",
                          params={"k": 4}, headers={"Authorization": "Bearer fk_wrong"})
    assert refusal(response) == (401, "invalid_api_key", "Invalid API key")
