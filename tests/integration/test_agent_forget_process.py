"""Forgetting reaches a running ``fedrec agent`` process: the coordinator (uvicorn on
PostgreSQL, Redis and a Celery worker process) records ``DELETE .../users/{user}/ratings``
for an agent tenant, the agent fetches it on its poll loop mid-job and forgets the user
on the tenant's machine: its later rounds, its stored state and its serving leave them
out."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from algorithms import Message
from tests.integration import test_agent_processes
from tests.integration.conftest import ROOT, wait_for
from tests.integration.test_agent_processes import AgentProcess, _rows
from tests.training_helpers import csv_body

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 10
coordinator = test_agent_processes.coordinator  # the fixture


def _local(state, job_id):
    where = state / "jobs" / str(job_id)
    users = json.loads((where / "users.json").read_text())
    local = Message.from_bytes((where / "local.msg").read_bytes())
    return users, np.hstack([np.asarray(getattr(local, n), dtype=float).reshape(
        len(users), -1) for n in local.user_rows])


def test_a_coordinator_forget_request_reaches_a_running_agent(coordinator, tmp_path):
    url, admin = coordinator
    admin.put("/v1/admin/items", json={"items": [{"key": f"i{j}"} for j in range(30)]}
              ).raise_for_status()
    rows = _rows(2)
    tenants, agents = [], []
    for t, name in enumerate(("fa", "fb")):
        tid = admin.post("/v1/admin/tenants", json={"name": name, "privacy_budget": 1000.0,
                                                    "allow_non_private": True}).json()["id"]
        key = admin.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
        tenants.append((tid, key))
        data = tmp_path / f"ratings-{t}.csv"
        data.write_bytes(csv_body(rows[t]))
        proc = AgentProcess(url, tid, key, data, tmp_path / f"state-{t}",
                            tmp_path / f"agent-{t}.log")
        proc.args += ["--allow-non-private"]
        agents.append(proc.start())
    (tid, key), a, user = tenants[0], agents[0], rows[0][0][0]
    try:
        wait_for(lambda: all((p.state / "agent.json").exists() for p in agents), 120,
                 "the agents to start")
        job = admin.post("/v1/admin/jobs", json={
            "algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": ROUNDS,
            "per_round": 0, "seed": 7, "dp": {"mechanism": "none"},
            "allow_not_private": True, "tenant_ids": [t for t, _ in tenants],
            "agents": [t for t, _ in tenants], "round_seconds": 60.0})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        users = a.state / "jobs" / str(job_id) / "users.json"
        wait_for(lambda: users.exists(), 120, "agent A to join")
        row = json.loads(users.read_text()).index(user)
        res = httpx.delete(f"{url}/v1/tenants/{tid}/users/{user}/ratings",
                           headers={"Authorization": f"Bearer {key}"})
        assert res.status_code == 202 and res.json()["agent"] is True, res.text
        wait_for(lambda: user not in json.loads(users.read_text()), 60,
                 "agent A to forget the user")
        status = admin.get(f"/v1/admin/jobs/{job_id}").json()
        assert status["status"] == "running", status  # it reached the agent mid-job

        def finished():
            j = admin.get(f"/v1/admin/jobs/{job_id}").json()
            return j if j["status"] not in ("queued", "running") else None

        final = wait_for(finished, 240, "the job to finish", interval=0.5)
        assert final["status"] == "completed", final
        for p in agents:
            p.proc.wait(60)
            assert p.proc.returncode == 0, p.log.read_text()
    finally:
        for p in agents:
            p.stop()
    log = a.log.read_text()
    assert f"forgot user {user!r} as the coordinator asked" in log
    assert log.index("forgot user") < log.index(f"job {job_id} completed")
    keys, u = _local(a.state, job_id)
    assert keys[row] == "" and np.all(u[row] == 0) and np.any(u[row + 1] != 0)
    out = subprocess.run([sys.executable, "-m", "app.cli", "agent", "recommend", user,
                          "--state-dir", str(a.state)], cwd=ROOT, env=a.env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown user" in out.stderr, out
