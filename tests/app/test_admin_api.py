"""Admin endpoints: authentication, tenants, API keys, item catalogue; health."""

from __future__ import annotations

import sqlalchemy as sa

from app.models import ApiKey
from app.security import hash_key
from tests.app.conftest import refusal


def test_admin_routes_need_the_admin_token(sqlite_api):
    client = sqlite_api.client
    missing = client.get("/v1/admin/tenants")
    assert refusal(missing) == (401, "admin_token_required", "Admin token required")
    wrong = client.get("/v1/admin/tenants", headers={"Authorization": "Bearer nope-secret"})
    assert refusal(wrong) == (401, "invalid_admin_token", "Invalid admin token")
    assert "nope-secret" not in wrong.text


def test_tenant_keys_are_not_admin_tokens(sqlite_api):
    _, headers = sqlite_api.tenant()
    response = sqlite_api.client.get("/v1/admin/tenants", headers=headers)
    assert refusal(response) == (401, "invalid_admin_token", "Invalid admin token")


def test_create_and_list_tenants(sqlite_api):
    client, admin = sqlite_api.client, sqlite_api.admin
    body = {"name": "acme", "rating_min": 0.5, "rating_max": 10, "privacy_budget": 2.5,
            "auto_create_items": True}
    created = client.post("/v1/admin/tenants", json=body, headers=admin)
    assert created.status_code == 201
    assert {k: created.json()[k] for k in body} == {**body, "rating_max": 10.0}
    again = client.post("/v1/admin/tenants", json=body, headers=admin)
    assert refusal(again) == (409, "tenant_name_taken", "A tenant named 'acme' already exists")
    listed = client.get("/v1/admin/tenants", headers=admin).json()
    assert listed["count"] == 1 and listed["data"][0]["name"] == "acme"


def test_tenant_scale_and_budget_are_validated(sqlite_api):
    bad = sqlite_api.client.post("/v1/admin/tenants", headers=sqlite_api.admin, json={
        "name": "x", "rating_min": 5, "rating_max": 1, "privacy_budget": 1})
    assert bad.status_code == 422
    assert refusal(bad)[:2] == (422, "validation_error")
    assert bad.json()["errors"][0]["field"] == "body"  # a rule between two fields
    assert "rating_min must be smaller than rating_max" in bad.json()["errors"][0]["message"]
    assert "rating_min must be smaller than rating_max" in bad.json()["detail"]
    zero = sqlite_api.client.post("/v1/admin/tenants", headers=sqlite_api.admin, json={
        "name": "y", "privacy_budget": 0})
    assert zero.status_code == 422 and zero.json()["errors"][0]["loc"] == [
        "body", "privacy_budget"]


def test_keys_are_stored_hashed_and_revocation_is_immediate(sqlite_api):
    client, admin = sqlite_api.client, sqlite_api.admin
    tenant_id, headers = sqlite_api.tenant()
    key = headers["Authorization"].removeprefix("Bearer ")
    engine = client.app.state.engine
    with engine.connect() as conn:
        stored = conn.execute(sa.select(ApiKey.key_hash, ApiKey.prefix)).one()
    assert stored.key_hash == hash_key(key) and key not in stored
    assert client.get(f"/v1/tenants/{tenant_id}/ratings", headers=headers).status_code == 200
    listed = client.get(f"/v1/admin/tenants/{tenant_id}/api-keys", headers=admin).json()
    assert listed["count"] == 1 and "key" not in listed["data"][0]
    key_id = listed["data"][0]["id"]
    revoked = client.delete(f"/v1/admin/tenants/{tenant_id}/api-keys/{key_id}", headers=admin)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    after = client.get(f"/v1/tenants/{tenant_id}/ratings", headers=headers)
    assert refusal(after) == (401, "invalid_api_key", "Invalid API key")


def test_key_routes_of_unknown_tenants_and_keys_are_404(sqlite_api):
    client, admin = sqlite_api.client, sqlite_api.admin
    tenant_id, _ = sqlite_api.tenant()
    other_id, _ = sqlite_api.tenant()
    assert refusal(client.post("/v1/admin/tenants/999/api-keys", headers=admin)) == (
        404, "tenant_not_found", "Tenant not found")
    key_id = client.get(f"/v1/admin/tenants/{tenant_id}/api-keys", headers=admin).json()[
        "data"][0]["id"]
    wrong = client.delete(f"/v1/admin/tenants/{other_id}/api-keys/{key_id}", headers=admin)
    assert refusal(wrong) == (404, "api_key_not_found", "API key not found")


def test_items_upsert_keeps_titles_unless_replaced(sqlite_api):
    client, admin = sqlite_api.client, sqlite_api.admin
    first = client.put("/v1/admin/items", headers=admin, json={"items": [
        {"key": "1", "title": "Toy Story"}, {"key": "2"}]})
    assert first.json() == {"upserted": 2}
    client.put("/v1/admin/items", headers=admin, json={"items": [
        {"key": "1"}, {"key": "2", "title": "Jumanji"}, {"key": "3", "title": "Heat"}]})
    page = client.get("/v1/admin/items", headers=admin).json()
    assert page["count"] == 3
    assert [(i["key"], i["title"]) for i in page["data"]] == [
        ("1", "Toy Story"), ("2", "Jumanji"), ("3", "Heat")]


def test_health_and_ready(sqlite_api):
    client = sqlite_api.client
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {
        "status": "ready", "database": "ok",
        "broker": "not configured (tasks run in-process)"}


def test_ready_is_503_when_the_broker_is_down(sqlite_url):
    from tests.app.conftest import make_api

    api = make_api(sqlite_url, broker_url="redis://127.0.0.1:1/0")
    response = api.client.get("/ready")
    assert refusal(response)[:2] == (503, "not_ready")
    assert response.json()["database"] == "ok"
    assert response.json()["broker"].startswith("unreachable (")


def test_openapi_docs_are_served(sqlite_api):
    assert sqlite_api.client.get("/docs").status_code == 200
    paths = sqlite_api.client.get("/openapi.json").json()["paths"]
    assert "/v1/tenants/{tenant_id}/ratings" in paths
    content = paths["/v1/tenants/{tenant_id}/ratings"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/json", "text/csv", "text/tab-separated-values",
                            "application/vnd.apache.parquet", "multipart/form-data"}
