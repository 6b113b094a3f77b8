"""Tuning jobs through the admin API: the search runs on the tenants' training ratings
only, its choice is a training job's config, and it needs every tenant's opt-in to
non-private training."""

from __future__ import annotations

import time

import pytest

from algorithms import registry
from algorithms.data import Federation
from algorithms.tuning import tune
from tests.training_helpers import federation_of, make_tenants, submit_job, wait_job

SEARCH = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 6, "trials": 4,
          "eta": 2, "seed": 5, "budget_seconds": 600}


def wait_tuning(client, tuning_id, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = client.get(f"/v1/admin/tuning-jobs/{tuning_id}").json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"tuning job {tuning_id} did not finish: {job}")


def test_a_tuning_job_chooses_a_config_a_training_job_accepts(env):
    app, client = env
    make_tenants(client, n=2)
    created = client.post("/v1/admin/tuning-jobs", json=SEARCH)
    assert created.status_code == 202, created.text
    assert created.headers["location"] == f"/v1/admin/tuning-jobs/{created.json()['id']}"
    tuned = wait_tuning(client, created.json()["id"])
    assert tuned["status"] == "completed", tuned
    assert tuned["base_config"] == {"rank": 3}
    assert len(tuned["scored"]) > SEARCH["trials"]  # successive halving: several rungs
    assert max(t["rounds"] for t in tuned["scored"]) == SEARCH["rounds"]
    assert tuned["validation_rmse"] <= tuned["default_validation_rmse"]

    # the same choice as the pure search on a training job's split of the same data (seed
    # and test fraction): the search read the training ratings only
    job = wait_job(client, submit_job(client, config=tuned["config"],
                                      rounds=tuned["chosen_rounds"],
                                      seed=SEARCH["seed"]).json()["id"])
    assert job["status"] == "completed", job
    fed, _ = federation_of(app, job["id"])
    alg = registry.get("fedmc-admm")
    train_only = Federation(fed.train, [], fed.user_ids, fed.item_ids, fed.scale)
    seen = []
    res = tune(alg, train_only, rounds=6, per_round=2, seed=5, trials=4, eta=2,
               base={"rank": 3}, on_trial=lambda t: seen.append((t.params, t.rounds, t.rmse)))
    assert [(t["params"], t["rounds"]) for t in tuned["scored"]] == [s[:2] for s in seen]
    assert [t["validation_rmse"] for t in tuned["scored"]] == pytest.approx(
        [s[2] for s in seen], rel=1e-12)
    assert tuned["changed"] == res.best.params
    assert tuned["chosen_rounds"] == res.rounds
    assert tuned["validation_rmse"] == pytest.approx(res.rmse, rel=1e-12)
    assert tuned["config"] == res.config(alg).model_dump(mode="json")
    # the training job runs with exactly the chosen config
    assert client.get(f"/v1/admin/jobs/{job['id']}").json()["config"] == tuned["config"]


def test_tuning_needs_every_tenants_opt_in_and_a_tunable_algorithm(env):
    app, client = env
    (private, _), = make_tenants(client, n=1, allow_non_private=False)
    refused = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "tenant_ids": [private]})
    assert refused.status_code == 409
    assert refused.json()["code"] == "not_private_refused"
    assert f"tenant(s) {private} (t0) did not opt in" in refused.json()["detail"]
    dpals = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "algorithm": "dpals",
                                                       "config": {}})
    assert dpals.status_code == 422 and dpals.json()["code"] == "not_tunable", dpals.text
    bad = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "config": {"rank": 0}})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_config", bad.text
    assert bad.json()["detail"] == "invalid config: rank must be at least 1"
    missing = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "tenant_ids": [999]})
    assert missing.status_code == 404 and missing.json()["code"] == "tenant_not_found"
    assert client.get("/v1/admin/tuning-jobs/999").json()["code"] == "tuning_job_not_found"
    from app.training.models import TuningJob

    with app.state.sessions() as s:  # no refused request left a tuning job behind
        assert s.query(TuningJob).count() == 0


def test_a_boolean_is_no_number(env):
    _, client = env
    for field in ("test_fraction", "trials", "rounds"):
        r = client.post("/v1/admin/tuning-jobs", json={**SEARCH, field: True})
        assert r.status_code == 422, (field, r.text)
        assert [e["loc"] for e in r.json()["errors"]] == [["body", field]], r.text


def test_tuning_jobs_are_listed_cancelled_and_resumed(env):
    app, client = env
    make_tenants(client, n=2)
    slow = {**SEARCH, "rounds": 400, "trials": 8}
    first = client.post("/v1/admin/tuning-jobs", json=slow).json()["id"]
    second = client.post("/v1/admin/tuning-jobs", json=SEARCH).json()["id"]
    listed = client.get("/v1/admin/tuning-jobs").json()
    assert listed["count"] == 2 and [j["id"] for j in listed["data"]] == [second, first]

    cancelled = client.post(f"/v1/admin/tuning-jobs/{first}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    time.sleep(1.0)  # the search stops at its next trial and stores nothing more
    seen = len(client.get(f"/v1/admin/tuning-jobs/{first}").json()["scored"])
    time.sleep(1.0)
    stopped = client.get(f"/v1/admin/tuning-jobs/{first}").json()
    assert stopped["status"] == "cancelled" and len(stopped["scored"]) == seen
    assert client.post(f"/v1/admin/tuning-jobs/{first}/cancel").status_code == 409

    resumed = client.post(f"/v1/admin/tuning-jobs/{first}/resume")
    assert resumed.status_code == 202, resumed.text
    assert wait_tuning(client, first, timeout=300)["status"] == "completed"
    assert client.post(f"/v1/admin/tuning-jobs/{first}/resume").status_code == 409
    assert wait_tuning(client, second)["status"] == "completed"
    assert client.get("/v1/admin/tuning-jobs/999").status_code == 404


def test_a_tuning_job_chooses_by_validation_ndcg(env):
    """metric ndcg: every trial reports its validation NDCG@10 (no RMSE) and the choice
    is the highest at its rung among those scored last."""
    _, client = env
    make_tenants(client, n=2)
    created = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "metric": "ndcg"})
    assert created.status_code == 202, created.text
    tuned = wait_tuning(client, created.json()["id"])
    assert tuned["status"] == "completed", tuned
    assert tuned["metric"] == "ndcg" and tuned["validation_rmse"] is None
    scored = tuned["scored"]
    assert all(t["validation_rmse"] is None and 0 <= t["validation_ndcg"] <= 1
               for t in scored)
    assert tuned["validation_ndcg"] in [t["validation_ndcg"] for t in scored
                                        if t["rounds"] == tuned["chosen_rounds"]]
    assert tuned["validation_ndcg"] >= tuned["default_validation_ndcg"]
    bad = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "metric": "mae"})
    assert bad.status_code == 422 and "metric" in bad.text
