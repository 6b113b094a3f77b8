"""Tenant agent overhead per round beyond the client step, and bytes per upload.

A coordinator (uvicorn in a separate process, SQLite, the pipeline in-process) runs a
FedMC-ADMM job of 100 agent tenants (MovieLens 1M users split among them by user id,
3,706 items, rank 10, 10 tenants per round, Gaussian noise on each upload). The 100 agents
run in this process, stepped one after the other; DP is off (the noise's cost is the
tenant-placed DP's, not the agent's, and without it the float32 wire's accuracy shows).
For every round an agent is selected in, the time of its round (download the global
message, client step, check and charge the ledger, persist, upload, adopt the new local
state) is split into the client step itself, the ledger check and the rest: the overhead
(HTTP on loopback, (de)serialisation, atomic state writes with fsync, the coordinator's
staging of the upload). Bytes per upload are those of the message as sent, float64 npz
(the exact wire) and float32 (``wire: float32``), whose test RMSE is compared with the
float64 run's.

    python -m bench.agent_overhead [--rounds 6] [--tenants 100] [--per-round 10]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

import agent.run as agent_run
from agent.client import Coordinator
from agent.data import parse_bytes
from agent.run import Agent
from agent.state import AgentState
from algorithms.data import data_dir, load_ratings
from privacy.ledger import Budget

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_PID: list[int] = []


def server_cpu() -> float:
    """CPU seconds (user + system) the coordinator process has used so far."""
    if not SERVER_PID:
        return 0.0
    fields = Path(f"/proc/{SERVER_PID[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Timed(Agent):
    """An agent that records, per round it runs, total / client step / privatise seconds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds: list[dict[str, float]] = []
        self.sizes: list[int] = []

    def _run_round(self, job_id, round_):
        t0, c0, s0 = time.perf_counter(), time.process_time(), server_cpu()
        parts = {"client": 0.0, "privatise": 0.0, "download": 0.0, "upload": 0.0,
                 "client_cpu": 0.0}
        inner_client, inner_release = agent_run.client_round, self._release
        inner_get, inner_put = self.coord.global_msg, self.coord.upload

        def get(*a, **k):
            t = time.perf_counter()
            out = inner_get(*a, **k)
            parts["download"] += time.perf_counter() - t
            return out

        def put(*a, **k):
            t = time.perf_counter()
            out = inner_put(*a, **k)
            parts["upload"] += time.perf_counter() - t
            return out

        def client(*a, **k):
            t, c = time.perf_counter(), time.process_time()
            out = inner_client(*a, **k)
            parts["client"] += time.perf_counter() - t
            parts["client_cpu"] += time.process_time() - c
            return out

        def release(*a, **k):
            t = time.perf_counter()
            out = inner_release(*a, **k)
            parts["privatise"] += time.perf_counter() - t
            return out

        agent_run.client_round, self._release = client, release
        self.coord.global_msg, self.coord.upload = get, put
        try:
            super()._run_round(job_id, round_)
        finally:
            agent_run.client_round = inner_client
            del self._release, self.coord.global_msg, self.coord.upload
        if parts["client"]:
            parts["total"] = time.perf_counter() - t0
            parts["agent_cpu"] = time.process_time() - c0 - parts["client_cpu"]
            parts["server_cpu"] = server_cpu() - s0
            self.rounds.append(parts)

    def _observe(self, job_id, completed):
        """Only note the round (the real agent also fetches the global message here to log
        its test error, which would hide the download from the measured round)."""
        self.state.jobs[str(job_id)]["seen"] = completed

    def _send_pending(self, job_id):
        pending = self.state.jobs[str(job_id)]["pending"]
        if pending and pending["kind"] == "upload":
            self.sizes.append(len(self.state.read(job_id, f"pending-{pending['round']}.upload")))
        super()._send_pending(job_id)


