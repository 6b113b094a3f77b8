"""Tenant agents against the coordinator in-process (TestClient on SQLite): the same
numbers as hosted tenants, the agent's own ledger and resume, and the routes' refusals."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import sqlalchemy as sa

from agent.client import Coordinator
from agent.data import parse_bytes
from agent.run import Agent
from agent.state import AgentState
from algorithms import Message, RatingBlock
from algorithms.messages import messages_equal
from algorithms.synthetic import generate_ratings
from app.training.models import JobRound as JobRoundRow
from app.training.models import LedgerEntry, RoundUpload, TrainingJob
from app.training.states import committed_states
from privacy.ledger import Budget
from tests.training_helpers import csv_body, wait_job

N_USERS, N_ITEMS, N_TENANTS = 60, 30, 3


def tenant_rows(n=N_TENANTS, seed=0):
    r = generate_ratings(N_USERS, N_ITEMS, 1200, rank=3, seed=seed)
    out = []
    for t in range(n):
        mine = r.users % n == t
        out.append(list(zip((f"u{u}" for u in r.users[mine]), (f"i{i}" for i in r.items[mine]),
                            r.values[mine], strict=True)))
    return out


TENANT_OF: dict[str, int] = {}  # API key -> tenant id


def new_tenant(client, name, budget=1000.0, **fields):
    tid = client.post("/v1/admin/tenants", json={"name": name, "privacy_budget": budget,
                                              "allow_non_private": True, **fields}).json()["id"]
    key = client.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
    TENANT_OF[key] = tid
    return tid, key


@pytest.fixture
def fed(env):
    """(app, admin client, hosted [(id, key)], agent [(id, key)], rows per tenant): the same
    ratings uploaded to hosted tenants and kept outside the service for agent tenants."""
    app, client = env
    client.put("/v1/admin/items", json={"items": [{"key": f"i{j}"} for j in range(N_ITEMS)]}
               ).raise_for_status()
    rows = tenant_rows()
    hosted, agents = [], []
    for t, mine in enumerate(rows):
        tid, key = new_tenant(client, f"hosted{t}")
        res = client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(mine),
                          headers={"Content-Type": "text/csv", "Authorization": f"Bearer {key}"})
        assert res.status_code == 200, res.text
        hosted.append((tid, key))
        agents.append(new_tenant(client, f"agent{t}"))
    return app, client, hosted, agents, rows


NO_LIMIT = Budget(float("inf"), 1e-5, True)


def make_agent(client, key, rows, root, budget=NO_LIMIT, **kw):
    coord = Coordinator(None, TENANT_OF[key], key, http=client, patience=5.0)
    state = AgentState.open(root, str(coord.tenant_id), budget)
    body = csv_body(rows)
    return Agent(coord, state, lambda scale: parse_bytes(body, "text/csv", scale),
                 log=lambda text: None, **kw)


def drive(agents, job_id, timeout=60.0):
    """Step every agent until the job ended for all of them (a single thread: each step
    answers at once; an upload completing a round runs the aggregate in the background)."""
    for a in agents:
        a.setup(job_id)
    live, end = list(agents), time.monotonic() + timeout
    while live:
        assert time.monotonic() < end, "agents did not finish"
        live = [a for a in live if a.step(job_id, wait=0.05)]


def agent_job(client, agents, **body):
    base = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 4, "per_round": 0,
            "seed": 11, "dp": {"mechanism": "none"}, "allow_not_private": True}
    return client.post("/v1/admin/jobs", json={**base, "tenant_ids": [t for t, _ in agents],
                                            "agents": [t for t, _ in agents], **body})


def hosted_job(client, hosted, **body):
    base = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 4, "per_round": 0,
            "seed": 11, "dp": {"mechanism": "none"}, "allow_not_private": True,
            "validation_fraction": 0}  # fits all its training ratings, as the agents do
    res = client.post("/v1/admin/jobs", json={**base, "tenant_ids": [t for t, _ in hosted],
                                           **body})
    assert res.status_code == 202, res.text
    return wait_job(client, res.json()["id"])


def max_diff(a: Message, b: Message) -> float:
    assert type(a) is type(b)
    return max(float(np.max(np.abs(x - b.arrays()[k]))) if x.size else 0.0
               for k, x in a.arrays().items())


def states(app, job_id):
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        locals_ = [b or b"" for b in committed_states(s, job_id)]
        return Message.from_bytes(job.global_msg), locals_, job


def hosted_then_agents(fed, tmp_path, dp, between=lambda: None):
    """One job (two of three tenants a round) hosted, then ``between()``, then run by the
    agent tenants to its end: (hosted job, agent job id, agents)."""
    _, client, hosted, agent_tenants, rows = fed
    ref = hosted_job(client, hosted, dp=dp, per_round=2)
    assert ref["status"] == "completed", ref
    between()
    res = agent_job(client, agent_tenants, dp=dp, per_round=2)
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    agents = [make_agent(client, key, rows[t], tmp_path / f"a{t}")
              for t, (_, key) in enumerate(agent_tenants)]
    drive(agents, job_id)
    job = wait_job(client, job_id)
    assert job["status"] == "completed", job
    return ref, job_id, agents


@pytest.mark.parametrize("dp", [{"mechanism": "none"},
                                {"mechanism": "gaussian", "noise_multiplier": 2.0}])
def test_agents_end_with_the_hosted_jobs_factors(fed, tmp_path, dp):
    """All-agent job vs the same job hosted (same data, split, seed): without DP the global
    V and every tenant's U agree to 1e-12; with DP the noise is fresh on each side (issue
    29), so the models differ, and every tenant's ledger agrees."""
    app, client, hosted, agent_tenants, rows = fed
    ref, job_id, agents = hosted_then_agents(fed, tmp_path, dp)
    glob_h, locals_h, _ = states(app, ref["id"])
    glob_a, _, _ = states(app, job_id)
    private = dp["mechanism"] != "none"
    assert (max_diff(glob_h, glob_a) > 1e-6) if private else max_diff(glob_h, glob_a) <= 1e-12
    for t, a in enumerate(agents):
        mine = Message.from_bytes(a.state.read(job_id, "local.msg"))
        if not private:
            assert max_diff(Message.from_bytes(locals_h[t]), mine) <= 1e-12
        assert messages_equal(Message.from_bytes(a.state.read(job_id, "global.msg")), glob_a)
    report_h = client.get(f"/v1/admin/jobs/{ref['id']}/report").json()["privacy"]
    report_a = client.get(f"/v1/admin/jobs/{job_id}/report").json()["privacy"]
    hosted_eps = report_h["epsilon_per_tenant"]
    agent_eps = report_a["epsilon_per_tenant"]
    for t, a in enumerate(agents):
        mine = a.epsilon_spent()
        theirs = agent_eps[str(agent_tenants[t][0])]
        assert theirs == hosted_eps[str(hosted[t][0])]
        if dp["mechanism"] == "none":
            assert mine == float("inf") and theirs == "infinity"
        else:
            assert mine == pytest.approx(theirs, rel=1e-12)
            charged = sorted(map(int, a.state.jobs[str(job_id)]["charged"]))
            assert charged == a.state.ledger.rounds(a.state.account)
            assert len(charged) == report_a["transmissions_per_tenant"][str(
                agent_tenants[t][0])]


