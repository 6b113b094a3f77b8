"""Ranking metrics of a rating model: precision@k, recall@k, NDCG@k and catalogue coverage.

Computed on each tenant's **held-out** ratings, the way the model would be served:

* every item a user rated in the *training* split is excluded from that user's ranking
  (it would never be recommended);
* the remaining items are ranked by the tenant's ``A[t] @ B`` (:meth:`Algorithm.factors`;
  for RFRec's sigmoid link the served ranking is the same, the link being monotone), ties
  broken by the lower item index, as :func:`algorithms.recommend.top_k` serves them;
* an item is **relevant** to a user when the user's held-out rating of it is at or above
  the relevance threshold, by default 62.5% of the way up the tenant's rating scale,
  :func:`relevance_threshold` (3.5 on 1-5 stars, so 4 and 5 stars, the Felb paper's cut;
  3.3125 on 0.5-5 half stars; 2.5 on -10..10; 1 on 0/1 data);
* only users with at least one relevant held-out item are scored, and every metric is the
  mean over those users, pooled over tenants (each user weighs the same).

Per user with ``h_j`` = 1 when the item at rank j (0-based) is relevant and ``R`` relevant
held-out items: precision@k = sum h / k, recall@k = sum h / R, NDCG@k = DCG / IDCG with
DCG = sum_j h_j / log2(j + 2) and IDCG the DCG of min(R, k) relevant items in the first
places. Catalogue coverage is the share of all items that appear in at least one scored
user's top k.

The work is vectorised per chunk of users (one dense ``chunk x n_items`` score matrix, an
``argpartition`` and a sort of the k best per row); there is no Python loop over users.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from algorithms.base import Algorithm
from algorithms.block import RatingBlock
from algorithms.messages import Message

_CHUNK = 1024  # users scored at once
#: where relevance starts, as a share of the scale's spread above its minimum
RELEVANCE_SHARE = 0.625


def relevance_threshold(scale: tuple[float, float]) -> float:
    """The default relevance cut of a scale (lo, hi): ``lo + 0.625 (hi - lo)``."""
    lo, hi = scale
    return float(lo + RELEVANCE_SHARE * (hi - lo))


@dataclasses.dataclass
class RankingSums:
    """Per-user sums of one or more tenants, to pool before taking means."""

    n_items: int
    precision: float = 0.0
    recall: float = 0.0
    ndcg: float = 0.0
    users: int = 0
    recommended: np.ndarray | None = None  # bool per item: in some scored user's top k

    def add(self, other: RankingSums) -> RankingSums:
        rec = other.recommended if self.recommended is None else (
            self.recommended if other.recommended is None
            else self.recommended | other.recommended)
        return RankingSums(self.n_items, self.precision + other.precision,
                           self.recall + other.recall, self.ndcg + other.ndcg,
                           self.users + other.users, rec)


@dataclasses.dataclass(frozen=True)
class RankingReport:
    """Mean ranking metrics over the scored users (NaN when no user has a relevant item)."""

    k: int
    threshold: float | None  #: the relevance cut (None: each tenant's scale default)
    precision_at_k: float
    recall_at_k: float
    ndcg_at_k: float
    coverage: float  #: share of the catalogue in some scored user's top k
    users_ranked: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {key: _num(v) for key, v in dataclasses.asdict(self).items()}

    @staticmethod
    def from_sums(s: RankingSums, k: int, threshold: float | None) -> RankingReport:
        if s.users == 0:
            nan = float("nan")
            return RankingReport(k, threshold, nan, nan, nan, 0.0, 0)
        cov = float(s.recommended.sum()) / s.n_items if s.recommended is not None else 0.0
        return RankingReport(k, threshold, s.precision / s.users, s.recall / s.users,
                             s.ndcg / s.users, cov, s.users)


def _num(v):
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k highest scores, best first, ties by lower index.

    ``scores`` may hold ``-inf`` for excluded entries; they rank last.
    """
    n_rows, n = scores.shape
    k = min(k, n)
    if k == 0:
        return np.empty((n_rows, 0), dtype=np.int64)
    if k < n:
        # the k-th best score of each row; every column scoring above it, plus enough of
        # those tied with it (lowest indices first), makes the top k
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        cut = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        # a row with exactly k scores at or above its cut (no tie beyond the k-th, the
        # usual case) has argpartition's k as its top k; the order is set below, so only
        # the other rows need the tie rule (a cumulative sum over the whole catalogue)
        ties = np.flatnonzero(np.count_nonzero(scores >= cut, axis=1) > k)
        cand = part
        if ties.size:
            sub, sub_cut = scores[ties], cut[ties]
            above = sub > sub_cut
            tied = sub == sub_cut
            need = k - above.sum(axis=1, keepdims=True)
            take = above | (tied & (np.cumsum(tied, axis=1) <= need))
            cand = part.copy()
            cand[ties] = np.nonzero(take)[1].reshape(ties.size, k)
    else:
        cand = np.broadcast_to(np.arange(n), (n_rows, n))
    cs = np.take_along_axis(scores, cand, axis=1)
    order = np.lexsort((cand, -cs), axis=1)
    return np.take_along_axis(cand, order, axis=1)


