"""Load test of single-user top-10 recommendations with API-key authentication.

Run from the repository root (needs PostgreSQL at 127.0.0.1:5432 and ``wrk``)::

    python -m bench.recommend_load --duration 30

It creates a fresh PostgreSQL database (dropped afterwards), uploads MovieLens 1M through
the API as one tenant, publishes an ML-1M-sized factor snapshot (rank 20 + biases: the
shape FedMC-ADMM serves) for that tenant, starts ``fedrec serve --workers 2`` (uvicorn with
uvloop and httptools), warms it up for 5 s (reported, not counted), and runs
``wrk -t2 -c32 -d<duration>s --latency`` on loopback,
each request for one of 200 users chosen in rotation. It prints wrk's summary and the
figures for BENCHMARKS.md.

In the same run it measures the framework floor: ``bench._floor_app``, a bare FastAPI app
(the same uvicorn, 2 workers, access log as fedrec's) computing the same top-10 from the
same factors and rated items held in memory, with no database and no authentication, under
the same wrk command. ``--rounds`` alternates fedrec and the floor that many times (fedrec
first in odd rounds, the floor first in even ones) and prints the ratios of each round
(throughput fedrec / floor, p99 fedrec / floor, and the CPU time the server's two worker
processes spent per request, fedrec / floor) and their medians. The CPU ratio is the least
sensitive to other jobs on the machine: it counts only the servers' own work.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench._server import ROOT, fresh_database, parse_wrk, serve, stop, worker_pids
from bench.upload_ratings import catalogue, new_tenant, ratings_csv


def _publish_snapshot(url: str, tenant_id: int, rank: int, seed: int) -> list[str]:
    """A completed job and a factor snapshot of the tenant's real users and items."""
    import sqlalchemy as sa

    from app.db import make_engine, session_factory
    from app.models import Item, User
    from app.training.models import TrainingJob
    from app.training.pipeline import item_ids_bytes
    from app.training.snapshots import write_snapshot

    sessions = session_factory(make_engine(url))
    rng = np.random.default_rng(seed)
    with sessions() as s:
        users = list(s.scalars(sa.select(User.key).where(User.tenant_id == tenant_id)
                               .order_by(User.key)))
        items = np.fromiter(s.scalars(sa.select(Item.id).order_by(Item.id)), dtype=np.int64)
        job = TrainingJob(status="completed", algorithm="fedmc-admm", config={"rank": rank},
                          dp={"mechanism": "none"}, rounds=1, per_round=1, seed=seed,
                          test_fraction=0.2, tenant_ids=[tenant_id],
                          item_ids=item_ids_bytes(items), current_round=1,
                          ratings_version={})
        s.add(job)
        s.flush()
        a = rng.normal(0, 0.3, (len(users), rank + 3))
        b = rng.normal(0, 0.3, (rank + 3, items.size))
        write_snapshot(s, tenant_id, job, users, a, b)
        s.commit()
    return users, a, b


def _floor_data(url: str, tenant_id: int, users: list[str], a: np.ndarray, b: np.ndarray,
                path: Path) -> None:
    """What the floor app serves: the same factors, catalogue labels and rated items."""
    import sqlalchemy as sa

    from app.db import make_engine, session_factory
    from app.models import Item, Rating, User

    sessions = session_factory(make_engine(url))
    with sessions() as s:
        items = s.execute(sa.select(Item.id, Item.key, Item.title).order_by(Item.id)).all()
        rated = s.execute(sa.select(User.key, Rating.item_id).join(
            Rating, Rating.user_id == User.id).where(User.tenant_id == tenant_id)).all()
    by_user: dict[str, list[int]] = {}
    for user, item in rated:
        by_user.setdefault(user, []).append(item)
    lists = [sorted(by_user.get(u, [])) for u in users]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    np.savez(path, a=a, b=b, item_ids=np.array([i for i, _, _ in items], dtype=np.int64),
             item_keys=np.array([k for _, k, _ in items]),
             titles=np.array([t or "" for _, _, t in items]), users=np.array(users),
             rated_ptr=ptr, rated_ids=np.array([i for x in lists for i in x], dtype=np.int64))