def test_engine_service_and_agents_release_through_one_client_round(fed, tmp_path,
                                                                   monkeypatch):
    """The client half of a round is one function (:func:`algorithms.simulate.
    client_round`: local step, then check budget, privatise, charge) in the in-process
    engine, the service's client-step task and ``fedrec agent``: for one job (tenant unit,
    Gaussian, two of three tenants a round) each path releases the same (client, round)
    uploads through it, and every tenant is charged the same events in the same rounds on
    the simulator's ledger, the service's ledger of hosted tenants, each agent's own ledger
    and the coordinator's record of the agents' charges."""
    from algorithms import registry
    from algorithms import simulate as engine
    from algorithms.data import Federation
    from privacy.accountant import compose
    from privacy.ledger import Charge, Ledger
    from privacy.wrapper import DPPrivatizer, DPSpec

    released: dict[str, list[tuple[int, int]]] = {}
    path = ["service"]
    real_send = engine.send

    def spy(upload, privatizer, client, round_):
        if upload is not None and privatizer is not None:  # not the creation's dry run
            released.setdefault(path[0], []).append((int(client), int(round_)))
        return real_send(upload, privatizer, client, round_)

    monkeypatch.setattr(engine, "send", spy)
    dp = {"mechanism": "gaussian", "noise_multiplier": 2.0}
    app, client, hosted, agent_tenants, rows = fed
    ref, job_id, agents = hosted_then_agents(fed, tmp_path, dp,
                                             between=lambda: path.__setitem__(0, "agents"))

    path[0] = "engine"
    manifest = agents[0].manifest(job_id)
    alg = registry.get(manifest["algorithm"])
    train = [RatingBlock.from_bytes(a.state.read(job_id, "train.block")) for a in agents]
    test = [RatingBlock.from_bytes(a.state.read(job_id, "test.block")) for a in agents]
    fedn = Federation(train, test, [np.arange(b.n_users) for b in train],
                      np.arange(N_ITEMS), tuple(manifest["scale"]))
    priv = DPPrivatizer(DPSpec(**dp), Ledger.open({i: NO_LIMIT for i in range(N_TENANTS)}),
                        seed=11)
    engine.simulate(alg, alg.config(**manifest["config"]), fedn, rounds=4, per_round=2,
                    seed=11, privatizer=priv, evaluate_every=0)

    assert len(released["engine"]) == 4 * 2
    assert sorted(released["service"]) == sorted(released["agents"]) == sorted(
        released["engine"])
    with app.state.sessions() as s:
        rows_of = s.execute(sa.select(LedgerEntry.job_id, LedgerEntry.tenant_id,
                                      LedgerEntry.round, LedgerEntry.event)
                            .where(LedgerEntry.job_id.in_([ref["id"], job_id]))
                            .order_by(LedgerEntry.round)).all()

    def book(job, tenant):
        mine = [(r, Charge.from_row(e).event) for j, t, r, e in rows_of
                if j == job and t == tenant]
        return [r for r, _ in mine], compose([e for _, e in mine])

    for t in range(N_TENANTS):
        want = priv.ledger.rounds(t), priv.ledger.history(t)
        assert want[0] == sorted(k for c, k in released["engine"] if c == t)
        assert book(ref["id"], hosted[t][0]) == want, t
        assert book(job_id, agent_tenants[t][0]) == want, t
        own = agents[t].state.ledger
        assert (own.rounds(own_account := agents[t].state.account),
                own.history(own_account)) == want, t
def test_a_round_closing_while_the_coordinator_reads_is_not_offered_twice(fed, tmp_path):
    """The round an agent polls is read from the job and its upload row; an aggregate
    committing between those reads (it deletes the round's uploads and moves the round on)
    once made a sent round look open, and the agent released it again: one more charge on
    its own ledger than the coordinator recorded (seen in about one run of the agent tests
    in ten). The coordinator now answers "wait" for a round that closed meanwhile, and an
    agent asked again for a round it sent runs nothing and charges nothing."""
    from app.training import agents as coordinator

    app, client, _, agent_tenants, rows = fed
    dp = {"mechanism": "gaussian", "noise_multiplier": 2.0}
    job_id = agent_job(client, agent_tenants, dp=dp).json()["id"]
    agent = make_agent(client, agent_tenants[0][1], rows[0], tmp_path / "a0")
    agent.setup(job_id)
    rec = agent.state.jobs[str(job_id)]
    while rec["local_round"] < 1:  # agent 0 sends round 1; the others send nothing yet
        agent.step(job_id, wait=0.05)
    spent = agent.epsilon_spent()
    assert agent.state.ledger.rounds(agent.state.account) == [1]

    with app.state.sessions() as s:
        stale, client_index = coordinator.agent_job(s, job_id, agent_tenants[0][0])
        assert coordinator.round_status(s, stale, client_index)["uploaded"] is True
        with app.state.sessions() as other:  # the round's aggregate commits meanwhile
            job = other.get(TrainingJob, job_id)
            job.current_round = 1
            other.execute(sa.delete(RoundUpload).where(RoundUpload.job_id == job_id))
            other.commit()
        assert stale.current_round == 0  # the first read, as the poll held it
        status = coordinator.round_status(s, stale, client_index)
    assert status["phase"] == "wait", status

    # asked for round 1 again by a coordinator whose answers are all stale (or hostile):
    # nothing runs, nothing is charged
    first = agent.state.read(job_id, "global.msg")
    agent.coord.global_msg = lambda job: (0, None, first)
    agent._act(job_id, rec, {**status, "phase": "upload", "round": 1,
                             "completed_rounds": 0})
    assert rec["pending"] is None
    assert agent.state.ledger.rounds(agent.state.account) == [1]
    assert agent.epsilon_spent() == spent


