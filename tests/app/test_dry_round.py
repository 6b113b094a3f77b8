"""The dry round a worker runs (:func:`app.training.dry_round.answer`, the worker task's
body) answers what the in-process one does: the same upload size (the DP event, so the
same reservation), the same upload schema for agents, and a job with the same blocks; and
its request carries no rating and no secret. The worker is stood in for by a second
session on the same database (the task itself is run by tests/worker)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import sqlalchemy as sa

from app.training import dry_round
from app.training.jobs import JobSpec, create_job
from app.training.models import JobClient
from tests.training_helpers import make_tenants

CASES = {
    "record-level Gaussian": ("fedmc-admm", {"rank": 3},
                              {"mechanism": "gaussian", "noise_multiplier": 2.0}, False),
    "user level": ("dpals", {"rank": 3}, {"unit": "user", "placement": "central",
                                          "epsilon": 8.0, "delta": 1e-6}, False),
    "an agent beside a hosted tenant": ("fedmc-admm", {"rank": 3}, {"mechanism": "none"},
                                        True),
    "agents only": ("fedmc-admm", {"rank": 3}, {"mechanism": "none"}, "all"),
}


def _job(s, tenants, case, dry_rounds):
    algorithm, config, dp, agents = CASES[case]
    agents = tenants if agents == "all" else tenants[1:] if agents else []
    spec = JobSpec(algorithm, tenants, 2, 0, 3, config, dp, allow_not_private=True,
                   agents=agents, dry_round_seconds=30.0, dry_rounds=dry_rounds)
    return create_job(s, spec)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_worker_dry_round_answers_as_the_in_process_one(admin_app, case):
    app, client = admin_app()
    tenants = [t for t, _ in make_tenants(client, n=3)]
    asked = []

    def worker(request):
        asked.append(request)
        with app.state.sessions() as other:  # the worker's own session
            return dry_round.answer(other, request)

    with app.state.sessions() as s:
        here = _job(s, tenants, case, None)
        there = _job(s, tenants, case, worker)
        assert len(asked) == 1
        assert (there.agents, there.reserved, there.dp) == (here.agents, here.reserved,
                                                            here.dp)
        assert there.item_ids == here.item_ids
        if CASES[case][3]:
            shape = there.agents["upload"]["arrays"]
            assert shape and all(a["shape"] for a in shape.values())
        if CASES[case][2].get("unit") != "user":  # user caps are fresh secrets per job
            digests = [[d for (d,) in s.execute(
                sa.select(JobClient.train_digest).where(JobClient.job_id == job.id)
                .order_by(JobClient.client_index))] for job in (here, there)]
            assert digests[0] == digests[1]
    request = dataclasses.asdict(asked[0])
    assert set(request) == {f.name for f in dataclasses.fields(dry_round.DryRound)}
    text = json.dumps(request)  # what crosses the broker: ids, config, catalogue
    assert "key" not in text and len(text) < 2000, text


def test_a_tenant_whose_ratings_went_is_refused_by_the_worker(admin_app):
    app, client = admin_app()
    tenants = [t for t, _ in make_tenants(client, n=2)]
    request = dry_round.DryRound(
        algorithm="fedmc-admm", config={"rank": 3}, seed=1, n_clients=2, client=0,
        tenant_id=tenants[0], registered_only=False, test_fraction=0.2, scale=(1.0, 5.0),
        tenant_scale=(1.0, 5.0), fraction=0.0, user_level=False, items=[], seconds=5.0)
    with app.state.sessions() as s:  # no item of the catalogue it was asked about
        assert dry_round.answer(s, request) == (
            "refused", (422, f"tenant {tenants[0]} has no ratings to train on any more"))


def test_the_worker_reads_over_the_catalogue_it_was_given(admin_app):
    """Items created after the API read the catalogue (here: the last one, as if new) are
    left out of the worker's block, so the upload's shapes are the job's."""
    from app import store

    app, client = admin_app()
    tenants = [t for t, _ in make_tenants(client, n=2)]
    with app.state.sessions() as s:
        items = store.catalogue_ids(s)
        block, _ = store.load_block(s, tenants[0], catalogue=items[:-1])
        full, _ = store.load_block(s, tenants[0])
        assert (block.n_items, full.n_items) == (len(items) - 1, len(items))
        assert block.nnz == int((full.cols < len(items) - 1).sum()) < full.nnz
        request = dry_round.DryRound(
            algorithm="fedmc-admm", config={"rank": 3}, seed=1, n_clients=2, client=0,
            tenant_id=tenants[0], registered_only=False, test_fraction=0.2,
            scale=(1.0, 5.0), tenant_scale=(1.0, 5.0), fraction=0.0, user_level=False,
            items=items[:-1].tolist(), seconds=5.0)
        kind, (size, schema) = dry_round.answer(s, request)
    assert kind == "ok"
    dims = {d for a in schema["arrays"].values() for d in a["shape"]}
    assert len(items) - 1 in dims and len(items) not in dims, schema
