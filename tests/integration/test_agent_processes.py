"""Tenant agents as real processes: the coordinator (uvicorn on PostgreSQL, Redis and a
Celery worker process), one hosted tenant and three ``fedrec agent`` processes with their
own state directories. Agent B is killed between charging round 3 and sending it, and
restarted; agent C is killed in round 2 and never comes back: rounds close at their
deadline without it and the job ends with the others. Both ledgers are exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import sqlalchemy as sa

from algorithms.synthetic import generate_ratings
from privacy.ledger import Ledger
from tests.integration.conftest import ROOT, free_port, wait_for
from tests.training_helpers import csv_body

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS, DEADLINE = 4, 25.0  # generous: B restarts within it on a loaded machine


def _rows(n_tenants=4, seed=5):
    r = generate_ratings(80, 30, 1600, rank=3, seed=seed)
    return [list(zip((f"u{u}" for u in r.users[r.users % n_tenants == t]),
                     (f"i{i}" for i in r.items[r.users % n_tenants == t]),
                     r.values[r.users % n_tenants == t], strict=True))
            for t in range(n_tenants)]


@pytest.fixture
def coordinator(services, tmp_path):
    settings, worker = services
    worker()
    port = free_port()
    token = settings.admin_token.get_secret_value()
    env = {**os.environ, "FEDREC_DATABASE_URL": settings.database_url,
           "FEDREC_BROKER_URL": settings.broker_url, "FEDREC_TASK_QUEUE": settings.task_queue,
           "FEDREC_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "uvicorn.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:create_app",
                             "--factory", "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=30,
                          headers={"Authorization": f"Bearer {token}"})

    def up():
        try:
            return client.get("/health").status_code < 500
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 60, "uvicorn to answer", interval=0.2)
        yield url, client
    finally:
        client.close()
        proc.terminate()
        proc.wait(15)
        log.close()


class AgentProcess:
    def __init__(self, url, tenant, key, data, state, log, fault=None):
        self.args = [sys.executable, "-m", "app.cli", "agent", "run", "--coordinator", url,
                     "--tenant-id", str(tenant), "--api-key", key, "--data", str(data),
                     "--state-dir", str(state),
                     "--epsilon-max", "1000", "--delta", "1e-5", "--poll", "2",
                     "--until-done"]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if fault:
            self.env["FEDREC_AGENT_FAULT"] = fault
        self.log, self.state, self.proc = log, state, None

    def start(self, fault=True):
        env = self.env if fault else {k: v for k, v in self.env.items()
                                      if k != "FEDREC_AGENT_FAULT"}
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"))
        return self

    def ledger(self):
        state = json.loads((self.state / "agent.json").read_text())
        return Ledger.from_dict(state["ledger"]), state

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_three_agent_processes_one_restarted_one_gone(coordinator, services, tmp_path):
    url, admin = coordinator
    admin.put("/v1/admin/items", json={"items": [{"key": f"i{j}"} for j in range(30)]}
              ).raise_for_status()
    rows = _rows()
    tenants = []
    for name in ("hosted", "a", "b", "c"):
        tid = admin.post("/v1/admin/tenants", json={"name": name, "privacy_budget": 1000.0}
                         ).json()["id"]
        key = admin.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
        tenants.append((tid, key))
    res = admin.post(f"/v1/tenants/{tenants[0][0]}/ratings", content=csv_body(rows[0]),
                     headers={"Content-Type": "text/csv",
                              "Authorization": f"Bearer {tenants[0][1]}"})
    assert res.status_code == 200, res.text
    agents = []
    for t, fault in ((1, None), (2, "die-before-send:3"), (3, "die-before-send:2")):
        data = tmp_path / f"ratings-{t}.csv"
        data.write_bytes(csv_body(rows[t]))
        agents.append(AgentProcess(url, tenants[t][0], tenants[t][1], data, tmp_path / f"state-{t}",
                                   tmp_path / f"agent-{t}.log", fault).start())
    try:  # every agent up (its state directory opened) before the job starts
        wait_for(lambda: all((p.state / "agent.json").exists() for p in agents), 120,
                 "the agents to start")
        job = admin.post("/v1/admin/jobs", json={
            "algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": ROUNDS,
            "per_round": 0, "seed": 7, "dp": {"mechanism": "gaussian", "noise_multiplier": 2.0},
            "tenant_ids": [t for t, _ in tenants], "agents": [t for t, _ in tenants[1:]],
            "round_seconds": DEADLINE})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        a, b, c = agents
        # B dies after charging round 3, before sending it: restart it at once
        wait_for(lambda: b.proc.poll() is not None, 120, "agent B to die in round 3")
        assert b.proc.returncode == 137
        pending = b.ledger()[1]["jobs"][str(job_id)]["pending"]
        assert pending["round"] == 3 and pending["kind"] == "upload"
        b.start(fault=False)
        wait_for(lambda: c.proc.poll() is not None, 120, "agent C to die in round 2")

        def finished():
            j = admin.get(f"/v1/admin/jobs/{job_id}").json()
            return j if j["status"] not in ("queued", "running") else None

        final = wait_for(finished, 180, "the job to finish", interval=0.5)
        assert final["status"] == "completed" and final["current_round"] == ROUNDS, final
        assert final["latest_metrics"]["missed_deadline"] == [tenants[3][0]]
        for p in (a, b):
            p.proc.wait(60)
            assert p.proc.returncode == 0, p.log.read_text()
    finally:
        for p in agents:
            p.stop()
    report = admin.get(f"/v1/admin/jobs/{job_id}/report").json()
    privacy = report["privacy"]
    # coordinator: every tenant charged once per upload it received, no round twice
    engine = sa.create_engine(services[0].database_url)
    with engine.connect() as conn:
        rows_ = conn.execute(sa.text("SELECT tenant_id, round FROM privacy_ledger "
                                     "WHERE job_id = :j ORDER BY tenant_id, round"),
                             {"j": job_id}).all()
    engine.dispose()
    charged = {t: [r for t2, r in rows_ if t2 == t] for t, _ in tenants}
    every = list(range(1, ROUNDS + 1))
    assert charged == {tenants[0][0]: every, tenants[1][0]: every, tenants[2][0]: every,
                       tenants[3][0]: [1]}, (charged, [p.log.read_text() for p in agents])
    for t, p in ((1, a), (2, b)):
        ledger, state = p.ledger()
        account = state["account"]
        assert ledger.rounds(account) == list(range(1, ROUNDS + 1))  # B's round 3 once
        assert ledger.spent(account).epsilon == pytest.approx(
            privacy["epsilon_per_tenant"][str(tenants[t][0])], rel=1e-12)
        assert state["jobs"][str(job_id)]["done"] and not state["jobs"][str(job_id)]["late"]
    assert f"job {job_id}: round 3: sent its upload" in b.log.read_text()
    # C charged round 2 on its own ledger before it died: conservative, never sent
    ledger, state = c.ledger()
    assert ledger.rounds(state["account"]) == [1, 2]
    curve = report["curve"]
    assert [r["uploads"] for r in curve] == [4, 3, 3, 3]
    # the agent serves its own users from its own factors
    user = rows[1][0][0]
    out = subprocess.run([sys.executable, "-m", "app.cli", "agent", "recommend", user,
                          "--state-dir", str(a.state), "--k", "5"], cwd=ROOT,
                         env=a.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 5
    rated = {i for u, i, _ in rows[1] if u == user}
    assert not {line.split("\t")[0] for line in lines} & rated