def test_an_agent_resumes_without_a_second_charge(fed, tmp_path):
    """Killed after charging round 1 and before sending: the restarted agent sends the
    persisted noisy bytes (no second draw: the noise is fresh, so a redraw would differ),
    the round is charged once on both ledgers, and the job completes."""
    from agent.run import plain_upload

    app, client, _, agent_tenants, rows = fed
    dp = {"mechanism": "gaussian", "noise_multiplier": 2.0}

    class Crash(Exception):
        pass

    def crash(*args):
        raise Crash

    job_id = agent_job(client, agent_tenants, dp=dp, seed=3).json()["id"]
    agents = [make_agent(client, key, rows[t], tmp_path / f"a{t}")
              for t, (_, key) in enumerate(agent_tenants)]
    agents[0].uploader = crash
    for a in agents:
        a.setup(job_id)
    while True:  # until agent 0 has charged round 1 and "died" sending it
        try:
            agents[0].step(job_id, wait=0.05)
        except Crash:
            break
    rec = agents[0].state.jobs[str(job_id)]
    assert rec["pending"]["round"] == 1 and list(rec["charged"]) == ["1"]
    with app.state.sessions() as s:
        assert s.get(RoundUpload, (job_id, 1, 0)) is None  # nothing reached the coordinator
    spent_before = agents[0].epsilon_spent()
    persisted = agents[0].state.read(job_id, "pending-1.upload")
    sent = {}

    def record(coord, manifest, round_, data, charge):
        sent.setdefault(round_, data)
        return plain_upload(coord, manifest, round_, data, charge)

    restarted = make_agent(client, agent_tenants[0][1], rows[0], tmp_path / "a0", budget=None,
                           uploader=record)
    assert restarted.epsilon_spent() == spent_before
    drive_after = [restarted, *agents[1:]]
    live, end = list(drive_after), time.monotonic() + 60
    while live:
        assert time.monotonic() < end
        live = [a for a in live if a.step(job_id, wait=0.05)]
    assert wait_job(client, job_id)["status"] == "completed"
    assert sent[1] == persisted  # the release persisted before the crash, not a new draw
    assert restarted.state.ledger.rounds(restarted.state.account) == [1, 2, 3, 4]
    with app.state.sessions() as s:
        rounds = s.scalars(sa.select(LedgerEntry.round).where(
            LedgerEntry.job_id == job_id, LedgerEntry.tenant_id == agent_tenants[0][0])
            .order_by(LedgerEntry.round)).all()
    assert rounds == [1, 2, 3, 4]


def test_an_agent_refuses_past_its_own_budget(fed, tmp_path):
    """The agent's own epsilon_max is below what the coordinator would allow: it sends two
    rounds, then declines, says so, and the job lists it as stopped."""
    app, client, _, agent_tenants, rows = fed
    dp = {"mechanism": "gaussian", "noise_multiplier": 2.0}
    job_id = agent_job(client, agent_tenants, dp=dp).json()["id"]
    from privacy.accountant import spend
    from privacy.wrapper import DPSpec, event_for

    ev = event_for(DPSpec(**dp), 1)  # noise multiplier given: the event does not depend on d
    two = spend([ev.times(2)], 1e-5).epsilon
    three = spend([ev.times(3)], 1e-5).epsilon
    said = []
    agents = [make_agent(client, key, rows[t], tmp_path / f"a{t}") for t, (_, key)
              in enumerate(agent_tenants)]
    agents[1] = make_agent(client, agent_tenants[1][1], rows[1], tmp_path / "a1x",
                           budget=Budget((two + three) / 2, 1e-5))
    agents[1].log = said.append
    drive(agents, job_id)
    job = wait_job(client, job_id)
    assert job["status"] == "completed"
    assert agents[1].state.ledger.rounds(agents[1].state.account) == [1, 2]
    assert agents[1].epsilon_spent() == pytest.approx(two)
    assert any("refusing to transmit in round 3: budget exhausted" in s for s in said)
    assert "declined by its agent: budget exhausted in round 3" in job["stopped_tenants"][
        str(agent_tenants[1][0])]
    with app.state.sessions() as s:
        assert s.scalars(sa.select(LedgerEntry.round).where(
            LedgerEntry.job_id == job_id, LedgerEntry.tenant_id == agent_tenants[1][0])
            .order_by(LedgerEntry.round)).all() == [1, 2]


# ---- the routes' refusals -------------------------------------------------------------

@pytest.fixture
def open_round(fed, tmp_path):
    """A job of two agents (tenant 0 hosted-free) in round 1, agent 0's round computed."""
    app, client, hosted, agent_tenants, rows = fed
    res = agent_job(client, agent_tenants[:2], dp={"mechanism": "gaussian",
                                                   "noise_multiplier": 2.0}, rounds=2)
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    sent = []

    def keep(coord, manifest, round_, data, charge):
        sent.append((round_, data, charge))
        raise RuntimeError("held back")

    a = make_agent(client, agent_tenants[0][1], rows[0], tmp_path / "a0", uploader=keep)
    a.setup(job_id)
    end = time.monotonic() + 10
    while not sent:
        assert time.monotonic() < end
        try:
            a.step(job_id, wait=0.05)
        except RuntimeError:
            pass
    return app, client, job_id, agent_tenants, sent[0], hosted


def _put(client, tenant, job_id, round_, data, **headers):
    tid, key = tenant
    return client.put(f"/v1/tenants/{tid}/agent/jobs/{job_id}/rounds/{round_}/upload",
                      content=data, headers={"Authorization": f"Bearer {key}",
                                             "Content-Type": "application/octet-stream",
                                             **headers})


