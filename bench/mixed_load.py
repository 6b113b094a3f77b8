"""Mixed load: 90% top-10 recommendations, 10% small rating uploads, while a job trains.

Run from the repository root (needs PostgreSQL at 127.0.0.1:5432, Redis at 127.0.0.1:6379
and ``wrk``)::

    python -m bench.mixed_load --duration 60

It creates a fresh PostgreSQL database (always dropped afterwards), starts ``fedrec serve
--workers 2`` with a Celery broker (Redis db 13, a private queue) and one real ``celery
worker --pool=solo`` on that queue, loads the ML-100k catalogue and ratings through the API
split over ``--tenants`` tenants by user id (synthetic ratings when the data folder is
absent), and trains a first FedMC-ADMM model so that recommendations come from factors.
It then starts a second, long training job and, while the worker runs it, drives the API
with wrk: one connection per wrk thread, each request drawn at random as an upload
(probability ``--upload-share``: a CSV of ``--rows`` valid ratings of one random user of a
random tenant, with its own Idempotency-Key) or a recommendation request (a random user of
a random tenant). The Lua script times every request itself (CLOCK_MONOTONIC, from the
moment wrk asks for the request to its parsed response) and tags it with its type, so the
latency and error figures are per type; any status outside 2xx counts as an error, as does
every socket error. A warm-up (not counted) precedes the measured window. The job is polled
every second through the window; the summary says whether it was running throughout.

Two ways to load it. ``--rate R`` (default 100 requests/s) offers a Poisson stream of R
requests/s spread over the connections and times each request from its scheduled send time
(so a server that falls behind shows its queueing, as wrk2 measures): latency at a given
load, the figure a service-level objective is about. ``--rate 0`` has every connection send
as soon as it has its previous answer: the saturation throughput, where latency is mostly
queueing (Little's law: about connections / throughput).

It prints a JSON summary: throughput, p50/p90/p99/max latency and errors per type and in
total, the job's rounds during the window, the 1-minute load average before and after, and
the CPU time used by this benchmark's processes against the whole machine's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from bench._server import ROOT, fresh_database, serve, stop, worker_pids
from bench.upload_ratings import cpu_seconds

REDIS_URL = "redis://127.0.0.1:6379/13"
TRAIN_CONFIG = {"rank": 10}


# ---------------------------------------------------------------- data and tenants


def dataset(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """(users, items, ratings, titles by item): ML-100k, or synthetic of its shape."""
    from algorithms.data import data_dir, load_movielens

    base = data_dir()
    if base is not None and (base / "ml-100k" / "u.data").is_file():
        r = load_movielens("ml-100k")
        lines = (base / "ml-100k" / "items.tsv").read_text(encoding="utf-8").splitlines()
        titles = {int(c[0]): c[1] for c in (line.split("\t") for line in lines[1:]) if c[0]}
        return r.users, r.items, r.values, titles
    from algorithms.synthetic import generate_ratings

    r = generate_ratings(943, 1682, 100_000, rank=5, seed=int(rng.integers(2**31)))
    return r.users + 1, r.items + 1, r.values, {j + 1: f"Item {j + 1}" for j in range(1682)}


def csv_body(users, items, values) -> bytes:
    buf = io.StringIO()
    buf.write("user,item,rating\n")
    for u, i, v in zip(users, items, values, strict=True):
        buf.write(f"{u},{i},{v:g}\n")
    return buf.getvalue().encode()


def load_tenants(api: httpx.Client, n: int,
                 rng: np.random.Generator) -> tuple[list[dict], list[str]]:
    """The catalogue, then n tenants holding the ratings of users with id % n == t;
    returns the tenants (id, API key, user keys) and the item keys."""
    users, items, values, titles = dataset(rng)
    catalogue = [{"key": str(i), "title": titles.get(int(i), f"Item {i}")}
                 for i in np.unique(items)]
    api.put("/v1/admin/items", json={"items": catalogue}).raise_for_status()
    tenants = []
    for t in range(n):
        # the load's noise-free jobs need each tenant's opt-in (epsilon = infinity)
        tid = api.post("/v1/admin/tenants", json={"name": f"mixed-{t}", "privacy_budget": 10.0,
                                               "allow_non_private": True}
                       ).json()["id"]
        key = api.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
        mine = users % n == t
        api.post(f"/v1/tenants/{tid}/ratings", content=csv_body(users[mine], items[mine],
                                                             values[mine]),
                 headers={"Authorization": f"Bearer {key}", "Content-Type": "text/csv"}
                 ).raise_for_status()
        tenants.append({"id": tid, "key": key,
                        "users": [str(u) for u in np.unique(users[mine])]})
    return tenants, [c["key"] for c in catalogue]


# ---------------------------------------------------------------- training


def start_worker(env: dict[str, str], queue: str, log: Path,
                 nice: int = 0) -> subprocess.Popen:
    """A real ``celery worker --pool=solo`` consuming ``queue`` (the command line of
    tests/integration/conftest.py's Worker), at CPU priority ``nice`` (0: as the API)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [*(["nice", "-n", str(nice)] if nice else []), sys.executable, "-m", "celery",
             "-A", "worker.celery_app", "worker", "--pool=solo", "-Q", queue,
             "--loglevel=WARNING", "--without-heartbeat", "--without-gossip",
             "--without-mingle"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def submit(api: httpx.Client, rounds: int, seed: int) -> int:
    body = {"algorithm": "fedmc-admm", "config": TRAIN_CONFIG, "rounds": rounds,
            "per_round": 0, "seed": seed, "dp": {"mechanism": "none"},
            "allow_not_private": True,
            # the load measured is serving a model's lists, whatever its held-out comparison
            # with popularity (a rating model loses it) and without a validation carve-out
            "lists": "model", "validation_fraction": 0}
    r = api.post("/v1/admin/jobs", json=body)
    if r.status_code != 202:
        raise RuntimeError(f"job refused: {r.status_code} {r.text}")
    return r.json()["id"]


def wait_job(api: httpx.Client, job_id: int, done, timeout: float) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = api.get(f"/v1/admin/jobs/{job_id}").json()
        if done(job):
            return job
        if job["status"] in ("failed", "cancelled", "completed"):
            break
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} not as expected: {job}")


