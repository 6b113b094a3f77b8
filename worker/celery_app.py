"""The Celery app, built from the settings on first use (never at import time).

``celery -A worker.celery_app worker`` finds ``app`` through the module ``__getattr__``.
With FEDREC_BROKER_URL (or REDIS_URL) set, tasks go through that broker to workers; without
one, the app is eager: tasks run in the calling process (the embedded default).
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery, signals

from app.config import Settings, get_settings
from app.logs import configure_logging, context, new_context
from app.queue import REFRESH_ALL_RATING_STATS, TRAINING_RESUME_STALLED, TRAINING_RETRAIN


def create_celery_app(settings: Settings | None = None) -> Celery:
    """A Celery app wired to the settings' broker, or eager when there is none."""
    settings = settings or get_settings()
    celery = Celery("fedrec", include=["worker.tasks", "worker.training_tasks"],
                    set_as_current=False)
    celery.conf.update(
        fedrec_database_url=settings.database_url,
        task_default_queue=settings.task_queue,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True, worker_prefetch_multiplier=1, timezone="UTC",
        broker_connection_retry_on_startup=True,
        beat_schedule=_beat_schedule(settings),
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


def _beat_schedule(settings: Settings) -> dict:
    schedule = {
        "refresh-rating-stats": {"task": REFRESH_ALL_RATING_STATS,
                                 "schedule": settings.stats_refresh_seconds},
        "resume-stalled-jobs": {"task": TRAINING_RESUME_STALLED,
                                "schedule": min(60.0, settings.stalled_job_seconds)},
    }
    if settings.retrain_seconds:
        schedule["retrain"] = {"task": TRAINING_RETRAIN, "schedule": settings.retrain_seconds}
    return schedule


@signals.setup_logging.connect
def _logging(**_: object) -> None:
    """Worker and beat log in the API's format (FEDREC_LOG_FORMAT) instead of Celery's."""
    configure_logging(get_settings().log_format)


@signals.task_prerun.connect
def _task_context(task_id=None, task=None, args=None, kwargs=None, **_: object) -> None:
    """Each task's log lines carry its id and, for a job's task, the job id."""
    fields = {"task_id": task_id}
    job_id = (kwargs or {}).get("job_id")
    if job_id is None and args and getattr(task, "name", "").startswith("fedrec.training"):
        job_id = args[0] if isinstance(args[0], int) else None
    if job_id is not None:
        fields["job_id"] = job_id
    new_context(**{**context(), **fields})  # an in-process task keeps its request id


@signals.worker_init.connect
def _start_metrics(**_: object) -> None:
    """FEDREC_WORKER_METRICS_PORT set: this worker serves its Prometheus metrics there
    (:mod:`worker.metrics`); started before the pool forks, so every pool process counts."""
    port = get_settings().worker_metrics_port
    if port is not None:
        from worker import metrics

        metrics.start_exporter(port)


@signals.worker_shutdown.connect
def _stop_metrics(**_: object) -> None:
    from worker import metrics

    metrics.stop_exporter()


@signals.task_prerun.connect
def _count_start(task_id=None, task=None, **_: object) -> None:
    from worker import metrics

    if (measured := metrics.current()) is not None:
        measured.task_started(task_id, task.name)


@signals.task_postrun.connect
def _count_end(task_id=None, **_: object) -> None:
    from worker import metrics

    if (measured := metrics.current()) is not None:
        measured.task_finished(task_id)


def _count(state: str):
    def handler(sender=None, **_: object) -> None:
        from worker import metrics

        if (measured := metrics.current()) is not None and sender is not None:
            measured.task_state(sender.name, state)
    return handler


_COUNTERS = [_count("succeeded"), _count("failed"), _count("retried")]
signals.task_success.connect(_COUNTERS[0], weak=False)
signals.task_failure.connect(_COUNTERS[1], weak=False)
signals.task_retry.connect(_COUNTERS[2], weak=False)


@signals.task_success.connect
def _beat_heartbeat(sender=None, **_: object) -> None:
    """Record each run of the beat-scheduled watchdog for ``fedrec doctor`` (best effort)."""
    if getattr(sender, "name", None) != TRAINING_RESUME_STALLED:
        return
    url = sender.app.conf.broker_url or ""
    if not url.startswith(("redis://", "rediss://")):
        return
    import time

    import redis

    from app.commands.doctor import BEAT_KEY

    try:
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            client.set(BEAT_KEY, time.time())
    except redis.RedisError:
        pass  # doctor will report beat as silent


@signals.beat_init.connect
def _beat_started(sender=None, **_: object) -> None:
    """Record beat's start for ``fedrec doctor``: until the watchdog's first run, one
    period later, doctor says beat is starting rather than failing (best effort)."""
    url = getattr(getattr(sender, "app", None), "conf", {}).get("broker_url") or ""
    if not url.startswith(("redis://", "rediss://")):
        return
    import time

    import redis

    from app.commands.doctor import BEAT_STARTED_KEY

    try:
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            client.set(BEAT_STARTED_KEY, time.time())
    except redis.RedisError:
        pass


@lru_cache
def get_celery_app() -> Celery:
    """The process-wide app built from :func:`app.config.get_settings`."""
    return create_celery_app()


def __getattr__(name: str) -> Celery:
    if name in ("app", "celery"):
        return get_celery_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
