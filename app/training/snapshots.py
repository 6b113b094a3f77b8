"""Serving factors: written when a job completes, cached in memory per process.

A tenant's scores for its user t are ``A[t] @ B``; the cache keeps one entry per tenant and
reloads it when a newer snapshot (later ``updated_at``) exists in the database.
"""

from __future__ import annotations

import dataclasses
import io
import threading
import time

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from algorithms.registry import RANKING
from app.cache import EXPIRED, REFRESH, SingleFlight
from app.models import Item
from app.training.forget import FORGOTTEN
from app.training.models import FactorSnapshot, TrainingJob
from app.training.reports import is_private


def non_finite_factors(factors: dict[int, tuple[np.ndarray, np.ndarray]]) -> str | None:
    """Why the factors ``{tenant_id: (A, B)}`` must not be published, or None.

    A NaN or infinity would make every score of the tenant NaN (empty recommendations);
    the job is failed instead and the previous snapshot keeps being served."""
    bad = sorted(t for t, (a, b) in factors.items()
                 if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))))
    if not bad:
        return None
    return (f"training diverged: the factors of tenant(s) {', '.join(map(str, bad))} contain "
            "NaN or infinity; nothing was published and the previous snapshots stay served")


def write_snapshot(s: Session, tenant_id: int, job: TrainingJob, user_keys: list[str],
                   a: np.ndarray, b: np.ndarray, columns: np.ndarray | None = None,
                   link: tuple[float, float] | None = None) -> None:
    """Upsert the tenant's snapshot from ``job`` (one row per tenant and job).

    Only the item ``columns`` of the job's item axis (default: all) are published. A
    differentially private job publishes all of them (its item axis is the registered
    catalogue, public; :func:`app.training.pipeline._finish`). A job without a guarantee
    publishes those the tenant's own training ratings covered: an item nobody rated has
    only its initial (or noise) factors, and an item only other tenants rated would tell
    this tenant, outside the privacy guarantee, that someone rated it. Users forgotten
    meanwhile (key ``FORGOTTEN``) are left out too. ``link`` = (offset, spread): the served score is
    ``offset + spread * sigmoid(A @ B)`` (RFRec's sigmoid link), kept in the blob.
    """
    keep = [i for i, key in enumerate(user_keys) if key != FORGOTTEN]
    if columns is None:
        columns = np.arange(b.shape[1])
    ids = np.load(io.BytesIO(job.item_ids), allow_pickle=False)[columns]
    ids_buf = io.BytesIO()
    np.save(ids_buf, ids.astype(np.int64), allow_pickle=False)
    buf = io.BytesIO()
    extra = {} if link is None else {"link": np.asarray(link, dtype=np.float64)}
    np.savez(buf, A=np.ascontiguousarray(a[keep]), B=np.ascontiguousarray(b[:, columns]),
             item_ids=np.frombuffer(ids_buf.getvalue(), dtype=np.uint8), **extra)
    row = s.get(FactorSnapshot, (tenant_id, job.id))
    if row is None:
        row = FactorSnapshot(tenant_id=tenant_id, job_id=job.id)
        s.add(row)
    row.round, row.factors = job.current_round, buf.getvalue()
    row.user_keys = [user_keys[i] for i in keep]