def run_job(url: str, admin: httpx.Client, blocks, tenant_ids, keys, args, wire: str,
            root: Path) -> tuple[list[Timed], dict]:
    job = admin.post("/v1/admin/jobs", json={
        "algorithm": "fedmc-admm", "config": {"rank": 10}, "rounds": args.rounds,
        "per_round": args.per_round, "seed": 0, "tenant_ids": tenant_ids,
        "agents": tenant_ids, "wire": wire, "round_seconds": 600,
        "dp": {"mechanism": "none"}, "allow_not_private": True})
    job.raise_for_status()
    job_id = job.json()["id"]
    http = httpx.Client(base_url=url, timeout=120)
    agents = []
    for t, (tid, key, body) in enumerate(zip(tenant_ids, keys, blocks, strict=True)):
        coord = Coordinator(url, tid, key, http=http)
        state = AgentState.open(root / f"{wire}-{t}", str(tid), Budget(1e6, 1e-5, True))
        agents.append(Timed(coord, state,
                            lambda scale, body=body: parse_bytes(body, "text/csv", scale),
                            log=lambda text: None))
    for a in agents:
        a.setup(job_id)
    live = list(agents)
    while live:
        live = [a for a in live if a.step(job_id, wait=0.0)]
    report = admin.get(f"/v1/admin/jobs/{job_id}").json()
    return agents, report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--wires", default="float64,float32")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "agent_overhead.json")
    args = p.parse_args(argv)
    base = data_dir()
    r = load_ratings(base / "ml-1m" / "ratings_no_timestamps.dat.gz")
    items = np.unique(r.items)
    tmp = Path(tempfile.mkdtemp(prefix="fedrec-agent-bench-"))
    db = tmp / "coordinator.db"
    token, port = secrets.token_urlsafe(16), _free_port()
    env = {**os.environ, "FEDREC_DATABASE_URL": f"sqlite:///{db}", "FEDREC_ADMIN_TOKEN": token,
           "PYTHONPATH": str(ROOT)}
    env.pop("FEDREC_BROKER_URL", None)
    subprocess.run([sys.executable, "-m", "app.cli", "migrate"], env=env, check=True,
                   cwd=ROOT, capture_output=True)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:create_app",
                               "--factory", "--port", str(port), "--log-level", "warning"],
                              env=env, cwd=ROOT)
    SERVER_PID[:] = [server.pid]
    url = f"http://127.0.0.1:{port}"
    admin = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"})
    try:
        for _ in range(600):
            try:
                admin.get("/health")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        admin.put("/v1/admin/items", json={"items": [{"key": str(i)} for i in items.tolist()]}
                  ).raise_for_status()
        tenant_ids, keys, blocks = [], [], []
        owner = r.users % args.tenants
        for t in range(args.tenants):
            tid = admin.post("/v1/admin/tenants", json={"name": f"agent-{t}", "privacy_budget": 1e6,
                                                     "allow_non_private": True}).json()["id"]
            keys.append(admin.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"])
            tenant_ids.append(tid)
            mine = owner == t
            rows = "".join(f"{u},{i},{v:g}\n" for u, i, v in zip(
                r.users[mine].tolist(), r.items[mine].tolist(), r.values[mine].tolist(),
                strict=True))
            blocks.append(("user,item,rating\n" + rows).encode())
        results = {}
        for wire in args.wires.split(","):
            t0 = time.perf_counter()
            agents, job = run_job(url, admin, blocks, tenant_ids, keys, args, wire, tmp)
            rounds = [x for a in agents for x in a.rounds]
            overhead = [x["total"] - x["client"] - x["privatise"] for x in rounds]
            sizes = [s for a in agents for s in a.sizes]
            results[wire] = {
                "rounds_measured": len(rounds),
                "client_step_ms_median": 1000 * statistics.median(x["client"] for x in rounds),
                "privatise_ms_median": 1000 * statistics.median(x["privatise"] for x in rounds),
                "overhead_ms_median": 1000 * statistics.median(overhead),
                "overhead_ms_p90": 1000 * float(np.percentile(overhead, 90)),
                "download_ms_median": 1000 * statistics.median(x["download"] for x in rounds),
                "upload_ms_median": 1000 * statistics.median(x["upload"] for x in rounds),
                "local_ms_median": 1000 * statistics.median(
                    x["total"] - x["client"] - x["privatise"] - x["download"] - x["upload"]
                    for x in rounds),
                "load_average": os.getloadavg()[0],
                "agent_cpu_ms_median": 1000 * statistics.median(x["agent_cpu"] for x in rounds),
                "server_cpu_ms_median": 1000 * statistics.median(x["server_cpu"]
                                                                 for x in rounds),
                "upload_bytes": int(statistics.median(sizes)),
                "test_rmse": job["latest_metrics"] and job["latest_metrics"].get("test_rmse"),
                "local_test_rmse_mean": float(np.mean([a.local_rmse(job["id"])
                                                       for a in agents])),
                "wall_seconds": time.perf_counter() - t0}
            print(wire, json.dumps(results[wire]), flush=True)
        results["setup"] = {"tenants": args.tenants, "per_round": args.per_round,
                            "rounds": args.rounds, "items": int(items.size), "rank": 10,
                            "algorithm": "fedmc-admm", "date": time.strftime("%Y-%m-%d")}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    finally:
        server.terminate()
        server.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