def _charges(app, job_id):
    with app.state.sessions() as s:
        return s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round)
                         .where(LedgerEntry.job_id == job_id)).all()


def test_upload_refusals_name_the_problem_and_change_nothing(open_round):
    app, client, job_id, tenants, (round_, data, charge), hosted = open_round
    msg = Message.from_bytes(data)
    name, arr = next(iter(msg.arrays().items()))
    cases = [
        (b"not a message", 422, "upload is not a fedrec message"),
        (msg.replace(**{name: arr[:-1]}).to_bytes(), 422, f"upload.{name} has shape"),
        (msg.replace(**{name: np.full_like(arr, np.nan)}).to_bytes(), 422, "non-finite"),
        (msg.replace(**{name: arr.astype(np.float32)}).to_bytes(), 422, "has dtype float32"),
    ]
    for body, code, text in cases:
        res = _put(client, tenants[0], job_id, round_, body)
        assert res.status_code == code and text in res.json()["detail"], res.text
    res = _put(client, tenants[0], job_id, round_, data,
               **{"Fedrec-Charge": json.dumps(["gaussian", 0.5, 1])})
    assert res.status_code == 422 and "is not what job" in res.json()["detail"]
    res = _put(client, tenants[0], job_id, round_, data, **{"Fedrec-Charge": "00"})
    assert res.status_code == 422 and "Fedrec-Charge is not an event" in res.json()["detail"]
    # a malformed charge is judged after the job: an unknown job stays a 404
    assert _put(client, tenants[0], job_id + 99, round_, data,
                **{"Fedrec-Charge": "00"}).status_code == 404
    res = _put(client, tenants[0], job_id, round_ + 1, data)
    assert res.status_code == 409 and "has not started" in res.json()["detail"]
    assert _charges(app, job_id) == []
    # another tenant's path, and a tenant that is not an agent of the job: 404
    other = _put(client, (tenants[1][0], tenants[0][1]), job_id, round_, data)
    assert other.status_code == 404
    assert _put(client, tenants[2], job_id, round_, data).status_code == 404
    assert _put(client, hosted[0], job_id, round_, data).status_code == 404
    # accepted once; the same bytes again are a replay; different bytes a duplicate
    ok = _put(client, tenants[0], job_id, round_, data,
              **{"Fedrec-Charge": json.dumps(charge)})
    assert ok.status_code == 200 and ok.json()["replayed"] is False, ok.text
    again = _put(client, tenants[0], job_id, round_, data)
    assert again.status_code == 200 and again.json()["replayed"] is True
    other_bytes = msg.replace(**{name: arr + 1.0}).to_bytes()
    dup = _put(client, tenants[0], job_id, round_, other_bytes)
    assert dup.status_code == 409 and "duplicate" in dup.json()["detail"]
    assert _charges(app, job_id) == [(tenants[0][0], round_)]


def test_a_round_closes_at_its_deadline_and_refuses_late_uploads(fed, tmp_path):
    app, client, _, tenants, rows = fed
    res = agent_job(client, tenants[:2], rounds=2, round_seconds=1.0)
    job_id = res.json()["id"]
    a = make_agent(client, tenants[0][1], rows[0], tmp_path / "a0")
    a.setup(job_id)
    end = time.monotonic() + 30
    while client.get(f"/v1/admin/jobs/{job_id}").json()["current_round"] < 1:
        assert time.monotonic() < end
        a.step(job_id, wait=0.05)  # tenant 1 never comes: round 1 closes at its deadline
    job = client.get(f"/v1/admin/jobs/{job_id}").json()
    assert job["latest_metrics"]["missed_deadline"] == [tenants[1][0]]
    late = make_agent(client, tenants[1][1], rows[1], tmp_path / "a1")
    late.setup(job_id)
    body = Message.from_bytes(late.state.read(job_id, "global.msg"))  # any message
    res = _put(client, tenants[1], job_id, 1, body.to_bytes())
    assert res.status_code == 409 and "late: round 1 is closed" in res.json()["detail"]
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry).where(
            LedgerEntry.tenant_id == tenants[1][0])) == 0


def test_job_creation_refuses_bad_agents(fed):
    app, client, hosted, tenants, _ = fed
    res = client.post("/v1/admin/jobs", json={
        "algorithm": "fedmc-admm", "rounds": 2, "tenant_ids": [tenants[0][0]],
        "agents": [hosted[0][0]], "dp": {"mechanism": "gaussian", "noise_multiplier": 1.0}})
    assert res.status_code == 422 and "invalid agents" in res.json()["detail"]
    res = client.post("/v1/admin/jobs", json={
        "algorithm": "dpals", "rounds": 2, "tenant_ids": [tenants[0][0]],
        "agents": [tenants[0][0]], "privacy": {"unit": "user", "placement": "central",
                                               "target_epsilon": 8.0, "delta": 1e-6}})
    assert res.status_code == 422 and "placement 'tenant'" in res.json()["detail"]


def test_agent_validates_ratings_like_the_upload_api(fed, tmp_path):
    """Unknown items and out-of-scale ratings: the agent refuses with the API's errors."""
    app, client, _, tenants, rows = fed
    job_id = agent_job(client, tenants[:1], rounds=1).json()["id"]
    bad = "user,item,rating\nu1,i1,4\nu1,nope,3\nu2,i2,9\n"
    api = client.post(f"/v1/tenants/{tenants[1][0]}/ratings", content=bad.encode(),
                      headers={"Content-Type": "text/csv",
                               "Authorization": f"Bearer {tenants[1][1]}"})
    assert api.status_code == 422
    coord = Coordinator(None, tenants[0][0], tenants[0][1], http=client)
    a = Agent(coord, AgentState.open(tmp_path / "x", str(coord.tenant_id),
                                     Budget(1.0, 1e-5, True)),
              lambda scale: parse_bytes(bad.encode(), "text/csv", scale), log=lambda t: None)
    with pytest.raises(ValueError) as exc:
        a.setup(job_id)
    assert api.json()["errors"]
    for e in api.json()["errors"]:
        assert f"line {e['line']}, {e['field']}: {e['message']}" in str(exc.value)