def _discounts(k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(k) + 2.0)


def tenant_ranking(a: np.ndarray, b: np.ndarray, train: RatingBlock, test: RatingBlock,
                   threshold: float, k: int = 10) -> RankingSums:
    """Per-user sums of precision/recall/NDCG@k of one tenant with factors (A, B).

    ``train`` gives the items excluded from each user's ranking, ``test`` the held-out
    ratings; an item is relevant when its held-out rating is >= ``threshold``.
    """
    if k <= 0:
        raise ValueError("k must be positive")
    n_items = test.n_items
    sums = RankingSums(n_items, recommended=np.zeros(n_items, dtype=bool))
    rel = test.vals >= threshold
    n_rel = np.bincount(test.rows[rel], minlength=test.n_users)
    users = np.flatnonzero(n_rel > 0)
    if users.size == 0:
        return sums
    disc = _discounts(k)
    ideal = np.cumsum(disc)
    # relevant held-out and training entries as CSR rows (for row slicing by user)
    rel_csr = sp.csr_array((np.ones(int(rel.sum()), dtype=bool),
                            (test.rows[rel], test.cols[rel])), shape=test.shape)
    seen_csr = sp.csr_array((np.ones(train.nnz, dtype=bool), (train.rows, train.cols)),
                            shape=train.shape)
    for start in range(0, users.size, _CHUNK):
        u = users[start:start + _CHUNK]
        scores = np.asarray(a[u] @ b, dtype=np.float64)
        scores[np.isnan(scores)] = -np.inf  # a diverged model: such items are not counted
        seen = seen_csr[u].tocoo()
        scores[seen.row, seen.col] = -np.inf
        top = top_k_rows(scores, k)
        kk = top.shape[1]
        relevant = rel_csr[u].toarray()
        hits = np.take_along_axis(relevant, top, axis=1)
        # an excluded (training) item never counts, even when fewer than k are left
        valid = np.isfinite(np.take_along_axis(scores, top, axis=1))
        hits &= valid
        h = hits.sum(axis=1)
        r = n_rel[u]
        dcg = hits @ disc[:kk]
        idcg = ideal[np.minimum(r, kk) - 1]
        sums.precision += float((h / k).sum())
        sums.recall += float((h / r).sum())
        sums.ndcg += float((dcg / idcg).sum())
        sums.users += int(u.size)
        sums.recommended[top[valid]] = True
    return sums



def pooled_ndcg(factors: Callable[[Any, Any], tuple[np.ndarray, np.ndarray]], glob: Any,
                parts: Iterable[tuple[Any, RatingBlock, RatingBlock, tuple[float, float]]],
                k: int = 10) -> float:
    """NDCG@k pooled over tenants' (local state, fit block, held-out block, scale): each
    tenant ranks its users by ``factors(glob, state)`` (:func:`tenant_ranking`, the fit
    block's items excluded, relevance at the scale's default cut,
    :func:`relevance_threshold`); the per-user sums are added before the mean. NaN when no
    user is ranked. The one score that model selection on a validation carve-out uses."""
    total: RankingSums | None = None
    for state, fit, held, scale in parts:
        a, b = factors(glob, state)
        sums = tenant_ranking(a, b, fit, held, relevance_threshold(scale), k)
        total = sums if total is None else total.add(sums)
    if total is None:
        return float("nan")
    return float(RankingReport.from_sums(total, k, None).ndcg_at_k)

def ranking_report(alg: Algorithm, global_msg: Message, local_states: Sequence[Message],
                   train: Sequence[RatingBlock], test: Sequence[RatingBlock],
                   scales: Sequence[tuple[float, float]] | tuple[float, float],
                   k: int = 10, threshold: float | None = None) -> RankingReport:
    """Pooled ranking metrics of every tenant (see the module docstring).

    ``scales`` is one (lo, hi) for all tenants or one per tenant; the relevance cut is
    ``threshold`` when given, else :func:`relevance_threshold` of the tenant's scale.
    """
    per_tenant = (list(scales) if scales and isinstance(scales[0], (tuple, list))
                  else [tuple(scales)] * len(test))
    total = RankingSums(test[0].n_items if test else 0)
    for state, tr, te, sc in zip(local_states, train, test, per_tenant, strict=True):
        cut = relevance_threshold(sc) if threshold is None else threshold
        a, b = alg.factors(global_msg, state)
        total = total.add(tenant_ranking(a, b, tr, te, cut, k))
    return RankingReport.from_sums(total, k, threshold)
