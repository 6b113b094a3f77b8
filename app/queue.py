"""The Celery app and its task names; enqueue tasks by name.

The API never imports the task modules (:mod:`worker`) themselves: the app built here
names them in ``include`` and Celery loads them where tasks run (a worker, or this process
when there is no broker). With FEDREC_BROKER_URL (or REDIS_URL) set, tasks go through that
broker to workers; without one, the app is eager: tasks run in the calling process (the
embedded default).
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from celery.states import FAILURE, READY_STATES, STARTED, SUCCESS
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


TRAINING_PRIORITY = 6
"""The priority of training and tuning tasks on the Redis broker, where a lower number is
taken first (kombu's Redis transport keeps one list per priority step, 0, 3, 6 and 9, of
the same queue, and a worker takes from the lowest non-empty one, whatever its ``-Q``).
Other tasks (statistics, beat's, and the API's dry rounds, which a request waits for) go
at 0, so they do not wait behind a backlog of training tasks."""


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


def ask(celery: Celery, name: str, args: list, seconds: float, poll: float = 0.05
        ) -> tuple[str, Any]:
    """Send task ``name`` to a worker and wait for its answer (a broker and a result
    backend are needed: not for the eager app), ahead of queued training tasks
    (:data:`TRAINING_PRIORITY`). ``seconds`` bounds the wait for a worker to start the
    task and, once one has, the task's own run: time spent queued is not counted against
    the run. The task must be declared
    ``track_started`` (so its start is seen) and must not ignore its result.

    Returns ("done", the task's return value), ("failed", "Type: message") when it raised
    or its worker was lost, ("waiting", None) when no worker started it within
    ``seconds`` (it expires unrun; a task revoked or expired by a worker whose clock is
    ahead reads the same), or ("running", None) when it started but had not answered
    ``seconds`` (and a second's grace) later. Under the prefork pool a task past
    ``seconds`` of its own run is interrupted (soft limit) and killed 10 s later; the solo
    and thread pools have no limits, so such a task runs to its end. Raises
    OperationalError (the API's 503) when the broker or the result backend cannot be
    reached.
    """
    try:
        result = celery.send_task(name, args=args, queue=celery.conf.task_default_queue,
                                  priority=0, expires=seconds, soft_time_limit=seconds,
                                  time_limit=seconds + 10)
    except OperationalError:
        raise
    except (RuntimeError, OSError, RedisError) as exc:
        raise OperationalError(f"could not send task {name}: {exc}") from exc
    try:
        deadline, started = time.monotonic() + seconds, False
        while (state := result.state) not in READY_STATES:
            if state == STARTED and not started:
                started, deadline = True, time.monotonic() + seconds + 1.0
            if time.monotonic() > deadline:
                return ("running" if started else "waiting"), None
            time.sleep(poll)
        if state == SUCCESS:
            return "done", result.result
        if state == FAILURE:
            exc = result.result
            return "failed", f"{type(exc).__name__}: {exc}"
        return "waiting", None  # REVOKED: expired before a worker started it
    except (OSError, RedisError) as exc:
        raise OperationalError(f"could not read the answer of task {name}: {exc}") from exc
    finally:
        try:
            result.forget()
        except (OSError, RedisError):  # pragma: no cover - the backend just went away
            pass