@pytest.mark.parametrize("newer, says", [
    ({"protocol": 2}, "the coordinator speaks agent protocol 2 and this agent"),
    ({"config": {"rank": 3, "future_knob": 1.5}}, "fields this agent does not know "
                                                   "(future_knob)"),
    ({"algorithm": "fedmc-next"}, "algorithm 'fedmc-next' is unknown to this agent"),
])
def test_an_agent_behind_its_coordinator_says_to_upgrade_and_joins_nothing(
        fed, tmp_path, newer, says):
    """A coordinator on a newer release (a protocol, config field or algorithm this agent
    does not know) gets a clear refusal naming the upgrade, not a traceback, and the
    agent keeps no state of the job."""
    _, client, _, tenants, rows = fed
    job_id = agent_job(client, tenants[:1], rounds=1).json()["id"]
    a = make_agent(client, tenants[0][1], rows[0], tmp_path / "a")
    real = a.coord.manifest
    a.coord.manifest = lambda j: {**real(j), **newer}
    with pytest.raises(ValueError) as exc:
        a.setup(job_id)
    assert says in str(exc.value) and "install the coordinator's fedrec release here" in \
        str(exc.value), exc.value
    assert str(job_id) not in a.state.jobs


def test_an_agent_imports_no_server_code():
    import subprocess
    import sys

    code = ("import sys, agent.run, agent.cli, app.cli; "
            "app.cli.main(['agent', 'status', '--state-dir', '/nonexistent']); "
            "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'celery', 'app.models', "
            "'app.main', 'app.db') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_state_writes_are_atomic(tmp_path):
    from agent.state import atomic_write

    path = tmp_path / "f"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temporary left behind


def test_an_agent_killed_after_its_upload_arrived_replays_it(fed, tmp_path):
    """Killed after the coordinator stored round 1 but before the agent recorded that: the
    restarted agent re-sends the same bytes, the coordinator answers with a replay, and
    round 1 stays charged once on both ledgers."""
    from agent.run import plain_upload

    app, client, _, tenants, rows = fed
    job_id = agent_job(client, tenants[:2], dp={"mechanism": "gaussian",
                                                "noise_multiplier": 2.0}, rounds=2).json()["id"]

    class Crash(Exception):
        pass

    answers = []

    def send_then_die(*args):
        answers.append(plain_upload(*args))
        raise Crash

    first = make_agent(client, tenants[0][1], rows[0], tmp_path / "a0", uploader=send_then_die)
    other = make_agent(client, tenants[1][1], rows[1], tmp_path / "a1")
    first.setup(job_id)
    other.setup(job_id)
    with pytest.raises(Crash):
        while True:
            first.step(job_id, wait=0.05)
    assert answers[0]["replayed"] is False
    with app.state.sessions() as s:
        assert s.get(RoundUpload, (job_id, 1, 0)) is not None
    said = []
    again = make_agent(client, tenants[0][1], rows[0], tmp_path / "a0", budget=None)
    again.log = said.append
    live, end = [again, other], time.monotonic() + 60
    while live:
        assert time.monotonic() < end
        live = [a for a in live if a.step(job_id, wait=0.05)]
    assert any("round 1: sent its upload (replayed)" in s for s in said)
    assert again.state.ledger.rounds(again.state.account) == [1, 2]
    assert sorted(r for t, r in _charges(app, job_id) if t == tenants[0][0]) == [1, 2]


def test_hosted_and_agent_tenants_mix_in_one_job(fed, tmp_path):
    """Tenant 0 hosted, tenants 1 and 2 agents: the rounds wait for both kinds and the job
    ends with the all-hosted job's factors."""
    app, client, hosted, agent_tenants, rows = fed
    ref = hosted_job(client, hosted, per_round=2)
    mixed = [hosted[0], *agent_tenants[1:]]
    res = client.post("/v1/admin/jobs", json={
        "algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 4, "per_round": 2,
        "seed": 11, "dp": {"mechanism": "none"}, "allow_not_private": True,
        "tenant_ids": [t for t, _ in mixed], "agents": [t for t, _ in mixed[1:]]})
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    agents = [make_agent(client, key, rows[t + 1], tmp_path / f"a{t}")
              for t, (_, key) in enumerate(agent_tenants[1:])]
    drive(agents, job_id)
    assert wait_job(client, job_id)["status"] == "completed"
    glob_h, locals_h, _ = states(app, ref["id"])
    glob_m, locals_m, _ = states(app, job_id)
    assert max_diff(glob_h, glob_m) <= 1e-12
    assert max_diff(Message.from_bytes(locals_h[0]), Message.from_bytes(locals_m[0])) <= 1e-12
    for t, a in enumerate(agents):
        mine = Message.from_bytes(a.state.read(job_id, "local.msg"))
        assert max_diff(Message.from_bytes(locals_h[t + 1]), mine) <= 1e-12
    with app.state.sessions() as s:  # the hosted tenant's metrics, the agents' stay theirs
        per_tenant = s.scalars(sa.select(JobRoundRow.per_tenant).where(
            JobRoundRow.job_id == job_id)).all()
    assert all(set(p) == {str(hosted[0][0])} for p in per_tenant)


def test_user_level_agents_match_hosted_placement_tenant(fed, tmp_path):
    """DPALS with users protected at placement tenant: agents noise and charge their own
    releases as the hosted client steps do, so every tenant's epsilon agrees (the noise is
    fresh and secret on each side, so the factors differ)."""
    app, client, hosted, agent_tenants, rows = fed
    body = {"algorithm": "dpals", "config": {"rank": 3}, "rounds": 3, "per_round": 0,
            "seed": 5, "privacy": {"unit": "user", "placement": "tenant",
                                   "target_epsilon": 8.0, "delta": 1e-6}}
    ref = client.post("/v1/admin/jobs", json={**body, "tenant_ids": [t for t, _ in hosted]})
    assert ref.status_code == 202, ref.text
    ref = wait_job(client, ref.json()["id"])
    assert ref["status"] == "completed", ref
    res = client.post("/v1/admin/jobs", json={**body, "tenant_ids": [t for t, _ in agent_tenants],
                                           "agents": [t for t, _ in agent_tenants]})
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    agents = [make_agent(client, key, rows[t], tmp_path / f"a{t}",
                         budget=Budget(100.0, 1e-6))
              for t, (_, key) in enumerate(agent_tenants)]
    drive(agents, job_id)
    assert wait_job(client, job_id)["status"] == "completed"
    glob_h, _, _ = states(app, ref["id"])
    glob_a, _, _ = states(app, job_id)
    assert max_diff(glob_h, glob_a) > 1e-6
    report_h = client.get(f"/v1/admin/jobs/{ref['id']}/report").json()["privacy"]
    report_a = client.get(f"/v1/admin/jobs/{job_id}/report").json()["privacy"]
    for t, a in enumerate(agents):
        assert (a.state.root / "user-draws.key").stat().st_mode & 0o077 == 0  # owner only
        theirs = report_a["epsilon_per_tenant"][str(agent_tenants[t][0])]
        assert theirs == pytest.approx(
            report_h["epsilon_per_tenant"][str(hosted[t][0])], rel=1e-12)
        assert a.epsilon_spent() == pytest.approx(theirs, rel=1e-12)


SECAGG = {"algorithm": "dpals", "config": {"rank": 3}, "rounds": 3, "per_round": 0,
          "seed": 5, "privacy": {"unit": "user", "placement": "tenant", "target_epsilon": 8.0,
                                 "delta": 1e-6, "secure_aggregation": True}}


def test_secure_aggregation_between_agents_matches_the_simulation(fed, tmp_path):
    """All-agent DPALS with secure aggregation over HTTP: the coordinator keeps only masked
    inputs (uniform-looking mod 2^64, nothing like a fixed-point upload) and unmasks the
    noisy sum; fedrec simulate's SecureAggregationPrivatizer path with the same seed and
    blocks ends elsewhere (issue 29: the agents' noise is fresh and secret, nothing the
    coordinator holds regenerates it), and the ledgers agree."""
    from algorithms import registry
    from algorithms.data import Federation
    from algorithms.simulate import simulate
    from app.training.models import SecAggMessage
    from privacy import secagg, user_level
    from privacy.distributed import SecureAggregationPrivatizer

    app, client, _, agent_tenants, rows = fed
    res = client.post("/v1/admin/jobs", json={**SECAGG,
                                           "tenant_ids": [t for t, _ in agent_tenants],
                                           "agents": [t for t, _ in agent_tenants]})
    assert res.status_code == 202, res.text
    job_id = res.json()["id"]
    agents = _secure_agents(client, agent_tenants, rows, tmp_path)
    drive(agents, job_id)
    assert wait_job(client, job_id)["status"] == "completed"
    glob, _, job = states(app, job_id)

    # what the coordinator kept: every phase of every round, masked inputs that look uniform
    with app.state.sessions() as s:
        kept = s.execute(sa.select(SecAggMessage.round, SecAggMessage.phase,
                                   SecAggMessage.body)
                         .where(SecAggMessage.job_id == job_id)).all()
        assert s.scalar(sa.select(sa.func.count()).select_from(RoundUpload)
                        .where(RoundUpload.job_id == job_id)) == 0
    manifest = agents[0].manifest(job_id)
    alg = registry.get(manifest["algorithm"])
    cfg = alg.config(**manifest["config"])
    sweeps = min(cfg.sweeps, SECAGG["rounds"])
    phases = {(r, p) for r, p, _ in kept}
    assert phases == {(r, p) for r in range(1, sweeps + 1)
                      for p in ("keys", "shares", "masked", "unmask")}
    masked = [secagg.from_wire(json.loads(b)).y for _, p, b in kept if p == "masked"]
    assert len(masked) == N_TENANTS * sweeps
    for y in masked:
        signed = np.abs(y.view(np.int64).astype(np.float64))
        # a fixed-point upload (|x| 2^20 plus noise) is far below 2^50 everywhere; a masked
        # one is uniform mod 2^64: below 2^50 with probability 2^-13 per entry
        assert np.mean(signed < 2.0 ** 50) < 0.01
        assert 0.4 < np.mean(y.astype(np.float64) / 2.0 ** 64) < 0.6

    # the same run in process: simulate with the job's privacy spec and the agents' blocks
    spec = user_level.from_settings(job.dp)
    bounds = registry.user_bounds(alg.name, cfg)
    train = [RatingBlock.from_bytes(a.state.read(job_id, "train.block")) for a in agents]
    test = [RatingBlock.from_bytes(a.state.read(job_id, "test.block")) for a in agents]
    fedn = Federation(train, test, [np.arange(b.n_users) for b in train],
                      np.arange(N_ITEMS), tuple(manifest["scale"]))
    priv = SecureAggregationPrivatizer(spec, bounds, N_TENANTS, SECAGG["seed"])
    ref = simulate(alg, cfg, fedn, rounds=SECAGG["rounds"], per_round=N_TENANTS,
                   seed=SECAGG["seed"], privatizer=priv, aggregator=priv.aggregate,
                   evaluate_every=0)
    assert max_diff(ref.global_msg, glob) > 1e-6
    assert not any(k in json.dumps(manifest).lower() for k in ("user-draws", "prf"))

    # each agent charged its own ledger per release; the coordinator's view says the same
    report = client.get(f"/v1/admin/jobs/{job_id}/report").json()["privacy"]
    for t, a in enumerate(agents):
        theirs = report["epsilon_per_tenant"][str(agent_tenants[t][0])]
        assert a.epsilon_spent() == pytest.approx(theirs, rel=1e-12)
        assert a.state.ledger.rounds(a.state.account) == list(range(1, sweeps + 1))
    with app.state.sessions() as s:
        rounds_charged = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round)
                                   .where(LedgerEntry.job_id == job_id)).all()
    assert sorted(rounds_charged) == sorted((t, r) for t, _ in agent_tenants
                                            for r in range(1, sweeps + 1))


