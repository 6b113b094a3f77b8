"""Tenant rating endpoints on SQLite and (integration) PostgreSQL: validation, atomicity,
idempotency, isolation, size limits, listing and the right to be forgotten."""

from __future__ import annotations

import json

import pytest

from tests.app.conftest import make_api, refusal


def test_csv_upload_stores_and_reupload_updates(api):
    api.items("m1", "m2")
    tenant_id, key = api.tenant()
    first = api.upload_csv(tenant_id, key, "user,item,rating\nu1,m1,4\nu1,m2,2.5\nu2,m1,1\n")
    assert (first.status_code, first.json()) == (200, {"stored": 3})
    again = api.upload_csv(tenant_id, key, "u1,m1,5,1600000000\n")
    assert again.json() == {"stored": 1}
    assert api.ratings(tenant_id, key) == [
        ("u1", "m1", 5.0), ("u1", "m2", 2.5), ("u2", "m1", 1.0)]
    stamp = api.client.get(f"/v1/tenants/{tenant_id}/ratings", headers=key,
                           params={"user": "u1"}).json()["data"][0]["timestamp"]
    assert stamp == "2020-09-13T12:26:40Z"
    count = api.client.get(f"/v1/tenants/{tenant_id}/ratings/count", headers=key).json()
    assert count == {"count": 3, "users": 2}


def test_json_upload_with_keys_needing_escapes(api):
    api.items("i\\1")
    tenant_id, key = api.tenant()
    body = {"ratings": [{"user": "o'brien\\x", "item": "i\\1", "rating": 3}]}
    response = api.client.post(f"/v1/tenants/{tenant_id}/ratings", json=body, headers=key)
    assert response.json() == {"stored": 1}
    assert api.ratings(tenant_id, key) == [("o'brien\\x", "i\\1", 3.0)]


def test_invalid_upload_lists_offending_rows_and_stores_nothing(api):
    api.items("m1", "m2")
    tenant_id, key = api.tenant(rating_min=1, rating_max=5)
    api.upload_csv(tenant_id, key, "u0,m1,3\n")
    body = "u1,m1,4\nu1,m2,6\nu2,nope,3\nu3,m1,NaN\nu4,m2,2\nu4,m2,3\n"
    response = api.upload_csv(tenant_id, key, body)
    assert refusal(response) == (422, "upload_rejected", "4 invalid row(s); nothing was stored")
    assert response.json()["omitted"] == 0
    assert response.json()["errors"] == [
        {"line": 2, "field": "rating",
         "message": "rating 6 is outside the tenant's scale [1, 5]"},
        {"line": 3, "field": "item", "message": "item 'nope' is not in the catalogue"},
        {"line": 4, "field": "rating",
         "message": "rating must be a finite number (NaN and infinity are rejected)"},
        {"line": 6, "field": "rating",
         "message": "conflicts with line 5 for the same user and item (2 vs 3)"}]
    assert api.ratings(tenant_id, key) == [("u0", "m1", 3.0)]


def test_error_list_is_capped_and_counts_the_rest(database_url):
    api = make_api(database_url, max_reported_errors=2)
    tenant_id, key = api.tenant()
    response = api.upload_csv(tenant_id, key, "".join(f"u{i},x,9\n" for i in range(5)))
    body = response.json()
    assert [e["line"] for e in body["errors"]] == [1, 2] and body["omitted"] == 3


def test_auto_create_tenants_add_unknown_items(api):
    tenant_id, key = api.tenant(auto_create_items=True)
    assert api.upload_csv(tenant_id, key, "u,new-a,1\nu,new-b,2\n").json() == {"stored": 2}
    keys = {i["key"] for i in api.client.get("/v1/admin/items", headers=api.admin,
                                               params={"limit": 1000}).json()["data"]}
    assert {"new-a", "new-b"} <= keys


def test_idempotency_key_replays_and_rejects_a_different_body(api):
    api.items("m1")
    tenant_id, key = api.tenant()
    headers = {"Idempotency-Key": "upload-1"}
    first = api.upload_csv(tenant_id, key, "u,m1,2\n", **headers)
    api.upload_csv(tenant_id, key, "u,m1,5\n")  # a later, unkeyed change
    replay = api.upload_csv(tenant_id, key, "u,m1,2\n", **headers)
    assert (replay.status_code, replay.json()) == (first.status_code, first.json())
    assert replay.headers["Idempotency-Replayed"] == "true"
    assert api.ratings(tenant_id, key) == [("u", "m1", 5.0)]  # the replay re-applied nothing
    other = api.upload_csv(tenant_id, key, "u,m1,3\n", **headers)
    assert refusal(other) == (422, "idempotency_conflict", (
        "Idempotency-Key 'upload-1' was already used with a different request body; "
        "use a new key for a new upload"))


