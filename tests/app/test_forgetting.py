"""Forgetting a user wins against every job step, however the deletion and the job
interleave, and can be repeated; a later upload for the same key is a new consent."""

from __future__ import annotations

import secrets
import threading
import time

import numpy as np
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient

from app import models
from app.config import Settings
from app.db import downgrade, make_engine, migrate
from app.main import create_app
from app.training import jobs
from app.training.models import FactorSnapshot
from app.training.states import local_state_bytes
from tests.app.conftest import refusal
from tests.integration.conftest import wait_for
from tests.training_helpers import csv_body, job_ratings, make_tenants, submit_job, wait_job


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def env(request, tmp_path):
    """The API, and a second API process on the same database (its own caches), on
    SQLite and (integration) on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/forget.db"
    else:
        url = request.getfixturevalue("make_postgres_db")()
    migrate(url)
    token = secrets.token_urlsafe(32)

    def app_():
        return create_app(Settings(database_url=url, admin_token=token, broker_url=None,
                                   serving_cache_seconds=0.0))

    app, other = app_(), app_()
    with TestClient(app) as client, TestClient(other) as other_client:
        for c in (client, other_client):
            c.headers["Authorization"] = f"Bearer {token}"
        yield app, client, other_client


def _a_user(client, tid, auth) -> str:
    page = client.get(f"/v1/tenants/{tid}/ratings", params={"limit": 1}, headers=auth).json()
    return page["data"][0]["user"]


def _snapshot_users(app, tid) -> list[list[str]]:
    with app.state.sessions() as s:
        return [snap.user_keys for snap in s.scalars(sa.select(FactorSnapshot).where(
            FactorSnapshot.tenant_id == tid))]


def _delete_during_job_creation(monkeypatch, other_client, path, auth) -> list:
    """Make the next job creation read its ratings, then let another API process forget
    the user before the job's rows are committed (the race of the issue)."""
    answers = []
    original = jobs._tenant_block

    def racing(s, tenant, *args):
        out = original(s, tenant, *args)
        if not answers:  # once the first tenant's ratings are read
            answers.append(other_client.delete(path, headers=auth))
        return out

    monkeypatch.setattr(jobs, "_tenant_block", racing)
    return answers


def test_a_deletion_during_job_creation_wins_and_can_be_repeated(env, monkeypatch):
    app, client, other_client = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    user = _a_user(client, tid, auth)
    path = f"/v1/tenants/{tid}/users/{user}/ratings"
    answers = _delete_during_job_creation(monkeypatch, other_client, path, auth)
    job = wait_job(client, submit_job(client).json()["id"])
    assert job["status"] == "completed", job
    assert answers[0].status_code == 200 and answers[0].json()["deleted"] > 0
    stored = job_ratings(app.state.sessions, job["id"], tid)
    assert stored and not [k for k in stored if k[0] == user]  # scrubbed from the blocks
    assert all(user not in keys and "" not in keys for keys in _snapshot_users(app, tid))
    r = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations", headers=auth)
    assert r.status_code == 404
    again = client.delete(path, headers=auth)  # repeatable: nothing remained
    assert again.status_code == 200 and again.json() == {"user": user, "deleted": 0}
    never = client.delete(f"/v1/tenants/{tid}/users/never-seen/ratings", headers=auth)
    assert refusal(never) == (404, "user_not_found", "User not found")


def test_an_upload_after_forgetting_is_a_new_consent(env, monkeypatch):
    app, client, other_client = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    user = _a_user(client, tid, auth)
    path = f"/v1/tenants/{tid}/users/{user}/ratings"
    _delete_during_job_creation(monkeypatch, other_client, path, auth)
    raced = wait_job(client, submit_job(client).json()["id"])
    monkeypatch.undo()
    rows = [(user, "i1", 2.0), (user, "i2", 5.0), (user, "i3", 4.0), (user, "i4", 1.0),
            (user, "i5", 3.0)]
    client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                headers={**auth, "Content-Type": "text/csv"}).raise_for_status()
    fresh = wait_job(client, submit_job(client, seed=3, test_fraction=0.0).json()["id"])
    mine = {k: v for k, v in job_ratings(app.state.sessions, fresh["id"], tid).items()
            if k[0] == user}
    assert mine == {(user, i): v for _, i, v in rows}  # exactly the new ratings
    assert not [k for k in job_ratings(app.state.sessions, raced["id"], tid) if k[0] == user]
    r = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations", headers=auth).json()
    assert r["source"] == "model" and r["job_id"] == fresh["id"]


def test_the_tombstone_table_matches_the_model_and_downgrades(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    migrate(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                 models.Base.metadata)
    assert [d for d in diffs if "forgotten_users" in str(d)] == []
    downgrade(url, "0002")
    assert "forgotten_users" not in sa.inspect(make_engine(url)).get_table_names()
    engine.dispose()


def test_a_deletion_racing_the_final_aggregate_step_is_honoured(env, monkeypatch):
    """The deletion commits just after the last aggregate step read the tombstones: it
    waits for that step and then scrubs the snapshot the step published."""
    from app.training import forget

    app, client, other_client = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    user = _a_user(client, tid, auth)
    answers, original = [], forget.forgotten_since

    def racing(s, job, tenant_ids=None):
        out = original(s, job, tenant_ids)
        if tenant_ids is None and job.current_round == job.rounds - 1 and not answers:
            answers.append(None)
            threading.Thread(target=lambda: answers.append(other_client.delete(
                f"/v1/tenants/{tid}/users/{user}/ratings", headers=auth))).start()
            time.sleep(0.5)  # the deletion would commit now, were it not kept waiting
        return out

    monkeypatch.setattr(forget, "forgotten_since", racing)
    job = wait_job(client, submit_job(client).json()["id"])
    assert job["status"] == "completed", job
    wait_for(lambda: len(answers) == 2, 30, "the racing deletion")
    assert answers[1].status_code == 200 and answers[1].json()["deleted"] > 0
    assert all(user not in keys for keys in _snapshot_users(app, tid))
    r = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations", headers=auth)
    assert r.status_code == 404


def test_forgetting_zeroes_the_users_rows_of_every_stored_local_state(env):
    """The user's U_i row (and any per-user array) of a finished job's local state is
    erased with the ratings; the other users' rows are untouched."""
    from algorithms import Message
    from app.training.models import JobClient

    app, client, _ = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    user = _a_user(client, tid, auth)
    job = wait_job(client, submit_job(client).json()["id"])
    assert job["status"] == "completed", job

    def stored():
        with app.state.sessions() as s:
            jc = s.scalars(sa.select(JobClient).where(JobClient.job_id == job["id"],
                                                      JobClient.tenant_id == tid)).one()
            return list(jc.user_keys), Message.from_bytes(
                local_state_bytes(s, job["id"], jc.client_index))

    keys, before = stored()
    row = keys.index(user)
    fields = type(before).user_rows
    assert fields and all(getattr(before, f)[row].any() for f in fields)
    r = client.delete(f"/v1/tenants/{tid}/users/{user}/ratings", headers=auth)
    assert r.status_code == 200 and r.json()["deleted"] > 0
    keys_after, after = stored()
    assert keys_after[row] == "" and user not in keys_after
    for f in fields:
        assert not getattr(after, f)[row].any(), f
        np.testing.assert_array_equal(np.delete(getattr(after, f), row, axis=0),
                                      np.delete(getattr(before, f), row, axis=0))
