"""Enqueue Celery tasks by name; the API never imports the task modules themselves."""

from __future__ import annotations

from celery import Celery
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

RECOMPUTE_RATING_STATS = "fedrec.recompute_rating_stats"
REFRESH_ALL_RATING_STATS = "fedrec.refresh_all_rating_stats"
TRAINING_START_ROUND = "fedrec.training.start_round"
TRAINING_CLIENT_STEP = "fedrec.training.client_step"
TRAINING_AGGREGATE = "fedrec.training.aggregate"
TRAINING_RETRAIN = "fedrec.training.retrain"
TRAINING_RESUME_STALLED = "fedrec.training.resume_stalled"
TUNING_RUN = "fedrec.tuning.run"


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