def _serve_floor(data: Path, port: int, log: Path) -> subprocess.Popen:
    """The floor app under uvicorn, 2 workers, access log on (fedrec serve's defaults)."""
    env = {**os.environ, "FEDREC_FLOOR_DATA": str(data), "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                                 "bench._floor_app:create_app", "--port", str(port),
                                 "--workers", "2"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    stop(proc)
    raise RuntimeError("the floor app did not start: " + log.read_text()[-2000:])


def _cpu_seconds(pids: list[str]) -> float:
    """User plus system CPU seconds the processes have used (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def _wrk_script(path: Path, tenant_id: int, users: list[str], key: str) -> None:
    wrk_rotation(path, [(f"/v1/tenants/{tenant_id}/users/{u}/recommendations?k=10", key)
                        for u in users])


def wrk_rotation(path: Path, requests: list[tuple[str, str]]) -> None:
    """A wrk Lua script GETting each (path, API key) of ``requests`` in rotation."""
    rows = ", ".join(f'{{"{url}", "Bearer {key}"}}' for url, key in requests)
    path.write_text(f"""
local requests = {{{rows}}}
local i = 0
request = function()
  i = i % #requests + 1
  return wrk.format("GET", requests[i][1], {{Authorization = requests[i][2]}})
end
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--rank", type=int, default=20)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--floor-port", type=int, default=8766)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure fedrec and the floor alternately this many times")
    parser.add_argument("--no-access-log", action="store_true",
                        help="run the server without uvicorn's per-request access log")
    parser.add_argument("--profile", type=Path, default=None,
                        help="record a py-spy flame graph of one worker during the run")
    args = parser.parse_args()
    with fresh_database() as url:
        run(args, url)


