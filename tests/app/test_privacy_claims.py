"""The privacy claims hold for what the service publishes (issue 29, item 4), on SQLite and
on the real PostgreSQL:

* a differentially private job trains on and serves the registered catalogue only, never an
  item an upload created (``auto_create_items``), and so do the agents' manifests;
* a cold-start list from a DP model is the user's own ratings folded into the released item
  factors, never a ranking counted from other users' raw ratings;
* a tuning job is charged epsilon = infinity, and every later report of a tuned tenant says
  not private.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from algorithms.recommend import fold_in
from app.config import Settings
from app.db import migrate
from app.main import create_app
from app.models import Item, Rating
from app.training import pipeline
from app.training.models import FactorSnapshot, LedgerEntry, TrainingJob
from tests.app.conftest import ADMIN_TOKEN, refusal
from tests.training_helpers import csv_body, make_tenants, submit_job, wait_job

DPALS = {"algorithm": "dpals", "config": {"rank": 3, "sweeps": 2}, "rounds": 3, "seed": 5}
SEARCH = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 4, "trials": 2,
          "eta": 2, "seed": 5, "budget_seconds": 600}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def env(request, tmp_path):
    """(app, admin client) on a fresh database, the pipeline in-process, caches re-read."""
    url = (f"sqlite:///{tmp_path}/claims.db" if request.param == "sqlite"
           else request.getfixturevalue("make_postgres_db")())
    migrate(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN, broker_url=None,
                              serving_cache_seconds=0.0))
    client = TestClient(app).__enter__()
    client.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    yield app, client
    client.__exit__(None, None, None)


def user_level(placement="central", **body):
    return {**DPALS, "privacy": {"unit": "user", "placement": placement,
                                 "target_epsilon": 4.0, "delta": 1e-3}, **body}


def auto_tenant(client, rows):
    """A tenant with ``auto_create_items`` whose upload of ``rows`` creates their items."""
    tid = client.post("/v1/admin/tenants", json={"name": "auto", "privacy_budget": 1000.0,
                                              "auto_create_items": True}).json()["id"]
    key = client.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
    auth = {"Authorization": f"Bearer {key}"}
    client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                headers={**auth, "Content-Type": "text/csv"}).raise_for_status()
    return tid, auth


def job_item_keys(app, job_id) -> list[str]:
    with app.state.sessions() as s:
        key_of = dict(s.execute(sa.select(Item.id, Item.key)).all())
        ids = pipeline.item_ids_from_bytes(s.get(TrainingJob, job_id).item_ids)
    return [key_of[int(i)] for i in ids]


def test_items_an_upload_created_are_left_out_of_dp_jobs_and_agent_manifests(env):
    app, client = env
    (t0, _), (t1, k1) = make_tenants(client, budget=1000.0)
    auto_tenant(client, [("e1", "e-secret", 4.0), ("e1", "i0", 3.0), ("e2", "e-other", 5.0)])
    with app.state.sessions() as s:
        origin = dict(s.execute(sa.select(Item.key, Item.origin)).all())
        users = s.scalar(sa.select(sa.func.count(sa.distinct(Rating.user_id)))
                         .join(Item, Item.id == Rating.item_id).where(Item.origin == "admin"))
    assert (origin["e-secret"], origin["i0"]) == ("upload", "admin")

    # a DP job trains on the registered catalogue
    r = client.post("/v1/admin/jobs", json=user_level())
    assert r.status_code == 202, r.text
    private_keys = job_item_keys(app, r.json()["id"])
    assert r.json()["dp"]["n_users"] == users  # e2 rated no registered item: not counted
    assert "e-secret" not in private_keys and "i0" in private_keys

    # an agent of a DP job is told the registered catalogue only
    r = client.post("/v1/admin/jobs", json=user_level(
        "tenant", tenant_ids=[t0, t1], agents=[t1], round_seconds=1.0))
    assert r.status_code == 202, r.text
    manifest = client.get(f"/v1/tenants/{t1}/agent/jobs/{r.json()['id']}",
                          headers={"Authorization": f"Bearer {k1}"}).json()
    assert "e-secret" not in manifest["items"] and len(manifest["items"]) == len(private_keys)
    client.post(f"/v1/admin/jobs/{r.json()['id']}/cancel")

    # a job without a guarantee (charged infinity: after the DP ones) on the whole one
    plain = wait_job(client, submit_job(client, tenant_ids=[t0, t1]).json()["id"])
    assert "e-secret" in job_item_keys(app, plain["id"])

    # an admin's upsert registers the item: public from then on
    client.put("/v1/admin/items", json={"items": [{"key": "e-secret"}]}).raise_for_status()
    with app.state.sessions() as s:
        assert s.scalar(sa.select(Item.origin).where(Item.key == "e-secret")) == "admin"


def test_a_dp_job_of_a_tenant_with_only_uploaded_items_is_refused_naming_the_rule(env):
    """As for a tenant without ratings (the data's state, not the request's fault: 409
    ``no_ratings``), the message names the registered-catalogue rule."""
    _, client = env
    tid, _ = auto_tenant(client, [("e1", "only-mine", 4.0)])
    client.put("/v1/admin/items", json={"items": [{"key": "registered"}]}).raise_for_status()
    r = client.post("/v1/admin/jobs", json=user_level(tenant_ids=[tid]))
    assert refusal(r)[:2] == (409, "no_ratings")
    detail = refusal(r)[2]
    assert f"tenant {tid} (auto) has no ratings of registered items to train on" in detail
    assert "auto_create_items" in detail


def _snapshot(app, tid, job_id):
    with app.state.sessions() as s:
        snap = s.get(FactorSnapshot, (tid, job_id))
        with np.load(io.BytesIO(snap.factors), allow_pickle=False) as z:
            item_ids = np.load(io.BytesIO(z["item_ids"].tobytes()), allow_pickle=False)
            b = z["B"]
        key_of = dict(s.execute(sa.select(Item.id, Item.key)).all())
    return [key_of[int(i)] for i in item_ids], b


def test_cold_start_from_a_dp_model_folds_in_the_users_own_ratings(env):
    """A user who rated after the DP job gets the released item factors scored with the
    user's own folded-in factor, computed here from the stored snapshot; not the
    tenant's popularity ranking (exact counts and means of other users' ratings)."""
    app, client = env
    (tid, key), _ = make_tenants(client, budget=1000.0, allow_non_private=False)
    # an item nobody rated: served by a DP model (public catalogue), whatever was rated
    client.put("/v1/admin/items", json={"items": [{"key": "unrated"}]}).raise_for_status()
    # lists "model": the DP model serves its lists whatever the held-out comparison with
    # popularity says (which on this small set it may lose)
    job = wait_job(client, client.post("/v1/admin/jobs",
                                       json=user_level(lists="model")).json()["id"])
    assert job["status"] == "completed", job
    auth = {"Authorization": f"Bearer {key}"}
    mine = [("newbie", "i0", 5.0), ("newbie", "i1", 1.0), ("newbie", "i2", 4.0)]
    client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(mine),
                headers={**auth, "Content-Type": "text/csv"}).raise_for_status()
    r = client.get(f"/v1/tenants/{tid}/users/newbie/recommendations",
                   params={"k": 1000}, headers=auth).json()
    assert r["source"] == "fold_in" and r["job_id"] == job["id"]
    assert r["private"] is True and "post-processing" in r["privacy"]

    keys, b = _snapshot(app, tid, job["id"])
    assert "unrated" in keys
    cols = [keys.index(item) for _, item, _ in mine]
    a = fold_in(b[:, cols], np.array([v for *_, v in mine]))
    scores = a @ b
    expected = [keys[j] for j in sorted(range(len(keys)), key=lambda j: (-scores[j], j))
                if j not in cols]
    assert [x["item"] for x in r["data"]] == expected
    np.testing.assert_allclose([x["score"] for x in r["data"]],
                               np.clip([scores[keys.index(k)] for k in expected], 1, 5),
                               rtol=1e-9)


def test_cold_start_without_a_dp_model_is_popularity_labelled_not_private(env):
    _, client = env
    (tid, key), _ = make_tenants(client, budget=1000.0)
    job = wait_job(client, submit_job(client).json()["id"])  # dp mechanism none
    auth = {"Authorization": f"Bearer {key}"}
    client.post(f"/v1/tenants/{tid}/ratings", content=csv_body([("newbie", "i0", 4.0)]),
                headers={**auth, "Content-Type": "text/csv"}).raise_for_status()
    r = client.get(f"/v1/tenants/{tid}/users/newbie/recommendations", headers=auth).json()
    assert r["source"] == "popularity" and r["private"] is False
    assert r["privacy"].startswith("not private")
    report = client.get(f"/v1/admin/jobs/{job['id']}/report").json()["privacy"]
    assert report["private"] is False
    assert {row["epsilon"] for row in report["threat_model"]["adversaries"]} == {"infinity"}


def test_a_dp_report_states_the_threat_model_for_one_user_account_of_one_tenant(env):
    _, client = env
    (tid, key), _ = make_tenants(client, budget=1000.0, allow_non_private=False)
    job = wait_job(client, client.post("/v1/admin/jobs", json=user_level()).json()["id"])
    report = client.get(f"/v1/tenants/{tid}/report",
                        headers={"Authorization": f"Bearer {key}"}).json()["privacy"]
    model = report["threat_model"]
    assert model["unit"] == "one user account of one tenant" and job["status"] == "completed"
    rows = {row["adversary"]: row for row in model["adversaries"]}
    assert rows["other tenants"]["epsilon"] == report["epsilon_max"]
    assert rows["operator/coordinator"]["epsilon"] == "none (trusted)"
    assert "one user account of one tenant" in report["lifetime_unit"]
    assert report["lifetime"][str(tid)]["unit"] == "user"


def test_tuning_is_charged_infinity_and_later_reports_say_not_private(env):
    app, client = env
    (t0, k0), (t1, _) = make_tenants(client, budget=1000.0)  # opted in
    dp = wait_job(client, client.post("/v1/admin/jobs", json=user_level()).json()["id"])
    assert dp["status"] == "completed", dp
    before = client.get(f"/v1/tenants/{t0}/report",
                        headers={"Authorization": f"Bearer {k0}"}).json()["privacy"]
    assert before["private"] is True

    created = client.post("/v1/admin/tuning-jobs", json={**SEARCH, "tenant_ids": [t0]})
    assert created.status_code == 202, created.text
    with app.state.sessions() as s:  # charged when created, before it reads a rating
        charges = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.job_id,
                                      LedgerEntry.event)
                            .where(LedgerEntry.tuning_job_id == created.json()["id"])).all()
    assert [(t, j, e["event"][0]) for t, j, e in charges] == [(t0, None, "none")]

    after = client.get(f"/v1/tenants/{t0}/report",
                       headers={"Authorization": f"Bearer {k0}"}).json()["privacy"]
    assert after["private"] is False
    assert after["guarantee"].startswith("not private: tuning used raw ratings")
    assert after["epsilon_per_tenant"][str(t0)] == "infinity"
    assert after["lifetime"][str(t0)]["epsilon_spent"] == "infinity"
    job_report = client.get(f"/v1/admin/jobs/{dp['id']}/report").json()["privacy"]
    assert job_report["tuning"] == {str(t0): [created.json()["id"]]}
    assert job_report["epsilon_per_tenant"][str(t1)] != "infinity"  # t1 was not tuned
    spent = client.get(f"/v1/tenants/{t0}/privacy",
                       headers={"Authorization": f"Bearer {k0}"}).json()
    assert spent["private"] is False

    # no later DP job can include the tuned tenant
    status, _, detail = refusal(client.post("/v1/admin/jobs", json=user_level(
        tenant_ids=[t0])))
    assert status == 409 and "tuning job" in detail


def test_a_tenant_without_the_opt_in_cannot_be_tuned_and_nothing_is_charged(env):
    app, client = env
    (tid, _), _ = make_tenants(client, allow_non_private=False)
    status, code, detail = refusal(client.post("/v1/admin/tuning-jobs",
                                               json={**SEARCH, "tenant_ids": [tid]}))
    assert (status, code) == (409, "not_private_refused")
    assert "allow_non_private is false" in detail and f"tenant(s) {tid} (t0)" in detail
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)) == 0


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.integration)])
def test_migration_0018_takes_existing_items_as_registered_and_round_trips(
        backend, tmp_path, request):
    """Items created before the migration cannot be told apart: they count as registered;
    the downgrade removes the column again."""
    from app.db import downgrade, make_engine

    url = (f"sqlite:///{tmp_path}/m.db" if backend == "sqlite"
           else request.getfixturevalue("make_postgres_db")())
    migrate(url, "0017")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO items (key) VALUES ('old')"))
    migrate(url, "0018")
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT origin FROM items")).scalar_one() == "admin"
    downgrade(url, "0017")
    with engine.connect() as conn:
        assert "origin" not in {c["name"] for c in sa.inspect(conn).get_columns("items")}
    engine.dispose()