def test_a_rejected_upload_does_not_consume_its_idempotency_key(api):
    api.items("m1")
    tenant_id, key = api.tenant()
    assert api.upload_csv(tenant_id, key, "u,m1,9\n", **{"Idempotency-Key": "k"}
                          ).status_code == 422
    fixed = api.upload_csv(tenant_id, key, "u,m1,4\n", **{"Idempotency-Key": "k"})
    assert fixed.json() == {"stored": 1} and "Idempotency-Replayed" not in fixed.headers


def test_idempotency_keys_are_per_tenant(api):
    api.items("m1")
    a, key_a = api.tenant()
    b, key_b = api.tenant()
    api.upload_csv(a, key_a, "u,m1,2\n", **{"Idempotency-Key": "same"})
    response = api.upload_csv(b, key_b, "u,m1,2\n", **{"Idempotency-Key": "same"})
    assert "Idempotency-Replayed" not in response.headers
    assert api.ratings(b, key_b) == [("u", "m1", 2.0)]


def test_tenant_a_can_never_read_or_delete_tenant_b(api):
    api.items("m1")
    a, key_a = api.tenant()
    b, key_b = api.tenant()
    api.upload_csv(b, key_b, "victim,m1,4\n")
    c = api.client
    for response in (c.get(f"/v1/tenants/{b}/ratings", headers=key_a),
                     c.get(f"/v1/tenants/{b}/ratings/count", headers=key_a),
                     c.post(f"/v1/tenants/{b}/ratings", headers=key_a, json={"ratings": []}),
                     c.delete(f"/v1/tenants/{b}/users/victim/ratings", headers=key_a),
                     c.get(f"/v1/tenants/{b}/stats", headers=key_a),
                     c.get("/v1/tenants/99999/ratings", headers=key_a)):
        assert refusal(response) == (404, "tenant_not_found", "Tenant not found")
    # Through its own URL, A sees only its own (empty) data and cannot reach B's user.
    assert api.ratings(a, key_a, user="victim") == []
    mine = c.delete(f"/v1/tenants/{a}/users/victim/ratings", headers=key_a)
    # A holds no ratings here: the request is recorded for A's own agent, if it runs one
    # (app.training.forget.forgets_on_agent), and never touches B's user
    assert mine.status_code == 202 and mine.json() == {"user": "victim", "deleted": 0,
                                                       "agent": True}, mine.text
    assert [r["user"] for r in c.get(f"/v1/tenants/{b}/agent/forgotten",
                                     headers=key_b).json()["data"]] == []
    assert api.ratings(b, key_b) == [("victim", "m1", 4.0)]


def test_forgetting_a_user_deletes_only_their_ratings(api):
    api.items("m1", "m2")
    tenant_id, key = api.tenant()
    api.upload_csv(tenant_id, key, "gone,m1,1\ngone,m2,2\nstays,m1,3\n")
    response = api.client.delete(f"/v1/tenants/{tenant_id}/users/gone/ratings", headers=key)
    assert response.json() == {"user": "gone", "deleted": 2}
    assert api.ratings(tenant_id, key) == [("stays", "m1", 3.0)]
    count = api.client.get(f"/v1/tenants/{tenant_id}/ratings/count", headers=key).json()
    assert count == {"count": 1, "users": 1}


def test_paging(api):
    api.items("m1", "m2", "m3")
    tenant_id, key = api.tenant()
    api.upload_csv(tenant_id, key, "b,m1,1\na,m2,2\na,m3,3\n")
    page = api.client.get(f"/v1/tenants/{tenant_id}/ratings", headers=key,
                          params={"offset": 1, "limit": 1}).json()
    assert page["count"] == 3 and [(r["user"], r["item"]) for r in page["data"]] == [("a", "m3")]


def test_missing_and_malformed_keys_are_401(api):
    tenant_id, _ = api.tenant()
    for headers, code, detail in (
            ({}, "api_key_required", "API key required"),
            ({"Authorization": "Bearer fk_short_x"}, "invalid_api_key", "Invalid API key"),
            ({"Authorization": "Bearer fk_0123456789ab_guess"}, "invalid_api_key",
             "Invalid API key")):
        response = api.client.get(f"/v1/tenants/{tenant_id}/ratings", headers=headers)
        assert refusal(response) == (401, code, detail)


@pytest.fixture
def small_limit_api(sqlite_url):
    return make_api(sqlite_url, max_upload_bytes=64)


