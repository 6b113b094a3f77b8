"""API conventions: Location headers, Idempotency-Key on tenant creation, PATCH tenant with
its audit log and ledger-checked budget changes, the same 422 for every configured limit,
the tenant's own privacy spend, TSV and multipart uploads."""

from __future__ import annotations

import math

import sqlalchemy as sa

from app.models import Tenant, TenantAudit
from privacy.accountant import Event, spend
from tests.app.conftest import make_api, refusal
from tests.training_helpers import make_tenants, submit_job, wait_job

DP = {"mechanism": "gaussian", "noise_multiplier": 2.0, "clip": 1.0}


def test_created_and_accepted_resources_have_a_location(env):
    app, client = env
    created = client.post("/v1/admin/tenants", json={"name": "loc", "privacy_budget": 5})
    assert created.status_code == 201
    assert created.headers["location"] == f"/v1/admin/tenants/{created.json()['id']}"
    assert client.get(created.headers["location"]).json()["name"] == "loc"
    key = client.post(f"{created.headers['location']}/api-keys", json={"name": "k"})
    assert key.status_code == 201
    shown = client.get(key.headers["location"])
    assert shown.status_code == 200 and shown.json()["id"] == key.json()["id"]
    assert "key" not in shown.json()  # the secret is in the creating answer only
    (a, _), (b, _) = make_tenants(client)
    job = submit_job(client, rounds=1, tenant_ids=[a, b])
    assert job.status_code == 202
    assert job.headers["location"] == f"/v1/admin/jobs/{job.json()['id']}"
    wait_job(client, job.json()["id"])
    tid = created.json()["id"]
    stats = client.post(f"/v1/tenants/{tid}/stats",
                        headers={"Authorization": f"Bearer {key.json()['key']}"})
    assert stats.status_code == 202 and stats.headers["location"] == f"/v1/tenants/{tid}/stats"
    assert client.delete(key.headers["location"]).status_code == 200
    assert refusal(client.get(key.headers["location"])) == (
        404, "api_key_revoked", f"API key {key.json()['id']} was revoked")


def test_tenant_creation_with_an_idempotency_key_creates_once(env):
    app, client = env
    body = {"name": "once", "privacy_budget": 3}
    first = client.post("/v1/admin/tenants", json=body, headers={"Idempotency-Key": "t-1"})
    again = client.post("/v1/admin/tenants", json=body, headers={"Idempotency-Key": "t-1"})
    assert first.status_code == 201 and "idempotency-replayed" not in first.headers
    assert again.status_code == 200 and again.headers["idempotency-replayed"] == "true"
    assert again.json() == first.json() and again.headers["location"] == first.headers[
        "location"]
    other = client.post("/v1/admin/tenants", json={**body, "privacy_budget": 4},
                        headers={"Idempotency-Key": "t-1"})
    assert refusal(other) == (422, "idempotency_conflict", (
        "Idempotency-Key 't-1' was already used with a different request body; use a new "
        "key for a new tenant"))
    empty = client.post("/v1/admin/tenants", json={"name": "e", "privacy_budget": 1},
                        headers={"Idempotency-Key": ""})
    assert refusal(empty) == (422, "validation_error", (
        "header.idempotency-key: String should have at least 1 character"))
    too_long = client.post("/v1/admin/tenants", json={"name": "e", "privacy_budget": 1},
                           headers={"Idempotency-Key": "k" * 256})
    assert too_long.json()["errors"][0]["loc"] == ["header", "idempotency-key"]
    without = client.post("/v1/admin/tenants", json=body)  # no key: the name is taken
    assert refusal(without) == (409, "tenant_name_taken", "A tenant named 'once' already exists")
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Tenant)) == 1


def test_a_budget_raise_admits_a_refused_job_and_is_audited(env):
    app, client = env
    (a, _), (b, _) = make_tenants(client, budget=0.5)
    refused = submit_job(client, rounds=2, dp=DP)
    assert refusal(refused)[:2] == (409, "budget_exceeded")
    raised = client.patch(f"/v1/admin/tenants/{a}", json={"privacy_budget": 50},
                          headers={"X-Actor": "alice"})
    assert raised.status_code == 200, raised.text
    assert raised.json()["privacy_budget"] == 50.0
    assert raised.json()["privacy"]["epsilon_max"] == 50.0
    client.patch(f"/v1/admin/tenants/{b}", json={"privacy_budget": 50}).raise_for_status()
    job = wait_job(client, submit_job(client, rounds=2, dp=DP).json()["id"])
    assert job["status"] == "completed", job
    log = client.get(f"/v1/admin/tenants/{a}/audit").json()
    assert log["count"] == 1
    entry = log["data"][0]
    assert entry["changes"] == {"privacy_budget": {"old": 0.5, "new": 50.0}}
    assert entry["actor"].startswith("admin:") and entry["actor"].endswith(" (alice)")
    assert len(entry["actor"].split()[0]) == len("admin:") + 12  # a token fingerprint
    assert entry["at"].endswith("Z") or entry["at"].endswith("+00:00")


