"""Prometheus metrics of the API: ``GET /metrics`` (admin token required).

Measured in this process:

* ``fedrec_http_request_duration_seconds{method, route, status}``: latency by route
  *template* (``/v1/tenants/{tenant_id}/ratings``, never a raw path: bounded cardinality);
* ``fedrec_uploads_total{outcome}`` and ``fedrec_uploaded_rows_total``;
* ``fedrec_serving_cache_total{cache, result}``: hits and misses of the serving caches.

Read from the database at scrape time (so they are right whichever process ran the work,
API or Celery worker): ``fedrec_jobs{status}``, ``fedrec_round_duration_seconds``
(histogram of every recorded round) and ``fedrec_epsilon_spent{tenant_id}``.

Why admin-only: the per-tenant epsilon and the job counts are operational data about
tenants; Prometheus sends the token with ``authorization: {credentials_file: ...}``.
"""

from __future__ import annotations

import logging
import math
import time

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from starlette.types import Scope

log = logging.getLogger("fedrec")
ROUND_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class DatabaseCollector:
    """Jobs by status, round durations and each tenant's lifetime epsilon, from the
    database (the epsilon through the privacy ledger; cached ``ttl`` seconds)."""

    def __init__(self, sessions, ttl: float = 15.0) -> None:
        self.sessions, self.ttl = sessions, ttl
        self._epsilon: tuple[float, dict[int, float]] = (-math.inf, {})

    def describe(self):
        return []  # nothing is read at registration (the database may not exist yet)

    def collect(self):
        from app.models import Tenant
        from app.training.ledger import load_ledger
        from app.training.models import JobRound, TrainingJob

        try:
            with self.sessions() as s:
                jobs = GaugeMetricFamily("fedrec_jobs", "Training jobs by status",
                                         labels=["status"])
                for status, n in s.execute(sa.select(TrainingJob.status, sa.func.count())
                                           .group_by(TrainingJob.status)):
                    jobs.add_metric([status], n)
                counts = [s.scalar(sa.select(sa.func.count()).select_from(JobRound)
                                   .where(JobRound.seconds <= b)) for b in ROUND_BUCKETS]
                total, seconds = s.execute(sa.select(sa.func.count(),
                                                     sa.func.sum(JobRound.seconds))).one()
                rounds = HistogramMetricFamily(
                    "fedrec_round_duration_seconds", "Duration of every recorded round",
                    buckets=[(str(b), c) for b, c in zip(ROUND_BUCKETS, counts, strict=True)]
                    + [("+Inf", total)], sum_value=float(seconds or 0.0))
                at, spent = self._epsilon
                if time.monotonic() - at > self.ttl:
                    ids = list(s.scalars(sa.select(Tenant.id)))
                    ledger = load_ledger(s, ids)
                    spent = {t: ledger.spent(t).epsilon for t in ids}
                    self._epsilon = (time.monotonic(), spent)
        except Exception:  # noqa: BLE001 - a scrape must not fail on a database hiccup
            log.exception("metrics: could not read the database")
            return
        epsilon = GaugeMetricFamily("fedrec_epsilon_spent", "Lifetime epsilon spent per "
                                    "tenant (+Inf after a noise-free job)", labels=["tenant_id"])
        for tenant_id, value in sorted(spent.items()):
            epsilon.add_metric([str(tenant_id)], value)
        yield from (jobs, rounds, epsilon)


class Metrics:
    """One registry per app (tests build many apps in one process)."""

    def __init__(self, sessions) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Histogram(
            "fedrec_http_request_duration_seconds", "HTTP request latency by route template",
            ["method", "route", "status"], registry=self.registry)
        self.uploads = Counter("fedrec_uploads_total", "Rating uploads by outcome",
                               ["outcome"], registry=self.registry)
        self.rows = Counter("fedrec_uploaded_rows_total", "Ratings stored by uploads",
                            registry=self.registry)
        self.cache = Counter("fedrec_serving_cache_total", "Serving cache lookups",
                             ["cache", "result"], registry=self.registry)
        self.registry.register(DatabaseCollector(sessions))
        # the labelled children by label values: ``labels()`` validates and locks on every
        # call, and the serving route looks up three per request
        self._timers: dict[tuple[str, str, str], object] = {}
        self._lookups: dict[tuple[str, bool], object] = {}

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request into ``fedrec_http_request_duration_seconds``."""
        key = (method, route, str(status))
        timer = self._timers.get(key)
        if timer is None:
            timer = self._timers.setdefault(key, self.requests.labels(*key))
        timer.observe(seconds)

    def cache_lookup(self, cache: str, hit: bool) -> None:
        """One lookup of a serving cache into ``fedrec_serving_cache_total``."""
        counter = self._lookups.get((cache, hit))
        if counter is None:
            counter = self._lookups.setdefault(
                (cache, hit), self.cache.labels(cache, "hit" if hit else "miss"))
        counter.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


UNMATCHED = "unmatched"


def route_template(scope: Scope) -> str:
    """The matched route's path template, or ``unmatched`` (a 404 of the router)."""
    route = scope.get("route")
    return getattr(route, "path_format", None) or getattr(route, "path", None) or UNMATCHED