def test_bodies_over_the_limit_are_413_by_content_length(small_limit_api):
    api = small_limit_api
    tenant_id, key = api.tenant()
    response = api.upload_csv(tenant_id, key, "u,m1,1\n" * 10)
    assert refusal(response) == (413, "body_too_large", (
        "Request body exceeds the upload limit of 64 bytes (FEDREC_MAX_UPLOAD_BYTES)"))


def test_bodies_over_the_limit_are_413_while_streaming(small_limit_api):
    api = small_limit_api
    tenant_id, key = api.tenant()
    chunks = iter([b"u,m1,1\n" * 5] * 3)  # no Content-Length: chunked transfer
    response = api.client.post(f"/v1/tenants/{tenant_id}/ratings", content=chunks,
                               headers={**key, "Content-Type": "text/csv"})
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert refusal(response)[:2] == (413, "body_too_large")


def test_bodies_at_the_limit_pass(small_limit_api):
    api = small_limit_api
    api.items("m1")
    tenant_id, key = api.tenant()
    body = "u,m1,1\n" * 9  # 63 bytes
    assert api.upload_csv(tenant_id, key, body).status_code == 200


def test_unsupported_media_type_and_bad_json(api):
    tenant_id, key = api.tenant()
    plain = api.client.post(f"/v1/tenants/{tenant_id}/ratings", content=b"x",
                            headers={**key, "Content-Type": "text/plain"})
    assert refusal(plain) == (415, "unsupported_media_type", (
        "unsupported Content-Type 'text/plain'; use application/json, text/csv, "
        "text/tab-separated-values, application/vnd.apache.parquet or "
        "multipart/form-data"))
    bad = api.client.post(f"/v1/tenants/{tenant_id}/ratings", content=b"{",
                          headers={**key, "Content-Type": "application/json"})
    assert refusal(bad)[:2] == (422, "upload_rejected")
    assert bad.json()["detail"].startswith("body is not valid JSON")
    assert json.loads(bad.content)["errors"] == []


def test_a_failure_after_writing_rolls_the_whole_upload_back(database_url, monkeypatch):
    from fastapi.testclient import TestClient

    from app import uploads

    api = make_api(database_url)
    api.client = TestClient(api.client.app, raise_server_exceptions=False)
    api.items("m1", "m2")
    tenant_id, key = api.tenant()
    real = uploads.store.upsert_ratings

    def write_then_fail(*args, **kwargs):
        real(*args, **kwargs)  # rows and users are written inside the transaction...
        raise RuntimeError("disk full")  # ...and then the request fails

    monkeypatch.setattr(uploads.store, "upsert_ratings", write_then_fail)
    response = api.upload_csv(tenant_id, key, "u1,m1,4\nu2,m2,5\n", **{"Idempotency-Key": "x"})
    assert response.status_code == 500
    monkeypatch.setattr(uploads.store, "upsert_ratings", real)
    assert api.ratings(tenant_id, key) == []
    count = api.client.get(f"/v1/tenants/{tenant_id}/ratings/count", headers=key).json()
    assert count == {"count": 0, "users": 0}
    retried = api.upload_csv(tenant_id, key, "u1,m1,4\nu2,m2,5\n", **{"Idempotency-Key": "x"})
    assert retried.json() == {"stored": 2} and "Idempotency-Replayed" not in retried.headers


def test_racing_requests_with_one_key_apply_once(api, monkeypatch):
    """B checks the key before A commits, then loses the race on the unique constraint:
    B's writes are rolled back and A's stored response is replayed."""
    from app import uploads
    from app.models import Tenant

    api.items("m1")
    tenant_id, key = api.tenant()
    assert api.upload_csv(tenant_id, key, "u,m1,2\n", **{"Idempotency-Key": "r"}).json() == {
        "stored": 1}
    api.upload_csv(tenant_id, key, "u,m1,5\n")  # changed since, without a key
    real, calls = uploads._replay, []

    def replay_missing_on_first_check(*args):
        calls.append(args)
        return None if len(calls) == 1 else real(*args)

    monkeypatch.setattr(uploads, "_replay", replay_missing_on_first_check)
    with api.client.app.state.sessions() as session:
        outcome = uploads.upload_ratings(session, session.get(Tenant, tenant_id),
                                         b"u,m1,2\n", "text/csv", "r")
    assert (outcome.status_code, outcome.body, outcome.replayed) == (200, {"stored": 1}, True)
    assert len(calls) == 2
    assert api.ratings(tenant_id, key) == [("u", "m1", 5.0)]
