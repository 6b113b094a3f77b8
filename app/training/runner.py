"""Starting and resuming jobs: through Celery when a broker is configured, else in-process.

In-process jobs run in a background thread of the API process (the embedded default), or
synchronously with :func:`run_inline` (the demo and the tests).
"""

from __future__ import annotations

import logging
import threading

from celery import Celery
from fastapi import FastAPI

from app.queue import TRAINING_PRIORITY
from app.training import pipeline

log = logging.getLogger("fedrec.training")


class CeleryDispatcher:
    """Sends pipeline tasks to the broker by name (the API never imports worker code)."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def send(self, task: str, *args: int) -> None:
        """Publish; the pipeline keeps its state in the database, so no result is awaited
        (and a broker outage fails fast with kombu's OperationalError: a 503 in the API)."""
        self.celery.send_task(task, args=list(args), queue=self.celery.conf.task_default_queue,
                              ignore_result=True, priority=TRAINING_PRIORITY)

    def send_later(self, task: str, delay: float, *args: int) -> None:
        """Publish with a countdown (a round's deadline; the task is idempotent)."""
        self.celery.send_task(task, args=list(args), queue=self.celery.conf.task_default_queue,
                              ignore_result=True, countdown=delay, priority=TRAINING_PRIORITY)


def dispatch_from_api(app: FastAPI, task: str, *args: int) -> None:
    """Send one pipeline task from a request (an agent's upload completed a round, or its
    deadline passed): to the broker, or in-process in a background thread."""
    if _uses_broker(app):
        CeleryDispatcher(app.state.celery).send(task, *args)
        return

    def run() -> None:
        dispatch = pipeline.InlineDispatcher(app.state.sessions)
        dispatch.send(task, *args)
        try:
            dispatch.drain()
        except Exception as exc:  # noqa: BLE001 - recorded on the job
            log.exception("training job %s failed", args[0])
            _mark_failed(app.state.sessions, args[0], exc)

    threading.Thread(target=run, name=f"fedrec-job-{args[0]}", daemon=True).start()


def run_inline(sessions, job_id: int, resume: bool = False) -> None:
    """Run (or resume) a job to the end in this thread."""
    dispatch = pipeline.InlineDispatcher(sessions)
    if resume:
        pipeline.resume(sessions, dispatch, job_id)
    else:
        dispatch.send(pipeline.TASK_START, job_id, 1)
    try:
        dispatch.drain()
    except Exception as exc:  # record the failure on the job instead of losing it
        log.exception("training job %s failed", job_id)
        _mark_failed(sessions, job_id, exc)


def _mark_failed(sessions, job_id: int, exc: Exception) -> None:
    from app.training.models import TrainingJob

    with sessions() as s:
        job = s.get(TrainingJob, job_id)
        if job is not None and job.status in ("queued", "running"):
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
            s.commit()


def _uses_broker(app: FastAPI) -> bool:
    return not app.state.celery.conf.task_always_eager


def start_job(app: FastAPI, job_id: int) -> None:
    """Send round 1 of a new job."""
    if _uses_broker(app):
        CeleryDispatcher(app.state.celery).send(pipeline.TASK_START, job_id, 1)
        return
    threading.Thread(target=run_inline, args=(app.state.sessions, job_id),
                     name=f"fedrec-job-{job_id}", daemon=True).start()


def resume_job(app: FastAPI, job_id: int) -> bool:
    """Re-send the next round of an unfinished job; False if there is nothing to resume."""
    if _uses_broker(app):
        return pipeline.resume(app.state.sessions, CeleryDispatcher(app.state.celery), job_id)
    from app.training.models import TrainingJob

    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        if job is None or job.status not in ("queued", "running", "failed"):
            return False
    threading.Thread(target=run_inline, args=(app.state.sessions, job_id, True),
                     name=f"fedrec-job-{job_id}", daemon=True).start()
    return True


def start_tuning(app: FastAPI, tuning_id: int) -> None:
    """Send a tuning job to a worker, or run it in a background thread (no broker)."""
    from app.queue import TUNING_RUN
    from app.training.tuning import run_tuning

    if _uses_broker(app):
        app.state.celery.send_task(TUNING_RUN, args=[tuning_id], ignore_result=True,
                                   queue=app.state.celery.conf.task_default_queue,
                                   priority=TRAINING_PRIORITY)
        return
    threading.Thread(target=run_tuning, args=(app.state.sessions, tuning_id),
                     name=f"fedrec-tuning-{tuning_id}", daemon=True).start()