def run(args: argparse.Namespace, url: str) -> None:
    """Upload, publish, serve and measure (the database is made and dropped by main)."""
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token,
           "FEDREC_BROKER_URL": "", "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    server = floor = None
    log = Path(tempfile.mkstemp(prefix="fedrec-serve-", suffix=".log")[1])
    floor_log = Path(tempfile.mkstemp(prefix="fedrec-floor-", suffix=".log")[1])
    try:
        server = serve(env, args.port, log, not args.no_access_log)
        base = f"http://127.0.0.1:{args.port}"
        admin = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, timeout=300, headers=admin) as api:
            api.put("/v1/admin/items", json={"items": catalogue()}).raise_for_status()
            tid, key = new_tenant(api, "load")
            api.post(f"/v1/tenants/{tid}/ratings", content=ratings_csv(), headers={
                "Authorization": f"Bearer {key}", "Content-Type": "text/csv"}
                     ).raise_for_status()
        users, a, b = _publish_snapshot(url, tid, args.rank, 0)
        rng = np.random.default_rng(1)
        chosen = [users[i] for i in rng.choice(len(users), 200, replace=False)]
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "floor.npz"
            _floor_data(url, tid, users, a, b, data)
            floor = _serve_floor(data, args.floor_port, floor_log)
            floor_base = f"http://127.0.0.1:{args.floor_port}"
            script = Path(tmp) / "rotate.lua"
            _wrk_script(script, tid, chosen, key)
            probe = httpx.get(f"{base}/v1/tenants/{tid}/users/{chosen[0]}/recommendations",
                              headers={"Authorization": f"Bearer {key}"}).json()
            assert probe["source"] == "model" and len(probe["data"]) == 10, probe
            same = httpx.get(f"{floor_base}/v1/tenants/{tid}/users/{chosen[0]}/recommendations"
                             ).json()
            assert [d["item"] for d in same["data"]] == [d["item"] for d in probe["data"]], (
                "the floor must compute the same top-10 as fedrec")
            wrk = ["wrk", "-t2", "-c32", "--latency", "-s", str(script)]
            for name, where in (("fedrec", base), ("floor", floor_base)):
                warm = subprocess.run([*wrk, "-d5s", where], capture_output=True, text=True,
                                      check=True).stdout
                print(f"{name} warm-up (5 s, not counted):", parse_wrk(warm), flush=True)
            results: dict[str, list[dict]] = {"fedrec": [], "floor": []}
            for n in range(args.rounds):
                pair = (("fedrec", base), ("floor", floor_base))
                # ABBA order: a drift in the machine's load favours neither side
                for name, where in (pair if n % 2 == 0 else pair[::-1]):
                    spy = None
                    if args.profile and name == "fedrec" and n == 0:
                        spy = subprocess.Popen(
                            ["py-spy", "record", "-p", worker_pids(server)[0], "-d",
                             str(args.duration), "-f", "raw", "-o", str(args.profile)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    load = os.getloadavg()[0]
                    workers = worker_pids(server if name == "fedrec" else floor)
                    cpu = _cpu_seconds(workers)
                    out = subprocess.run([*wrk, f"-d{args.duration}s", where],
                                         capture_output=True, text=True, check=True).stdout
                    cpu = _cpu_seconds(workers) - cpu
                    if spy is not None:
                        spy.wait(60)
                    fig = {**parse_wrk(out), "load": load}
                    fig["cpu_us"] = cpu / max(fig["requests"], 1) * 1e6
                    results[name].append(fig)
                    if n == 0 and name == "fedrec":
                        print(out)
                    print(f"round {n + 1} {name}: rps={fig['rps']:.0f} p50={fig['p50_ms']:.2f}ms "
                          f"p99={fig['p99_ms']:.2f}ms non2xx={fig['non_2xx']} "
                          f"socket_errors={fig['socket_errors']} "
                          f"cpu={fig['cpu_us']:.0f}us/request (load average {load:.1f})",
                          flush=True)
                ours, bare = results["fedrec"][-1], results["floor"][-1]
                print(f"round {n + 1} ratio: throughput {ours['rps'] / bare['rps']:.1%} of the "
                      f"floor, p99 {ours['p99_ms'] / bare['p99_ms']:.2f}x the floor's, worker "
                      f"CPU per request {ours['cpu_us'] / bare['cpu_us']:.2f}x the floor's",
                      flush=True)
        fig = results["fedrec"][0]
        print(f"RESULT rps={fig['rps']:.0f} p50={fig['p50_ms']:.2f}ms "
              f"p99={fig['p99_ms']:.2f}ms non2xx={fig['non_2xx']} "
              f"socket_errors={fig['socket_errors']}")
        rps = [o["rps"] / f["rps"] for o, f in zip(results["fedrec"], results["floor"],
                                                  strict=True)]
        p99 = [o["p99_ms"] / f["p99_ms"] for o, f in zip(results["fedrec"], results["floor"],
                                                       strict=True)]
        print(f"FLOOR median over {args.rounds} round(s): throughput "
              f"{statistics.median(rps):.1%} of the floor (target >= 90%), p99 "
              f"{statistics.median(p99):.2f}x the floor's (target <= 1.3x)")
        cpu = [o["cpu_us"] / f["cpu_us"] for o, f in zip(results["fedrec"], results["floor"],
                                                        strict=True)]
        print(f"FLOOR median over {args.rounds} round(s): worker CPU per request "
              f"{statistics.median(cpu):.2f}x the floor's")
        pooled = (sum(o["rps"] for o in results["fedrec"])
                  / sum(f["rps"] for f in results["floor"]))
        print(f"FLOOR pooled over {args.rounds} round(s): fedrec served {pooled:.1%} of the "
              f"floor's requests")
    finally:
        stop(floor)
        if server is not None:
            stop(server)  # never leave a server (or its database) behind
            print(f"server log: {log} ({log.stat().st_size} bytes)")
        floor_log.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
