"""The dashboard in a real browser: Debian's chromium (``/usr/bin/chromium``, installed by
``.ci/run``) driven by Playwright, against the API served by uvicorn on an embedded SQLite
database with in-process tasks.

An operator signs in, dry-runs and starts a small DPALS job, watches it finish, and sees
the curve and every tenant's budget change; a tenant signs in, sees its own pages and a
recommendation preview, and gets a 404 for another tenant's page and for operator pages.
Screenshots of each page go to ``FEDREC_SCREENSHOTS`` (those of docs/how-to/dashboard.md are
made with ``FEDREC_SCREENSHOTS=docs/screenshots``), else to the test's temporary folder.
"""

from __future__ import annotations

import io
import os
import re
import secrets
from pathlib import Path

import httpx
import numpy as np
import pytest

from algorithms.synthetic import generate_ratings
from tests.conftest import services_required

CHROMIUM = os.environ.get("FEDREC_CHROMIUM", "/usr/bin/chromium")
ROUNDS = 4
pytestmark = pytest.mark.slow


def _require_browser():
    missing = [what for what, ok in (("chromium", Path(CHROMIUM).is_file()),
                                     ("playwright", _has_playwright())) if not ok]
    if missing:
        message = (f"{', '.join(missing)} not installed (apt-get install chromium; "
                   "pip install playwright)")
        if services_required():
            pytest.fail(message + "; CI installs it (.ci/run)", pytrace=False)
        pytest.skip(message)


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def _csv(users, items, values) -> bytes:
    buf = io.StringIO()
    buf.write("user,item,rating\n")
    for u, i, v in zip(users.tolist(), items.tolist(), values.tolist(), strict=True):
        buf.write(f"u{u},{i},{v:g}\n")
    return buf.getvalue().encode()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The API on a free port with three tenants (and their noise-free copies, trained
    without noise as the reference curve), each with an API key and uploaded ratings."""
    from app.commands.demo import _free_port, start_server
    from app.config import Settings
    from app.db import migrate

    _require_browser()
    url = f"sqlite:///{tmp_path_factory.mktemp('dash')}/fedrec.db"
    migrate(url)
    token = secrets.token_urlsafe(32)
    port = _free_port()
    server, thread = start_server(Settings(database_url=url, admin_token=token,
                                            broker_url=None), port)
    base = f"http://127.0.0.1:{port}"
    ratings = generate_ratings(300, 200, 12_000, seed=3)
    admin = httpx.Client(base_url=base, timeout=60,
                         headers={"Authorization": f"Bearer {token}"})
    items = np.unique(ratings.items)
    admin.put("/v1/admin/items", json={"items": [{"key": str(i), "title": f"Film {i}"}
                                              for i in items.tolist()]}).raise_for_status()
    owner = np.asarray(ratings.users) % 3
    tenants = {}
    for copy in ("", "-noise-free"):
        for t, name in enumerate(("northwind", "contoso", "fabrikam")):
            made = admin.post("/v1/admin/tenants", json={
                "name": name + copy, "rating_min": 1, "rating_max": 5, "privacy_budget": 20,
                "allow_non_private": bool(copy)})
            made.raise_for_status()
            tid = made.json()["id"]
            key = admin.post(f"/v1/admin/tenants/{tid}/api-keys").json()["key"]
            mine = owner == t
            up = admin.post(f"/v1/tenants/{tid}/ratings", headers={
                "Authorization": f"Bearer {key}", "Content-Type": "text/csv"},
                content=_csv(ratings.users[mine], ratings.items[mine], ratings.values[mine]))
            up.raise_for_status()
            tenants[name + copy] = {"id": tid, "key": key,
                                    "user": f"u{ratings.users[mine][0]}"}
    copies = [v["id"] for k, v in tenants.items() if k.endswith("-noise-free")]
    ref = admin.post("/v1/admin/jobs", json={"algorithm": "dpals", "rounds": ROUNDS,
                                          "tenant_ids": copies, "dp": {"mechanism": "none"},
                                          "allow_not_private": True})
    assert ref.status_code == 202, ref.text
    _wait(admin, ref.json()["id"])
    yield {"base": base, "token": token, "tenants": tenants, "admin": admin,
           "reference_job": ref.json()["id"]}
    admin.close()
    server.should_exit = True
    thread.join(timeout=10)


def _wait(api: httpx.Client, job_id: int) -> dict:
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = api.get(f"/v1/admin/jobs/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            assert job["status"] == "completed", job
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    _require_browser()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    where = os.environ.get("FEDREC_SCREENSHOTS")
    folder = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _page(browser, base: str, phone: bool = False):
    size = {"width": 390, "height": 844} if phone else {"width": 1280, "height": 800}
    context = browser.new_context(viewport=size, base_url=base, locale="en-US",
                                  timezone_id="Asia/Tokyo", is_mobile=phone)
    context.set_default_timeout(15_000)
    return context, context.new_page()


def _sign_in(page, secret: str) -> None:
    page.goto("/dashboard/login")
    page.get_by_label("Admin token or tenant API key").fill(secret)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def _fits_width(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


def _spent(page, tenant: str) -> float:
    row = page.locator("tr", has=page.get_by_role("link", name=tenant, exact=True))
    text = row.locator("td").nth(4).inner_text()
    return float(text.split("/")[0].strip())


def test_operator_starts_a_job_and_watches_it_finish(service, browser, shots):
    context, page = _page(browser, service["base"])
    _sign_in(page, "not-a-token")
    assert "Not the admin token" in page.get_by_role("alert").inner_text()
    _sign_in(page, service["token"])
    assert page.url.endswith("/dashboard/tenants")
    cookie = next(c for c in context.cookies() if c["name"] == "fedrec_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert service["token"] not in cookie["value"]
    before = _spent(page, "northwind")
    assert before == 0.0
    page.screenshot(path=shots / "operator-tenants.png", full_page=True)

    page.get_by_role("link", name="Start a job").first.click()
    page.get_by_label("Algorithm").select_option("dpals")
    for name in ("northwind", "contoso", "fabrikam"):
        page.get_by_role("checkbox", name=re.compile(rf"^{name} \(")).check()
    page.get_by_label("Rounds").fill(str(ROUNDS))
    page.get_by_label("Privacy: protected unit").select_option("user")
    page.get_by_label("Target epsilon").fill("4")
    page.get_by_role("button", name=re.compile("Dry run")).click()
    plan = page.locator("#plan")
    assert "nothing was created or charged" in plan.inner_text()
    row = plan.locator("tr", has_text="northwind").locator("td")
    assert float(row.nth(1).inner_text()) == 0.0
    planned = float(row.nth(2).inner_text())  # at the tenant's budget delta (1e-5 > 1e-6)
    assert 0 < planned <= 4.0
    page.screenshot(path=shots / "operator-start-job.png", full_page=True)
    assert service["admin"].get("/v1/admin/jobs").json()["count"] == 1  # the reference only

    page.get_by_role("button", name="Start the job").click()
    page.wait_for_url(re.compile(r"/dashboard/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    page.wait_for_selector(".status.completed", timeout=120_000)  # the page refreshes itself
    page.reload()
    overall = page.locator("#rmse polyline.overall")
    assert len(overall.get_attribute("points").split()) == ROUNDS
    assert page.locator("#rmse polyline.reference").count() == 1
    assert page.locator("#rmse line.baseline").count() == 1
    caption = page.locator("#rmse figcaption").inner_text()
    assert "ε = 4" in caption and "user level" in caption
    legend = page.locator("#rmse ul.legend").inner_text()
    assert "northwind" in legend and "contoso" in legend and "without noise" in legend
    report = service["admin"].get(f"/v1/admin/jobs/{job_id}/report").json()
    last = report["curve"][-1]["test_rmse"]
    assert f"{last:.4f}" in page.locator(".stat", has_text="Test RMSE").inner_text()
    assert "Protected unit: one user" in page.locator("#privacy").inner_text()
    assert re.search(r"\d{4}-\d\d-\d\dT", page.locator("time").first.inner_text()) is None
    page.screenshot(path=shots / "operator-job.png", full_page=True)

    page.get_by_role("link", name="Tenants", exact=True).click()
    after = _spent(page, "northwind")
    spent = report["privacy"]["lifetime"][str(service["tenants"]["northwind"]["id"])]
    assert after == pytest.approx(spent["epsilon_spent"], abs=0.01)
    assert after == pytest.approx(planned, abs=0.01)  # the dry run told the truth
    page.get_by_role("link", name="Jobs", exact=True).click()
    assert page.locator("tr", has_text=f"job {job_id}").locator(".status").inner_text() \
        == "completed"
    page.screenshot(path=shots / "operator-jobs.png", full_page=True)
    page.get_by_role("link", name="Health").click()
    assert "ok" in page.locator("tr", has_text="Database").inner_text()
    page.screenshot(path=shots / "operator-health.png", full_page=True)
    page.get_by_role("button", name="Sign out").click()
    assert page.url.endswith("/dashboard/login")
    page.goto("/dashboard/jobs")
    assert page.url.endswith("/dashboard/login")
    context.close()


def test_tenant_sees_only_its_own_pages(service, browser, shots):
    northwind, contoso = service["tenants"]["northwind"], service["tenants"]["contoso"]
    context, page = _page(browser, service["base"])
    _sign_in(page, northwind["key"])
    assert page.url.endswith(f"/dashboard/tenants/{northwind['id']}")
    assert page.locator("h1").inner_text() == "northwind"
    assert page.locator("svg.hist rect").count() >= 2
    page.screenshot(path=shots / "tenant-home.png", full_page=True)

    page.get_by_role("link", name="Recommendations", exact=True).click()
    page.get_by_label("User key").fill(northwind["user"])
    page.get_by_role("button", name="Show recommendations").click()
    rows = page.locator("#recommendations tbody tr")
    assert rows.count() == 10
    assert "Film " in rows.first.inner_text()
    page.screenshot(path=shots / "tenant-recommendations.png", full_page=True)

    for path in (f"/dashboard/tenants/{contoso['id']}", f"/dashboard/tenants/{contoso['id']}"
                 "/recommendations", "/dashboard/jobs", "/dashboard/tenants",
                 "/dashboard/health", "/dashboard/tenants/999999"):
        response = page.goto(path)
        assert response.status == 404, path
        assert "contoso" not in page.content()
    context.close()


def test_pages_fit_a_phone_screen(service, browser, shots):
    context, page = _page(browser, service["base"], phone=True)
    _sign_in(page, service["token"])
    for name, path in (("phone-tenants", "/dashboard/tenants"), ("phone-jobs", "/dashboard/jobs"),
                       ("phone-job", "/dashboard/jobs/1"), ("phone-start-job",
                                                            "/dashboard/jobs/new")):
        page.goto(path)
        assert page.locator("body").evaluate(
            "b => getComputedStyle(b).overflowX") != "scroll"
        assert _fits_width(page), path  # wide tables scroll inside their own box
        page.screenshot(path=shots / f"{name}.png", full_page=True)
    context.close()


def test_forms_need_the_session_csrf_token(service):
    with httpx.Client(base_url=service["base"]) as client:
        form = client.get("/dashboard/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)[1]
        refused = client.post("/dashboard/login", data={"secret": service["token"],
                                                        "csrf": "forged"})
        assert refused.status_code == 403
        assert "fedrec_session" not in client.cookies
        csrf = re.search(r'name="csrf" value="([^"]+)"', refused.text)[1]  # a new form
        signed = client.post("/dashboard/login", data={"secret": service["token"],
                                                       "csrf": csrf})
        assert signed.status_code == 303
        body = {"algorithm": "dpals", "rounds": "2", "privacy": "user", "epsilon": "1",
                "action": "start"}
        assert client.post("/dashboard/jobs/new", data=body).status_code == 403
        assert client.post("/dashboard/jobs/1/cancel", data={}).status_code == 403
        assert client.post("/dashboard/logout", data={"csrf": "x"}).status_code == 403
    assert service["admin"].get("/v1/admin/jobs").json()["count"] <= 2  # nothing was started


def test_operator_starts_the_default_job_and_sees_which_model_serves_lists(
        service, browser, shots):
    """The form's default algorithm is the default job: dp-ials for the lists and dpals
    for the ratings; the ranking job's page names the model behind the lists and the one
    behind the RMSE, and shows a most-popular list's figures on the same split."""
    context, page = _page(browser, service["base"])
    _sign_in(page, service["token"])
    page.goto("/dashboard/jobs/new")
    assert page.get_by_label("Algorithm").input_value() == ""
    assert "dp-ials (ranking model" in page.get_by_label("Algorithm").inner_text()
    for name in ("northwind", "contoso", "fabrikam"):
        page.get_by_role("checkbox", name=re.compile(rf"^{name} \(")).check()
    page.get_by_label("Rounds").fill(str(ROUNDS))
    page.get_by_label("Privacy: protected unit").select_option("user")
    page.get_by_label("Target epsilon").fill("4")
    page.get_by_role("button", name=re.compile("Dry run")).click()
    assert "nothing was created or charged" in page.locator("#plan").inner_text()
    page.get_by_role("button", name="Start the job").click()
    page.wait_for_url(re.compile(r"/dashboard/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    page.wait_for_selector(".status.completed", timeout=120_000)
    admin = service["admin"]
    job = admin.get(f"/v1/admin/jobs/{job_id}").json()
    assert (job["algorithm"], job["model_kind"]) == ("dp-ials", "ranking")
    _wait(admin, job["pair_job_id"])
    page.reload()
    models = page.locator("#models").inner_text()
    assert "ranking model" in models and "dp-ials" in models
    assert f"dpals (job {job['pair_job_id']}, a rating model)" in models
    report = admin.get(f"/v1/admin/jobs/{job_id}/report").json()
    popularity = page.locator("#ranking tr.popularity").inner_text()
    assert f"{report['popularity']['ndcg_at_k']:.4f}" in popularity
    served = "dp-ials" if job["serving"]["lists"] == "model" else "popularity"
    assert f"Served lists: {served}." in page.locator("#ranking").inner_text()
    page.screenshot(path=shots / "operator-default-job.png", full_page=True)
    context.close()