class JobWatch(threading.Thread):
    """Polls a job once a second; remembers every (status, round) seen."""

    def __init__(self, base: str, headers: dict, job_id: int) -> None:
        super().__init__(daemon=True)
        self.base, self.headers, self.job_id = base, headers, job_id
        self.seen: list[tuple[str, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, headers=self.headers, timeout=10) as c:
            while True:
                job = c.get(f"/v1/admin/jobs/{self.job_id}").json()
                self.seen.append((job["status"], job["current_round"]))
                if self.halt.wait(1.0):
                    return

    def finish(self) -> dict:
        self.halt.set()
        self.join(15)
        statuses = [s for s, _ in self.seen]
        return {"polls": len(self.seen), "statuses": sorted(set(statuses)),
                "round_at_start": self.seen[0][1], "round_at_end": self.seen[-1][1],
                "running_throughout": bool(statuses) and set(statuses) == {"running"}}


# ---------------------------------------------------------------- wrk


LUA = r"""
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } fedrec_timespec;
int clock_gettime(int clk_id, fedrec_timespec *tp);
]]
local ts = ffi.new("fedrec_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000000 + tonumber(ts.tv_nsec) / 1000
end

local tenants = __TENANTS__
local items = __ITEMS__
local upload_share, rows_per_upload, seed, run_id = __SHARE__, __ROWS__, __SEED__, "__RUN__"
local rate, connections = __RATE__, __CONNS__
local out_path = "__OUT__"

local threads, n_threads = {}, 0
function setup(thread)
  n_threads = n_threads + 1
  thread:set("thread_no", n_threads)
  threads[n_threads] = thread
end

-- per thread (one connection each, so request and response strictly alternate)
kinds, statuses, lats = {}, {}, {}
local kind, started, sent = nil, 0, 0
function init(args)
  math.randomseed(seed * 1000 + thread_no)
end

local function upload(t)
  local user = t.users[math.random(#t.users)]
  local rows, used = {"user,item,rating"}, {}
  while #rows <= rows_per_upload do
    local item = items[math.random(#items)]
    if not used[item] then
      used[item] = true
      rows[#rows + 1] = user .. "," .. item .. "," .. math.random(5)
    end
  end
  sent = sent + 1
  local headers = {["Authorization"] = "Bearer " .. t.key, ["Content-Type"] = "text/csv",
                   ["Idempotency-Key"] = run_id .. "-" .. thread_no .. "-" .. sent}
  return wrk.format("POST", "/v1/tenants/" .. t.id .. "/ratings", headers,
                    table.concat(rows, "\n") .. "\n")
end

local function recommendations(t)
  local user = t.users[math.random(#t.users)]
  return wrk.format("GET", "/v1/tenants/" .. t.id .. "/users/" .. user .. "/recommendations?k=10",
                    {["Authorization"] = "Bearer " .. t.key})
end

-- Paced (rate > 0): each connection sends on its own Poisson schedule, rate / connections
-- requests/s, so the whole load is a Poisson stream at ``rate``. Latency is timed from the
-- scheduled send time, not from when wrk got round to sending (that would hide the queueing
-- of a server that falls behind: coordinated omission, as wrk2 corrects it). wrk's delay()
-- has whole milliseconds, so a request may leave up to 1 ms early; it is timed from then.
local next_at = nil
local function gap_us()
  return -math.log(1 - math.random()) * connections * 1000000 / rate
end
if rate > 0 then
  function delay()
    if next_at == nil then return 0 end  -- wrk may ask before the first request
    local wait = next_at - now_us()
    if wait > 0 then return wait / 1000 end
    return 0
  end
end

function request()
  local t = tenants[math.random(#tenants)]
  local req
  if math.random() < upload_share then
    kind, req = 2, upload(t)
  else
    kind, req = 1, recommendations(t)
  end
  local now = now_us()
  if rate > 0 then
    if next_at == nil then next_at = now + gap_us() * math.random() end
    started = math.min(now, next_at)
    next_at = next_at + gap_us()
  else
    started = now
  end
  return req
end

function response(status, headers, body)
  local n = #lats + 1
  lats[n] = now_us() - started
  kinds[n] = kind
  statuses[n] = status
end

function done(summary, latency, requests)
  local f = assert(io.open(out_path, "w"))
  local e = summary.errors
  f:write(string.format("summary %d %d %d %d %d %d %d\n", summary.duration,
          summary.requests, e.connect, e.read, e.write, e.status, e.timeout))
  for _, thread in ipairs(threads) do
    local k, s, l = thread:get("kinds"), thread:get("statuses"), thread:get("lats")
    for i = 1, #l do
      f:write(k[i], " ", s[i], " ", string.format("%.1f", l[i]), "\n")
    end
  end
  f:close()
end
"""


def lua_list(values) -> str:
    return "{" + ", ".join(json.dumps(v) for v in values) + "}"


def wrk_script(path: Path, out: Path, tenants: list[dict], items: list[str], share: float,
               rows: int, seed: int, rate: float = 0.0, connections: int = 1) -> None:
    ts = ", ".join(f'{{id = {t["id"]}, key = {json.dumps(t["key"])}, '
                   f'users = {lua_list(t["users"])}}}' for t in tenants)
    text = (LUA.replace("__TENANTS__", "{" + ts + "}").replace("__ITEMS__", lua_list(items))
            .replace("__SHARE__", repr(share)).replace("__ROWS__", str(rows))
            .replace("__SEED__", str(seed)).replace("__RUN__", uuid.uuid4().hex[:12])
            .replace("__OUT__", str(out)).replace("__RATE__", repr(float(rate)))
            .replace("__CONNS__", str(connections)))
    path.write_text(text)


def run_wrk(base: str, script: Path, out: Path, connections: int, seconds: int) -> dict:
    """wrk with one connection per thread; returns the per-type figures of its records."""
    proc = subprocess.run(["wrk", f"-t{connections}", f"-c{connections}", f"-d{seconds}s",
                           "--timeout", "10s", "-s", str(script), base],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return figures(out.read_text())


def figures(text: str) -> dict:
    """Throughput, latency percentiles and errors per type from the Lua script's records."""
    lines = text.splitlines()
    head = lines[0].split()
    duration = int(head[1]) / 1e6
    socket_errors = dict(zip(("connect", "read", "write", "timeout"),
                             (int(head[3]), int(head[4]), int(head[5]), int(head[7])),
                             strict=True))
    rec = np.array([line.split() for line in lines[1:]], dtype=float).reshape(-1, 3)
    out = {"duration_s": round(duration, 3), "socket_errors": socket_errors}
    for code, name in ((1, "recommendations"), (2, "uploads")):
        mine = rec[rec[:, 0] == code]
        lat_ms = mine[:, 2] / 1000
        status = mine[:, 1].astype(int)
        codes, counts = np.unique(status, return_counts=True)
        out[name] = {
            "requests": int(mine.shape[0]),
            "rps": round(mine.shape[0] / duration, 1),
            "p50_ms": round(float(np.percentile(lat_ms, 50)), 2) if lat_ms.size else None,
            "p90_ms": round(float(np.percentile(lat_ms, 90)), 2) if lat_ms.size else None,
            "p99_ms": round(float(np.percentile(lat_ms, 99)), 2) if lat_ms.size else None,
            "max_ms": round(float(lat_ms.max()), 2) if lat_ms.size else None,
            "errors": int(((status < 200) | (status > 299)).sum()),
            "statuses": {str(c): int(n) for c, n in zip(codes, counts, strict=True)}}
    n = out["recommendations"]["requests"] + out["uploads"]["requests"]
    http_errors = out["recommendations"]["errors"] + out["uploads"]["errors"]
    out["total"] = {"requests": n, "rps": round(n / duration, 1),
                    "upload_share": round(out["uploads"]["requests"] / max(n, 1), 4),
                    "errors": http_errors + sum(socket_errors.values())}
    all_ms = rec[:, 2] / 1000
    if all_ms.size:
        out["total"].update(p50_ms=round(float(np.percentile(all_ms, 50)), 2),
                            p99_ms=round(float(np.percentile(all_ms, 99)), 2))
    return out


# ---------------------------------------------------------------- CPU accounting


def machine_busy_seconds() -> float:
    """Non-idle CPU time of the whole machine so far (all cores, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's children that have been waited for."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def our_pids(server: subprocess.Popen, worker: subprocess.Popen,
             url: str) -> dict[str, list[int]]:
    """The API processes, the Celery worker and this database's PostgreSQL backends."""
    import psycopg

    from bench._server import ADMIN_DSN

    with psycopg.connect(ADMIN_DSN) as conn:
        backends = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (url.rsplit("/", 1)[1],))]
    return {"api": [server.pid, *map(int, worker_pids(server))], "celery_worker": [worker.pid],
            "postgres": backends}


