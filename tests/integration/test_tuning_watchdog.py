"""A tuning job whose worker is killed mid-search: the watchdog tells it from a live search
by its heartbeat, sends it again, and a second worker completes it (it used to stay
``running`` until the broker's one-hour visibility timeout, or for ever after a Redis
restart)."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.main import create_app
from app.training.runner import CeleryDispatcher
from app.training.schedule import resume_stalled_tuning
from tests.integration.conftest import wait_for
from tests.training_helpers import make_tenants

pytestmark = pytest.mark.integration
STALLED = 4.0
SEARCH = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 200, "trials": 6,
          "eta": 2, "seed": 5, "budget_seconds": 600}


@pytest.fixture
def api(services):
    settings, worker = services
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {settings.admin_token.get_secret_value()}"
        with app.state.sessions() as s:
            for table in ("tuning_jobs", "training_jobs", "ratings", "users", "items",
                          "tenants"):
                s.execute(sa.text(f"DELETE FROM {table}"))
            s.commit()
        yield app, client, worker


def test_a_killed_worker_s_tuning_job_is_sent_again_and_completes(api):
    app, client, worker = api
    make_tenants(client, n=2)
    first = worker(FEDREC_STALLED_JOB_SECONDS=str(STALLED))
    tuning_id = client.post("/v1/admin/tuning-jobs", json=SEARCH).json()["id"]

    def read() -> dict:
        return client.get(f"/v1/admin/tuning-jobs/{tuning_id}").json()

    wait_for(lambda: len(read()["scored"]) >= 1, 120, "the first scored trial")
    first.kill()
    assert read()["status"] == "running"
    worker(FEDREC_STALLED_JOB_SECONDS=str(STALLED))
    dispatch = CeleryDispatcher(app.state.celery)
    wait_for(lambda: resume_stalled_tuning(app.state.sessions, dispatch, STALLED), 30,
             "the watchdog to find the dead worker's search")
    resent, end = 0, time.monotonic() + 300
    while (status := read()["status"]) in ("queued", "running") and time.monotonic() < end:
        if status == "running":  # claimed by the new worker, which beats every STALLED / 4 s
            resent += len(resume_stalled_tuning(app.state.sessions, dispatch, STALLED))
        time.sleep(0.5)
    job = read()
    assert job["status"] == "completed", job
    assert resent == 0
    assert job["config"]["rank"] == 3 and job["chosen_rounds"] <= SEARCH["rounds"]