def test_a_budget_cut_below_the_spend_is_409_and_changes_nothing(env):
    app, client = env
    (a, key), _ = make_tenants(client, budget=50)
    job = wait_job(client, submit_job(client, rounds=2, dp=DP).json()["id"])
    assert job["status"] == "completed", job
    spent = client.get(f"/v1/admin/tenants/{a}").json()["privacy"]["epsilon_spent"]
    assert 0 < spent < 50
    cut = client.patch(f"/v1/admin/tenants/{a}", json={"privacy_budget": spent / 2,
                                                    "name": "renamed"})
    status, code, detail = refusal(cut)
    assert (status, code) == (409, "budget_below_spend")
    assert detail.startswith(f"privacy_budget {spent / 2:.6g} is below the epsilon tenant {a}")
    shown = client.get(f"/v1/admin/tenants/{a}").json()
    assert (shown["privacy_budget"], shown["name"]) == (50.0, "t0")  # nothing half-written
    assert client.get(f"/v1/admin/tenants/{a}/audit").json()["count"] == 0
    ok = client.patch(f"/v1/admin/tenants/{a}", json={"privacy_budget": spent * 1.01})
    assert ok.status_code == 200 and ok.json()["privacy"]["epsilon_remaining"] == \
        ok.json()["privacy_budget"] - spent


def test_patch_validates_like_creation(env):
    app, client = env
    (a, _), (b, _) = make_tenants(client)
    for body, field in (({"rating_min": 0}, "rating_min"), ({"name": None}, "name"),
                        ({"privacy_budget": -1}, "privacy_budget"),
                        ({"privacy_budget": None}, "privacy_budget")):
        r = client.patch(f"/v1/admin/tenants/{a}", json=body)
        assert refusal(r)[:2] == (422, "validation_error"), (body, r.text)
        assert r.json()["errors"][0]["loc"] == ["body", field]
    taken = client.patch(f"/v1/admin/tenants/{a}", json={"name": "t1"})
    assert refusal(taken) == (409, "tenant_name_taken", "A tenant named 't1' already exists")
    same = client.patch(f"/v1/admin/tenants/{a}", json={"name": "t0"})  # no change: no row
    assert same.status_code == 200
    assert refusal(client.patch("/v1/admin/tenants/999", json={})) == (
        404, "tenant_not_found", "Tenant not found")
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TenantAudit)) == 0


