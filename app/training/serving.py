"""Top-k recommendations from the cached factors, with a cold-start fallback.

Every list says which model and which privacy status produced it (:class:`Ranked`). A user
the model has no factor for gets, from a differentially private model, the user's own
ratings folded into the released item factors (post-processing) or nothing; the tenant's
popularity ranking (exact counts and means of other users' raw ratings) only from a
model without a guarantee, or before any model, labelled not private.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from algorithms.recommend import fold_in, popularity_scores, top_k
from app.cache import EXPIRED, REFRESH, SingleFlight
from app.models import Item, Rating, Tenant, User
from app.training.snapshots import FactorCache, ServingFactors


class UnknownUser(LookupError):
    """The user has neither factors nor ratings in this tenant."""


@dataclasses.dataclass(frozen=True)
class Ranked:
    source: str  # "model" | "fold_in" | "popularity" | "none"
    job_id: int | None
    items: list[tuple[str, str | None, float]]  # (item key, title, score)
    #: whether what produced the list is differentially private for the other users
    private: bool = False
    privacy: str = ""  # in words: which model and which privacy status produced it
    model: str | None = None  #: the algorithm whose model produced the list, or "popularity"
    reason: str | None = None  #: why popularity serves a user the model knows


def _model_privacy(f: ServingFactors) -> str:
    if f.private:
        return (f"differentially private: job {f.job_id}'s released item factors and this "
                "user's own factor (see the job's report for the epsilon)")
    return f"not private: job {f.job_id} has no differential privacy guarantee"


FOLD_IN = ("differentially private: cold start, this user's own ratings folded into job "
           "{}'s released item factors (post-processing of the released model)")
NO_COLD_START = ("omitted: job {} is differentially private and {}; a popularity list "
                 "counted from other users' raw ratings would not be, so none is served")
POPULARITY = ("not private: a popularity list counted from this tenant's raw ratings "
              "(exact counts and means of other users' ratings)")


class RatingsCache:
    """Per-process cache of each tenant's rated-item sets and popularity ranking.

    Entries are valid for one ``ratings_version`` of the tenant (every upload or deletion
    bumps it), re-read from the database about once every ``ttl / 2`` seconds in the
    background, and never served more than ``ttl`` seconds after that read (see
    :mod:`app.cache`). When the version changes, a user's cached rated set is kept only if
    the user's rating count is unchanged (see :func:`_unchanged`), so a small upload does
    not turn every other user's next request into a database query.
    """

    def __init__(self, ttl: float = 1.0, max_users: int = 200_000) -> None:
        self.ttl, self.max_users = ttl, max_users
        self._flight = SingleFlight(ttl)
        self._tenants: dict[int, dict] = {}

    def _entry(self, s: Session, tenant_id: int, limit: float | None = None) -> dict:
        """The tenant's entry, re-checked first when older than ``limit`` (default ttl)."""
        now = time.monotonic()  # before the query: the entry is as old as this read
        entry = self._tenants.get(tenant_id)
        if entry is not None and now - entry["checked"] < (self.ttl if limit is None
                                                           else limit):
            if limit is not None:  # renewed meanwhile: release this refresher's claim
                self._flight.done(tenant_id)
            return entry
        try:
            version = s.scalar(sa.select(Tenant.ratings_version)
                               .where(Tenant.id == tenant_id))
            if entry is None or entry["version"] != version:
                rated = {} if entry is None else _unchanged(s, tenant_id, entry["rated"])
                entry = {"version": version, "rated": rated, "popularity": None}
            entry["checked"] = now
            self._tenants[tenant_id] = entry
        finally:
            self._flight.done(tenant_id)
        return entry

    def peek_rated(self, tenant_id: int, user_key: str) -> tuple[np.ndarray | None, bool]:
        """(the user's rated items from memory, or None when not cached or expired;
        whether the tenant's entry is due for a background refresh by this caller: see
        :meth:`refresh`)."""
        entry = self._tenants.get(tenant_id)
        if entry is None:
            return None, True
        state = self._flight.state(tenant_id, entry["checked"], time.monotonic())
        if state == EXPIRED:
            return None, True
        cached = entry["rated"].get(user_key)
        return (None if cached is None else cached[1]), state == REFRESH

    def refresh(self, s: Session, tenant_id: int, max_age: float | None = None) -> None:
        """The background refresh: re-check the tenant's ratings version if it was read
        more than ``max_age`` (default ``ttl / 2``) seconds ago; drops its entries if it
        changed."""
        self._entry(s, tenant_id, self.ttl / 2 if max_age is None else max_age)

    def rated(self, s: Session, tenant_id: int, user_key: str) -> np.ndarray:
        rated = self._entry(s, tenant_id)["rated"]
        cached = rated.get(user_key)
        if cached is None:
            cached = _rated_item_ids(s, tenant_id, user_key)
            if len(rated) >= self.max_users:
                rated.clear()
            rated[user_key] = cached
        return cached[1]

    def popularity(self, s: Session, tenant: Tenant, by_count: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(item ids, damped mean rating); ``by_count``: (item ids, ranking key) of the
        most-popular list, the tenant's rating counts with the damped mean breaking ties
        (what serves when a model lost to it on held-out data)."""
        entry = self._entry(s, tenant.id)
        if entry["popularity"] is None:
            entry["popularity"] = _popularity(s, tenant)
        ids, damped, counts = entry["popularity"]
        return (ids, counts + _TIE * damped) if by_count else (ids, damped)


def _rated_item_ids(s: Session, tenant_id: int,
                    user_key: str) -> tuple[int | None, np.ndarray]:
    """(the user's row id or None, the ids of the items the user rated)."""
    rows = s.execute(sa.select(User.id, Rating.item_id).select_from(User)
                     .outerjoin(Rating, Rating.user_id == User.id)
                     .where(User.tenant_id == tenant_id, User.key == user_key)).all()
    items = np.fromiter((i for _, i in rows if i is not None), dtype=np.int64)
    return (rows[0][0] if rows else None), items


def _unchanged(s: Session, tenant_id: int, rated: dict) -> dict:
    """The cached rated sets, ``user key -> (user id, item ids)``, still exact now.

    A user's ratings are only ever inserted or updated until the user row is deleted, and a
    re-created user gets a new id, so the same user id with the same rating count means the
    same set of rated items. One grouped query: over the cached users when they are few,
    else over the whole tenant.
    """
    ids = [uid for uid, _ in rated.values() if uid is not None]
    if not ids:
        return {}
    query = (sa.select(User.id, sa.func.count(Rating.item_id))
             .join(Rating, Rating.user_id == User.id).where(User.tenant_id == tenant_id)
             .group_by(User.id))
    if len(ids) <= 1000:
        query = query.where(User.id.in_(ids))
    counts = dict(s.execute(query).all())
    return {key: (uid, items) for key, (uid, items) in rated.items()
            if uid is not None and counts.get(uid, 0) == items.size}


#: weight of the damped mean in the most-popular list's key: it only breaks ties of counts
_TIE = 1e-6


def _popularity(s: Session, tenant: Tenant) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item ids, damped mean rating, rating count) over the tenant's own ratings."""
    rows = s.execute(sa.select(Rating.item_id, sa.func.count(), sa.func.sum(Rating.value))
                     .join(User, User.id == Rating.user_id).where(User.tenant_id == tenant.id)
                     .group_by(Rating.item_id).order_by(Rating.item_id)).all()
    if not rows:
        return np.empty(0, dtype=np.int64), np.empty(0), np.empty(0)
    ids, counts, sums = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
    return ids.astype(np.int64), popularity_scores(counts, sums), counts


def recommend_from_memory(cache: FactorCache, ratings: RatingsCache, tenant: Tenant,
                          user_key: str, k: int, offset: int = 0,
                          include_rated: bool = False) -> tuple[Ranked | None, bool]:
    """(:func:`recommend` answered from memory, or None when something is not cached;
    whether a cache is due for a refresh, which the caller runs in the background with
    :func:`refresh_caches`). Same answer as :func:`recommend` on the same cache state."""
    known, factors_due, factors = cache.peek(tenant.id)
    rated, ratings_due = ratings.peek_rated(tenant.id, user_key)
    due = factors_due or ratings_due
    if not known or factors is None or rated is None or user_key not in factors.user_index:
        return None, due
    if factors.lists != "model":  # popularity serves: answered by :func:`recommend`
        return None, due
    return _from_model(factors, factors.a[factors.user_index[user_key]], rated, k, offset,
                       include_rated, _scale(tenant)), due


def refresh_caches(s: Session, cache: FactorCache, ratings: RatingsCache,
                   tenant_id: int) -> None:
    """Re-check the tenant's snapshot and ratings version (the background refresh)."""
    cache.get(s, tenant_id, ahead=True)
    ratings.refresh(s, tenant_id)


def recommend(s: Session, cache: FactorCache, ratings: RatingsCache, tenant: Tenant,
              user_key: str, k: int, offset: int = 0, include_rated: bool = False) -> Ranked:
    """The user's top-k (from ``offset``): model scores when the user has factors, else
    the tenant's popularity ranking (cold start). Raises :class:`UnknownUser`."""
    factors = cache.get(s, tenant.id)
    rated = ratings.rated(s, tenant.id, user_key)
    row = None if factors is None else factors.user_index.get(user_key)
    serves = factors is not None and factors.lists == "model"
    if row is not None and serves:
        return _from_model(factors, factors.a[row], rated, k, offset, include_rated,
                           _scale(tenant))
    if rated.size == 0 and row is None:
        raise UnknownUser(user_key)
    if serves and factors.private:  # a user the DP model has no factor for
        return _cold_start_private(s, factors, tenant, user_key, k, offset, include_rated)
    reason = None if row is None else factors.reason  # the model lost to popularity
    ids, scores = ratings.popularity(s, tenant)
    exclude = None if include_rated else np.flatnonzero(np.isin(ids, rated))
    if reason is not None:  # the most-popular list the model was compared with
        idx, _ = top_k(ratings.popularity(s, tenant, by_count=True)[1], k, exclude, offset)
        vals = scores[idx]
    else:
        idx, vals = top_k(scores, k, exclude, offset)
    labels = item_labels(s, ids[idx].tolist())
    vals = np.clip(vals, *_scale(tenant))
    return Ranked("popularity", None, [(*labels[i], v) for i, v in
                                       zip(ids[idx].tolist(), vals.tolist(), strict=True)],
                  private=False, privacy=POPULARITY, model="popularity", reason=reason)


def _cold_start_private(s: Session, f: ServingFactors, tenant: Tenant, user_key: str,
                        k: int, offset: int, include_rated: bool) -> Ranked:
    """A user the DP model has no factor for (rated after the job): the user's own
    ratings folded into the released item factors (:func:`algorithms.recommend.fold_in`),
    never a ranking counted from other users' raw ratings. Omitted (an empty list, source
    "none") when the model's scores go through a link (no linear fold-in) or none of the
    user's rated items is in the model's catalogue."""
    ids, values = _user_ratings(s, tenant.id, user_key)
    hit, pos = f.matched(ids)
    why = ("its scores go through a sigmoid link" if f.link is not None else
           "none of this user's rated items is in its catalogue" if not pos.size else None)
    if why is not None:
        return Ranked("none", f.job_id, [], private=True,
                      privacy=NO_COLD_START.format(f.job_id, why), model=f.algorithm or None)
    a = fold_in(f.b[:, pos], values[hit])
    ranked = _from_model(f, a, ids, k, offset, include_rated, _scale(tenant))
    return dataclasses.replace(ranked, source="fold_in", privacy=FOLD_IN.format(f.job_id))


def _user_ratings(s: Session, tenant_id: int, user_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(item ids, values) of the user's ratings."""
    rows = s.execute(sa.select(Rating.item_id, Rating.value).join(User, User.id == Rating.user_id)
                     .where(User.tenant_id == tenant_id, User.key == user_key)).all()
    return (np.fromiter((i for i, _ in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((v for _, v in rows), dtype=np.float64, count=len(rows)))


def _scale(tenant: Tenant) -> tuple[float, float]:
    return tenant.rating_min, tenant.rating_max


def _from_model(f: ServingFactors, user: np.ndarray, rated: np.ndarray, k: int, offset: int,
                include_rated: bool, scale: tuple[float, float]) -> Ranked:
    """Ranked by the raw score ``user @ B`` (``user``: the user's row of A); the scores
    reported are the model's
    predictions (through its link, which is monotone, so the ranking is the same) clamped
    to the tenant's rating scale (a raw score of 102 on a 1-5 scale means "5 at most")."""
    scores = user @ f.b
    exclude = None
    if not include_rated and rated.size:
        exclude = f.positions(rated)
    idx, vals = top_k(scores, k, exclude, offset)
    if f.link is not None:
        shift, spread = f.link
        vals = shift + spread / (1.0 + np.exp(-vals))
    vals = np.clip(vals, *scale)
    return Ranked("model", f.job_id, [(f.item_keys[i], f.titles[i], v) for i, v in
                                      zip(idx.tolist(), vals.tolist(), strict=True)],
                  private=f.private, privacy=_model_privacy(f), model=f.algorithm or None)


def item_labels(s: Session, ids: list[int]) -> dict[int, tuple[str, str | None]]:
    """Item id -> (external key, title)."""
    if not ids:
        return {}
    rows = s.execute(sa.select(Item.id, Item.key, Item.title).where(Item.id.in_(ids))).all()
    return {i: (key, title) for i, key, title in rows}
