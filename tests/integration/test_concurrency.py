"""Concurrent uploads for one tenant while a job trains: real PostgreSQL, Redis, worker.

The documented rule: uploads to one tenant serialise at commit (each bumps the tenant's
``ratings_version`` row), and a re-uploaded (user, item) pair takes the value of the
upload that committed last. The test runs on a private cluster with
``track_commit_timestamp`` on, so the commit order is read back from PostgreSQL itself and
the final rows must equal a serial replay of the uploads in that order, exactly. A job
created mid-stream must hold exactly the ratings of the uploads committed before it (a
prefix of that order), nothing of the later ones.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.main import create_app
from app.models import Item, Rating, Tenant, User
from tests.integration.conftest import wait_for
from tests.training_helpers import csv_body, job_ratings, make_tenants, submit_job, wait_job

pytestmark = pytest.mark.integration

WRITERS, BATCHES, PAIRS = 8, 6, 40
POOL_USERS = [f"u{2 * j}" for j in range(8)] + [f"c{j}" for j in range(16)]  # old and new
POOL_ITEMS = [f"i{j}" for j in range(15)]


def _batch(writer: int, number: int) -> list[tuple[str, str, float]]:
    """Overlapping pairs from a shared pool plus one marker pair only this batch writes;
    every value names its batch (1 + k/100, k unique)."""
    rng = np.random.default_rng([writer, number])
    value = round(1 + (writer * BATCHES + number + 1) / 100, 2)  # exact through CSV
    cells = rng.choice(len(POOL_USERS) * len(POOL_ITEMS), PAIRS, replace=False)
    rows = [(POOL_USERS[c // len(POOL_ITEMS)], POOL_ITEMS[c % len(POOL_ITEMS)], value)
            for c in cells]
    return [*rows, (_marker(writer, number), "i0", value)]


def _marker(writer: int, number: int) -> str:
    return f"m{writer}-{number}"


def _ratings(sessions, tenant_id: int) -> dict[tuple[str, str], float]:
    with sessions() as s:
        rows = s.execute(sa.select(User.key, Item.key, Rating.value)
                         .join(User, User.id == Rating.user_id)
                         .join(Item, Item.id == Rating.item_id)
                         .where(User.tenant_id == tenant_id)).all()
    assert len(rows) == len({(u, i) for u, i, _ in rows}), "duplicate (user, item) rows"
    return {(u, i): v for u, i, v in rows}


def _commit_order(sessions, tenant_id: int) -> list[tuple[int, int]]:
    """Batches in the order PostgreSQL committed them: each marker user is created by its
    batch alone, so its row's xmin is that upload's transaction."""
    with sessions() as s:
        rows = s.execute(sa.text(
            "SELECT key, pg_xact_commit_timestamp(xmin) AS t FROM users "
            "WHERE tenant_id = :t AND key LIKE 'm%' ORDER BY t"), {"t": tenant_id}).all()
    stamps = [t for _, t in rows]
    assert len(set(stamps)) == len(stamps), "two uploads committed at the same instant"
    return [tuple(int(x) for x in key[1:].split("-")) for key, _ in rows]


def _replay(base: dict, order: list[tuple[int, int]]) -> dict:
    state = dict(base)
    for writer, number in order:
        state.update({(u, i): v for u, i, v in _batch(writer, number)})
    return state


def test_overlapping_uploads_equal_a_serial_replay_and_the_job_keeps_its_snapshot(
        private_services):
    settings, worker, _, _ = private_services
    # all writers upload to one tenant at once (FEDREC_MAX_CONCURRENT_UPLOADS would 429)
    app = create_app(settings.model_copy(update={"max_concurrent_uploads": WRITERS}))
    worker()
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {settings.admin_token.get_secret_value()}"
        (tid, key), _ = make_tenants(client)
        base = _ratings(app.state.sessions, tid)
        with app.state.sessions() as s:
            version0 = s.get(Tenant, tid).ratings_version
        job_created, done = threading.Event(), []

        def write(writer: int) -> list[int]:
            codes = []
            for number in range(BATCHES):
                if number == BATCHES - 1:  # every writer's last batch follows the job
                    assert job_created.wait(120)
                rows = _batch(writer, number)
                r = client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                                headers={"Content-Type": "text/csv",
                                         "Authorization": f"Bearer {key}"})
                assert r.status_code == 200 and r.json() == {"stored": len(rows)}, r.text
                codes.append(r.status_code)
                done.append((writer, number))
            return codes

        with ThreadPoolExecutor(WRITERS) as pool:
            futures = [pool.submit(write, w) for w in range(WRITERS)]
            wait_for(lambda: len(done) >= WRITERS * BATCHES // 3, 120, "a third of the uploads")
            created = submit_job(client)  # no tenant_ids: every tenant, read in one snapshot
            job_created.set()
            assert created.status_code == 202, created.text
            results = [f.result() for f in futures]
        assert sum(map(len, results)) == WRITERS * BATCHES
        job = wait_job(client, created.json()["id"], timeout=120)
        assert job["status"] == "completed", job

    order = _commit_order(app.state.sessions, tid)
    assert sorted(order) == [(w, b) for w in range(WRITERS) for b in range(BATCHES)]
    final = _ratings(app.state.sessions, tid)
    expected = _replay(base, order)
    assert len(final) == len(expected)
    assert final == expected  # last writer (by commit) wins, pair by pair, nothing else

    snapshot = job_ratings(app.state.sessions, job["id"], tid)
    seen = {(w, b) for w, b in order if (_marker(w, b), "i0") in snapshot}
    prefix = order[:len(seen)]
    assert WRITERS * BATCHES // 3 <= len(seen) <= WRITERS * (BATCHES - 1)
    assert set(prefix) == seen, "the job saw an upload without one committed before it"
    assert snapshot == _replay(base, prefix)  # the state right after that prefix, exactly
    with app.state.sessions() as s:
        recorded = s.get(Tenant, tid).ratings_version
        from app.training.models import TrainingJob

        assert s.get(TrainingJob, job["id"]).ratings_version[str(tid)] == version0 + len(seen)
    assert recorded == version0 + WRITERS * BATCHES
