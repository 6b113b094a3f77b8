"""Hardening at the edge (the third outside attack): NUL characters are a 422 naming the
field on every backend, every response carries the security headers, wrong admin tokens
and dashboard secrets are rate limited, signing out revokes the session, plots and the
jobs page render whatever a tenant is called and whatever state a job is in."""

from __future__ import annotations

import re
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.dashboard import auth
from app.models import Item, Tenant
from app.security import FailedSignIns
from app.training.models import TrainingJob
from tests.app.conftest import ADMIN_TOKEN, make_api
from tests.training_helpers import make_tenants, submit_job, wait_job


def _field(response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "validation_error"
    return [e["field"] for e in response.json()["errors"]]


def test_nul_characters_are_a_422_naming_the_field_and_nothing_is_stored(database_url):
    api = make_api(database_url)
    client = TestClient(api.client.app, raise_server_exceptions=False)
    tid, headers = api.tenant(auto_create_items=True)
    fresh = f"ok-{uuid.uuid4().hex}"
    assert api.upload_csv(tid, headers, "alice,a,3\n").status_code == 200
    with api.client.app.state.sessions() as s:
        tenants_before = s.scalar(sa.select(sa.func.count()).select_from(Tenant))
    base = f"/v1/tenants/{tid}"
    cases = [
        (client.get(f"{base}/users/a%00b/recommendations", headers=headers), ["path"]),
        (client.delete(f"{base}/users/a%00b/ratings", headers=headers), ["path"]),
        (client.get(f"{base}/ratings", params={"user": "a\x00b"}, headers=headers), ["user"]),
        (client.post(f"{base}/recommendations", json={"users": ["alice", "b\x00"]},
                     headers=headers), ["users"]),
        (client.post("/v1/admin/tenants", json={"name": "x\x00y", "privacy_budget": 1},
                     headers=api.admin), ["name"]),
        (client.patch(f"/v1/admin/tenants/{tid}", json={"name": "x\x00y"},
                      headers=api.admin), ["name"]),
        (client.put("/v1/admin/items", json={"items": [{"key": fresh}, {"key": "k\x00"}]},
                    headers=api.admin), ["items.1.key"]),
        (client.put("/v1/admin/items", json={"items": [{"key": fresh, "title": "t\x00"}]},
                    headers=api.admin), ["items.0.title"]),
        (client.post("/v1/admin/jobs", json={"config": {"n\x00": 1}}, headers=api.admin),
         ["config"]),
    ]
    for response, fields in cases:
        assert _field(response) == fields, response.request.url
        assert "NUL" in response.json()["detail"]
    with api.client.app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Tenant)) == tenants_before
        assert s.scalar(sa.select(Item).where(Item.key == fresh)) is None


def test_every_response_carries_the_security_headers(sqlite_api):
    for path, inline_scripts in (("/health", False), ("/dashboard/login", False),
                                 ("/docs", True), ("/no/such/route", False)):
        response = sqlite_api.client.get(path)
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        policy = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
        assert ("script-src 'self' 'unsafe-inline'" in policy) == inline_scripts, path


def test_wrong_admin_tokens_lock_the_client_out_even_with_the_right_one(sqlite_url):
    api = make_api(sqlite_url, max_failed_sign_ins=5)
    wrong = {"Authorization": "Bearer " + "w" * 43}
    for _ in range(5):
        assert api.client.get("/v1/admin/tenants", headers=wrong).status_code == 401
    refused = api.client.get("/v1/admin/tenants", headers=api.admin)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "too_many_failed_sign_ins"
    assert 1 <= int(refused.headers["retry-after"]) <= 60


def test_failed_sign_ins_leave_the_window_after_a_minute():
    limiter = FailedSignIns(limit=2, window=60.0)
    limiter.failed("a", now=0.0)
    limiter.failed("a", now=10.0)
    assert limiter.wait("a", now=11.0) == 49 and limiter.wait("b", now=11.0) == 0
    assert limiter.wait("a", now=60.5) == 0  # the first failure left the window


def _sign_in(client: TestClient, secret: str):
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/dashboard/login").text)[1]
    return client.post("/dashboard/login", data={"secret": secret, "csrf": csrf},
                       follow_redirects=False)