def test_secure_aggregation_is_refused_with_a_hosted_tenant(fed):
    _, client, hosted, agent_tenants, _ = fed
    mixed = [hosted[0], *agent_tenants[1:]]
    res = client.post("/v1/admin/jobs", json={**SECAGG, "tenant_ids": [t for t, _ in mixed],
                                           "agents": [t for t, _ in mixed[1:]]})
    assert res.status_code == 422, res.text
    detail = res.json()["detail"]
    assert "privacy.secure_aggregation" in detail and str(hosted[0][0]) in detail
    res = client.post("/v1/admin/jobs", json={
        **SECAGG, "tenant_ids": [t for t, _ in agent_tenants],
        "agents": [t for t, _ in agent_tenants],
        "privacy": {**SECAGG["privacy"], "placement": "central"}})
    assert res.status_code == 422, res.text
    assert "privacy.placement" in res.json()["detail"]
    res = client.post("/v1/admin/jobs", json={**SECAGG, "per_round": 1,
                                           "tenant_ids": [t for t, _ in agent_tenants],
                                           "agents": [t for t, _ in agent_tenants]})
    assert res.status_code == 422 and "at least 2 tenants" in res.json()["detail"]
    with_extra = {**SECAGG["privacy"], "dropout_tolerance": 0.6}
    res = client.post("/v1/admin/jobs", json={**SECAGG, "privacy": with_extra,
                                           "tenant_ids": [t for t, _ in agent_tenants],
                                           "agents": [t for t, _ in agent_tenants]})
    assert res.status_code == 422, res.text
    assert "dropout_tolerance" in res.text


