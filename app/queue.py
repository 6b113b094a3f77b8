"""The Celery app and its task names; enqueue tasks by name.

The API never imports the task modules (:mod:`worker`) themselves: the app built here
names them in ``include`` and Celery loads them where tasks run (a worker, or this process
when there is no broker). With FEDREC_BROKER_URL (or REDIS_URL) set, tasks go through that
broker to workers; without one, the app is eager: tasks run in the calling process (the
embedded default).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.exceptions import TimeoutError as ResultTimeout
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from app.config import Settings, get_settings

RECOMPUTE_RATING_STATS = "fedrec.recompute_rating_stats"
REFRESH_ALL_RATING_STATS = "fedrec.refresh_all_rating_stats"
TRAINING_START_ROUND = "fedrec.training.start_round"
TRAINING_CLIENT_STEP = "fedrec.training.client_step"
TRAINING_AGGREGATE = "fedrec.training.aggregate"
TRAINING_RETRAIN = "fedrec.training.retrain"
TRAINING_RESUME_STALLED = "fedrec.training.resume_stalled"
TUNING_RUN = "fedrec.tuning.run"

TASK_MODULES = ["worker.celery_app", "worker.tasks", "worker.training_tasks"]
"""Loaded by Celery where tasks run; the first connects the worker's signal handlers
(log context, task metrics, beat heartbeat)."""

BEAT_KEY = "fedrec:beat:watchdog_last_run"
"""Unix time of the watchdog's last run (a beat-scheduled task, written by the worker)."""
BEAT_STARTED_KEY = "fedrec:beat:started"
"""Unix time beat last started (written by beat itself): until the watchdog's first run,
one period later, ``fedrec doctor`` says beat is starting instead of failing."""


def create_celery_app(settings: Settings | None = None) -> Celery:
    """A Celery app wired to the settings' broker, or eager when there is none."""
    settings = settings or get_settings()
    celery = Celery("fedrec", include=TASK_MODULES, set_as_current=False)
    celery.conf.update(
        fedrec_database_url=settings.database_url,
        task_default_queue=settings.task_queue,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True, worker_prefetch_multiplier=1, timezone="UTC",
        broker_connection_retry_on_startup=True,
        beat_schedule=beat_schedule(settings),
        fedrec_stalled_job_seconds=settings.stalled_job_seconds,
    )
    if settings.broker_url:
        celery.conf.update(broker_url=settings.broker_url,
                           result_backend=settings.result_backend or settings.broker_url,
                           result_expires=24 * 3600)
    else:
        celery.conf.update(broker_url="memory://", task_always_eager=True,
                           task_eager_propagates=False, task_store_eager_result=False)
    return celery


def beat_schedule(settings: Settings) -> dict:
    """Beat's periodic tasks: statistics refresh, the stalled-job watchdog, retraining."""
    schedule = {
        "refresh-rating-stats": {"task": REFRESH_ALL_RATING_STATS,
                                 "schedule": settings.stats_refresh_seconds},
        "resume-stalled-jobs": {"task": TRAINING_RESUME_STALLED,
                                "schedule": min(60.0, settings.stalled_job_seconds)},
    }
    if settings.retrain_seconds:
        schedule["retrain"] = {"task": TRAINING_RETRAIN, "schedule": settings.retrain_seconds}
    return schedule


def enqueue(celery: Celery, name: str, args: list) -> tuple[str, str]:
    """Send task ``name``; without a broker (eager mode) run it here and now.

    Returns the task id and its state (``SUCCESS``/``FAILURE`` when run in-process,
    ``PENDING`` when queued).
    """
    if celery.conf.task_always_eager:
        celery.loader.import_default_modules()
        result = celery.tasks[name].apply(args=args)
        return result.id, result.state
    try:
        result = celery.send_task(name, args=args, queue=celery.conf.task_default_queue)
    except OperationalError:
        raise
    except (RuntimeError, OSError, RedisError) as exc:
        # Sending also subscribes to the result backend; its failure (Redis down) surfaces
        # as these, not as kombu's OperationalError: re-raise as the broker outage it is,
        # which the API answers with 503 (app.main.unavailable).
        raise OperationalError(f"could not send task {name}: {exc}") from exc
    return result.id, "PENDING"


def ask(celery: Celery, name: str, args: list, seconds: float) -> tuple[str, Any]:
    """Send task ``name`` to a worker and wait up to ``seconds`` for its answer (a broker
    and a result backend are needed: not for the eager app).

    Returns ("done", the task's return value), ("failed", "Type: message") when the task
    raised or its worker was lost, or, at the deadline, ("running", None) when a worker
    had started it (the task must be declared ``track_started``) or ("waiting", None) when
    none had. A task not started by then expires unrun, and a started one is interrupted
    at ``seconds`` (soft limit) and killed 10 s later. Raises OperationalError (the API's
    503) when the broker or the result backend cannot be reached.
    """
    try:
        result = celery.send_task(name, args=args, queue=celery.conf.task_default_queue,
                                  expires=seconds, soft_time_limit=seconds,
                                  time_limit=seconds + 10)
    except OperationalError:
        raise
    except (RuntimeError, OSError, RedisError) as exc:
        raise OperationalError(f"could not send task {name}: {exc}") from exc
    try:
        try:
            value = result.get(timeout=seconds, propagate=False, interval=0.05)
        except ResultTimeout:
            return ("running" if result.state == "STARTED" else "waiting"), None
        if result.failed():
            return "failed", f"{type(value).__name__}: {value}"
        return "done", value
    except (OSError, RedisError) as exc:
        raise OperationalError(f"could not read the answer of task {name}: {exc}") from exc
    finally:
        try:
            result.forget()
        except (OSError, RedisError):  # pragma: no cover - the backend just went away
            pass