@dataclasses.dataclass(frozen=True, eq=False)
class ServingFactors:
    """One tenant's factors, ready for top-k: ``B`` is C-contiguous (r' x n)."""

    job_id: int
    round: int
    version: str
    user_index: dict[str, int]
    a: np.ndarray
    b: np.ndarray
    item_ids: np.ndarray
    item_keys: list[str]
    titles: list[str | None]
    link: tuple[float, float] | None = None  # (offset, spread) of a sigmoid link
    #: whether the job that produced the factors is differentially private (its released
    #: item factors may then be post-processed for a cold-start list, nothing else)
    private: bool = False
    algorithm: str = ""  #: the model that produced the factors
    #: "model": these factors serve the lists; "popularity": the job's model lost to
    #: popularity on held-out data, which serves them instead (``reason`` says why)
    lists: str = "model"
    reason: str | None = None
    #: the item ids sorted, and where each sorted id is in ``item_ids``
    _sorted: np.ndarray = dataclasses.field(init=False, repr=False)
    _order: np.ndarray = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        order = np.argsort(self.item_ids, kind="stable")
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_sorted", self.item_ids[order])

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Indices into ``item_ids`` of those of ``ids`` it holds (by binary search: a
        user's few rated items against the whole catalogue, on every request)."""
        return self.matched(ids)[1]

    def matched(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(which of ``ids`` it holds, their indices into ``item_ids``)."""
        if not ids.size or not self._sorted.size:
            return np.zeros(ids.size, dtype=bool), np.empty(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted, ids), self._sorted.size - 1)
        hit = self._sorted[at] == ids
        return hit, self._order[at[hit]]


def _load(s: Session, tenant_id: int, job_id: int, version: str) -> ServingFactors:
    row = s.get(FactorSnapshot, (tenant_id, job_id))
    with np.load(io.BytesIO(row.factors), allow_pickle=False) as z:
        item_ids = np.load(io.BytesIO(z["item_ids"].tobytes()), allow_pickle=False)
        a, b = z["A"], np.ascontiguousarray(z["B"])
        link = tuple(float(x) for x in z["link"]) if "link" in z.files else None
    job = s.get(TrainingJob, job_id)
    labels = dict((i, (k, t)) for i, k, t in s.execute(
        sa.select(Item.id, Item.key, Item.title).where(Item.id.in_(item_ids.tolist()))))
    serving = job.serving or {}
    return ServingFactors(row.job_id, row.round, version,
                          {k: i for i, k in enumerate(row.user_keys)}, a, b, item_ids,
                          [labels[int(i)][0] for i in item_ids],
                          [labels[int(i)][1] for i in item_ids], link,
                          private=is_private(job), algorithm=job.algorithm,
                          lists=serving.get("lists", "model"), reason=serving.get("reason"))


#: the snapshot that serves a tenant's lists: the newest of a ranking model if there is
#: one (a rating model's lists lose to popularity, see RANKING in algorithms.registry),
#: else the newest
_HEAD = (sa.select(FactorSnapshot.job_id, FactorSnapshot.updated_at)
         .join(TrainingJob, TrainingJob.id == FactorSnapshot.job_id)
         .where(FactorSnapshot.tenant_id == sa.bindparam("tenant_id"))
         .order_by(sa.case((TrainingJob.algorithm.in_(sorted(RANKING)), 1), else_=0).desc(),
                   FactorSnapshot.updated_at.desc(), FactorSnapshot.job_id.desc())
         .limit(1))


class FactorCache:
    """Per-process cache of the latest snapshot of each tenant.

    The database is asked whether a newer snapshot exists about once every ``ttl / 2``
    seconds per tenant (one small query, by one request in the background while the
    others keep serving, see :mod:`app.cache`); the factors and item labels load only when
    it does. Nothing checked more than ``ttl`` seconds ago is served.
    """

    def __init__(self, ttl: float = 1.0) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._flight = SingleFlight(ttl)
        self._by_tenant: dict[int, tuple[ServingFactors | None, float]] = {}

    def peek(self, tenant_id: int) -> tuple[bool, bool, ServingFactors | None]:
        """(known, due, factors) from memory only: ``known`` is False before the first
        :meth:`get` and once the entry expired (then call :meth:`get` before answering);
        ``due`` means this caller should refresh it in the background
        (``get(..., ahead=True)``)."""
        if tenant_id not in self._by_tenant:
            return False, True, None
        cached, checked = self._by_tenant[tenant_id]
        state = self._flight.state(tenant_id, checked, time.monotonic())
        if state == EXPIRED:
            return False, True, None
        return True, state == REFRESH, cached

    def get(self, s: Session, tenant_id: int, ahead: bool = False) -> ServingFactors | None:
        """The tenant's factors, re-checked first when older than ``ttl`` (with ``ahead``,
        the background refresh: older than ``ttl / 2``)."""
        limit = self.ttl / 2 if ahead else self.ttl
        cached, checked = self._by_tenant.get(tenant_id, (None, -np.inf))
        if time.monotonic() - checked < limit:
            if ahead:  # renewed meanwhile: release this refresher's claim
                self._flight.done(tenant_id)
            return cached
        with self._lock:  # one thread refreshes; the others then find it fresh
            try:
                return self._refresh(s, tenant_id, limit)
            finally:
                self._flight.done(tenant_id)

    def forget(self, tenant_id: int) -> None:
        """Drop the tenant's entry (the tenant was deleted)."""
        self._by_tenant.pop(tenant_id, None)

    def _refresh(self, s: Session, tenant_id: int, limit: float) -> ServingFactors | None:
        now = time.monotonic()  # before the query: the entry is as old as this read
        cached, checked = self._by_tenant.get(tenant_id, (None, -np.inf))
        if now - checked < limit:
            return cached
        fresh = latest_factors(s, tenant_id, cached)
        self._by_tenant[tenant_id] = (fresh, now)
        return fresh


def latest_factors(s: Session, tenant_id: int, cached: ServingFactors | None = None
                   ) -> ServingFactors | None:
    """The tenant's serving snapshot (:data:`_HEAD`) as read now (``cached`` when it is
    still that one); None before any."""
    head = s.execute(_HEAD, {"tenant_id": tenant_id}).first()
    if head is None:
        return None
    version = f"{head.job_id}:{head.updated_at.isoformat()}"
    if cached is not None and cached.version == version:
        return cached
    return _load(s, tenant_id, head.job_id, version)
