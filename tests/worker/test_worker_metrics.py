"""A real Celery worker (prefork, two pool processes) with FEDREC_WORKER_METRICS_PORT runs
a training job through Redis and PostgreSQL; its exporter then reports every task the
pool processes ran, summed, and its JSON log lines carry the job's and tenant's ids."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.db import migrate
from app.main import create_app
from app.queue import (
    RECOMPUTE_RATING_STATS,
    TRAINING_AGGREGATE,
    TRAINING_CLIENT_STEP,
    TRAINING_START_ROUND,
    TUNING_RUN,
)
from app.training.models import JobRound
from tests.training_helpers import make_tenants, submit_job, wait_job
from tests.worker.conftest import celery_worker

TOKEN = "worker-metrics-test-token-0123456789abcdef"
pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of the worker's exporter."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


@pytest.fixture
def metered_worker(make_postgres_db, redis_test_url, tmp_path):
    url = make_postgres_db()
    migrate(url)
    port, log = _free_port(), tmp_path / "worker.log"
    with celery_worker(url, redis_test_url, log, "--pool=prefork", "--concurrency=2",
                       FEDREC_WORKER_METRICS_PORT=str(port),
                       FEDREC_LOG_FORMAT="json") as (queue, proc):
        yield (Settings(database_url=url, broker_url=redis_test_url, task_queue=queue,
                        admin_token=TOKEN), port, proc, log)


def test_exporter_reports_the_tasks_of_a_job_and_logs_carry_its_ids(metered_worker):
    settings, port, proc, log_path = metered_worker
    end = time.monotonic() + 60
    while True:  # the exporter is up once the worker has initialised
        try:
            before = _scrape(port)
            break
        except OSError:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < end, "the worker's exporter never answered"
            time.sleep(0.2)
    assert not [k for k in before if k[0] == "fedrec_worker_tasks_total"]
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        tenants = make_tenants(client, n=2)
        job = wait_job(client, submit_job(client, rounds=3).json()["id"], timeout=180)
        assert job["status"] == "completed", (job, log_path.read_text()[-3000:])
        # a task that raises is counted as failed (a tenant id that is no number)
        broken = app.state.celery.send_task(RECOMPUTE_RATING_STATS, args=["no-id"],
                                            queue=settings.task_queue)
        assert broken.get(timeout=60, propagate=False) is not None and broken.failed()
        broken.forget()
    with app.state.sessions() as s:
        rounds = s.execute(sa.select(JobRound.participants, JobRound.seconds)
                           .where(JobRound.job_id == job["id"])).all()
    steps = sum(len(participants) for participants, _ in rounds)
    assert steps == 3 * 2  # every tenant in every round (per_round 0)
    after = _scrape(port)

    def tasks(task: str, state: str) -> float:
        return after.get(("fedrec_worker_tasks_total",
                          (("state", state), ("task", task))), 0.0)

    for state in ("started", "succeeded"):
        assert tasks(TRAINING_CLIENT_STEP, state) == steps
        assert tasks(TRAINING_START_ROUND, state) == 3
    assert tasks(TRAINING_CLIENT_STEP, "failed") == tasks(TRAINING_CLIENT_STEP, "retried") == 0
    assert (tasks(RECOMPUTE_RATING_STATS, "started"), tasks(RECOMPUTE_RATING_STATS, "failed"),
            tasks(RECOMPUTE_RATING_STATS, "succeeded")) == (1, 1, 0)
    # every client step completes the round or not; the last one of each round aggregates
    assert tasks(TRAINING_AGGREGATE, "succeeded") >= 3
    duration = (("task", TRAINING_CLIENT_STEP),)
    assert after[("fedrec_worker_task_duration_seconds_count", duration)] == steps
    assert after[("fedrec_worker_task_duration_seconds_sum", duration)] > 0
    assert after[("fedrec_worker_client_step_duration_seconds_count", ())] == steps
    computed = after[("fedrec_worker_client_step_duration_seconds_sum", ())]
    assert 0 < computed <= after[("fedrec_worker_task_duration_seconds_sum", duration)]
    # the rounds this worker committed: the durations stored on the rounds
    assert after[("fedrec_worker_round_duration_seconds_count", ())] == 3
    assert after[("fedrec_worker_round_duration_seconds_sum", ())] == pytest.approx(
        sum(seconds for _, seconds in rounds), rel=1e-9)

    lines = [json.loads(line) for line in log_path.read_text().splitlines()
             if line.startswith("{")]
    succeeded = [line for line in lines if TRAINING_CLIENT_STEP in line["message"]
                 and "succeeded" in line["message"]]
    assert len(succeeded) == steps
    assert {line.get("job_id") for line in succeeded} == {job["id"]}
    assert {line.get("tenant_id") for line in succeeded} == {t for t, _ in tenants}


def test_a_worker_runs_a_tuning_job_and_counts_it(metered_worker):
    settings, port, proc, log_path = metered_worker
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        make_tenants(client, n=2)
        created = client.post("/v1/admin/tuning-jobs", json={
            "algorithm": "fedmc-admm", "rounds": 3, "trials": 3, "seed": 1})
        assert created.status_code == 202, created.text
        end = time.monotonic() + 180
        while (tuned := client.get(created.headers["location"]).json())["status"] in (
                "queued", "running"):
            assert time.monotonic() < end, log_path.read_text()[-3000:]
            time.sleep(0.2)
        assert tuned["status"] == "completed", (tuned, log_path.read_text()[-3000:])
        job = wait_job(client, submit_job(client, config=tuned["config"], rounds=2,
                                          seed=1).json()["id"], timeout=180)
        assert job["status"] == "completed", job
    after = _scrape(port)
    assert after[("fedrec_worker_tasks_total",
                  (("state", "succeeded"), ("task", TUNING_RUN)))] == 1