def test_dashboard_sign_in_is_rate_limited(sqlite_url):
    client = make_api(sqlite_url, max_failed_sign_ins=3).client
    for _ in range(3):
        assert _sign_in(client, "fk_000000000000_wrong").status_code == 401
    locked = _sign_in(client, ADMIN_TOKEN)
    assert locked.status_code == 429 and "retry in" in locked.text
    assert auth.COOKIE not in client.cookies


def test_signing_out_revokes_the_session_cookie_everywhere(sqlite_url):
    client = make_api(sqlite_url).client
    assert _sign_in(client, ADMIN_TOKEN).status_code == 303
    cookie = client.cookies[auth.COOKIE]
    page = client.get("/dashboard/tenants")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)[1]
    assert client.post("/dashboard/logout", data={"csrf": csrf},
                       follow_redirects=False).status_code == 303
    client.cookies.set(auth.COOKIE, cookie)  # a copy kept by whoever stole it
    replay = client.get("/dashboard/tenants", follow_redirects=False)
    assert (replay.status_code, replay.headers["location"]) == (303, "/dashboard/login")


def test_session_cookie_is_secure_in_production(sqlite_url):
    """Behind a TLS-terminating proxy the app sees http: production cookies are Secure."""
    for env, secure in (("production", True), ("development", False)):
        form = make_api(sqlite_url, env=env).client.get("/dashboard/login")
        assert ("secure" in form.headers["set-cookie"].lower()) == secure, env


@pytest.fixture
def admin(sqlite_url):
    api = make_api(sqlite_url, broker_url=None)
    return TestClient(api.client.app, headers=api.admin)


def test_plots_render_a_tenant_name_with_mathematical_markup(admin):
    tenants = make_tenants(admin, 2, seed=3)
    renamed = admin.patch(f"/v1/admin/tenants/{tenants[0][0]}",
                          json={"name": "$\\notacommand{$"})
    assert renamed.status_code == 200, renamed.text
    job = submit_job(admin, tenant_ids=[t for t, _ in tenants], rounds=2)
    assert wait_job(admin, job.json()["id"])["status"] == "completed"
    png = admin.get(f"/v1/admin/jobs/{job.json()['id']}/plot.png")
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    tenant_png = admin.get(f"/v1/tenants/{tenants[0][0]}/report/plot.png",
                           headers={"Authorization": f"Bearer {tenants[0][1]}"})
    assert tenant_png.status_code == 200 and tenant_png.content[:4] == b"\x89PNG"


@pytest.mark.parametrize("state", [
    {"status": "running", "current_round": 0, "latest_metrics": {"round_started": 1.0}},
    {"status": "cancelled", "current_round": 0, "latest_metrics": {"round_started": 1.0}},
    {"status": "failed", "current_round": 0, "latest_metrics": None},
    {"status": "completed", "current_round": 2,
     "latest_metrics": {"round": 2, "test_rmse": None}},
])
def test_the_jobs_page_renders_a_job_in_any_state(admin, state):
    tenants = make_tenants(admin, 2, seed=4)
    job = submit_job(admin, tenant_ids=[t for t, _ in tenants], rounds=2)
    wait_job(admin, job.json()["id"])
    with admin.app.state.sessions() as s:
        s.execute(sa.update(TrainingJob).where(TrainingJob.id == job.json()["id"])
                  .values(**state))
        s.commit()
    assert _sign_in(admin, ADMIN_TOKEN).status_code == 303
    page = admin.get("/dashboard/jobs")
    assert page.status_code == 200, page.text
    assert f"job {job.json()['id']}" in page.text