# ---------------------------------------------------------------- main


def profile(pids: list[int], seconds: int, folder: Path | None) -> list[subprocess.Popen]:
    """py-spy recordings (raw collapsed stacks) of the API worker processes, if asked."""
    if folder is None:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(seconds), "-f",
                              "raw", "-o", str(folder / f"api-{pid}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for pid in pids]


def note(message: str) -> None:
    """Progress on stderr, so stdout carries only the summary."""
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace, url: str) -> dict:
    """Set up, train, then run the mixed load while a second job trains."""
    rng = np.random.default_rng(args.seed)
    token = secrets.token_urlsafe(32)
    queue = f"fedrec-mixed-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": token,
           "FEDREC_BROKER_URL": REDIS_URL, "FEDREC_TASK_QUEUE": queue,
           "PYTHONPATH": str(ROOT),
           # every connection may upload to the same tenant at once: no 429s in the figures
           "FEDREC_MAX_CONCURRENT_UPLOADS": str(max(2, args.connections))}
    env.pop("REDIS_URL", None)
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {token}"}
    tmp = Path(tempfile.mkdtemp(prefix="fedrec-mixed-"))
    server = worker = None
    try:
        server = serve(env, port, tmp / "serve.log", access_log=not args.no_access_log)
        worker = start_worker(env, queue, tmp / "worker.log", args.worker_nice)
        with httpx.Client(base_url=base, timeout=300, headers=admin) as api:
            tenants, items = load_tenants(api, args.tenants, rng)
            note(f"{len(tenants)} tenants loaded; training the first model")
            first = submit(api, args.first_rounds, args.seed)
            wait_job(api, first, lambda j: j["status"] == "completed", 600)
            note("first model trained; starting the background job")
            for t in tenants:
                probe = api.get(f"/v1/tenants/{t['id']}/users/{t['users'][0]}/recommendations",
                                headers={"Authorization": f"Bearer {t['key']}"}).json()
                assert probe["source"] == "model" and len(probe["data"]) == 10, probe
            long_job = submit(api, args.job_rounds, args.seed + 1)
            wait_job(api, long_job, lambda j: j["status"] == "running"
                     and j["current_round"] >= 1, 120)
            script, out = tmp / "mixed.lua", tmp / "records.txt"
            wrk_script(script, out, tenants, items, args.upload_share, args.rows, args.seed,
                       args.rate, args.connections)
            note(f"background job {long_job} running; warm-up")
            warm = run_wrk(base, script, out, args.connections, args.warmup)
            note(f"warm-up ({args.warmup} s, not counted): {warm['total']['rps']} "
                 f"requests/s, errors {warm['total']['errors']}; measuring")
            load_before = os.getloadavg()[0]
            pids = our_pids(server, worker, url)
            busy0, t0 = machine_busy_seconds(), time.monotonic()
            ours0 = {name: cpu_seconds(p) for name, p in pids.items()}
            wrk0 = children_cpu_seconds()
            watch = JobWatch(base, admin, long_job)
            watch.start()
            spies = profile(pids["api"][1:], args.duration, args.profile)
            fig = run_wrk(base, script, out, args.connections, args.duration)
            wrk_cpu = children_cpu_seconds() - wrk0  # wrk is the only child waited for yet
            for spy in spies:
                spy.wait(60)
            job = watch.finish()
            elapsed = time.monotonic() - t0
            busy = machine_busy_seconds() - busy0
            ours = {name: cpu_seconds(p) - ours0[name] for name, p in pids.items()}
            load_after = os.getloadavg()[0]
            note("measured; cancelling the background job")
            api.post(f"/v1/admin/jobs/{long_job}/cancel")
            wait_job(api, long_job, lambda j: j["status"] == "cancelled", 120)
            for t in tenants:  # the service still answers, from the model, after the load
                probe = api.get(f"/v1/tenants/{t['id']}/users/{t['users'][-1]}/recommendations",
                                headers={"Authorization": f"Bearer {t['key']}"})
                assert probe.status_code == 200 and probe.json()["source"] == "model"
    finally:
        stop(worker)
        stop(server)
        _drop_queue(queue)
    fig.update({
        "command": "python -m bench.mixed_load " + " ".join(sys.argv[1:]),
        "offered_rps": args.rate or None, "worker_nice": args.worker_nice,
        "connections": args.connections,
        "warmup_s": args.warmup,
        "tenants": len(tenants), "users": sum(len(t["users"]) for t in tenants),
        "rows_per_upload": args.rows, "upload_share_target": args.upload_share,
        "job": {"id": long_job, "algorithm": "fedmc-admm", "config": TRAIN_CONFIG,
                "rounds": args.job_rounds, **job},
        "load_average_1min": {"before": round(load_before, 2), "after": round(load_after, 2)},
        "cpu_seconds": {"window_s": round(elapsed, 1),
                        "machine_busy": round(busy, 1),
                        **{name: round(v, 1) for name, v in ours.items()},
                        "wrk": round(wrk_cpu, 1),
                        "other_processes": round(busy - sum(ours.values()) - wrk_cpu, 1),
                        "cores": os.cpu_count()},
        "logs": str(tmp)})
    return fig


