"""The serving caches' staleness bound, across processes: ``fedrec serve --workers 2`` on
PostgreSQL with FEDREC_SERVING_CACHE_SECONDS=1. After a key is revoked and a user is
forgotten (each request handled by one of the two processes), no request that starts once
the bound has passed is served with the key or gets the user's model recommendations,
whichever process answers it and however long it sat idle with the old entry cached.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import time
import uuid

import httpx
import pytest
from fastapi.testclient import TestClient

from algorithms.synthetic import generate_ratings
from app.config import Settings
from app.db import migrate
from app.main import create_app
from bench._server import serve, stop
from tests.integration.conftest import free_port
from tests.training_helpers import CONFIG, csv_body, wait_job

pytestmark = pytest.mark.integration
BOUND = 1.0  # FEDREC_SERVING_CACHE_SECONDS
MARGIN = 0.5


def _prepare(url: str, token: str) -> tuple[int, str, str, str, str]:
    """A trained tenant: (tenant id, key kept, key to revoke, user to forget, other user)."""
    app = create_app(Settings(database_url=url, admin_token=token, broker_url=None))
    r = generate_ratings(60, 30, 900, rank=3, seed=1)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        client.put("/v1/admin/items", json={"items": [{"key": f"i{j}"} for j in range(30)]}
                   ).raise_for_status()
        tid = client.post("/v1/admin/tenants", json={"name": f"s-{uuid.uuid4().hex[:8]}",
                                                  "privacy_budget": 100.0,
                                                  # the job below is noise-free
                                                  "allow_non_private": True}).json()["id"]
        keys = [client.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
                for _ in range(2)]
        rows = zip((f"u{u}" for u in r.users), (f"i{i}" for i in r.items), r.values,
                   strict=True)
        client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                    headers={"Content-Type": "text/csv",
                             "Authorization": f"Bearer {keys[0]}"}).raise_for_status()
        job = client.post("/v1/admin/jobs", json={"algorithm": "fedmc-admm", "config": CONFIG,
                                               "rounds": 2, "seed": 0,
                                               "tenant_ids": [tid],
                                               "dp": {"mechanism": "none"},
                                               "lists": "model"})  # served whatever
        # it scores against popularity: this test follows the model's factors
        assert wait_job(client, job.json()["id"])["status"] == "completed"
    first, second = (f"u{u}" for u in sorted(set(r.users.tolist()))[:2])
    return tid, keys[0], keys[1], first, second


def _burst(base: str, key: str, paths: list[str]) -> list[httpx.Response]:
    """One request per path, 8 at a time, each on a new connection (so the kernel spreads
    them over both worker processes)."""
    def get(path: str) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=10) as c:
            return c.get(path, headers={"Authorization": f"Bearer {key}"})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(get, paths))


@pytest.fixture
def server(make_postgres_db, tmp_path):
    url = make_postgres_db()
    migrate(url)
    token = secrets.token_urlsafe(32)
    prepared = _prepare(url, token)
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "FEDREC_BROKER_URL", "DATABASE_URL")}
    env.update(FEDREC_DATABASE_URL=url, FEDREC_ADMIN_TOKEN=token,
               FEDREC_SERVING_CACHE_SECONDS=str(BOUND))
    port = free_port()
    proc = serve(env, port, tmp_path / "serve.log", access_log=False)
    yield f"http://127.0.0.1:{port}", token, prepared
    stop(proc)


def test_revocation_and_forgetting_reach_every_process_within_the_bound(server):
    base, token, (tid, kept, revoked, user, other) = server
    mine, theirs = (f"/v1/tenants/{tid}/users/{u}/recommendations" for u in (user, other))
    warm = _burst(base, kept, [mine] * 40) + _burst(base, revoked, [theirs] * 40)
    assert {r.status_code for r in warm} == {200}  # both processes cached both keys
    assert {r.json()["source"] for r in warm[:40]} == {"model"}
    with httpx.Client(base_url=base, timeout=10) as c:
        forget = c.delete(f"/v1/tenants/{tid}/users/{user}/ratings",
                          headers={"Authorization": f"Bearer {kept}"})
        assert forget.status_code == 200, forget.text
        key_id = [k["id"] for k in c.get(f"/v1/admin/tenants/{tid}/api-keys",
                                         headers={"Authorization": f"Bearer {token}"}
                                         ).json()["data"]][1]
        revoke = c.delete(f"/v1/admin/tenants/{tid}/api-keys/{key_id}",
                          headers={"Authorization": f"Bearer {token}"})
        assert revoke.status_code == 200 and revoke.json()["revoked_at"], revoke.text
    time.sleep(BOUND + MARGIN)
    for _ in range(3):  # idle caches first, then the processes' refreshed ones
        assert [r.status_code for r in _burst(base, revoked, [theirs] * 20)] == [401] * 20
        gone = _burst(base, kept, [mine] * 20)
        assert [r.status_code for r in gone] == [404] * 20, [r.text for r in gone]
        time.sleep(MARGIN)
    assert {r.status_code for r in _burst(base, kept, [theirs] * 8)} == {200}
