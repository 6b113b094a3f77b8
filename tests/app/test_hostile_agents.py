"""A hostile agent against the coordinator (TestClient on SQLite, pipeline in-process):
compressed uploads cannot inflate, every field of an upload is checked against the job's
schema, values outside clip plus noise are refused with the tenant dropped from the round
(its charge stated) while the round completes for the others, and an agent's release is
refused past its tenant's budget."""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np
import pytest
import sqlalchemy as sa

from agent.client import Refused
from algorithms import Message
from app.training.models import LedgerEntry, RoundUpload
from bench.agent_upload_bomb import deflated, meta_member, npy
from privacy.ledger import Budget
from tests.app import test_agents
from tests.app.test_agents import _put, agent_job, drive, make_agent, new_tenant, states
from tests.training_helpers import wait_job

fed, open_round = test_agents.fed, test_agents.open_round  # the agent tests' fixtures


def traced(call):
    tracemalloc.start()
    try:
        out = call()
        return out, tracemalloc.get_traced_memory()[1] / 2 ** 20
    finally:
        tracemalloc.stop()


INFLATED = 256 << 20  # each bomb inflates to 256 MiB


def test_a_compressed_upload_is_refused_before_it_inflates(open_round):
    """Wrong header, right header with more data than it says, and a huge metadata
    member: each body is under 1 MB, inflates to 256 MiB, and is refused (422 naming
    the field) with the request's Python allocations under 16 MB."""
    app, client, job_id, tenants, (round_, data, _), _ = open_round
    msg = Message.from_bytes(data)
    kind = f"{type(msg).__module__}.{type(msg).__qualname__}"
    (a, arr), (b, brr) = msg.arrays().items()
    small = {b: (npy(brr.shape) + brr.tobytes(), 0)}
    bombs = [
        ({"__meta__": meta_member(kind), a: (npy((INFLATED // 8,)), INFLATED), **small},
         f"upload.{a} has shape [{INFLATED // 8}]"),
        ({"__meta__": meta_member(kind), a: (npy(arr.shape), INFLATED), **small},
         f"upload.{a} holds {arr.nbytes + 1} bytes"),
        ({"__meta__": (npy((INFLATED,), "|u1"), INFLATED), a: (npy(arr.shape), 0), **small},
         "upload.__meta__ has shape"),
    ]
    for members, text in bombs:
        body = deflated(members)
        assert len(body) < 1 << 20
        res, peak = traced(lambda body=body: _put(client, tenants[0], job_id, round_, body))
        assert res.status_code == 422 and text in res.json()["detail"], res.text
        assert peak < 16, f"{text}: peak {peak:.0f} MB"
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(RoundUpload)) == 0


def test_every_scalar_field_is_checked_against_the_job(fed, tmp_path):
    """A user-level (DPALS, placement tenant) agent whose upload states noise that is
    NaN, absent (0), of the wrong type, or adds a field: 422 naming the field, nothing
    charged; the honest upload is then accepted."""
    app, client, _, agent_tenants, rows = fed
    body = {"algorithm": "dpals", "config": {"rank": 3}, "rounds": 2, "per_round": 0,
            "seed": 5, "privacy": {"unit": "user", "placement": "tenant",
                                   "target_epsilon": 8.0, "delta": 1e-6},
            "tenant_ids": [t for t, _ in agent_tenants[:2]],
            "agents": [t for t, _ in agent_tenants[:2]]}
    res = client.post("/v1/admin/jobs", json=body)
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    round_, data, charge = held_upload(client, agent_tenants[0][1], rows[0], tmp_path, job_id)
    honest = Message.from_bytes(data)
    assert honest.gram_noise > 0
    cases = [(honest.replace(gram_noise=float("nan")), "upload.gram_noise is nan"),
             (honest.replace(rhs_noise=0.0), "upload.rhs_noise is 0.0"),
             (honest.replace(gram_noise="1.0"), "upload.gram_noise is '1.0'")]
    for bad, text in cases:
        res = _put(client, agent_tenants[0], job_id, round_, bad.to_bytes(),
                   **{"Fedrec-Charge": json.dumps(charge)})
        assert res.status_code == 422 and text in res.json()["detail"], res.text
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)) == 0
    ok = _put(client, agent_tenants[0], job_id, round_, data,
              **{"Fedrec-Charge": json.dumps(charge)})
    assert ok.status_code == 200, ok.text


def held_upload(client, key, rows, tmp_path, job_id):
    """(round, bytes, charge) of an agent's first upload, computed and held back."""
    sent = []

    def keep(coord, manifest, round_, data, charge):
        sent.append((round_, data, charge))
        raise RuntimeError("held back")

    a = make_agent(client, key, rows, tmp_path / "held", uploader=keep)
    a.setup(job_id)
    end = time.monotonic() + 10
    while not sent:
        assert time.monotonic() < end
        try:
            a.step(job_id, wait=0.05)
        except RuntimeError:
            pass
    return sent[0]


USER_LEVEL = {"algorithm": "dpals", "config": {"rank": 3}, "dp": None,
              "privacy": {"unit": "user", "placement": "tenant", "target_epsilon": 8.0,
                          "delta": 1e-6}}


@pytest.mark.parametrize("body, poisoned, says", [
    ({"dp": {"mechanism": "gaussian", "noise_multiplier": 1.0}}, None, "l2 norm"),
    (USER_LEVEL, "b", "b["),  # the user-level DPALS attack: b = 1e6 x the honest sums
    # the gradient methods' attack: G = 1e6 x the honest gradient sums, H left as it was
    ({**USER_LEVEL, "algorithm": "dp-fedmavg"}, "G", "G[:, "),
    ({**USER_LEVEL, "algorithm": "dp-fedmc-admm"}, "G", "G[:, "),
])
def test_an_upload_past_its_bound_drops_its_tenant_and_the_round_goes_on(fed, tmp_path,
                                                                      body, poisoned, says):
    """Three agents; one multiplies its round-1 upload (all arrays, or DPALS's b) by 1e6.
    It is refused (422, charge stated and recorded), the tenant sits round 1 out, and the
    job completes for the others with a finite model."""
    app, client, _, tenants, rows = fed
    res = agent_job(client, tenants, rounds=2, **body)
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    answers = []

    def poison(coord, manifest, round_, data, charge):
        if round_ == 1:
            msg = Message.from_bytes(data)
            big = msg.replace(**{k: v * 1e6 for k, v in msg.arrays().items()
                                 if poisoned in (None, k)})
            try:
                return coord.upload(manifest["job_id"], round_, big.to_bytes(), charge)
            except Refused as exc:
                answers.append(exc)
                raise Refused(409, exc.detail) from None  # the agent goes on
        return coord.decline(manifest["job_id"], round_, "gave up")  # charges nothing

    budget = {"budget": Budget(100.0, 1e-6)} if "privacy" in body else {}
    agents = [make_agent(client, key, rows[t], tmp_path / f"a{t}", **budget,
                         **({"uploader": poison} if t == 0 else {}))
              for t, (_, key) in enumerate(tenants)]
    drive(agents, job_id)
    job = wait_job(client, job_id)
    assert job["status"] == "completed", job
    (exc,) = answers
    assert exc.status == 422 and exc.code == "upload_out_of_bounds", exc.detail
    assert says in exc.detail and "its charge" in exc.detail
    assert f"tenant {tenants[0][0]} sits out round 1" in exc.detail
    assert says in job["stopped_tenants"][str(tenants[0][0])]
    with app.state.sessions() as s:
        charged = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round)
                            .where(LedgerEntry.job_id == job_id)).all()
    # the refused upload's charge stands; the honest tenants are charged every round
    assert sorted(charged) == sorted([(tenants[0][0], 1)] + [
        (t, r) for t, _ in tenants[1:] for r in (1, 2)])
    glob, _, _ = states(app, job_id)
    assert all(np.isfinite(a).all() for a in glob.arrays().values())


