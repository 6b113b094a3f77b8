"""A flood of an agent's long-polls against the API on the real PostgreSQL: waiting holds
no database connection, one tenant's requests beyond FEDREC_MAX_AGENT_POLLS get 429 with
Retry-After while another tenant is served, and an exhausted connection pool is a 503
with Retry-After, not a 500 (1,000 concurrent ``round?wait=60`` used to exhaust the pool
and answer 141 requests, another tenant's among them, with 500)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import migrate
from app.main import create_app
from tests.app.conftest import ADMIN_TOKEN, refusal

pytestmark = pytest.mark.integration

POLLS = 4


@pytest.fixture
def polled(make_postgres_db):
    """(app, client, [(tenant id, auth header)] of 2 agents) with job round 1 open and
    the first agent's round already declined (its long-polls wait for the other)."""
    url = make_postgres_db()
    migrate(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN, broker_url=None,
                              max_agent_polls=POLLS, database_pool_timeout=0.5))
    with TestClient(app) as client:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        client.put("/v1/admin/items", json={"items": [{"key": f"i{j}"} for j in range(10)]},
                   headers=admin).raise_for_status()
        tenants = []
        for name in ("a", "b"):
            tid = client.post("/v1/admin/tenants", headers=admin, json={
                "name": name, "privacy_budget": 10.0, "allow_non_private": True}).json()["id"]
            key = client.post(f"/v1/admin/tenants/{tid}/api-keys", headers=admin).json()["key"]
            tenants.append((tid, {"Authorization": f"Bearer {key}"}))
        res = client.post("/v1/admin/jobs", headers=admin, json={
            "algorithm": "fedmc-admm", "config": {"rank": 2}, "rounds": 1, "per_round": 0,
            "seed": 1, "dp": {"mechanism": "none"}, "allow_not_private": True,
            "tenant_ids": [t for t, _ in tenants], "agents": [t for t, _ in tenants]})
        assert res.status_code == 202, res.text
        job_id = res.json()["id"]
        (a, ha) = tenants[0]
        path = f"/v1/tenants/{a}/agent/jobs/{job_id}"
        assert client.get(f"{path}/round", headers=ha).json()["phase"] == "upload"
        client.post(f"{path}/rounds/1/decline", headers=ha).raise_for_status()
        yield app, client, tenants, job_id


def _round(client, tenant, job_id, wait):
    tid, headers = tenant
    return client.get(f"/v1/tenants/{tid}/agent/jobs/{job_id}/round",
                      params={"wait": wait}, headers=headers)


def test_a_long_poll_flood_is_capped_per_tenant_and_holds_no_connection(polled):
    app, client, tenants, job_id = polled
    pool, peak, stop = app.state.engine.pool, [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], pool.checkedout())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    with ThreadPoolExecutor(32) as ex:
        flood = [ex.submit(_round, client, tenants[0], job_id, 3.0) for _ in range(32)]
        time.sleep(1.0)  # the admitted long-polls are waiting now
        watcher.start()
        other = _round(client, tenants[1], job_id, 0.0)
        time.sleep(1.0)
        stop.set()
        answers = [f.result() for f in flood]
    watcher.join()
    assert other.status_code == 200 and other.json()["phase"] == "upload", other.text
    codes = sorted(r.status_code for r in answers)
    assert set(codes) == {200, 429} and codes.count(200) <= POLLS, codes
    limited = next(r for r in answers if r.status_code == 429)
    assert refusal(limited)[1] == "too_many_requests"
    assert int(limited.headers["Retry-After"]) > 0
    assert all(r.json()["phase"] == "wait" for r in answers if r.status_code == 200)
    # the admitted requests look with a short session every 0.25 s and hold none between
    # looks: connections out are bounded by the cap (plus the other tenant's request),
    # not by the 32 requests of the flood
    assert peak[0] <= POLLS + 1, peak


def test_an_exhausted_pool_is_a_503_with_retry_after(polled):
    app, client, tenants, job_id = polled
    engine = app.state.engine
    held = []
    try:
        while len(held) < engine.pool.size() + engine.pool._max_overflow:
            held.append(engine.connect())
        start = time.monotonic()
        res = _round(client, tenants[1], job_id, 0.0)
        assert time.monotonic() - start < 5.0
    finally:
        for conn in held:
            conn.close()
    status, code, _ = refusal(res)
    assert (status, code) == (503, "database_busy")
    assert int(res.headers["Retry-After"]) > 0
    assert _round(client, tenants[1], job_id, 0.0).status_code == 200