def _drop_queue(queue: str) -> None:
    """Remove the private queue's leftovers from Redis db 13 (if any)."""
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = [k for k in client.scan_iter(f"*{queue}*")]
        if keys:
            client.delete(*keys)
    except Exception as exc:  # cleanup only: report, do not mask the run's outcome
        print(f"could not clean the Redis queue {queue}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=60, help="measured seconds")
    parser.add_argument("--warmup", type=int, default=15,
                        help="seconds of load not counted (fills the per-process caches)")
    parser.add_argument("--quick", action="store_true",
                        help="5 s measured after 2 s of warm-up (for the tests)")
    parser.add_argument("--connections", type=int, default=16,
                        help="wrk connections, one per wrk thread")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="offered requests/s, a Poisson stream spread over the "
                             "connections, latency timed from each scheduled send; 0: every "
                             "connection sends as soon as it has its answer (saturation)")
    parser.add_argument("--worker-nice", type=int, default=0,
                        help="run the Celery worker at this nice level (training is batch "
                             "work; 0: the API's priority)")
    parser.add_argument("--upload-share", type=float, default=0.1)
    parser.add_argument("--rows", type=int, default=5, help="ratings per upload")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--first-rounds", type=int, default=3,
                        help="rounds of the first job (the model that serves)")
    parser.add_argument("--job-rounds", type=int, default=10_000,
                        help="rounds of the background job (cancelled after the window)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--no-access-log", action="store_true")
    parser.add_argument("--profile", type=Path, default=None,
                        help="folder for py-spy profiles of the API workers during the window")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 5, 2
    with fresh_database("fedrec_mixed") as url:
        summary = measure(args, url)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