def test_an_agent_upload_past_its_tenants_budget_is_refused(fed, tmp_path):
    """The coordinator checks an agent's release against the tenant's budget under the
    tenant's lock (as a hosted release): the agent's own ledger allows it, the tenant's
    budget at the coordinator does not; refused (409 budget_exceeded), nothing charged,
    the tenant sits the round out."""
    app, client, _, _, rows = fed
    poor = new_tenant(client, "poor", budget=0.5)
    rich = new_tenant(client, "rich", budget=1000.0)
    res = agent_job(client, [poor, rich], dp={"mechanism": "gaussian",
                                              "noise_multiplier": 1.0}, rounds=1,
                    allow_not_private=False)
    # job creation itself refuses (its plan exceeds the budget); lift the budget, create,
    # then cut it as another job's spend would
    assert res.status_code == 409, res.text
    client.patch(f"/v1/admin/tenants/{poor[0]}", json={"privacy_budget": 1000.0}
                 ).raise_for_status()
    res = agent_job(client, [poor, rich], dp={"mechanism": "gaussian",
                                              "noise_multiplier": 1.0}, rounds=1)
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    round_, data, charge = held_upload(client, poor[1], rows[0], tmp_path, job_id)
    client.patch(f"/v1/admin/tenants/{poor[0]}", json={"privacy_budget": 0.5}
                 ).raise_for_status()
    res = _put(client, poor, job_id, round_, data, **{"Fedrec-Charge": json.dumps(charge)})
    assert res.status_code == 409 and res.json()["code"] == "budget_exceeded", res.text
    assert "nothing was charged" in res.json()["detail"]
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)
                        .where(LedgerEntry.job_id == job_id)) == 0
        staged = s.get(RoundUpload, (job_id, round_, 0))
    assert staged.upload is None and "budget" in staged.refused


def test_a_masked_input_past_its_tenants_budget_is_refused_and_the_round_goes_on(fed,
                                                                               tmp_path):
    """Secure aggregation: the coordinator checks each masked input's release against
    the tenant's budget under its lock (the same check-and-charge as any release); past
    it the input is 409 and never unmasked, nothing is charged at the coordinator, and
    the round completes with the others (a dropout within the tolerance)."""
    app, client, _, agent_tenants, rows = fed
    job_id = test_agents._secagg_job(client, agent_tenants, rounds=1, round_seconds=12.0,
                                     privacy={"dropout_tolerance": 0.4})
    poor = agent_tenants[0][0]
    client.patch(f"/v1/admin/tenants/{poor}", json={"privacy_budget": 0.01}
                 ).raise_for_status()
    agents = test_agents._secure_agents(client, agent_tenants, rows, tmp_path)
    for a in agents:
        a.setup(job_id)
    live, refused, end = list(agents), [], time.monotonic() + 60
    while live:  # the refused agent stops (it would rejoin with fresh keys: a duplicate)
        assert time.monotonic() < end, "agents did not finish"
        for a in list(live):
            try:
                if not a.step(job_id, wait=0.05):
                    live.remove(a)
            except Refused as exc:
                refused.append(exc)
                live.remove(a)
    assert all(exc.status == 409 for exc in refused), refused
    job = wait_job(client, job_id)
    assert job["status"] == "completed", job
    with app.state.sessions() as s:
        charged = s.execute(sa.select(LedgerEntry.tenant_id)
                            .where(LedgerEntry.job_id == job_id)).scalars().all()
    assert poor not in charged and sorted(charged) == sorted(
        t for t, _ in agent_tenants[1:])
