"""Budgets bind every job (docs/explanation/security.md, "Privacy budgets bind"), on
embedded defaults.

* A tenant's data leaves without a DP guarantee only with its own opt-in
  (``allow_non_private``); the ledger then reads epsilon = infinity and no DP job can
  include the tenant again.
* Only a real change of a tenant's ratings starts scheduled retraining, and only for
  tenants that consented, at most once per their minimum interval.
* A job creation answered with an error leaves no job behind; an ``Idempotency-Key``
  makes a retry return the first job instead of paying again.
* A config whose step raises is refused at creation; a step that keeps raising fails its
  job after a bounded number of attempts instead of being resumed for ever.
* ``"tenant_ids": []`` is refused, never "every tenant".
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from app.models import Tenant
from app.training import pipeline
from app.training.jobs import JobSpec, create_job
from app.training.models import LedgerEntry, TrainingJob
from app.training.schedule import resume_stalled, retrain_if_changed
from tests.app.conftest import make_api, refusal
from tests.training_helpers import CONFIG, csv_body, make_tenants, submit_job, wait_job

DP = {"mechanism": "gaussian", "noise_multiplier": 2.0, "clip": 1.0}




def _count(app, table) -> int:
    with app.state.sessions() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(table))


def _upload(client, tenant: tuple[int, str], rows):
    tid, key = tenant
    return client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "text/csv"})


def _version(app, tid: int) -> int:
    with app.state.sessions() as s:
        return s.get(Tenant, tid).ratings_version


# --- defect 1: noise-free jobs are bound by the tenants' opt-in ------------------------

def test_tenant_opt_ins_are_off_by_default_and_shown_to_the_admin(env):
    _, client = env
    created = client.post("/v1/admin/tenants", json={"name": "plain", "privacy_budget": 10.0})
    assert created.status_code == 201, created.text
    shown = client.get(f"/v1/admin/tenants/{created.json()['id']}").json()
    assert {k: shown[k] for k in ("allow_non_private", "scheduled_retraining",
                                  "retrain_min_seconds", "last_retrained_at")} == {
        "allow_non_private": False, "scheduled_retraining": False,
        "retrain_min_seconds": 86400.0, "last_retrained_at": None}
    bad = client.post("/v1/admin/tenants", json={"name": "x", "privacy_budget": 1.0,
                                              "retrain_min_seconds": -1})
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == [
        "body", "retrain_min_seconds"]


def test_jobs_without_a_dp_guarantee_are_409_naming_the_tenants_without_the_opt_in(env):
    app, client = env
    (a, _), (b, _) = make_tenants(client, allow_non_private=False)
    r = submit_job(client)  # dp mechanism "none"
    assert refusal(r)[:2] == (409, "not_private_refused"), r.text
    assert r.json()["detail"] == (
        f"tenant(s) {a} (t0), {b} (t1) did not opt in to non-private training "
        "(allow_non_private is false): dp mechanism 'none' sends their uploads without noise")
    r = submit_job(client, algorithm="fedmgs", allow_not_private=True, dp=DP)
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == (
        f"tenant(s) {a} (t0), {b} (t1) did not opt in to non-private training "
        "(allow_non_private is false): fedmgs uploads reveal their ratings whatever the "
        "noise")
    assert _count(app, TrainingJob) == 0 and _count(app, LedgerEntry) == 0


def test_an_opted_in_noise_free_job_is_charged_infinity_and_ends_dp_for_the_tenant(env):
    app, client = env
    (a, key), (b, _) = make_tenants(client, budget=10.0)  # the helper opts them in
    job = wait_job(client, submit_job(client, rounds=2).json()["id"])
    assert job["status"] == "completed", job
    with app.state.sessions() as s:
        charges = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round,
                                      LedgerEntry.event)).all()
    assert sorted((t, r) for t, r, _ in charges) == [(a, 1), (a, 2), (b, 1), (b, 2)]
    assert {tuple(e["event"]) for _, _, e in charges} == {("none", 0.0, 1)}
    privacy = client.get(f"/v1/admin/jobs/{job['id']}/report").json()["privacy"]
    assert privacy["guarantee"] == "not private (epsilon = infinity)"
    assert privacy["private"] is False and privacy["epsilon_max"] == "infinity"
    assert privacy["epsilon_per_tenant"] == {str(a): "infinity", str(b): "infinity"}
    this_job = privacy["lifetime"][str(a)].pop("this_job")
    assert (this_job["epsilon"], this_job["epsilon_at_requested_delta"]) == ("infinity",
                                                                             "infinity")
    assert privacy["lifetime"][str(a)] | {"delta": None} == {
        "epsilon_spent": "infinity", "epsilon_max": 10.0, "epsilon_remaining": 0.0,
        "delta": None, "private": False, "allow_non_private": True, "unit": "tenant"}
    own = client.get(f"/v1/tenants/{a}/report", headers={"Authorization": f"Bearer {key}"})
    assert own.status_code == 200, own.text
    assert own.json()["privacy"]["guarantee"] == "not private (epsilon = infinity)"
    # infinity is spent for good: a DP job including these tenants would claim a
    # guarantee that no longer holds, so it is refused
    r = submit_job(client, dp=DP, rounds=1)
    assert refusal(r)[:2] == (409, "budget_exceeded"), r.text
    assert r.json()["detail"] == (
        f"privacy budget exceeded: tenant {a} has spent epsilon = infinity (its data was "
        "sent without noise by an earlier job, or tuned on raw ratings by a tuning job), so "
        "no differentially private job can include it; 1 other tenant(s) too")
    assert _count(app, TrainingJob) == 1


# --- defect 2: only consenting tenants, on a real change, at their rate --------------

def test_an_upload_that_changes_nothing_leaves_the_ratings_version(env):
    app, client = env
    tenant, _ = make_tenants(client)
    v0 = _version(app, tenant[0])
    auth = {"Authorization": f"Bearer {tenant[1]}"}
    for body, kind in ((b"user,item,rating\n", "text/csv"), (b'{"ratings": []}',
                                                              "application/json")):
        r = client.post(f"/v1/tenants/{tenant[0]}/ratings", content=body,
                        headers={**auth, "Content-Type": kind})
        assert r.status_code in (200, 422), r.text  # stored nothing either way
        if r.status_code == 200:
            assert r.json() == {"stored": 0}
        assert _version(app, tenant[0]) == v0
    assert _upload(client, tenant, [("late", "i1", 3.0)]).json() == {"stored": 1}
    assert _version(app, tenant[0]) == v0 + 1
    assert _upload(client, tenant, [("late", "i1", 3.0)]).json() == {"stored": 1}
    assert _version(app, tenant[0]) == v0 + 1  # the same rating again: no change
    _upload(client, tenant, [("late", "i1", 4.0)]).raise_for_status()
    assert _version(app, tenant[0]) == v0 + 2


def test_an_unchanged_upload_leaves_the_version_on_both_databases(api):
    """The same through the PostgreSQL COPY path: its row count is the real change."""
    api.items("j1", "j2")
    tid, auth = api.tenant()
    app = api.client.app
    rows = "user,item,rating,timestamp\nu1,j1,4,978300760\nu2,j2,3,\n"
    for expected in (1, 1):  # the second, identical upload changes nothing
        assert api.upload_csv(tid, auth, rows).json() == {"stored": 2}
        assert _version(app, tid) == expected
    changed = "user,item,rating,timestamp\nu1,j1,4,978300761\nu2,j2,3,\n"  # a timestamp
    assert api.upload_csv(tid, auth, changed).json() == {"stored": 2}
    assert _version(app, tid) == 2
    assert api.upload_csv(tid, auth, "user,item,rating\n").status_code in (200, 422)
    assert _version(app, tid) == 2


def test_retraining_never_charges_a_tenant_that_did_not_consent(env):
    app, client = env
    tenants = make_tenants(client, budget=100.0)  # scheduled_retraining off (the default)
    first = wait_job(client, submit_job(client, dp=DP, rounds=2).json()["id"])
    assert first["status"] == "completed"
    charged = _count(app, LedgerEntry)
    _upload(client, tenants[0], [("late", "i1", 3.0)]).raise_for_status()
    assert retrain_if_changed(app.state.sessions,
                              pipeline.InlineDispatcher(app.state.sessions)) is None
    assert _count(app, TrainingJob) == 1 and _count(app, LedgerEntry) == charged


def test_retraining_runs_at_most_once_per_tenants_minimum_interval(env):
    app, client = env
    tenants = make_tenants(client, budget=100.0, scheduled_retraining=True,
                           retrain_min_seconds=3600)
    wait_job(client, submit_job(client, dp=DP, rounds=2).json()["id"])
    dispatch = pipeline.InlineDispatcher(app.state.sessions)
    _upload(client, tenants[0], [("late", "i1", 3.0)]).raise_for_status()
    second = retrain_if_changed(app.state.sessions, dispatch)
    assert second is not None
    dispatch.drain()
    assert client.get(f"/v1/admin/jobs/{second}").json()["status"] == "completed"
    _upload(client, tenants[1], [("later", "i2", 2.0)]).raise_for_status()
    assert retrain_if_changed(app.state.sessions, dispatch) is None  # within the hour
    assert _count(app, TrainingJob) == 2
    with app.state.sessions() as s:  # an hour later
        for t in s.scalars(sa.select(Tenant)):
            assert t.last_retrained_at is not None
            t.last_retrained_at -= dt.timedelta(seconds=3601)
        s.commit()
    assert retrain_if_changed(app.state.sessions, dispatch) is not None


# --- defect 5: no job behind an error; Idempotency-Key ---------------------------------

class _BrokerDown(pipeline.InlineDispatcher):
    def send(self, task, *args):
        from kombu.exceptions import OperationalError

        raise OperationalError("Error 111 connecting to 127.0.0.1:1. Connection refused.")


def test_a_retraining_that_cannot_be_enqueued_leaves_no_job(env):
    app, client = env
    tenants = make_tenants(client, scheduled_retraining=True, retrain_min_seconds=0)
    wait_job(client, submit_job(client, rounds=1).json()["id"])
    _upload(client, tenants[0], [("late", "i1", 3.0)]).raise_for_status()
    with pytest.raises(Exception, match="Connection refused"):
        retrain_if_changed(app.state.sessions, _BrokerDown(app.state.sessions))
    assert _count(app, TrainingJob) == 1
    assert resume_stalled(app.state.sessions, pipeline.InlineDispatcher(app.state.sessions),
                          -1.0) == []


def test_a_job_refused_during_a_broker_outage_leaves_no_job_and_a_keyed_retry_pays_once(
        sqlite_url):
    down = make_api(sqlite_url, broker_url="redis://127.0.0.1:1/0")
    down.client.headers.update(down.admin)
    make_tenants(down.client)
    body = {"algorithm": "fedmc-admm", "config": CONFIG, "rounds": 2, "seed": 1, "dp": DP}
    key = {"Idempotency-Key": "train-2026-11-24"}
    r = down.client.post("/v1/admin/jobs", json=body, headers=key)
    assert r.status_code == 503, r.text
    assert refusal(r) == (503, "broker_unavailable",
                          "The broker is unavailable; retry the request later")
    app = down.client.app
    assert _count(app, TrainingJob) == 0  # nothing for the watchdog to run later
    assert resume_stalled(app.state.sessions, pipeline.InlineDispatcher(app.state.sessions),
                          -1.0) == []
    up = make_api(sqlite_url)  # the broker is back (here: tasks in-process)
    up.client.headers.update(up.admin)
    first = up.client.post("/v1/admin/jobs", json=body, headers=key)
    assert first.status_code == 202, first.text
    again = up.client.post("/v1/admin/jobs", json=body, headers=key)
    assert again.status_code == 200 and again.headers["Idempotency-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    wait_job(up.client, first.json()["id"])
    assert _count(app, TrainingJob) == 1
    assert _count(app, LedgerEntry) == 4  # 2 tenants x 2 rounds, paid once


def test_the_same_idempotency_key_with_another_body_is_422(env):
    app, client = env
    make_tenants(client)
    key = {"Idempotency-Key": "k1"}
    body = {"algorithm": "dpals", "config": CONFIG, "dp": DP}
    first = client.post("/v1/admin/jobs", json={**body, "rounds": 1},
                        headers=key)
    assert first.status_code == 202, first.text
    other = client.post("/v1/admin/jobs", json={**body, "rounds": 2},
                        headers=key)
    assert refusal(other)[:2] == (422, "idempotency_conflict")
    assert other.json()["detail"] == ("Idempotency-Key 'k1' was already used with a "
                                      "different request body; use a new key for a new job")
    empty = client.post("/v1/admin/jobs", json={**body, "rounds": 1},
                        headers={"Idempotency-Key": ""})
    assert refusal(empty)[:2] == (422, "validation_error")
    assert empty.json()["errors"][0]["loc"] == ["header", "idempotency-key"]
    assert _count(app, TrainingJob) == 1


# --- defect 6: configs checked at creation, failures bounded ----------------------------

def _failing_server_step(monkeypatch, message: str) -> None:
    """FedMC-ADMM whose server step raises ``ValueError(message)`` (as a config whose
    aggregate step fails would), wherever the service looks it up."""
    import dataclasses

    from algorithms import registry

    real = registry.get

    def raises(*_):
        raise ValueError(message)

    def get(name):
        alg = real(name)
        return dataclasses.replace(alg, server_step=raises) if name == "fedmc-admm" else alg

    monkeypatch.setattr(registry, "get", get)


def test_a_config_whose_step_raises_is_422_at_creation(env, monkeypatch):
    app, client = env
    make_tenants(client)
    _failing_server_step(monkeypatch, "these settings cannot aggregate")
    r = submit_job(client, config={"rank": 3})
    assert refusal(r)[:2] == (422, "invalid_config"), r.text
    assert r.json()["detail"] == ("invalid config: round 1 fails with these settings "
                                  "(ValueError: these settings cannot aggregate)")
    assert _count(app, TrainingJob) == 0


class _CeleryLikeWorker(pipeline.InlineDispatcher):
    """Runs each task as a Celery worker does: a task that raises is logged and dropped."""

    def drain(self):
        while self._queue:
            task, args = self._queue.popleft()
            try:
                pipeline.TASKS[task](self.sessions, self, *args)
            except ValueError:
                pass


def test_a_step_that_keeps_raising_fails_the_job_after_bounded_attempts(env, monkeypatch):
    app, client = env
    tenants = make_tenants(client)
    with app.state.sessions() as s:
        job_id = create_job(s, JobSpec("fedmc-admm", [t for t, _ in tenants], 3, 0, 11,
                                       CONFIG, {"mechanism": "none"})).id
    calls = []

    def exploding(*args, **kwargs):
        calls.append(args[2])
        raise ValueError("server step exploded")

    monkeypatch.setattr(pipeline, "server_round", exploding)
    worker = _CeleryLikeWorker(app.state.sessions)
    worker.send(pipeline.TASK_START, job_id, 1)
    worker.drain()
    for _ in range(6):  # beat's watchdog, every FEDREC_STALLED_JOB_SECONDS
        resume_stalled(app.state.sessions, worker, -1.0)
        worker.drain()
    job = client.get(f"/v1/admin/jobs/{job_id}").json()
    assert (job["status"], job["current_round"]) == ("failed", 0)
    assert job["error"] == "ValueError: server step exploded (attempt 3 of 3; job failed)"
    assert calls == [1, 1, 1]
    assert resume_stalled(app.state.sessions, worker, -1.0) == []  # left alone now
    assert _count(app, LedgerEntry) == 2  # round 1's two transmissions, charged once


def test_an_outage_is_not_counted_against_the_job(env):
    """A broker outage makes every step that sends fail; that is not the job's fault, so
    it never uses up its attempts (the watchdog resumes it once the broker is back)."""
    app, client = env
    tenants = make_tenants(client)
    with app.state.sessions() as s:
        job_id = create_job(s, JobSpec("fedmc-admm", [t for t, _ in tenants], 2, 0, 11,
                                       CONFIG, {"mechanism": "none"})).id
    for _ in range(4):
        with pytest.raises(Exception, match="Connection refused"):
            pipeline.TASKS[pipeline.TASK_START](app.state.sessions,
                                                _BrokerDown(app.state.sessions), job_id, 1)
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        assert (job.status, job.attempts, job.error) == ("running", 0, None)


# --- defect 9: an empty participant list ------------------------------------------------

def test_empty_tenant_ids_is_422_not_every_tenant(env):
    app, client = env
    make_tenants(client)
    r = submit_job(client, tenant_ids=[])
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == ["body", "tenant_ids"]
    assert r.json()["errors"][0]["type"] == "too_short"
    assert _count(app, TrainingJob) == 0


def test_null_tenant_ids_still_means_every_tenant(env):
    _, client = env
    (a, _), (b, _) = make_tenants(client)
    body = {"algorithm": "fedmc-admm", "config": CONFIG, "rounds": 1,
            "dp": {"mechanism": "none"}, "tenant_ids": None}
    job = wait_job(client, client.post("/v1/admin/jobs", json=body).json()["id"])
    assert job["tenant_ids"] == [a, b]
