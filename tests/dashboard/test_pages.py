"""Dashboard sessions, the 404 rule, the offline API docs and the chart data, without a
browser (tests/dashboard/test_browser.py drives the pages in chromium)."""

from __future__ import annotations

import re
import time

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.dashboard import auth
from app.main import create_app
from tests.app.conftest import ADMIN_TOKEN, Api
from tests.training_helpers import make_tenants, submit_job, wait_job


@pytest.fixture
def client(tmp_path):
    from app.db import migrate

    sqlite_url = f"sqlite:///{tmp_path}/fedrec.db"
    migrate(sqlite_url)
    app = create_app(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN,
                              broker_url=None))
    with TestClient(app) as c:
        yield c


def sign_in(client: TestClient, secret: str):
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/dashboard/login").text)[1]
    return client.post("/dashboard/login", data={"secret": secret, "csrf": csrf},
                       follow_redirects=False)


def test_docs_and_redoc_load_nothing_from_another_host(client):
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert assets and all(a.startswith("/static/docs/") for a in assets), assets
        for asset in assets:
            assert client.get(asset).status_code == 200, asset
    assert client.get("/openapi.json").status_code == 200


def test_pages_need_a_session_and_a_bad_secret_is_refused(client):
    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    for path in ("/dashboard", "/dashboard/tenants", "/dashboard/jobs/1"):
        response = client.get(path, follow_redirects=False)
        assert (response.status_code, response.headers["location"]) == (303,
                                                                          "/dashboard/login")
    refused = sign_in(client, "fk_000000000000_wrong")
    assert refused.status_code == 401 and "Invalid API key" in refused.text
    assert auth.COOKIE not in client.cookies


def test_a_tampered_or_stale_cookie_ends_the_session(client, monkeypatch):
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    assert client.get("/dashboard/tenants").status_code == 200
    good = client.cookies[auth.COOKIE]
    client.cookies.set(auth.COOKIE, good[:-4] + ("AAAA" if not good.endswith("AAAA")
                                                 else "BBBB"))
    assert client.get("/dashboard/tenants", follow_redirects=False).status_code == 303
    client.cookies.set(auth.COOKIE, good)
    monkeypatch.setattr(auth, "SESSION_SECONDS", 1)
    time.sleep(2.1)
    assert client.get("/dashboard/tenants", follow_redirects=False).status_code == 303


