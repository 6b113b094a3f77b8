"""API fixtures: the app on a fresh migrated database, admin and tenant helpers."""

from __future__ import annotations

import secrets
import uuid

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import migrate
from app.main import create_app

ADMIN_TOKEN = secrets.token_urlsafe(32)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path}/fedrec.db"
    migrate(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def database_url(request) -> str:
    """Each test using this runs on SQLite and (integration) on PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("migrated_postgres_url")


class Api:
    """A TestClient plus helpers to create tenants and keys as the admin."""

    def __init__(self, client: TestClient):
        self.client = client
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def tenant(self, **fields) -> tuple[int, dict[str, str]]:
        """A new tenant (unique name) and the auth header of a fresh API key."""
        body = {"name": f"t-{uuid.uuid4().hex[:10]}", "privacy_budget": 1.0, **fields}
        created = self.client.post("/v1/admin/tenants", json=body, headers=self.admin)
        assert created.status_code == 201, created.text
        tenant_id = created.json()["id"]
        key = self.client.post(f"/v1/admin/tenants/{tenant_id}/api-keys", headers=self.admin)
        assert key.status_code == 201, key.text
        return tenant_id, {"Authorization": f"Bearer {key.json()['key']}"}

    def items(self, *keys: str) -> None:
        body = {"items": [{"key": k} for k in keys]}
        assert self.client.put("/v1/admin/items", json=body, headers=self.admin).status_code == 200

    def upload_csv(self, tenant_id: int, headers: dict, text: str, **extra):
        return self.client.post(f"/v1/tenants/{tenant_id}/ratings", content=text.encode(),
                                headers={**headers, "Content-Type": "text/csv", **extra})

    def ratings(self, tenant_id: int, headers: dict, **params) -> list[tuple]:
        page = self.client.get(f"/v1/tenants/{tenant_id}/ratings", headers=headers,
                               params={"limit": 1000, **params})
        assert page.status_code == 200, page.text
        return [(r["user"], r["item"], r["rating"]) for r in page.json()["data"]]


def make_api(url: str, **settings) -> Api:
    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN, **settings))
    return Api(TestClient(app))


@pytest.fixture
def api(database_url) -> Api:
    """The API on SQLite and on PostgreSQL."""
    return make_api(database_url)


@pytest.fixture
def sqlite_api(sqlite_url) -> Api:
    """The API on SQLite only (admin and auth behaviour does not depend on the backend)."""
    return make_api(sqlite_url)


@pytest.fixture
def admin_app(tmp_path):
    """Factory of (app, client): the API on a fresh SQLite database with the training
    pipeline in-process (no broker), the client acting as the admin; keyword arguments
    are further settings (e.g. ``serving_cache_seconds``)."""
    opened: list[TestClient] = []

    def make(**settings) -> tuple:
        url = f"sqlite:///{tmp_path}/app-{len(opened)}.db"
        migrate(url)
        app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN, broker_url=None,
                                  **settings))
        client = TestClient(app).__enter__()
        client.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        opened.append(client)
        return app, client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


@pytest.fixture
def env(admin_app):
    """The API on SQLite with the pipeline in-process, acting as the admin."""
    return admin_app()


def refusal(response) -> tuple[int, str, str]:
    """(status, code, detail) of an error answer, after checking it is a problem document
    (RFC 9457) whose members agree with the response."""
    assert response.headers["content-type"] == "application/problem+json", response.text
    body = response.json()
    assert body["status"] == response.status_code, body
    assert body["type"] == f"urn:fedrec:problem:{body['code']}", body
    return response.status_code, body["code"], body["detail"]
