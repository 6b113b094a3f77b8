"""Top-k selection for serving: one matrix-vector product and an argpartition.

Scores of user t of tenant i are ``A[t] @ B`` (see :meth:`algorithms.base.Algorithm.factors`).
"""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, k: int, exclude: np.ndarray | None = None,
          offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Items ranked ``offset .. offset+k-1`` by descending score, ties by item index.

    Parameters
    ----------
    scores : (n,) float array
        One user's predicted score of every item.
    k, offset : int
        Page size and start (pagination over the ranking).
    exclude : int array, optional
        Item indices never returned (e.g. those the user already rated).

    Returns
    -------
    items, item_scores : arrays of length <= k
    """
    if k < 0 or offset < 0:
        raise ValueError("k and offset must be non-negative")
    n = scores.shape[0]
    candidates = np.arange(n)
    if exclude is not None and exclude.size:
        keep = np.ones(n, dtype=bool)
        keep[exclude] = False
        candidates = candidates[keep]
    want = min(offset + k, candidates.size)
    if want == 0:
        return np.empty(0, dtype=np.int64), np.empty(0)
    cand_scores = scores[candidates]
    if want < candidates.size:
        # argpartition on -score; widen to every item tied with the cut so ties order stably
        part = np.argpartition(-cand_scores, want - 1)[:want]
        cut = cand_scores[part].min()
        part = np.flatnonzero(cand_scores >= cut)
    else:
        part = np.arange(candidates.size)
    order = np.lexsort((candidates[part], -cand_scores[part]))[offset:want]
    chosen = part[order]
    return candidates[chosen].astype(np.int64), cand_scores[chosen]


def popularity_scores(item_counts: np.ndarray, item_sums: np.ndarray,
                      prior_weight: float = 10.0) -> np.ndarray:
    """Cold-start scores: the Bayesian-damped mean rating of each item.

    ``(sum + prior_weight * global_mean) / (count + prior_weight)``, so on MovieLens-like data
    (mean about 3.5) an item rated once at 5 stars does not outrank one rated 500 times
    at 4.6.
    """
    total = item_counts.sum()
    mean = item_sums.sum() / total if total else 0.0
    return (item_sums + prior_weight * mean) / (item_counts + prior_weight)


def fold_in(b: np.ndarray, values: np.ndarray, lam: float = 1.0) -> np.ndarray:
    """One user's factor from the user's own ratings against fixed item factors.

    Ridge regression ``a = argmin ||values - a B||^2 + lam ||a||^2``, the user step of
    alternating least squares (Hu, Koren and Volinsky, "Collaborative Filtering for
    Implicit Feedback Datasets", ICDM 2008, fold-in of new users). It reads only the
    item factors and this user's ratings, so on a differentially private model it is
    post-processing: a list built from it tells its reader nothing about other users
    beyond the released model.

    Parameters
    ----------
    b : (r, s) float array
        The item factors of the s items the user rated.
    values : (s,) float array
        The user's ratings of those items, in the units of ``a @ b``.
    lam : float
        Ridge weight (> 0, so the system is solvable for any s).
    """
    r = b.shape[0]
    return np.linalg.solve(b @ b.T + lam * np.eye(r), b @ values)