def test_every_page_size_over_the_limit_is_422_never_a_silent_cut(env):
    app, client = env
    (a, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    for url, headers in (("/v1/admin/items", {}), (f"/v1/tenants/{a}/ratings", auth),
                         ("/v1/admin/jobs", {})):
        at = client.get(url, params={"limit": 1000}, headers=headers)
        assert at.status_code == 200, (url, at.text)
        past = client.get(url, params={"limit": 5000}, headers=headers)
        assert refusal(past) == (422, "validation_error", (
            "query.limit: limit must be at most 1000 (FEDREC_MAX_PAGE_SIZE); got 5000")), url
    schema = app.openapi()
    for path in ("/v1/admin/items", "/v1/tenants/{tenant_id}/ratings", "/v1/admin/jobs"):
        params = schema["paths"][path]["get"]["parameters"]
        assert next(p for p in params if p["name"] == "limit")["schema"]["maximum"] == 1000
    k = schema["paths"]["/v1/tenants/{tenant_id}/users/{user_key}/recommendations"]["get"]
    assert next(p for p in k["parameters"] if p["name"] == "k")["schema"]["maximum"] == 1000


def test_a_tenant_sees_its_own_spend_and_no_one_elses(env):
    app, client = env
    (a, key_a), (b, key_b) = make_tenants(client, budget=50)
    fresh = client.get(f"/v1/tenants/{a}/privacy", headers={"Authorization": f"Bearer {key_a}"})
    from app.training.ledger import SPEND_NOTE

    assert fresh.json() == {"tenant_id": a, "note": SPEND_NOTE, "epsilon_spent": 0.0,
                            "epsilon_max": 50.0,
                            "epsilon_remaining": 50.0, "delta": 1e-05, "private": True,
                            "transmissions": 0, "jobs": []}
    jobs = [wait_job(client, submit_job(client, rounds=r, dp=DP).json()["id"])["id"]
            for r in (2, 1)]
    mine = client.get(f"/v1/tenants/{a}/privacy", headers={"Authorization": f"Bearer {key_a}"})
    assert mine.status_code == 200
    body = mine.json()
    # independent computation: three gaussian transmissions at the tenant's delta
    sigma_event = [Event("gaussian", 2.0, 1)]
    expect_all = spend(sigma_event * 3, 1e-5).epsilon
    assert math.isclose(body["epsilon_spent"], expect_all, rel_tol=1e-9)
    assert math.isclose(body["epsilon_remaining"], 50 - expect_all, rel_tol=1e-9)
    assert [j["job_id"] for j in body["jobs"]] == jobs
    assert [j["transmissions"] for j in body["jobs"]] == [2, 1]
    assert math.isclose(body["jobs"][0]["epsilon"], spend(sigma_event * 2, 1e-5).epsilon)
    assert client.get(f"/v1/admin/tenants/{a}").json()["privacy"] == body
    report = client.get(f"/v1/admin/jobs/{jobs[1]}/report").json()["privacy"]["lifetime"][str(a)]
    assert math.isclose(report["epsilon_spent"], body["epsilon_spent"])
    other = client.get(f"/v1/tenants/{a}/privacy", headers={"Authorization": f"Bearer {key_b}"})
    assert refusal(other) == (404, "tenant_not_found", "Tenant not found")


def test_a_noise_free_job_shows_infinity(env):
    app, client = env
    (a, key), _ = make_tenants(client, budget=10)
    wait_job(client, submit_job(client, rounds=1).json()["id"])
    body = client.get(f"/v1/tenants/{a}/privacy", headers={"Authorization": f"Bearer {key}"})
    assert body.json()["epsilon_spent"] == "infinity" and body.json()["private"] is False
    assert body.json()["epsilon_remaining"] == 0.0
    assert body.json()["jobs"][0]["epsilon"] == "infinity"


MOVIELENS = "196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n"


def test_tsv_and_multipart_uploads_read_movielens_as_it_is(sqlite_url):
    api = make_api(sqlite_url)
    api.items("242", "302", "377")
    tenant_id, key = api.tenant()
    url = f"/v1/tenants/{tenant_id}/ratings"
    tsv = api.client.post(url, content=MOVIELENS.encode(), headers={
        **key, "Content-Type": "text/tab-separated-values"})
    assert tsv.json() == {"stored": 3}, tsv.text
    sniffed = api.upload_csv(tenant_id, key, MOVIELENS.replace("\t3\t", "\t4\t"))
    assert sniffed.json() == {"stored": 3}, sniffed.text
    assert sorted(api.ratings(tenant_id, key)) == [("186", "302", 4.0), ("196", "242", 4.0),
                                                  ("22", "377", 1.0)]
    form = api.client.post(url, files={"file": ("u.data", MOVIELENS.encode(),
                                                "application/octet-stream")},
                           headers={**key, "Idempotency-Key": "form-1"})
    assert form.json() == {"stored": 3}, form.text
    assert sorted(api.ratings(tenant_id, key))[0] == ("186", "302", 3.0)
    # curl -F picks a new boundary on each try: a retry is still a replay
    again = api.client.post(url, files={"file": ("u.data", MOVIELENS.encode())},
                            headers={**key, "Idempotency-Key": "form-1"})
    assert again.status_code == 200 and again.headers["idempotency-replayed"] == "true"
    as_json = api.client.post(url, files={"file": (
        "r.json", b'{"ratings": [{"user": "9", "item": "242", "rating": 2}]}')}, headers=key)
    assert as_json.json() == {"stored": 1}, as_json.text


def test_tsv_and_multipart_rows_are_refused_like_csv(sqlite_url):
    api = make_api(sqlite_url)
    api.items("242")
    tenant_id, key = api.tenant(rating_min=1, rating_max=5)
    url = f"/v1/tenants/{tenant_id}/ratings"
    bad = "196\t242\t9\t881250949\n196\tnope\t3\n7\t242\n"
    expected = [{"line": 1, "field": "rating",
                 "message": "rating 9 is outside the tenant's scale [1, 5]"},
                {"line": 2, "field": "item", "message": "item 'nope' is not in the catalogue"},
                {"line": 3, "field": "row", "message": "expected 3 or 4 fields, got 2 (user, "
                 "item, rating[, timestamp], tab-separated as the first line)"}]
    for response in (
            api.client.post(url, content=bad.encode(), headers={
                **key, "Content-Type": "text/tab-separated-values"}),
            api.client.post(url, files={"file": ("u.data", bad.encode())}, headers=key)):
        assert refusal(response) == (422, "upload_rejected",
                                     "3 invalid row(s); nothing was stored")
        assert response.json()["errors"] == expected
    no_file = api.client.post(url, data={"other": "x"}, files={"x": ("", b"")}, headers=key)
    assert refusal(no_file) == (422, "upload_rejected", (
        "multipart/form-data body has no file part; send the ratings as "
        "-F file=@ratings.csv"))
    assert api.ratings(tenant_id, key) == []
