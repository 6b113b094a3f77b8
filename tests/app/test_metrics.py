"""``GET /metrics``: admin-only Prometheus text with request latency by route template,
uploads, serving cache lookups, jobs by status, round durations and epsilon per tenant."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from app.training.models import JobRound
from privacy.accountant import Event, spend
from tests.app.conftest import refusal
from tests.training_helpers import make_tenants, submit_job, wait_job

DP = {"mechanism": "gaussian", "noise_multiplier": 2.0, "clip": 1.0}


def samples(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def test_metrics_need_the_admin_token(env):
    app, client = env
    (tid, key), _ = make_tenants(client)
    assert refusal(client.get("/metrics", headers={"Authorization": ""}))[:2] == (
        401, "admin_token_required")
    tenant = client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
    assert refusal(tenant)[:2] == (401, "invalid_admin_token")


def test_metrics_count_requests_uploads_jobs_rounds_and_epsilon(env):
    app, client = env
    (a, key), (b, _) = make_tenants(client, budget=50)  # two uploads of rows
    auth = {"Authorization": f"Bearer {key}"}
    for _ in range(3):
        client.get(f"/v1/tenants/{a}/ratings/count", headers=auth)
    client.get("/v1/tenants/999999/ratings/count", headers=auth)  # 404: another label
    bad = client.post(f"/v1/tenants/{a}/ratings", content=b"u,nope,3\n",
                      headers={**auth, "Content-Type": "text/csv"})
    assert bad.status_code == 422
    job = wait_job(client, submit_job(client, rounds=2, dp=DP).json()["id"])
    assert job["status"] == "completed"
    for _ in range(2):
        client.get(f"/v1/tenants/{a}/users/u0/recommendations", headers=auth)
    got = samples(client)
    route = "/v1/tenants/{tenant_id}/ratings/count"
    count = ("fedrec_http_request_duration_seconds_count",
             (("method", "GET"), ("route", route), ("status", "200")))
    assert got[count] == 3
    assert got[(count[0], (("method", "GET"), ("route", route), ("status", "404")))] == 1
    assert got[("fedrec_uploads_total", (("outcome", "stored"),))] == 2
    assert got[("fedrec_uploads_total", (("outcome", "upload_rejected"),))] == 1
    with app.state.sessions() as s:
        rows = s.query(JobRound).count()
        seconds = sum(r.seconds for r in s.query(JobRound))
    assert got[("fedrec_jobs", (("status", "completed"),))] == 1
    assert got[("fedrec_round_duration_seconds_count", ())] == rows == 2
    assert math.isclose(got[("fedrec_round_duration_seconds_sum", ())], seconds)
    expected = spend([Event("gaussian", 2.0, 2)], 1e-5).epsilon  # independent of the ledger
    for tenant in (a, b):
        assert math.isclose(got[("fedrec_epsilon_spent", (("tenant_id", str(tenant)),))],
                            expected, rel_tol=1e-9)
    hits = got.get(("fedrec_serving_cache_total",
                    (("cache", "recommendations"), ("result", "hit"))), 0)
    misses = got[("fedrec_serving_cache_total",
                  (("cache", "recommendations"), ("result", "miss")))]
    assert hits + misses == 2 and misses >= 1
    assert got[("fedrec_uploaded_rows_total", ())] > 0
    assert not any(n == "fedrec_http_request_duration_seconds_count" and "999999" in str(lab)
                   for n, lab in got)  # raw paths never become labels


def test_the_served_app_freezes_its_heap_once_started_and_test_apps_do_not(sqlite_url):
    """``fedrec serve``'s app moves its startup objects out of the collector's reach (a
    full collection would otherwise walk them all, pausing every request in flight)."""
    import gc

    from fastapi.testclient import TestClient

    from app.config import Settings
    from app.main import create_app

    gc.unfreeze()
    settings = Settings(database_url=sqlite_url, admin_token="t" * 32)
    with TestClient(create_app(settings)) as client:
        assert client.get("/health").status_code == 200
        assert gc.get_freeze_count() == 0
    try:
        with TestClient(create_app(settings, freeze_heap=True)) as client:
            assert client.get("/health").status_code == 200
            assert gc.get_freeze_count() > 50_000
    finally:
        gc.unfreeze()
