"""The worker's side of the Celery app: its signal handlers (log format and context, task
metrics, the beat heartbeat for ``fedrec doctor``) and the process-wide app.

``celery -A worker.celery_app worker`` finds ``app`` through the module ``__getattr__``;
the app itself is built by :func:`app.queue.create_celery_app`. The API builds it too but
never imports this package: Celery loads it with the task modules
(:data:`app.queue.TASK_MODULES`).
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery, signals

from app.config import get_settings
from app.logs import configure_logging, context, new_context
from app.queue import (  # noqa: F401 - create_celery_app re-exported for `celery -A`
    BEAT_KEY,
    BEAT_STARTED_KEY,
    TRAINING_RESUME_STALLED,
    create_celery_app,
)


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
