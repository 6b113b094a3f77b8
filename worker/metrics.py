"""Prometheus metrics of a Celery worker: its own exporter on FEDREC_WORKER_METRICS_PORT.

Why a port per worker and not the API's ``/metrics``: workers run on several hosts, each
with several pool processes; what a task measures lives in the process that ran it. The
standard arrangement is one exporter per ``celery worker`` command, scraped by Prometheus
like any other target (one ``scrape_configs`` job listing every worker host, or Docker /
Kubernetes service discovery). Inside one worker the pool processes (prefork) write to
memory-mapped files in a private directory (prometheus-client's multiprocess mode) and the
exporter, served by the worker's main process, sums them at scrape time, so a
``--concurrency=8`` worker is one target.

Exported (no tenant label: nothing here is tenant data, so the exporter needs no token;
keep its port on the internal network):

* ``fedrec_worker_tasks_total{task, state}``: ``started``, ``succeeded``, ``failed``,
  ``retried`` (a database outage's backoff) per task name;
* ``fedrec_worker_task_duration_seconds{task}``: wall time of every task that ran;
* ``fedrec_worker_round_duration_seconds``: each round this worker committed (from the
  round's start to its commit, the figure stored on the round);
* ``fedrec_worker_client_step_duration_seconds``: each hosted tenant's client step this
  worker computed (local training, privatisation and the staged upload; a stale or
  duplicate delivery that computes nothing is not counted).

Unset (the default), nothing is measured or served; in the API process (no broker: tasks
run in-process) the hooks below are never installed.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

log = logging.getLogger("fedrec.worker")
TASK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0)
ROUND_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
STATES = ("started", "succeeded", "failed", "retried")


class WorkerMetrics:
    """The worker's metric objects (multiprocess values: see :func:`start_exporter`)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.tasks = Counter("fedrec_worker_tasks", "Celery tasks by name and state",
                             ["task", "state"], registry=None)
        self.duration = Histogram("fedrec_worker_task_duration_seconds",
                                  "Wall time of each Celery task", ["task"],
                                  buckets=TASK_BUCKETS, registry=None)
        self.rounds = Histogram("fedrec_worker_round_duration_seconds",
                                "Training rounds committed by this worker (start to commit)",
                                buckets=ROUND_BUCKETS, registry=None)
        self.client_steps = Histogram("fedrec_worker_client_step_duration_seconds",
                                      "Hosted tenants' client steps computed by this worker",
                                      buckets=TASK_BUCKETS, registry=None)
        self._started: dict[str, tuple[str, float]] = {}

    def task_started(self, task_id: str, task: str) -> None:
        self.tasks.labels(task, "started").inc()
        self._started[task_id] = (task, time.perf_counter())

    def task_finished(self, task_id: str) -> None:
        task, at = self._started.pop(task_id, (None, 0.0))
        if task is not None:
            self.duration.labels(task).observe(time.perf_counter() - at)

    def task_state(self, task: str, state: str) -> None:
        self.tasks.labels(task, state).inc()


_metrics: WorkerMetrics | None = None
_directory: str | None = None


def current() -> WorkerMetrics | None:
    """The worker's metrics once its exporter runs, else None (nothing is measured)."""
    return _metrics


def start_exporter(port: int, addr: str = "0.0.0.0") -> WorkerMetrics:  # noqa: S104
    """Switch this process (and the pool processes it forks) to multiprocess values in a
    fresh private directory, and serve their sum on ``addr:port`` from a thread of this,
    the worker's main process. Called once, before the pool starts."""
    global _metrics, _directory
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server, values

    if _metrics is not None:
        return _metrics
    # a private directory per worker command: two workers on one host never mix files,
    # and no stale file of an earlier run is summed in
    _directory = tempfile.mkdtemp(prefix="fedrec-worker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _directory
    values.ValueClass = values.MultiProcessValue()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=_directory)
    start_http_server(port, addr, registry=registry)
    _metrics = WorkerMetrics()
    log.info("worker metrics on http://%s:%s/metrics", addr, port)
    return _metrics


def stop_exporter() -> None:
    """Remove the private directory (the worker is shutting down)."""
    if _directory is not None:
        shutil.rmtree(_directory, ignore_errors=True)
