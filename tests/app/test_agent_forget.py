"""Forgetting for agent tenants (issue 32, item 9): ``fedrec agent forget`` removes the
user from every joined job's blocks, local state and serving, and from jobs joined later;
a running agent's later rounds leave them out; the coordinator's ``DELETE .../users/{user}/
ratings`` for an agent tenant reaches the agent on its poll loop."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent import cli
from agent.run import recommend
from algorithms import Message, RatingBlock
from tests.app import test_agents
from tests.app.test_agents import agent_job, drive, make_agent

fed = test_agents.fed  # the fixture


def _job(client, agents, **body):
    res = agent_job(client, agents, **body)
    assert res.status_code == 202, res.text
    return res.json()["id"]


def _stored(root, job_id):
    """(users, train, test, per-user rows of the local state) of a job's stored state."""
    where = root / "jobs" / str(job_id)
    local = Message.from_bytes((where / "local.msg").read_bytes())
    a = np.hstack([np.asarray(getattr(local, n), dtype=float).reshape(
        len(json.loads((where / "users.json").read_text())), -1) for n in local.user_rows])
    return (json.loads((where / "users.json").read_text()),
            RatingBlock.from_bytes((where / "train.block").read_bytes()),
            RatingBlock.from_bytes((where / "test.block").read_bytes()), np.asarray(a))


def _forget(capsys, root, user, *extra):
    assert cli.main(["agent", "forget", user, "--state-dir", str(root), *extra]) == 0
    return capsys.readouterr().out


def _mine(rows, user):
    return sum(1 for u, _, _ in rows if u == user)


def test_agent_forget_removes_the_user_everywhere_and_from_later_jobs(fed, tmp_path, capsys):
    """After the command the user's ratings, U row and key are gone from the joined job,
    recommend answers 'unknown user'; a second forget says so and changes nothing; a job
    joined later never sees the user, until --undo (a new consent)."""
    app, client, _, agent_tenants, rows = fed
    roots = [tmp_path / f"a{t}" for t in range(len(agent_tenants))]
    agents = [make_agent(client, key, rows[t], roots[t])
              for t, (_, key) in enumerate(agent_tenants)]
    first = _job(client, agent_tenants)
    drive(agents, first)
    root, user = roots[0], rows[0][0][0]
    assert recommend(root, user, 3)
    users, train, test, a = _stored(root, first)
    row = users.index(user)
    assert np.any(a[row] != 0) and np.sum(train.rows == row) + np.sum(test.rows == row)
    before = train.nnz + test.nnz

    out = _forget(capsys, root, user)
    assert f"forgot user {user!r}: {_mine(rows[0], user)} ratings removed" in out
    users, train, test, a = _stored(root, first)
    assert user not in users and users[row] == ""
    assert not np.any(train.rows == row) and not np.any(test.rows == row)
    assert train.nnz + test.nnz == before - _mine(rows[0], user)
    assert np.all(a[row] == 0) and np.any(a[row + 1] != 0)
    with pytest.raises(ValueError, match="unknown user"):
        recommend(root, user, 3)
    other = users[row + 1]
    assert recommend(root, other, 3)

    files = {p.name: p.read_bytes() for p in (root / "jobs" / str(first)).iterdir()}
    assert "forgotten already: nothing to do" in _forget(capsys, root, user)
    assert files == {p.name: p.read_bytes() for p in (root / "jobs" / str(first)).iterdir()}

    second = _job(client, agent_tenants)  # the data source still has the user's ratings
    drive(agents, second)
    users, train, test, _ = _stored(root, second)
    assert user not in users and "" not in users
    assert train.nnz + test.nnz == before - _mine(rows[0], user)
    with pytest.raises(ValueError, match="unknown user"):
        recommend(root, user, 3, second)

    assert "trained on again" in _forget(capsys, root, user, "--undo")
    assert "nothing to undo" in _forget(capsys, root, user, "--undo")
    third = _job(client, agent_tenants)
    drive(agents, third)
    assert user in _stored(root, third)[0] and recommend(root, user, 3, third)
    assert user not in _stored(root, first)[0]  # jobs joined before keep them out


def test_a_running_agents_later_rounds_leave_the_forgotten_user_out(fed, tmp_path, capsys):
    """Forgotten between rounds (as by another process): the agent's next rounds train
    without the user, so their U row, zeroed, stays zero to the end of the job."""
    app, client, _, agent_tenants, rows = fed
    roots = [tmp_path / f"a{t}" for t in range(len(agent_tenants))]
    agents = [make_agent(client, key, rows[t], roots[t])
              for t, (_, key) in enumerate(agent_tenants)]
    job_id = _job(client, agent_tenants, rounds=6)
    for a in agents:
        a.setup(job_id)
    while agents[0].state.jobs[str(job_id)]["local_round"] < 2:
        for a in agents:
            a.step(job_id, wait=0.05)
    user = rows[0][0][0]
    row = _stored(roots[0], job_id)[0].index(user)
    _forget(capsys, roots[0], user)
    live = list(agents)
    while live:
        live = [a for a in live if a.step(job_id, wait=0.05)]
    rec = agents[0].state.jobs[str(job_id)]
    assert rec["done"] and rec["local_round"] >= 4
    users, train, _, a = _stored(roots[0], job_id)
    assert users[row] == "" and not np.any(train.rows == row)
    assert np.all(a[row] == 0) and np.any(a[row + 1] != 0)