def _secagg_job(client, agent_tenants, **extra):
    privacy = {**SECAGG["privacy"], **extra.pop("privacy", {})}
    res = client.post("/v1/admin/jobs", json={**SECAGG, **extra, "privacy": privacy,
                                           "tenant_ids": [t for t, _ in agent_tenants],
                                           "agents": [t for t, _ in agent_tenants]})
    assert res.status_code == 202, res.text
    return res.json()["id"]



def _secure_agents(client, agent_tenants, rows, tmp_path, budget=None):
    """One agent per tenant (directory a<t>), secure aggregation without long-polls."""
    agents = [make_agent(client, key, rows[t], tmp_path / f"a{t}",
                         budget=budget or Budget(100.0, 1e-6))
              for t, (_, key) in enumerate(agent_tenants)]
    for a in agents:
        a.secure.wait = 0.0
    return agents


def _shares_sent(agent, job_id: int, round_: int) -> bool:
    """The agent has recorded sending its shares of round ``round_``."""
    path = agent.state.job_dir(job_id) / f"secagg-{round_}.json"
    return path.exists() and "shares" in json.loads(path.read_text())["sent"]


def _post_phase(client, tenant, job_id, round_, phase, body):
    tid, key = tenant
    return client.post(f"/v1/tenants/{tid}/agent/jobs/{job_id}/rounds/{round_}/secagg/{phase}",
                       content=body if isinstance(body, bytes) else json.dumps(body),
                       headers={"Authorization": f"Bearer {key}",
                                "Content-Type": "application/json"})


def test_secure_aggregation_messages_follow_the_upload_rules(fed, tmp_path):
    """Replay 200, different bytes 409, a phase not open yet 409, malformed 422, a plain
    upload 409; nothing refused is stored."""
    from app.training.models import SecAggMessage
    from privacy import secagg

    app, client, _, agent_tenants, rows = fed
    job_id = _secagg_job(client, agent_tenants)
    a = make_agent(client, agent_tenants[0][1], rows[0], tmp_path / "a0")
    a.secure.wait = 0.0
    a.setup(job_id)
    end = time.monotonic() + 10
    while not (a.state.job_dir(job_id) / "secagg-1.json").exists():
        assert time.monotonic() < end
        a.step(job_id, wait=0.05)
    sent = json.loads(a.state.read(job_id, "secagg-1.json"))["sent"]["keys"]
    t0 = agent_tenants[0]
    res = _post_phase(client, t0, job_id, 1, "keys", {"message": sent})
    assert res.status_code == 200 and res.json()["replayed"] is True, res.text
    _, other = secagg.advertise(0, b"x")
    res = _post_phase(client, t0, job_id, 1, "keys", {"message": secagg.to_wire(other)})
    assert res.status_code == 409 and "duplicate" in res.json()["detail"]
    res = _post_phase(client, t0, job_id, 1, "shares", {"message": sent})
    assert res.status_code == 409 and "not open yet (open: keys)" in res.json()["detail"]
    t2 = agent_tenants[2]
    short = {**secagg.to_wire(secagg.advertise(2, b"x")[1]), "mask_pk": {"b64": "AAAA"}}
    res = _post_phase(client, t2, job_id, 1, "keys", {"message": short})
    assert res.status_code == 422 and "32-byte" in res.json()["detail"]
    res = _post_phase(client, t2, job_id, 1, "keys", {"message": sent})  # tenant 0's keys
    assert res.status_code == 422 and "sent by client 2" in res.json()["detail"]
    res = _post_phase(client, t2, job_id, 1, "keys", b"{not json")
    assert res.status_code == 422
    res = _post_phase(client, t2, job_id, 1, "keys", {"message": {"type": "Nope"}})
    assert res.status_code == 422 and "malformed" in res.json()["detail"]
    res = _put(client, t2, job_id, 1, a.state.read(job_id, "pending-1.upload"))
    assert res.status_code == 409 and "uses secure aggregation" in res.json()["detail"]
    with app.state.sessions() as s:
        kept = s.execute(sa.select(SecAggMessage.client_index, SecAggMessage.phase)
                         .where(SecAggMessage.job_id == job_id)).all()
    assert kept == [(0, "keys")]
    assert _charges(app, job_id) == []  # charged at the masked input only


