"""Job configs bounded before anything runs (422 naming the field, answered at once),
tenant settings that would break beat bounded, and a dry run that never returns a stored
job (TestClient on SQLite, pipeline in-process)."""

from __future__ import annotations

import time

import pytest

from tests.app.conftest import refusal
from tests.training_helpers import make_tenants

BASE = {"algorithm": "fedmc-admm", "rounds": 2, "per_round": 0, "seed": 1,
        "dp": {"mechanism": "gaussian", "noise_multiplier": 2.0}}


@pytest.mark.parametrize("config, field", [
    ({"rank": 10 ** 9}, "config.rank"),          # used to allocate 12.3 TiB: 500
    ({"rank": 200_000}, "config.rank"),          # fits, but a round is ~1e14 work
    ({"rank": 3, "inner_steps": 10 ** 9}, "config.inner_steps"),  # ran for minutes
])
def test_a_config_past_the_machine_is_refused_before_its_dry_round(env, config, field):
    _, client = env
    tenants = make_tenants(client)
    for dry_run in (True, False):
        start = time.monotonic()
        res = client.post("/v1/admin/jobs", params={"dry_run": dry_run},
                          json={**BASE, "config": config, "tenant_ids": [t for t, _ in tenants]})
        status, code, detail = refusal(res)
        assert (status, code) == (422, "invalid_config") and detail.startswith(
            f"invalid {field}: "), detail
        assert time.monotonic() - start < 5.0
    assert client.get("/v1/admin/jobs").json()["count"] == 0


@pytest.mark.parametrize("value", [1e30, 1e10])
def test_retrain_min_seconds_is_bounded(env, value):
    """1e30 used to be stored and then raise OverflowError on every beat tick."""
    _, client = env
    res = client.post("/v1/admin/tenants", json={"name": "x", "privacy_budget": 1.0,
                                                 "retrain_min_seconds": value})
    assert res.status_code == 422 and "retrain_min_seconds" in res.text, res.text
    tid = client.post("/v1/admin/tenants", json={"name": "y", "privacy_budget": 1.0}
                      ).json()["id"]
    res = client.patch(f"/v1/admin/tenants/{tid}", json={"retrain_min_seconds": value})
    assert res.status_code == 422 and "retrain_min_seconds" in res.text, res.text


def test_a_stored_huge_interval_does_not_break_beat(env):
    """A row written before the bound: the tenant is never due, beat does not raise."""
    import sqlalchemy as sa

    from app.models import Tenant
    from app.training.schedule import _not_consenting

    app, client = env
    tid = client.post("/v1/admin/tenants", json={
        "name": "old", "privacy_budget": 1.0, "scheduled_retraining": True}).json()["id"]
    with app.state.sessions() as s:
        s.execute(sa.update(Tenant).where(Tenant.id == tid).values(
            retrain_min_seconds=1e30, last_retrained_at=sa.func.current_timestamp()))
        s.commit()
        assert "within their minimum retraining interval" in _not_consenting(s, [tid])


def test_a_dry_run_with_a_used_idempotency_key_plans_instead_of_replaying(env):
    _, client = env
    tenants = make_tenants(client)
    body = {**BASE, "config": {"rank": 3}, "tenant_ids": [t for t, _ in tenants]}
    key = {"Idempotency-Key": "job-1"}
    created = client.post("/v1/admin/jobs", json=body, headers=key)
    assert created.status_code == 202, created.text
    plan = client.post("/v1/admin/jobs", params={"dry_run": True}, json=body, headers=key)
    assert plan.status_code == 200 and "Idempotency-Replayed" not in plan.headers
    assert "id" not in plan.json() and set(plan.json()["tenants"]) == {
        str(t) for t, _ in tenants}


def test_a_dry_round_past_its_wall_clock_bound_is_refused_naming_it(admin_app, monkeypatch):
    """A config that passes the cheap checks but whose round 1 runs long (here: a client
    step slowed to 3 s) is answered within FEDREC_DRY_ROUND_SECONDS, for a dry run and a
    creation alike, with a 422 naming the bound; nothing is stored. Overrunning rounds
    keep their slot until they end: past two, 503."""
    from app.training import dry_round

    real = dry_round.client_round

    def slow(*args, **kwargs):
        time.sleep(3.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(dry_round, "client_round", slow)
    _, client = admin_app(dry_round_seconds=0.5)
    tenants = make_tenants(client)
    body = {**BASE, "config": {"rank": 3}, "tenant_ids": [t for t, _ in tenants]}
    for dry_run in (True, False):
        start = time.monotonic()
        res = client.post("/v1/admin/jobs", params={"dry_run": dry_run}, json=body)
        status, code, detail = refusal(res)
        assert (status, code) == (422, "invalid_config"), detail
        assert "0.5 s (FEDREC_DRY_ROUND_SECONDS)" in detail, detail
        assert time.monotonic() - start < 2.5
    assert client.get("/v1/admin/jobs").json()["count"] == 0
    # both overrunning rounds still run (a thread cannot be stopped) and hold the
    # process's two slots: a third request waits out its bound for one, then 503
    res = client.post("/v1/admin/jobs", params={"dry_run": True}, json=body)
    status, _, detail = refusal(res)
    assert status == 503 and "dry rounds are running already" in detail, detail
    time.sleep(3.0)  # the discarded rounds end and give their slots back
    monkeypatch.setattr(dry_round, "client_round", real)
    assert client.post("/v1/admin/jobs", params={"dry_run": True}, json=body
                       ).status_code == 200


def test_a_quick_dry_round_is_not_affected_by_its_bound(admin_app):
    """The bound is a wall clock, not a budget of work: a round well within it plans."""
    _, client = admin_app(dry_round_seconds=30.0)
    tenants = make_tenants(client)
    body = {**BASE, "config": {"rank": 3}, "tenant_ids": [t for t, _ in tenants]}
    res = client.post("/v1/admin/jobs", params={"dry_run": True}, json=body)
    assert res.status_code == 200, res.text
