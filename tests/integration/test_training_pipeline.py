"""Training through the real pipeline: PostgreSQL, Redis and Celery worker processes.

Upload -> train -> recommend -> report for two tenants; the service's numbers equal the
simulator's on the same data, split and seed; a worker killed mid-job loses only the round
in flight, and the resumed job ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from algorithms import registry
from algorithms.simulate import simulate
from app.main import create_app
from app.training.jobs import JobSpec, create_job
from app.training.models import JobClient, LedgerEntry
from app.training.runner import run_inline
from privacy.ledger import Budget, Ledger
from privacy.wrapper import DPPrivatizer, DPSpec
from tests.integration.conftest import wait_for
from tests.training_helpers import (
    CONFIG,
    assert_same_run,
    federation_of,
    job_round,
    make_tenants,
    submit_job,
    wait_job,
)

pytestmark = pytest.mark.integration
DP = {"mechanism": "gaussian", "noise_multiplier": 2.0, "clip": 1.0}


@pytest.fixture
def api(services):
    settings, worker = services
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {settings.admin_token.get_secret_value()}"
        yield app, client, worker


def _clear(app):
    with app.state.sessions() as s:
        for table in ("training_jobs", "ratings", "users", "items", "tenants"):
            s.execute(sa.text(f"DELETE FROM {table}"))
        s.commit()


def test_upload_train_recommend_report_for_two_tenants(api):
    app, client, worker = api
    _clear(app)
    worker()
    tenants = make_tenants(client)
    job = wait_job(client, submit_job(client, dp=DP, rounds=6, per_round=1).json()["id"],
                   timeout=120)
    assert job["status"] == "completed", job
    report = client.get(f"/v1/admin/jobs/{job['id']}/report").json()
    fed, _ = federation_of(app, job["id"])
    alg = registry.get("fedmc-admm")
    budgets = {i: Budget(1000.0, 1e-5) for i in range(2)}
    sim = simulate(alg, alg.config(**CONFIG), fed, rounds=6, per_round=1, seed=11,
                   privatizer=DPPrivatizer(DPSpec(**DP), Ledger.open(budgets), seed=11))
    curve = [c["test_rmse"] for c in report["curve"]]  # fresh noise: not the simulator's
    assert len(curve) == len(sim.history) and curve != [h.test_rmse for h in sim.history]
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)
                        .where(LedgerEntry.job_id == job["id"])) == 6
    for (tid, key), (other, _) in ((tenants[0], tenants[1]), (tenants[1], tenants[0])):
        auth = {"Authorization": f"Bearer {key}"}
        with app.state.sessions() as s:
            user = s.scalars(sa.select(JobClient.user_keys).where(
                JobClient.job_id == job["id"], JobClient.tenant_id == tid)).one()[0]
        recs = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations", headers=auth).json()
        assert recs["source"] == "model" and len(recs["data"]) == 10
        own = client.get(f"/v1/tenants/{tid}/report", headers=auth).json()
        assert own["job_id"] == job["id"]
        assert set(own["privacy"]["epsilon_per_tenant"]) <= {str(tid)}
        assert client.get(f"/v1/tenants/{other}/report", headers=auth).status_code == 404


def test_killed_worker_loses_only_the_round_in_flight(api):
    app, client, worker = api
    _clear(app)
    make_tenants(client)
    rounds = 40
    with app.state.sessions() as s:
        tids = list(s.scalars(sa.select(sa.text("id")).select_from(sa.table("tenants"))
                              .order_by(sa.text("id"))))
        spec = JobSpec("fedmc-admm", tids, rounds, 1, 11, CONFIG, DP)
        reference = create_job(s, spec).id
        job_id = create_job(s, spec).id
    run_inline(app.state.sessions, reference)  # the uninterrupted run, in-process

    first = worker()
    from app.training.runner import start_job
    start_job(app, job_id)

    def progress():
        return job_round(app.state.sessions, job_id)

    wait_for(lambda: progress() >= 3, 60, "three completed rounds")
    first.kill()
    stopped_at = progress()
    assert 3 <= stopped_at < rounds, "the job finished before the worker was killed"
    worker()
    r = client.post(f"/v1/admin/jobs/{job_id}/resume")
    assert r.status_code == 202, r.text
    wait_for(lambda: progress() == rounds, 120, "the resumed job to finish")
    assert_same_run(app.state.sessions, reference, job_id, rounds)


def test_user_level_central_job_on_postgres_and_a_worker_equals_the_simulator(api):
    """User-level DP, placement central, through PostgreSQL, Redis and a real worker: the
    aggregate task charges every tenant and noises the sum; the releases are the
    simulator's, the noise fresh and secret (issue 29)."""
    from privacy import user_level

    app, client, worker = api
    _clear(app)
    worker()
    make_tenants(client, n=3, allow_non_private=False)
    body = {"algorithm": "dpals", "config": {"rank": 3, "sweeps": 2}, "rounds": 3, "seed": 7,
            "privacy": {"unit": "user", "placement": "central", "target_epsilon": 2.0,
                        "delta": 1e-3}}
    job = wait_job(client, client.post("/v1/admin/jobs", json=body).json()["id"], timeout=120)
    assert job["status"] == "completed", job
    fed, _ = federation_of(app, job["id"])
    alg = registry.get("dpals")
    cfg = alg.config(rank=3, sweeps=2)
    priv = user_level.UserLevelPrivatizer(user_level.from_settings(job["dp"]),
                                          registry.user_bounds("dpals", cfg), 3, seed=7)
    sim = simulate(alg, cfg, fed, rounds=3, per_round=3, seed=7, privatizer=priv,
                   aggregator=priv.aggregate)
    report = client.get(f"/v1/admin/jobs/{job['id']}/report").json()
    curve = [c["test_rmse"] for c in report["curve"]]
    assert len(curve) == len(sim.history) and curve != [h.test_rmse for h in sim.history]
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)
                        .where(LedgerEntry.job_id == job["id"])) == 6  # 3 tenants x 2
    assert report["privacy"]["unit"] == "user"
    assert report["privacy"]["epsilon_max"] <= 2.0 + 1e-9
