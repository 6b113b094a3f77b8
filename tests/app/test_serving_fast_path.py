"""The recommendation route's fast path (``ServingRoute``): a request with plain inputs
skips FastAPI's dependency resolution, and must get exactly the answer the declared route
gives (which still answers every other request)."""

from __future__ import annotations

import pytest
from fastapi.security import HTTPBearer

from app.routes.recommendations import _plain_inputs
from tests.app.conftest import refusal
from tests.training_helpers import make_tenants, submit_job, wait_job

KEY = "fk_0123456789ab_secret"


def _scope(query: bytes = b"", tenant: str = "7", auth: bytes | None = b"Bearer " + KEY.encode(),
           ) -> dict:
    headers = [(b"host", b"x")] + ([] if auth is None else [(b"authorization", auth)])
    return {"headers": headers, "query_string": query,
            "path_params": {"tenant_id": tenant, "user_key": "u 1"}}


@pytest.mark.parametrize(("query", "expected"), [
    (b"", (10, 0, False)),
    (b"k=10", (10, 0, False)),
    (b"k=3&offset=0&include_rated=true", (3, 0, True)),
    (b"include_rated=false&offset=100000&k=1", (1, 100000, False)),
])
def test_plain_requests_are_read_from_the_raw_request(query, expected):
    assert _plain_inputs(_scope(query)) == (7, "u 1", KEY, *expected)


@pytest.mark.parametrize("scope", [
    _scope(auth=None), _scope(auth=b"Basic abc"), _scope(auth=b"Bearer"),
    _scope(tenant="0"), _scope(tenant="07"), _scope(tenant="+7"), _scope(tenant="2147483648"),
    _scope(tenant="\u0667"),  # an Arabic-Indic seven: a digit, not ASCII
    _scope(b"k=0"), _scope(b"k=010"), _scope(b"k=-1"), _scope(b"k="), _scope(b"k"),
    _scope(b"k=1&k=2"), _scope(b"k=%31"), _scope(b"k=+1"), _scope(b"offset=100001"),
    _scope(b"include_rated=1"), _scope(b"include_rated=True"), _scope(b"other=1"),
    _scope(b"k=1&"), _scope(b"k=99999999999999999999"),
])
def test_anything_else_goes_through_fastapi(scope):
    assert _plain_inputs(scope) is None


@pytest.fixture
def trained(admin_app, monkeypatch):
    """A tenant with a completed job, and a counter of HTTPBearer resolutions (FastAPI's
    declared route resolves the bearer dependency; the fast path does not)."""
    app, client = admin_app()
    (tid, key), (other, _) = make_tenants(client)
    assert wait_job(client, submit_job(client).json()["id"])["status"] == "completed"
    declared = []
    original = HTTPBearer.__call__

    async def counting(self, request):
        declared.append(request.url.path)
        return await original(self, request)

    monkeypatch.setattr(HTTPBearer, "__call__", counting)
    return client, tid, other, key, declared


def test_the_fast_path_answers_as_the_declared_route(trained):
    client, tid, _, key, declared = trained
    auth = {"Authorization": f"Bearer {key}"}
    base = f"/v1/tenants/{tid}/users/u0/recommendations"
    pairs = [("", "?k=10&k=10"), ("?k=5", "?k=05"), ("?include_rated=true", "?include_rated=1"),
             ("?offset=2&k=3", "?offset=%32&k=3")]
    for plain, other in pairs:
        fast = client.get(base + plain, headers=auth)
        assert declared == [], plain  # answered without FastAPI's dependency resolution
        slow = client.get(base + other, headers=auth)
        assert len(declared) == 1, other
        declared.clear()
        assert fast.status_code == slow.status_code == 200
        assert fast.json() == slow.json() and fast.json()["source"] == "model"
        assert fast.headers["content-type"] == slow.headers["content-type"]
    assert len(client.get(base + "?k=5", headers=auth).json()["data"]) == 5
    skipped = client.get(base + "?offset=2&k=3", headers=auth).json()["data"]
    assert skipped == client.get(base + "?k=5", headers=auth).json()["data"][2:]


def test_the_fast_path_refuses_as_the_declared_route(trained):
    """Same problem documents for an unknown user, another tenant, a bad key and k over
    FEDREC_MAX_TOP_K, whichever path answers (the fast one first)."""
    client, tid, other, key, declared = trained
    auth = {"Authorization": f"Bearer {key}"}
    cases = [  # (path with plain query, the same with a non-plain spelling, headers, refusal)
        (f"/v1/tenants/{tid}/users/nobody/recommendations", "?k=010", auth,
         (404, "user_not_found",
          "User 'nobody' not found: no ratings and no factors in this tenant")),
        (f"/v1/tenants/{other}/users/u0/recommendations", "?k=010", auth,
         (404, "tenant_not_found", "Tenant not found")),
        (f"/v1/tenants/{tid}/users/u0/recommendations", "?k=010",
         {"Authorization": "Bearer fk_000000000000_wrong"}, (401, "invalid_api_key",
                                                            "Invalid API key")),
    ]
    for path, spelt, headers, expected in cases:
        fast = client.get(path + "?k=10", headers=headers)
        assert declared == [] and refusal(fast) == expected
        slow = client.get(path + spelt, headers=headers)
        assert len(declared) == 1 and fast.json() == slow.json()
        declared.clear()
    path = f"/v1/tenants/{tid}/users/u0/recommendations"
    fast = client.get(path + "?k=1001", headers=auth)
    assert declared == [] and fast.status_code == 422
    slow = client.get(path + "?k=01001", headers=auth)
    assert len(declared) == 1 and fast.json() == slow.json()
    assert fast.json()["errors"][0]["loc"] == ["query", "k"]
    assert "FEDREC_MAX_TOP_K" in fast.json()["detail"]
    assert fast.headers["x-request-id"] != slow.headers["x-request-id"]
    missing = client.get(path, headers={"Authorization": ""})
    assert refusal(missing) == (401, "api_key_required", "API key required")
