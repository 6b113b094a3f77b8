"""Celery tasks of the training pipeline: ids in, one call into app.training.pipeline.

``acks_late`` with ``reject_on_worker_lost``: a task whose worker dies is redelivered, and
every pipeline step is idempotent, so a redelivery (or an operator's resume) repeats only
the round in flight. A step that loses its database connection (PostgreSQL restarting) is
retried with backoff (1, 2, 4, 8, then every 16 s; about six minutes in all) instead of
being dropped, so the job carries on by itself once the database is back. Any other
failure is counted on the job (``pipeline.record_failure``): after FEDREC_JOB_MAX_ATTEMPTS
of them without a round committing, the job is ``failed`` with the error and the watchdog
leaves it alone. Their results are not stored: the job's state is in the database.
"""

from __future__ import annotations

import sqlalchemy as sa
from celery import shared_task

from app.db import DATABASE_DOWN, engine_for, session_factory
from app.logs import bind
from app.queue import TUNING_RUN
from app.training import dry_round, pipeline, schedule, tuning
from app.training.models import JobClient
from app.training.runner import CeleryDispatcher
from worker import metrics

_OPTIONS = {"bind": True, "acks_late": True, "reject_on_worker_lost": True, "ignore_result": True,
            "autoretry_for": DATABASE_DOWN, "retry_backoff": 1, "retry_backoff_max": 16,
            "retry_jitter": False, "max_retries": 25}


def _sessions(task):
    return session_factory(engine_for(task.app.conf.fedrec_database_url))


def _run(task, step, *args: int):
    return step(_sessions(task), CeleryDispatcher(task.app), *args)


@shared_task(name=pipeline.TASK_START, **_OPTIONS)
def start_round(self, job_id: int, round_: int) -> None:
    """Sample the round's tenants and send their client steps."""
    _run(self, pipeline.TASKS[pipeline.TASK_START], job_id, round_)


@shared_task(name=pipeline.TASK_CLIENT, **_OPTIONS)
def client_step(self, job_id: int, round_: int, client: int) -> None:
    """One tenant's privatised client step; stages its upload and ledger charge. Its log
    lines carry the tenant's id (the job's id comes from the task's arguments)."""
    with _sessions(self)() as s:
        tenant_id = s.scalar(sa.select(JobClient.tenant_id).where(
            JobClient.job_id == job_id, JobClient.client_index == client))
    if tenant_id is not None:
        bind(tenant_id=tenant_id)
    seconds = _run(self, pipeline.TASKS[pipeline.TASK_CLIENT], job_id, round_, client)
    if seconds is not None and (measured := metrics.current()) is not None:
        measured.client_steps.observe(seconds)


@shared_task(name=pipeline.TASK_AGGREGATE, **_OPTIONS)
def aggregate(self, job_id: int, round_: int) -> None:
    """The server step on the round's uploads; commits the round."""
    seconds = _run(self, pipeline.TASKS[pipeline.TASK_AGGREGATE], job_id, round_)
    if seconds is not None and (measured := metrics.current()) is not None:
        measured.rounds.observe(seconds)


@shared_task(name=dry_round.TASK, bind=True, track_started=True, acks_late=False)
def dry_round_task(self, request: dict) -> list:
    """A new job's dry round, for the API (:mod:`app.training.dry_round`): its outcome
    is the result the API waits for. Not acked late: the API gives up on it at its bound,
    so a redelivery would find nobody waiting."""
    with _sessions(self)() as s:
        kind, value = dry_round.answer(s, dry_round.DryRound(**request))
    return [kind, value]


@shared_task(name=pipeline.TASK_RETRAIN, bind=True)
def retrain(self) -> int | None:
    """Beat: start a job from the last one's settings when ratings changed since."""
    return schedule.retrain_if_changed(_sessions(self), CeleryDispatcher(self.app))


@shared_task(name=pipeline.TASK_WATCHDOG, bind=True)
def resume_stalled(self) -> list[int]:
    """Beat: resume training jobs whose round made no progress, and tuning jobs whose
    search stopped beating, for FEDREC_STALLED_JOB_SECONDS."""
    sessions, dispatch = _sessions(self), CeleryDispatcher(self.app)
    stalled = self.app.conf.fedrec_stalled_job_seconds
    schedule.resume_stalled_tuning(sessions, dispatch, stalled)
    return schedule.resume_stalled(sessions, dispatch, stalled)


@shared_task(name=TUNING_RUN, **_OPTIONS)
def run_tuning(self, tuning_id: int) -> None:
    """A tuning job's whole search (:mod:`app.training.tuning`), beating four times per
    FEDREC_STALLED_JOB_SECONDS so the watchdog tells a live search from a dead worker's."""
    tuning.run_tuning(_sessions(self), tuning_id,
                      heartbeat_seconds=self.app.conf.fedrec_stalled_job_seconds / 4)