def test_secure_aggregation_survives_a_dropout_within_the_tolerance(fed, tmp_path):
    """Agent 2 vanishes after sending its shares: the masked phase closes at its cut-off,
    the survivors reveal agent 2's mask key, the round closes at its deadline with the sum
    of the other two, as simulate's privatizer with that tenant dropped computes it; agent
    2's charge is on its own ledger only (nothing of it reached the sum). The noise is
    fresh, so the model is compared in kind, not bit for bit (issue 29)."""
    from algorithms import registry
    from algorithms.data import Federation
    from algorithms.simulate import simulate
    from privacy import user_level
    from privacy.distributed import SecureAggregationPrivatizer

    app, client, _, agent_tenants, rows = fed
    # the keys phase is the first quarter of the round: the agents, set up after the round
    # started, need more than 1.5 s on a loaded machine (two cores shared by many test
    # processes) to send theirs; 3 s here, and the test waits out the round's 12 s
    job_id = _secagg_job(client, agent_tenants, rounds=1, round_seconds=12.0,
                         privacy={"dropout_tolerance": 0.4})
    agents = _secure_agents(client, agent_tenants, rows, tmp_path)
    for a in agents:
        a.setup(job_id)
    gone = agents[2]

    end = time.monotonic() + 60
    live = list(agents)
    while live:
        assert time.monotonic() < end, "agents did not finish"
        if gone in live and _shares_sent(gone, job_id, 1):
            live.remove(gone)
        live = [a for a in live if a.step(job_id, wait=0.05)]
    assert wait_job(client, job_id)["status"] == "completed"
    glob, _, job = states(app, job_id)
    with app.state.sessions() as s:
        rounds = s.scalars(sa.select(JobRoundRow.uploads).where(JobRoundRow.job_id == job_id)
                           ).all()
    assert rounds == [2]
    assert sorted(_charges(app, job_id)) == sorted((t, 1) for t, _ in agent_tenants[:2])
    assert gone.state.ledger.rounds(gone.state.account) == [1]

    manifest = agents[0].manifest(job_id)
    alg = registry.get(manifest["algorithm"])
    cfg = alg.config(**manifest["config"])
    train = [RatingBlock.from_bytes(a.state.read(job_id, "train.block")) for a in agents]
    fedn = Federation(train, train, [np.arange(b.n_users) for b in train],
                      np.arange(N_ITEMS), tuple(manifest["scale"]))
    priv = SecureAggregationPrivatizer(user_level.from_settings(job.dp),
                                       registry.user_bounds(alg.name, cfg), N_TENANTS, 5,
                                       drop=[2])
    ref = simulate(alg, cfg, fedn, rounds=1, per_round=N_TENANTS, seed=5, privatizer=priv,
                   aggregator=priv.aggregate, evaluate_every=0)
    assert priv.releases[-1]["dropped"] == [2]
    # the same release, other (fresh, secret) noise: close in scale, never equal
    assert 0 < max_diff(ref.global_msg, glob) and all(
        np.all(np.isfinite(x)) for x in glob.arrays().values())


def test_an_agent_restarted_mid_protocol_resends_the_same_messages(fed, tmp_path):
    """Agent 0 is replaced by a fresh process on its state directory after sending its
    shares in round 2: it re-sends the same bytes (replays), draws no new keys or noise and
    is charged once per release; the job completes (its noise is fresh, so it is not
    compared bit for bit with a simulation: issue 29)."""
    from algorithms import registry
    from app.training.models import SecAggMessage

    app, client, _, agent_tenants, rows = fed
    job_id = _secagg_job(client, agent_tenants)
    budget = Budget(100.0, 1e-6)
    agents = _secure_agents(client, agent_tenants, rows, tmp_path, budget)
    for a in agents:
        a.setup(job_id)
    first = agents[0]

    end, restarted, live = time.monotonic() + 60, False, list(agents)
    while live:
        assert time.monotonic() < end, "agents did not finish"
        if not restarted and _shares_sent(first, job_id, 2):
            sent = json.loads(first.state.read(job_id, "secagg-2.json"))["sent"]
            fresh = make_agent(client, agent_tenants[0][1], rows[0], tmp_path / "a0",
                               budget=budget)  # the same directory: a restarted agent
            fresh.secure.wait = 0.0
            live[live.index(first)] = agents[0] = fresh
            restarted = True
        live = [a for a in live if a.step(job_id, wait=0.05)]
    assert restarted
    assert wait_job(client, job_id)["status"] == "completed"
    glob, _, job = states(app, job_id)
    with app.state.sessions() as s:
        kept = {p: json.loads(b) for p, b in s.execute(
            sa.select(SecAggMessage.phase, SecAggMessage.body).where(
                SecAggMessage.job_id == job_id, SecAggMessage.round == 2,
                SecAggMessage.client_index == 0))}
    assert kept["keys"] == sent["keys"] and kept["shares"] == sent["shares"]
    manifest = agents[0].manifest(job_id)
    alg = registry.get(manifest["algorithm"])
    cfg = alg.config(**manifest["config"])
    sweeps = min(cfg.sweeps, SECAGG["rounds"])
    assert agents[0].state.ledger.rounds(agents[0].state.account) == list(
        range(1, sweeps + 1))
    assert all(np.all(np.isfinite(x)) for x in glob.arrays().values())
    assert sorted(r for t, r in _charges(app, job_id) if t == agent_tenants[0][0]) == list(
        range(1, sweeps + 1))


def test_a_masked_input_with_a_charge_not_the_jobs_is_refused(fed, tmp_path):
    """The masked input carries the agent's charge; one that is not the job's release event
    is 422 and stores nothing; the right one is recorded once in the coordinator's view."""
    from agent.client import Refused

    app, client, _, agent_tenants, rows = fed
    job_id = _secagg_job(client, agent_tenants, rounds=1)
    agents = _secure_agents(client, agent_tenants, rows, tmp_path)
    seen = []
    coord = agents[0].coord
    real_post = coord.secagg_post

    def post(job, round_, phase, message, charge=None):
        if phase == "masked" and not seen:
            wrong = [charge[0], charge[1] * 2, charge[2]]
            with pytest.raises(Refused) as err:
                real_post(job, round_, phase, message, wrong)
            seen.append((err.value.status, err.value.detail, list(_charges(app, job_id))))
        return real_post(job, round_, phase, message, charge)

    coord.secagg_post = post
    drive(agents, job_id)
    assert wait_job(client, job_id)["status"] == "completed"
    (status, detail, before), = seen
    assert status == 422 and "is not what job" in detail
    assert (agent_tenants[0][0], 1) not in before
    assert sorted(_charges(app, job_id)) == sorted((t, 1) for t, _ in agent_tenants)
