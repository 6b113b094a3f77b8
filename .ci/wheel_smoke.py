"""The installed wheel runs the product: the image's commands against real services.

Usage: python .ci/wheel_smoke.py VENV   (VENV: a fresh virtual environment holding fedrec
installed from its wheel, not editable; .ci/wheel_smoke.sh builds it)

From a directory outside the repository (so nothing is imported from the source tree) it
runs `fedrec demo` (the README's first command), then, on a new PostgreSQL database and a
private Redis queue, the container's commands as docker-compose.yml gives them (the
Dockerfile's CMD is the api's without --workers): `fedrec migrate`, `fedrec serve`
(health, a dashboard page, a dashboard asset and the API docs answer 200), a Celery
worker, and one small training job end to end through the API.
Exits non-zero, saying what failed.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("FEDREC_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test")
REDIS_URL = os.environ.get("FEDREC_TEST_REDIS", "redis://127.0.0.1:6379/13")
#: the demo's own defaults at a smaller size: the same code paths in a few seconds
DEMO = ("--synthetic-ratings", "10000", "--rounds", "5")


def compose_command(service: str, port: int) -> list[str]:
    """The service's command in docker-compose.yml, defaults substituted, on ``port``."""
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service][
        "command"]
    words = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(w)) for w in command]
    return [str(port) if w == "8000" else w for w in words]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_installed(venv: Path, env: dict[str, str], cwd: str) -> None:
    """fedrec's packages come from the venv's site-packages, not from a source tree."""
    code = "import app, worker, migrations; print(app.__file__, migrations.__file__)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, cwd=cwd,
                         capture_output=True, text=True, check=True).stdout
    assert all("site-packages" in p for p in out.split()), f"not the installed wheel: {out}"
    lab = subprocess.run([str(venv / "bin" / "python"), "-c", "import bench"], env=env,
                         cwd=cwd, capture_output=True, text=True)
    assert lab.returncode != 0, "the wheel ships the lab (bench/): it belongs to the checkout"


def wait_for(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"wheel smoke: the server exited ({proc.returncode}) before {url}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"wheel smoke: {url} did not answer 200 within {timeout:.0f} s")


def check_pages(base: str) -> None:
    """Pages whose files the wheel must carry: templates, static assets, the docs' assets."""
    for path in ("/health", "/dashboard/login", "/static/dashboard/dashboard.css", "/docs"):
        r = httpx.get(base + path, timeout=10)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text[:300]}"
    assert "<form" in httpx.get(base + "/dashboard/login").text


def run_job(base: str, token: str) -> dict:
    """Two tenants upload ratings, a 3-round job trains on the worker; returns the job."""
    rng = random.Random(0)
    with httpx.Client(base_url=base, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as c:
        items = [{"key": f"i{j}", "title": f"Title {j}"} for j in range(30)]
        c.put("/v1/admin/items", json={"items": items}).raise_for_status()
        for t in range(2):
            tid = c.post("/v1/admin/tenants", json={"name": f"t{t}", "privacy_budget": 100.0,
                                                    "allow_non_private": True}).json()["id"]
            key = c.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]
            rows = "".join(f"u{t}_{u},i{j},{rng.randint(1, 5)}\n" for u in range(20)
                           for j in rng.sample(range(30), 10))
            r = c.post(f"/v1/tenants/{tid}/ratings", content="user,item,rating\n" + rows,
                       headers={"Content-Type": "text/csv", "Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        body = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 3, "per_round": 0,
                "seed": 1, "dp": {"mechanism": "gaussian", "noise_multiplier": 2.0,
                                  "clip": 1.0}}
        r = c.post("/v1/admin/jobs", json=body)
        assert r.status_code in (200, 201, 202), r.text
        return wait_job(c, r.json()["id"])


def wait_job(c: httpx.Client, job_id: int, timeout: float = 180) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = c.get(f"/v1/admin/jobs/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.3)
    raise SystemExit(f"wheel smoke: job {job_id} did not finish in {timeout:.0f} s: {job}")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def run_demo(venv: Path, cwd: str) -> None:
    """The README's first command after its install: `fedrec demo` on embedded defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEDREC_", "PYTHON"))}
    out = subprocess.run([str(venv / "bin" / "fedrec"), "demo", *DEMO], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"fedrec demo failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}"


def smoke(venv: Path, env: dict[str, str], cwd: str) -> None:
    bin_ = venv / "bin"
    check_installed(venv, env, cwd)
    run_demo(venv, cwd)
    subprocess.run([str(bin_ / "fedrec"), "migrate"], env=env, cwd=cwd, check=True)
    port = free_port()
    api, worker = compose_command("api", port), compose_command("worker", port)
    log = open(Path(cwd) / "services.log", "w+")  # read back on failure
    procs = [subprocess.Popen([str(bin_ / api[0]), *api[1:]], env=env, cwd=cwd, stdout=log,
                              stderr=subprocess.STDOUT)]
    try:
        procs.append(subprocess.Popen([str(bin_ / worker[0]), *worker[1:]], env=env, cwd=cwd,
                                      stdout=log, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        wait_for(base + "/health", procs[0])
        check_pages(base)
        job = run_job(base, env["FEDREC_ADMIN_TOKEN"])
        assert job["status"] == "completed", f"job ended {job['status']}: {job}"
        print(f"wheel smoke: demo, migrate, serve ({' '.join(api)}), pages, worker and job "
              f"{job['id']} ({job['status']}) passed")
    except BaseException:
        stop(procs)
        log.seek(0)
        print("wheel smoke: the server's and the worker's log:\n" + log.read()[-6000:],
              file=sys.stderr)
        raise
    finally:
        stop(procs)
        log.close()


def main(venv: Path) -> None:
    name = f"fedrec_wheel_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEDREC_", "PYTHON"))}
    env.update(FEDREC_ENV="production", FEDREC_ADMIN_TOKEN=secrets.token_urlsafe(32),
               FEDREC_DATABASE_URL=f"postgresql://postgres@127.0.0.1:5432/{name}",
               FEDREC_BROKER_URL=REDIS_URL, FEDREC_TASK_QUEUE=f"fedrec-wheel-{name[-12:]}",
               PATH=f"{venv / 'bin'}:{env_path()}")
    try:
        with tempfile.TemporaryDirectory() as cwd:
            smoke(venv, env, cwd)
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def env_path() -> str:
    return os.environ.get("PATH", "/usr/bin:/bin")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]).resolve())