def test_a_revoked_key_ends_the_tenant_session_and_other_tenants_are_404(client):
    api = Api(client)
    mine, headers = api.tenant(name="alpha")
    other, _ = api.tenant(name="beta")
    key = headers["Authorization"].split()[1]
    client.cookies.clear()
    assert sign_in(client, key).headers["location"] == f"/dashboard/tenants/{mine}"
    assert client.get(f"/dashboard/tenants/{mine}").status_code == 200
    for path in (f"/dashboard/tenants/{other}", f"/dashboard/tenants/{other}/recommendations",
                 "/dashboard/tenants/99999", "/dashboard/jobs", "/dashboard/health"):
        page = client.get(path)
        assert page.status_code == 404 and "beta" not in page.text, path
    keys = client.get(f"/v1/admin/tenants/{mine}/api-keys", headers=api.admin).json()["data"]
    revoked = client.delete(f"/v1/admin/tenants/{mine}/api-keys/{keys[0]['id']}",
                            headers=api.admin)
    assert revoked.status_code == 200
    response = client.get(f"/dashboard/tenants/{mine}", follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/dashboard/login")


def test_job_chart_names_tenants_and_spans_its_references(client):
    from app.training import curves
    from app.training.models import TrainingJob

    admin = TestClient(client.app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    tenants = make_tenants(admin, 3, seed=1)
    created = submit_job(admin, tenant_ids=[t for t, _ in tenants], rounds=3)
    assert created.status_code == 202, created.text
    assert wait_job(admin, created.json()["id"])["status"] == "completed"
    with client.app.state.sessions() as s:
        record = s.get(TrainingJob, created.json()["id"])
        chart = curves.job_chart(s, record)
        baselines = curves.mean_baselines(s, record)
    labels = [series.label for series in chart.series]
    assert labels == ["t0", "t1", "t2", "all tenants"]  # no reference: not private
    assert chart.title.startswith(f"Test RMSE, job {record.id} (fedmc-admm), all tenants")
    assert chart.title.endswith("not private (ε = ∞)")
    lo, hi = chart.y_range()
    values = [v for series in chart.series for _, v in series.points]
    assert lo < min(values) and hi > max([*values, chart.baseline])
    assert chart.baseline == baselines["all"][0]
    n = sum(b[2] for k, b in baselines.items() if k != "all")
    pooled = (sum(b[0] ** 2 * b[2] for k, b in baselines.items() if k != "all") / n) ** 0.5
    assert baselines["all"][0] == pytest.approx(pooled)
    png = admin.get(f"/v1/admin/jobs/{record.id}/plot.png")
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"


def test_cancel_and_resume_buttons_use_the_admin_api_logic(client):
    admin = TestClient(client.app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    tenants = make_tenants(admin, 2, seed=2)
    created = submit_job(admin, tenant_ids=[t for t, _ in tenants], rounds=5000)
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    page = client.get(f"/dashboard/jobs/{job_id}")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)[1]
    assert "Cancel after this round" in page.text
    done = client.post(f"/dashboard/jobs/{job_id}/cancel", data={"csrf": csrf},
                       follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (
        303, f"/dashboard/jobs/{job_id}?done=cancel")
    assert "Cancel requested" in client.get(done.headers["location"]).text
    job = wait_job(admin, job_id)
    assert job["status"] == "cancelled" and job["current_round"] < 5000
    again = client.post(f"/dashboard/jobs/{job_id}/resume", data={"csrf": csrf})
    assert again.status_code == 409
    assert f"Job {job_id} is cancelled; nothing to resume" in again.text
    assert "Cancel after this round" not in again.text


def test_job_form_names_a_bad_field_and_dry_runs_a_tenant_level_job(client):
    admin = TestClient(client.app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    tenants = make_tenants(admin, 2, seed=3, allow_non_private=False)
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/dashboard/jobs/new").text)[1]
    form = {"csrf": csrf, "algorithm": "fedmc-admm", "rounds": "3", "privacy": "tenant",
            "mechanism": "gaussian", "noise_multiplier": "lots", "clip": "1",
            "action": "plan", "tenant_ids": [str(t) for t, _ in tenants]}
    bad = client.post("/dashboard/jobs/new", data=form)
    assert bad.status_code == 422 and "Noise multiplier: &#39;lots&#39; is not a number" in bad.text
    plan = client.post("/dashboard/jobs/new", data={**form, "noise_multiplier": "2"})
    assert plan.status_code == 200 and "nothing was created or charged" in plan.text
    assert "tenant-level DP, gaussian noise ×2.0 on uploads clipped to 1.0" in plan.text
    refused = client.post("/dashboard/jobs/new", data={**form, "privacy": "none",
                                                       "action": "start"})
    assert refused.status_code == 409 and "did not opt in to non-private training" in refused.text
    assert admin.get("/v1/admin/jobs").json()["count"] == 0


def test_the_job_form_creates_off_the_event_loop(client, monkeypatch):
    """The form's handler is async: job creation (whose dry round runs for up to
    FEDREC_DRY_ROUND_SECONDS, or waits that long for a worker) runs on a worker thread,
    not on the event loop every other request of the process shares."""
    import asyncio

    from app.services import jobs as job_service

    admin = TestClient(client.app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    tenants = make_tenants(admin, 2, seed=3)
    real, loops = job_service.create_job, []

    def create_job(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:
            loops.append(False)
        return real(*args, **kwargs)

    monkeypatch.setattr(job_service, "create_job", create_job)
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/dashboard/jobs/new").text)[1]
    plan = client.post("/dashboard/jobs/new", data={
        "csrf": csrf, "algorithm": "fedmc-admm", "rounds": "2", "privacy": "none",
        "action": "plan", "tenant_ids": [str(t) for t, _ in tenants]})
    assert plan.status_code == 200, plan.text
    assert loops == [False]


def test_job_page_shows_the_final_ranking_metrics_of_the_report(client):
    """The ranking card shows the figures the job's report holds, overall and per tenant
    by name (none before the job completes)."""
    admin = TestClient(client.app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    tenants = make_tenants(admin, 2, seed=2)
    created = submit_job(admin, tenant_ids=[t for t, _ in tenants], rounds=2)
    job_id = created.json()["id"]
    assert wait_job(admin, job_id)["status"] == "completed"
    report = admin.get(f"/v1/admin/jobs/{job_id}/report").json()
    overall = report["ranking"]
    assert overall and overall["users_ranked"] > 0
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    page = client.get(f"/dashboard/jobs/{job_id}").text
    card = page[page.index('id="ranking"'):page.index('id="privacy"')]
    assert f"NDCG@{overall['k']}" in card
    rows = re.findall(r"<tr><td>(.*?)</td>\s*<td class=\"num\">([^<]+)</td>\s*"
                      r"<td class=\"num\">([^<]+)</td>\s*<td class=\"num\">([^<]+)</td>",
                      card, re.S)
    assert rows[0][0] == "all tenants"
    assert [float(x) for x in rows[0][1:]] == pytest.approx(
        [overall["precision_at_k"], overall["recall_at_k"], overall["ndcg_at_k"]], abs=1e-4)
    per_tenant = report["ranking_per_tenant"]
    assert len(rows) == 1 + len(per_tenant)
    names = {str(t): f"t{i}" for i, (t, _) in enumerate(tenants)}
    for (cell, p, r, n), (tid, figures) in zip(rows[1:], sorted(per_tenant.items()),
                                               strict=True):
        assert f">{names[tid]}</a>" in cell
        assert [float(p), float(r), float(n)] == pytest.approx(
            [figures["precision_at_k"], figures["recall_at_k"], figures["ndcg_at_k"]],
            abs=1e-4)


def test_preview_says_why_popularity_serves_and_what_its_column_holds(client):
    """A model that lost to popularity on held-out data: the preview says so (not "no
    trained factors"), and its last column is the items' mean rating, since the list is
    ordered by the number of ratings, not by that column. A model that serves names its
    own privacy status (a non-DP job is not called private)."""
    admin = TestClient(client.app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    (tid, key), _ = make_tenants(admin, 2, seed=2)
    created = submit_job(admin, lists="auto")
    assert created.status_code == 202, created.text
    lost = wait_job(admin, created.json()["id"])
    assert lost["serving"]["lists"] == "popularity"
    user = admin.get(f"/v1/tenants/{tid}/ratings", params={"limit": 1},
                     headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["user"]
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    page = client.get(f"/dashboard/tenants/{tid}/recommendations",
                      params={"user": user}).text
    card = page[page.index('id="recommendations"'):]
    assert "ordered by number of ratings" in card and "NDCG@10" in card
    assert "no trained factors" not in card and ">Mean rating</th>" in card
    wait_job(admin, submit_job(admin).json()["id"])  # lists="model", no DP
    client.app.state.factor_cache.ttl = 0.0  # serve the new snapshot without waiting
    page = client.get(f"/dashboard/tenants/{tid}/recommendations",
                      params={"user": user}).text
    card = page[page.index('id="recommendations"'):]
    assert "not private" in card and "private model" not in card
    assert ">Score</th>" in card
