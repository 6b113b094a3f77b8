"""What a model recommendation may contain, scored on the tenant's scale (ranking by the
raw score): from a differentially private job, the registered catalogue (public), never
an item an upload created; from a job without a guarantee, only items the tenant's own
training ratings gave factors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import sqlalchemy as sa

from algorithms import Message, RatingBlock, registry
from app.models import Item
from app.training import pipeline
from app.training.models import FactorSnapshot, JobClient, TrainingJob
from app.training.states import local_state_bytes
from tests.training_helpers import csv_body, make_tenants, submit_job, wait_job


@pytest.fixture
def env(admin_app):
    """The API with serving caches re-read on every request."""
    return admin_app(serving_cache_seconds=0.0)


def _tenant_e(client) -> tuple[int, dict[str, str]]:
    """Tenant E auto-creates two items: 'e-secret' (rated by E's user) and 'e-orphan'
    (its only rating deleted again, so nobody rated it)."""
    tid = client.post("/v1/admin/tenants", json={"name": "E", "privacy_budget": 1000.0,
                                              "auto_create_items": True}).json()["id"]
    key = client.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
    auth = {"Authorization": f"Bearer {key}"}
    rows = [("e1", "e-secret", 4.0), ("e1", "i0", 3.0), ("e2", "e-orphan", 5.0)]
    client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                headers={**auth, "Content-Type": "text/csv"}).raise_for_status()
    client.delete(f"/v1/tenants/{tid}/users/e2/ratings", headers=auth).raise_for_status()
    return tid, auth


def _expected(app, job_id: int, tid: int, user: str, trained_only: bool = False):
    """(item keys ranked by raw score among the job's columns, or the tenant's trained
    columns only, raw scores), computed from the job's stored state, independently of the
    serving code."""
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        jc = s.scalars(sa.select(JobClient).where(JobClient.job_id == job_id,
                                                  JobClient.tenant_id == tid)).one()
        a, b = registry.get(job.algorithm).factors(Message.from_bytes(job.global_msg),
                                                   Message.from_bytes(local_state_bytes(
                                                       s, job_id, jc.client_index)))
        key_of = dict(s.execute(sa.select(Item.id, Item.key)).all())
        columns = [key_of[int(i)] for i in pipeline.item_ids_from_bytes(job.item_ids)]
        trained = (np.unique(RatingBlock.from_bytes(jc.train_block).cols) if trained_only
                   else np.arange(len(columns)))
        raw = a[jc.user_keys.index(user)] @ b
    order = sorted(trained.tolist(), key=lambda j: (-raw[j], j))
    return [columns[j] for j in order], [float(raw[j]) for j in order], columns


def test_a_dp_model_serves_the_registered_catalogue_with_clamped_scores(env):
    """A DP job's item axis is the registered catalogue: the items tenant E's upload
    created are not in it, and every registered item is served, whoever rated it."""
    app, client = env
    (tid, key), _ = make_tenants(client, budget=1000.0)
    _tenant_e(client)
    dp = {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0}
    job = wait_job(client, submit_job(client, dp=dp).json()["id"])
    assert job["status"] == "completed", job
    auth = {"Authorization": f"Bearer {key}"}
    with app.state.sessions() as s:
        user = s.scalars(sa.select(JobClient.user_keys).where(
            JobClient.job_id == job["id"], JobClient.tenant_id == tid)).one()[0]
    keys, raw, columns = _expected(app, job["id"], tid, user)
    assert not {"e-secret", "e-orphan"} & set(columns)  # not in the job's item axis
    assert len(keys) == len(columns)  # and every registered item is served
    assert any(v > 5.0 for v in raw) or any(v < 1.0 for v in raw)  # precondition
    r = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations",
                   params={"k": 1000, "include_rated": True}, headers=auth).json()
    assert r["source"] == "model" and r["job_id"] == job["id"]
    assert [x["item"] for x in r["data"]] == keys
    assert r["private"] is True and "differentially private" in r["privacy"]
    # to the last bits: the serving path's matrix product may sum in another order
    assert [x["score"] for x in r["data"]] == pytest.approx(
        [min(5.0, max(1.0, v)) for v in raw], rel=1e-12, abs=1e-12)
    batch = client.post(f"/v1/tenants/{tid}/recommendations",
                        json={"users": [user], "k": 1000, "include_rated": True},
                        headers=auth).json()
    assert batch["data"][0]["data"] == r["data"]
    with app.state.sessions() as s:  # the published snapshot has only those columns
        snap = s.get(FactorSnapshot, (tid, job["id"]))
        with np.load(io.BytesIO(snap.factors), allow_pickle=False) as z:
            assert z["B"].shape[1] == len(keys)


def test_a_model_without_a_guarantee_serves_only_the_tenants_trained_items(env):
    app, client = env
    (tid, key), (other, _) = make_tenants(client, budget=1000.0)
    _tenant_e(client)  # not opted in to a job without a guarantee: not in this one
    job = wait_job(client, submit_job(client, tenant_ids=[tid, other]).json()["id"])
    assert job["status"] == "completed", job
    with app.state.sessions() as s:
        user = s.scalars(sa.select(JobClient.user_keys).where(
            JobClient.job_id == job["id"], JobClient.tenant_id == tid)).one()[0]
    keys, _, columns = _expected(app, job["id"], tid, user, trained_only=True)
    assert {"e-secret", "e-orphan"} <= set(columns)  # in the job's item axis...
    r = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations",
                   params={"k": 1000, "include_rated": True},
                   headers={"Authorization": f"Bearer {key}"}).json()
    assert [x["item"] for x in r["data"]] == keys  # ...but never recommended to A
    assert r["private"] is False and r["privacy"].startswith("not private")


def test_a_sigmoid_link_model_is_served_with_its_predictions(env):
    """RFRec's default (sigmoid link, no matrix product): the served scores are the
    model's own predictions (rfrec.predict_ratings, computed here from the stored state),
    ranked by them, clamped to the scale."""
    from algorithms.rfrec import predict_ratings

    app, client = env
    (tid, key), _ = make_tenants(client)
    cfg = {"rank": 3, "iterations": 6}
    job = wait_job(client, submit_job(client, algorithm="rfrec", config=cfg,
                                      rounds=6).json()["id"])
    assert job["status"] == "completed", job
    assert job["config"]["link"] == "sigmoid"
    with app.state.sessions() as s:
        stored = s.get(TrainingJob, job["id"])
        jc = s.scalars(sa.select(JobClient).where(JobClient.job_id == job["id"],
                                                  JobClient.tenant_id == tid)).one()
        glob = Message.from_bytes(stored.global_msg)
        local = Message.from_bytes(local_state_bytes(s, job["id"], jc.client_index))
        key_of = dict(s.execute(sa.select(Item.id, Item.key)).all())
        columns = [key_of[int(i)] for i in pipeline.item_ids_from_bytes(stored.item_ids)]
        train, test = (RatingBlock.from_bytes(b) for b in (jc.train_block, jc.test_block))
        user = jc.user_keys[0]
    trained = np.unique(train.cols)
    rated = np.r_[train.cols[train.rows == 0], test.cols[test.rows == 0]]  # all of them
    candidates = np.setdiff1d(trained, rated)
    pred = predict_ratings(glob, local, np.zeros(candidates.size, dtype=np.int64), candidates)
    order = np.argsort(-pred, kind="stable")[:5]
    recs = client.get(f"/v1/tenants/{tid}/users/{user}/recommendations?k=5",
                      headers={"Authorization": f"Bearer {key}"}).json()
    assert recs["source"] == "model", recs
    assert [r["item"] for r in recs["data"]] == [columns[i] for i in candidates[order]]
    np.testing.assert_allclose([r["score"] for r in recs["data"]],
                               np.clip(pred[order], 1, 5), rtol=1e-9)


def test_forgetting_a_user_keeps_the_served_link_of_the_others(env):
    """Scrubbing a forgotten user's row from a sigmoid-link snapshot keeps its link: the
    other users' scores stay the model's predictions (on the rating scale)."""
    _, client = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    job = wait_job(client, submit_job(client, algorithm="rfrec", config={"rank": 3},
                                      rounds=4).json()["id"])
    assert job["status"] == "completed", job
    users = sorted({r["user"] for r in client.get(f"/v1/tenants/{tid}/ratings?limit=1000",
                                                  headers=auth).json()["data"]})
    before = client.get(f"/v1/tenants/{tid}/users/{users[1]}/recommendations?k=5",
                        headers=auth).json()
    client.delete(f"/v1/tenants/{tid}/users/{users[0]}/ratings", headers=auth).raise_for_status()
    after = client.get(f"/v1/tenants/{tid}/users/{users[1]}/recommendations?k=5",
                       headers=auth).json()
    assert after["source"] == "model" and after["data"] == before["data"]
