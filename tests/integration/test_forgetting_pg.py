"""Deletions interleaved with a running job on PostgreSQL: every DELETE answers 200 (no
deadlock with the aggregate step's locks), the job completes, and none of the forgotten
users is left in the job's blocks or in any snapshot, whichever step each deletion met."""

from __future__ import annotations

import secrets
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import migrate
from app.main import create_app
from app.training.models import FactorSnapshot, JobClient
from tests.training_helpers import CONFIG, job_ratings, make_tenants, submit_job, wait_job

pytestmark = pytest.mark.integration


@pytest.fixture
def env(make_postgres_db):
    url = make_postgres_db()
    migrate(url)
    token = secrets.token_urlsafe(32)
    app = create_app(Settings(database_url=url, admin_token=token, broker_url=None,
                              serving_cache_seconds=0.0))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield app, client


def test_deletions_during_a_running_job_all_win(env):
    app, client = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    users = sorted({r["user"] for r in client.get(f"/v1/tenants/{tid}/ratings",
                                                  params={"limit": 1000},
                                                  headers=auth).json()["data"]})[:8]
    job_id = submit_job(client, rounds=40, config=CONFIG).json()["id"]
    mid_job, pending = 0, list(users)
    while pending:  # one deletion every 5 rounds, the last ones near the job's end
        job = client.get(f"/v1/admin/jobs/{job_id}").json()
        running = job["status"] in ("queued", "running")
        if running and job["current_round"] < 5 * (len(users) - len(pending)):
            time.sleep(0.01)
            continue
        r = client.delete(f"/v1/tenants/{tid}/users/{pending.pop()}/ratings", headers=auth)
        assert r.status_code == 200 and r.json()["deleted"] > 0, r.text
        mid_job += running
    job = wait_job(client, job_id, timeout=120)
    assert mid_job >= 4, mid_job  # most deletions met the job between or during its steps
    assert job["status"] == "completed", job
    stored = job_ratings(app.state.sessions, job_id, tid)
    assert stored and not {u for u, _ in stored} & set(users)
    with app.state.sessions() as s:
        snaps = s.scalars(sa.select(FactorSnapshot).where(FactorSnapshot.tenant_id == tid))
        assert all(not set(snap.user_keys) & {*users, ""} for snap in snaps)
        jc = s.scalars(sa.select(JobClient).where(JobClient.job_id == job_id,
                                                  JobClient.tenant_id == tid)).one()
        assert jc.user_keys.count("") == len(users)
    for user in users:
        r = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations", headers=auth)
        assert r.status_code == 404
