"""The OpenAPI document against a live server: ``st run <server>/openapi.json --checks all``.

An independent check of what clients generate from: schemathesis (the CLI, as a user runs
it) loads the document from a real uvicorn process on a migrated SQLite database and
sends ~25 generated requests per operation through every phase (examples, coverage,
fuzzing, stateful) with every check, including schema-valid requests that must be
accepted, schema-invalid ones that must be refused, ``Allow`` on 405 and response
schemas. The admin token goes to ``/admin/*``, a tenant key to ``/tenants/*`` with the
tenant's own id pinned, so both reach their handlers.

Accepted on purpose (schemathesis.toml written below): a 422 for a schema-valid body of
``POST /admin/tenants`` (``rating_min < rating_max``: JSON Schema cannot relate two
fields; the description says so) and of ``POST /admin/jobs`` (an algorithm's ``config``
and the privacy settings are checked against the algorithm, which the schema cannot
express). The agents' long-polls run with ``wait=0``: st may create an agent job and then
poll it, and 25 examples of a 60-second poll would outlast the run's time limit. The
stateful check that a resource a walk created can be read back (ST302) is off: the key and
job routes' ids are pinned to the fixture's below, so a walk that creates a tenant and then
reads "its" key reads the fixture's spare key, which an earlier step of the walk may have
revoked (404 ``api_key_revoked``, as documented). Nothing else.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.db import migrate
from tests.integration.conftest import free_port, wait_for
from tests.training_helpers import make_tenants, submit_job, wait_job

ADMIN = "live-admin-token-0123456789abcdefghij"
EXAMPLES = 25
ST = Path(sys.executable).with_name("st")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    url = f"sqlite:///{tmp}/live.db"
    migrate(url)
    port = free_port()
    env = {**os.environ, "FEDREC_DATABASE_URL": url, "FEDREC_ADMIN_TOKEN": ADMIN,
           "FEDREC_MAX_JOB_ROUNDS": "2", "FEDREC_MAX_TOP_K": "50",
           "FEDREC_MAX_FAILED_SIGN_INS": "1000000",  # schemathesis sends wrong tokens
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FEDREC_BROKER_URL", None)
    env.pop("REDIS_URL", None)
    log = tmp / "server.log"  # a file, not a pipe: nobody drains a pipe while st runs, and
    # a server whose log fills the pipe's buffer blocks on its next write (and hangs st)
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                                 "app.main:create_app", "--port", str(port), "--log-level",
                                 "warning"], env=env, stdout=subprocess.DEVNULL, stderr=sink)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None  # crashed: stop waiting, the assert says why

    try:
        wait_for(up, 60, "uvicorn to answer /health")
        assert proc.poll() is None, log.read_text()[-2000:]
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"},
                              timeout=30)
        (tenant, key), _ = make_tenants(client)
        job = wait_job(client, submit_job(client, rounds=1).json()["id"])
        spare = client.post(f"/v1/admin/tenants/{tenant}/api-keys", json={}).json()["id"]
        victim = client.post("/v1/admin/tenants", json={"name": "to-delete",
                                                        "privacy_budget": 1}).json()["id"]
        yield base, tmp, tenant, key, job["id"], spare, victim
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:  # a request still in flight: the test says why
            proc.kill()
            proc.wait(5)


def config(tmp: Path, tenant: int, key: str, job: int, spare: int, victim: int) -> Path:
    path = tmp / "schemathesis.toml"
    path.write_text(f"""
headers = {{ Authorization = "Bearer {ADMIN}" }}

[[operations]]
include-path-regex = "^/v1/tenants/"
headers = {{ Authorization = "Bearer {key}" }}
parameters = {{ tenant_id = {tenant}, user_key = "u0", user = "u1", wait = 0 }}

[[operations]]
include-path-regex = "^/v1/admin/tenants/[^/]+/api-keys/"
parameters = {{ tenant_id = {tenant}, key_id = {spare} }}

[[operations]]
include-path-regex = "^/v1/admin/tenants/[^/]+$"
include-method = "DELETE"
parameters = {{ tenant_id = {victim} }}

[[operations]]
include-path-regex = "^/v1/admin/jobs/"
parameters = {{ job_id = {job} }}

[[operations]]
include-path-regex = "^/v1/admin/(tenants|jobs)$"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "404", "409", "422"]
""")
    return path


@pytest.mark.slow
def test_schemathesis_finds_no_failure_against_a_live_server(server):
    base, tmp, tenant, key, job, spare, victim = server
    started = time.monotonic()
    run = subprocess.run(
        [str(ST), "--config-file", str(config(tmp, tenant, key, job, spare, victim)), "run",
         f"{base}/openapi.json", "--checks", "all",
         "--exclude-checks", "ensure_resource_availability", "--max-examples", str(EXAMPLES),
         "--seed", "20261124", "--workers", "2", "--no-color", "--request-timeout", "30"],
        capture_output=True, text=True, timeout=900, cwd=tmp)  # a hang guard only
    took = time.monotonic() - started
    (tmp / "st-output.txt").write_text(run.stdout + run.stderr)
    tail = f"(full output: {tmp / 'st-output.txt'})\n" + run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    operations = sum(len(item) for item in httpx.get(f"{base}/openapi.json").json()[
        "paths"].values())
    assert re.search(r"Tested: (\d+)", run.stdout).group(1) == str(operations), tail
    assert "Authentication failed" not in run.stdout, tail  # tenant routes were reached
    print(f"the schemathesis run took {took:.0f} s")  # a figure, not a target (noisy hosts)