def test_the_coordinators_forget_request_reaches_the_agent(fed, tmp_path):
    """DELETE for an agent tenant's user: 202 with ``agent`` true and a tombstone listed to
    the tenant's own key only; the agent applies it on its poll; a repeated request is
    listed again and changes nothing more. Hosted tenants keep their answers."""
    app, client, hosted, agent_tenants, rows = fed
    (tid, key), user = agent_tenants[0], rows[0][0][0]
    auth = {"Authorization": f"Bearer {key}"}
    agents = [make_agent(client, k, rows[t], tmp_path / f"a{t}")
              for t, (_, k) in enumerate(agent_tenants)]
    job_id = _job(client, agent_tenants)
    drive(agents, job_id)
    res = client.delete(f"/v1/tenants/{tid}/users/{user}/ratings", headers=auth)
    assert res.status_code == 202, res.text
    assert res.json() == {"user": user, "deleted": 0, "agent": True}
    listed = client.get(f"/v1/tenants/{tid}/agent/forgotten", headers=auth).json()
    assert [r["user"] for r in listed["data"]] == [user]
    other = {"Authorization": f"Bearer {agent_tenants[1][1]}"}
    assert client.get(f"/v1/tenants/{tid}/agent/forgotten", headers=other).status_code in (
        403, 404)
    agents[0].sync_forgotten()
    users, train, test, a = _stored(tmp_path / "a0", job_id)
    assert user not in users
    with pytest.raises(ValueError, match="unknown user"):
        recommend(tmp_path / "a0", user, 3)
    assert client.get(f"/v1/tenants/{tid}/agent/forgotten", headers=auth,
                      params={"after": listed["last"]}).json()["data"] == []

    again = client.delete(f"/v1/tenants/{tid}/users/{user}/ratings", headers=auth)
    assert again.status_code == 202
    files = {p.name: p.read_bytes() for p in (tmp_path / "a0" / "jobs" / str(job_id)).iterdir()}
    agents[0].sync_forgotten()
    assert files == {p.name: p.read_bytes()
                     for p in (tmp_path / "a0" / "jobs" / str(job_id)).iterdir()}
    hid, hkey = hosted[0]
    res = client.delete(f"/v1/tenants/{hid}/users/nobody/ratings",
                        headers={"Authorization": f"Bearer {hkey}"})
    assert res.status_code == 404
    res = client.delete(f"/v1/tenants/{hid}/users/{user}/ratings",
                        headers={"Authorization": f"Bearer {hkey}"})
    assert res.status_code == 200 and res.json() == {
        "user": user, "deleted": _mine(rows[0], user)}  # as before: no "agent"


def test_a_request_before_the_tenants_first_job_reaches_its_agent_when_it_joins(fed,
                                                                               tmp_path):
    """An agent tenant that is in no job yet (the coordinator holds none of its ratings):
    DELETE is recorded for its agent (202, ``agent`` true), not 404; the agent's loop
    fetches it before it joins its first job and trains without the user. A hosted tenant
    holding ratings still gets 404 for a user it does not have."""
    app, client, hosted, agent_tenants, rows = fed
    (tid, key), user = agent_tenants[0], rows[0][0][0]
    auth = {"Authorization": f"Bearer {key}"}
    res = client.delete(f"/v1/tenants/{tid}/users/{user}/ratings", headers=auth)
    assert res.status_code == 202, res.text
    assert res.json() == {"user": user, "deleted": 0, "agent": True}
    listed = client.get(f"/v1/tenants/{tid}/agent/forgotten", headers=auth).json()
    assert [r["user"] for r in listed["data"]] == [user]
    job_id = _job(client, agent_tenants[:1])
    root = tmp_path / "a0"
    agent = make_agent(client, key, rows[0], root)
    assert agent.run(until_done=True, poll=0.05, max_seconds=60) == 0
    users, train, _, _ = _stored(root, job_id)
    assert user not in users and len(users) == len({u for u, _, _ in rows[0]}) - 1
    hid, hkey = hosted[0]
    res = client.delete(f"/v1/tenants/{hid}/users/nobody/ratings",
                        headers={"Authorization": f"Bearer {hkey}"})
    assert res.status_code == 404
