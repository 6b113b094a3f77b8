"""Shared steps of the training tests: tenants with ratings, jobs, and the simulator's view
of a job's data (rebuilt independently from the stored blocks)."""

from __future__ import annotations

import io
import time

import numpy as np
import sqlalchemy as sa

from algorithms import RatingBlock
from algorithms.data import federation_from_tenants
from algorithms.synthetic import generate_ratings
from app.training import pipeline
from app.training.models import JobClient, TrainingJob
from app.training.states import committed_states, load_server

N_USERS, N_ITEMS = 90, 40
CONFIG = {"rank": 3}


def csv_body(rows) -> bytes:
    buf = io.StringIO()
    buf.write("user,item,rating\n")
    for u, i, v in rows:
        buf.write(f"{u},{i},{v:g}\n")
    return buf.getvalue().encode()


def make_tenants(client, n=2, budget=1000.0, seed=0, **settings):
    """n tenants, each with its own users over one shared catalogue; returns [(id, key)].

    They opt in to non-private jobs (``allow_non_private``) unless ``settings`` say
    otherwise: most tests compare noise-free jobs with the simulator; ``settings`` are
    further tenant fields (e.g. ``scheduled_retraining``)."""
    settings = {"allow_non_private": True, **settings}
    r = generate_ratings(N_USERS, N_ITEMS, 1800, rank=3, seed=seed)
    client.put("/v1/admin/items", json={"items": [{"key": f"i{j}", "title": f"Title {j}"}
                                               for j in range(N_ITEMS)]}).raise_for_status()
    out = []
    for t in range(n):
        tid = client.post("/v1/admin/tenants", json={"name": f"t{t}", "privacy_budget": budget,
                                                  **settings}).json()["id"]
        key = client.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
        mine = r.users % n == t
        rows = zip((f"u{u}" for u in r.users[mine]), (f"i{i}" for i in r.items[mine]),
                   r.values[mine], strict=True)
        res = client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                          headers={"Content-Type": "text/csv", "Authorization": f"Bearer {key}"})
        assert res.status_code == 200, res.text
        out.append((tid, key))
    return out


def wait_job(client, job_id, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = client.get(f"/v1/admin/jobs/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def submit_job(client, **overrides):
    """A noise-free FedMC-ADMM job that runs its rounds on all its training ratings (no
    validation carve-out, so the simulator on the stored blocks repeats it exactly) and
    whose model serves the lists (these tests check the engine and the serving of
    factors, not which list wins on held-out data)."""
    body = {"algorithm": "fedmc-admm", "config": CONFIG, "rounds": 4, "per_round": 0,
            "seed": 11, "dp": {"mechanism": "none"}, "validation_fraction": 0,
            "lists": "model", **overrides}
    return client.post("/v1/admin/jobs", json=body)


def federation_of(app, job_id):
    """The job's stored blocks rebuilt into the simulator's federation, independently."""
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        clients = s.scalars(sa.select(JobClient).where(JobClient.job_id == job_id)
                            .order_by(JobClient.client_index)).all()
        blocks, keys = [], []
        for c in clients:
            tr, te = RatingBlock.from_bytes(c.train_block), RatingBlock.from_bytes(c.test_block)
            both = RatingBlock(np.r_[tr.rows, te.rows], np.r_[tr.cols, te.cols],
                               np.r_[tr.vals, te.vals], tr.n_users, tr.n_items)
            order = np.lexsort((both.cols, both.rows))
            blocks.append(both.subset(order))
            keys.append(np.array(c.user_keys))
        items = pipeline.item_ids_from_bytes(job.item_ids)
        return federation_from_tenants(blocks, keys, items, job.seed, job.test_fraction,
                                       (1.0, 5.0)), job


def job_ratings(sessions, job_id, tenant_id) -> dict[tuple[str, str], float]:
    """{(user key, item key): rating} of one tenant as the job stored it (train + test)."""
    from app.models import Item

    with sessions() as s:
        jc = s.scalars(sa.select(JobClient).where(JobClient.job_id == job_id,
                                                  JobClient.tenant_id == tenant_id)).one()
        job = s.get(TrainingJob, job_id)
        item_keys = dict(s.execute(sa.select(Item.id, Item.key)).all())
        columns = [item_keys[int(i)] for i in pipeline.item_ids_from_bytes(job.item_ids)]
        out = {}
        for blob in (jc.train_block, jc.test_block):
            block = RatingBlock.from_bytes(blob)
            for r, c, v in zip(block.rows, block.cols, block.vals, strict=True):
                key = (jc.user_keys[int(r)], columns[int(c)])
                assert key not in out, f"{key} stored twice in job {job_id}"
                out[key] = float(v)
    return out


def job_round(sessions, job_id) -> int:
    """The job's last committed round."""
    with sessions() as s:
        return s.get(TrainingJob, job_id).current_round


def assert_same_run(sessions, reference, job_id, rounds) -> None:
    """``job_id`` completed as the undisturbed ``reference`` with the same ledger charges,
    each (round, tenant) once: none lost, none doubled. Without privacy, bit-identical
    (global and server state, every local state); with it the noise is fresh and secret
    (issue 29), so the same rounds with the same participants, each committed once."""
    from app.training.models import JobRound, LedgerEntry

    with sessions() as s:
        a, b = s.get(TrainingJob, reference), s.get(TrainingJob, job_id)
        assert (b.status, b.current_round) == ("completed", rounds), (b.status, b.error)
        if (b.dp or {}).get("mechanism", "none") == "none" and "unit" not in (b.dp or {}):
            assert a.global_msg == b.global_msg
            assert load_server(s, a).to_bytes() == load_server(s, b).to_bytes()
            assert committed_states(s, reference) == committed_states(s, job_id)
        else:
            def participants(j):
                return s.execute(sa.select(JobRound.round, JobRound.participants)
                                 .where(JobRound.job_id == j).order_by(JobRound.round)).all()

            assert participants(job_id) == participants(reference)
            assert len(participants(job_id)) == rounds
        def charged(j):
            return sorted(s.execute(sa.select(LedgerEntry.round, LedgerEntry.tenant_id)
                                    .where(LedgerEntry.job_id == j)).all())

        mine = charged(job_id)
        assert len(set(mine)) == len(mine), "a transmission was charged twice"
        assert mine == charged(reference)  # the undisturbed run's charges: none lost
