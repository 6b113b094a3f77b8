"""A job whose step always raises, on real Celery worker processes, PostgreSQL and Redis:
after FEDREC_JOB_MAX_ATTEMPTS failures the job is ``failed`` with the error, and beat's
watchdog stops resuming it (it used to stay ``running`` and be re-run for ever)."""

from __future__ import annotations

import re
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.main import create_app
from app.training.jobs import JobSpec, create_job
from app.training.models import LedgerEntry, TrainingJob
from app.training.runner import CeleryDispatcher, start_job
from app.training.schedule import resume_stalled
from tests.integration.conftest import wait_for
from tests.training_helpers import make_tenants

pytestmark = pytest.mark.integration


def _job(app, job_id: int) -> TrainingJob:
    with app.state.sessions() as s:
        return s.get(TrainingJob, job_id)


def test_a_step_that_always_raises_fails_the_job_after_three_attempts(services):
    settings, worker = services
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {settings.admin_token.get_secret_value()}"
        with app.state.sessions() as s:
            for table in ("training_jobs", "ratings", "users", "items", "tenants"):
                s.execute(sa.text(f"DELETE FROM {table}"))
            s.commit()
        tenants = make_tenants(client)
        # one tenant per round, so each attempt is one failing step
        spec = JobSpec("fedmc-admm", [t for t, _ in tenants], 1, 1, 3, {"rank": 3},
                       {"mechanism": "gaussian", "noise_multiplier": 2.0, "clip": 1.0})
        with app.state.sessions() as s:
            job = create_job(s, spec)
            # A config that no longer fits the job's stored states (planted: creation checks
            # a config against round 1): the client step raises ValueError every time.
            job.config = {**job.config, "rank": 5}
            s.commit()
            job_id = job.id
        worker()
        start_job(app, job_id)
        wait_for(lambda: _job(app, job_id).attempts >= 1, 90, "the first failure")
        dispatch = CeleryDispatcher(app.state.celery)
        for attempt in (2, 3):  # beat's watchdog, once per stalled interval
            assert resume_stalled(app.state.sessions, dispatch, -1.0) == [job_id]
            wait_for(lambda a=attempt: _job(app, job_id).attempts >= a, 90, f"failure {attempt}")
        job = _job(app, job_id)
        assert (job.status, job.current_round) == ("failed", 0)
        # the planted mismatch fails inside the step's kernels (which exception depends on
        # the code path); the error names its type and message, then the attempts
        assert re.fullmatch(r"(ValueError|IndexError): \S.* \(attempt 3 of 3; job failed\)",
                            job.error), job.error
        assert resume_stalled(app.state.sessions, dispatch, -1.0) == []
        with app.state.sessions() as s:  # the step failed before sending: nothing charged
            assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)
                            .where(LedgerEntry.job_id == job_id)) == 0
        shown = client.get(f"/v1/admin/jobs/{job_id}").json()
        assert shown["status"] == "failed" and shown["error"] == job.error


def test_resuming_a_job_that_failed_at_publication_runs_no_further_round(services):
    """A 2-round job whose rounds all committed but whose publication failed (as
    ``_finish`` leaves it when a factor is not finite): resume publishes only, on the real
    worker, PostgreSQL and Redis; no round 3 runs and nobody is charged again (it used to
    run round 3 and charge every tenant on each resume), and who serves the lists is
    decided on the same held-out figures as at the first publication."""
    settings, worker = services
    app = create_app(settings)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {settings.admin_token.get_secret_value()}"
        with app.state.sessions() as s:
            for table in ("training_jobs", "ratings", "users", "items", "tenants"):
                s.execute(sa.text(f"DELETE FROM {table}"))
            s.commit()
        tenants = make_tenants(client)
        worker()
        res = client.post("/v1/admin/jobs", json={
            "algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 2, "per_round": 0,
            "seed": 3, "tenant_ids": [t for t, _ in tenants],
            "dp": {"mechanism": "gaussian", "noise_multiplier": 2.0}})
        assert res.status_code == 202, res.text
        job_id = res.json()["id"]
        wait_for(lambda: _job(app, job_id).status == "completed", 90, "the job")
        with app.state.sessions() as s:
            job = s.get(TrainingJob, job_id)
            serving = job.serving
            assert serving["model"] is not None  # the first publication compared figures
            job.status, job.error = "failed", "publication failed (planted)"
            s.commit()
            charges = s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)
                               .where(LedgerEntry.job_id == job_id))
        assert charges == 2 * len(tenants)
        for _ in range(2):
            res = client.post(f"/v1/admin/jobs/{job_id}/resume")
            assert res.status_code == 202, res.text
            wait_for(lambda: _job(app, job_id).status == "completed", 90, "publication")
            with app.state.sessions() as s:
                job = s.get(TrainingJob, job_id)
                job.status = "failed"
                s.commit()
        time.sleep(3.0)  # a round 3, had one been sent, runs on the worker by now
        job = _job(app, job_id)
        assert job.current_round == 2
        assert job.serving == serving
        with app.state.sessions() as s:
            assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)
                            .where(LedgerEntry.job_id == job_id)) == charges