def test_a_500_keeps_the_kept_alive_connection(sqlite_url):
    """A bug answers 500 and the client's next request on the same connection is served
    (re-raised to the server, the exception used to reset the connection)."""
    import http.client
    import socket
    import threading
    import time

    import uvicorn

    app = make_api(sqlite_url).client.app

    def planted_bug() -> None:
        raise RuntimeError("planted bug")

    app.add_api_route("/planted-bug", planted_bug)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/planted-bug")
        first = conn.getresponse()
        assert first.status == 500 and b"planted bug" not in first.read()
        conn.request("GET", "/health")
        second = conn.getresponse()
        assert second.status == 200, second.read()
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_tenant_downloads_its_own_model_and_scores_like_the_service(admin):
    from fedrec.client import ApiError as ClientError
    from fedrec.client import Client

    tenants = make_tenants(admin, 2, seed=5)
    (mine, key), (_, other_key) = tenants
    own = Client("http://testserver", token=key, http=TestClient(admin.app))
    with pytest.raises(ClientError) as before:
        own.model(mine)
    assert before.value.status == 404 and before.value.code == "no_model"
    job = submit_job(admin, tenant_ids=[t for t, _ in tenants], rounds=3)
    assert wait_job(admin, job.json()["id"])["status"] == "completed"

    model = own.model(mine)
    assert model.meta["job_id"] == job.json()["id"] and model.meta["algorithm"] == "fedmc-admm"
    assert model.user_factors.shape == (len(model.user_keys), model.item_factors.shape[0])
    assert all(u.startswith("u") for u in model.user_keys)
    user = model.user_keys[0]
    served = own.recommendations(mine, user, k=5, include_rated=True)
    scores = dict(zip(model.item_keys, model.scores(user), strict=True))
    assert [r.item for r in served.data] == sorted(scores, key=scores.get, reverse=True)[:5]
    # another tenant's key cannot read it
    other = TestClient(admin.app).get(f"/v1/tenants/{mine}/model",
                                      headers={"Authorization": f"Bearer {other_key}"})
    assert other.status_code == 404


def test_deleting_a_tenant_removes_its_data_and_leaves_the_others_jobs_readable(admin):
    from app.models import ApiKey, Rating, User
    from app.training.models import FactorSnapshot, JobClient, LedgerEntry

    tenants = make_tenants(admin, 2, seed=6)
    (gone, gone_key), (kept, kept_key) = tenants
    running = submit_job(admin, tenant_ids=[gone, kept], rounds=5000).json()["id"]
    busy = admin.delete(f"/v1/admin/tenants/{gone}")
    assert busy.status_code == 409 and busy.json()["code"] == "tenant_in_job"
    assert str(running) in busy.json()["detail"]
    admin.post(f"/v1/admin/jobs/{running}/cancel")
    wait_job(admin, running)
    done = submit_job(admin, tenant_ids=[gone, kept], rounds=2).json()["id"]
    assert wait_job(admin, done)["status"] == "completed"

    deleted = admin.delete(f"/v1/admin/tenants/{gone}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["ratings"] > 0 and deleted.json()["users"] > 0
    with admin.app.state.sessions() as s:
        for model in (ApiKey, User, JobClient, FactorSnapshot, LedgerEntry):
            left = s.scalar(sa.select(sa.func.count()).select_from(model)
                            .where(model.tenant_id == gone))
            assert left == 0, model.__name__
        orphans = s.scalar(sa.select(sa.func.count()).select_from(Rating).where(
            ~Rating.user_id.in_(sa.select(User.id))))
        assert orphans == 0
    assert admin.get(f"/v1/admin/tenants/{gone}").status_code == 404
    assert admin.delete(f"/v1/admin/tenants/{gone}").status_code == 404
    refused = TestClient(admin.app).get(f"/v1/tenants/{gone}/report",
                                        headers={"Authorization": f"Bearer {gone_key}"})
    assert refused.status_code == 401
    # the other tenant and the jobs it shared still read
    own = {"Authorization": f"Bearer {kept_key}"}
    for path in (f"/v1/tenants/{kept}/report", f"/v1/tenants/{kept}/report/plot.png",
                 f"/v1/tenants/{kept}/users/u1/recommendations"):
        assert TestClient(admin.app).get(path, headers=own).status_code == 200, path
    for path in (f"/v1/admin/jobs/{done}", f"/v1/admin/jobs/{done}/report",
                 f"/v1/admin/jobs/{done}/plot.png", "/v1/admin/jobs"):
        assert admin.get(path).status_code == 200, path
    assert _sign_in(admin, ADMIN_TOKEN).status_code == 303
    for page in ("/dashboard/jobs", f"/dashboard/jobs/{done}", "/dashboard/tenants"):
        assert admin.get(page).status_code == 200, page
