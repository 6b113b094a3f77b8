"""Attack-based audit: what a curious server learns about a tenant's ratings from its uploads.

Two attacks on what the server really receives (after the DP wrapper, if any):

* **Membership** (:func:`item_membership_scores`, :func:`auc`): was item j in the tenant's
  training set? The score of item j is how much the upload's column j departs from what the
  server broadcast (for arrays shaped like the broadcast V) or from zero (other arrays,
  e.g. FedMGS's statistics, whose column is exactly zero for an unrated item). Members are
  the items the tenant rated in training; non-members the items it rated only in its
  held-out test split (same distribution of items a tenant cares about). AUC 1 = the rated
  set leaks exactly; 0.5 = chance.
* **Reconstruction**:
  - exact, for FedMGS's sufficient statistics (:func:`fedmgs_single_rater`): when one user
    of a tenant rated item j, G_j = u u^T and b_j = u (m_j - mu), so
    m_j - mu = u^T b_j / ||u||^2 with u read off G_j (its sign cancels); the tenant's offset
    mu is then fixed by the ratings being integers in the known scale (:func:`fix_offset`);
  - regression-based, for factor uploads (:func:`ridge_fit`, :func:`item_features`): the
    server knows the ratings of some "shadow" tenants (auxiliary knowledge), regresses the
    tenant-item mean rating on the upload's column j and the broadcast column j, and
    predicts it for the other tenants. Chance = predicting the shadow mean.

**Empirical epsilon** (:func:`epsilon_lower_bound`): the standard DP audit of *Auditing
Differentially Private Machine Learning: How Private is Private SGD?* (Jagielski, Ullman
and Oprea, NeurIPS 2020) and *Adversary Instantiation: Lower Bounds for Differentially
Private Machine Learning* (Nasr, Song, Thakurta, Papernot and Carlini, IEEE S&P 2021).
Train many times with a canary and many times without; any test "canary in?" with false
positive rate FPR and false negative rate FNR bounds an (epsilon, delta)-DP mechanism by
``FPR + e^eps FNR >= 1 - delta`` and ``FNR + e^eps FPR >= 1 - delta``, so
``eps >= log((1 - delta - FNR) / FPR)`` and ``log((1 - delta - FPR) / FNR)``. With the
rates replaced by their Clopper-Pearson upper bounds (:func:`clopper_pearson`) the bound
holds with the interval's confidence. Such a lower bound below the claimed epsilon is
consistent with the claim but never proves it (a stronger attack may exist); one above it
refutes the claim.

Pure numpy (and scipy); the runners are ``bench/privacy_audit.py`` and ``bench/dp_audit.py``.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import beta, rankdata


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve of scores (Mann-Whitney U / (n_pos n_neg); ties count 1/2)."""
    pos, neg = np.asarray(pos, dtype=float), np.asarray(neg, dtype=float)
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    ranks = rankdata(np.concatenate([pos, neg]))
    u = ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2
    return float(u / (pos.size * neg.size))


def _item_axis(a: np.ndarray, n_items: int) -> int:
    """The axis of length n_items (last one preferred: V is r x n, statistics n x ...)."""
    axes = [k for k, s in enumerate(a.shape) if s == n_items]
    if not axes:
        raise ValueError(f"no axis of length {n_items} in an array of shape {a.shape}")
    return axes[-1]


def _departures(arrays: dict[str, np.ndarray], reference: np.ndarray | None
                ) -> list[np.ndarray]:
    """The arrays, the first one shaped like the broadcast minus the broadcast (W_i - V:
    the local copy of V; later arrays of that shape, e.g. ADMM's dual Y_i, are kept)."""
    out, done = [], False
    for a in arrays.values():
        if not done and reference is not None and a.shape == reference.shape:
            out.append(a - reference)
            done = True
        else:
            out.append(a)
    return out


def item_features(arrays: dict[str, np.ndarray], reference: np.ndarray | None,
                  n_items: int) -> np.ndarray:
    """Per item j, the upload's column j (the local copy of V minus the broadcast), plus
    the broadcast column j: an (n_items, f) matrix."""
    cols = [np.moveaxis(x, _item_axis(x, n_items), 0).reshape(n_items, -1)
            for x in _departures(arrays, reference)]
    if reference is not None:
        cols.append(np.moveaxis(reference, _item_axis(reference, n_items), 0)
                    .reshape(n_items, -1))
    return np.concatenate(cols, axis=1)


def item_membership_scores(arrays: dict[str, np.ndarray], reference: np.ndarray | None,
                           n_items: int) -> np.ndarray:
    """Per item, the norm of the upload's departure from the broadcast (see module)."""
    feats = [np.moveaxis(x, _item_axis(x, n_items), 0).reshape(n_items, -1)
             for x in _departures(arrays, reference)]
    return np.linalg.norm(np.concatenate(feats, axis=1), axis=1)


def ridge_fit(x: np.ndarray, y: np.ndarray, lam: float = 1e-3) -> np.ndarray:
    """Ridge regression weights (with intercept) on standardised features."""
    mu, sd = x.mean(0), x.std(0) + 1e-12
    z = np.hstack([(x - mu) / sd, np.ones((x.shape[0], 1))])
    w = np.linalg.solve(z.T @ z + lam * x.shape[0] * np.eye(z.shape[1]), z.T @ y)
    return np.concatenate([w[:-1] / sd, [w[-1] - (w[:-1] / sd) @ mu]])


def ridge_predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return x @ w[:-1] + w[-1]


def fedmgs_single_rater(gram: np.ndarray, cross: np.ndarray, tol: float = 1e-9,
                        assume_single: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Centred ratings, up to one sign per tenant, of items rated by one user: G_j = u u^T + c I.

    G_j gives u only up to its sign, and m_j - mu = u^T b_j / ||u||^2 flips with it; the sign
    is the same for all items of a tenant, see :func:`resolve_sign`.

    A ridge folded into the statistics (FedMGS ``reg="per_rating"`` adds gamma n_j I) shows
    as r - 1 equal eigenvalues c; removing c leaves u u^T, so the test is "all eigenvalues
    but the largest are equal".

    Parameters
    ----------
    gram : (n, r, r) per-item G_j;  cross : (n, r) per-item b_j.
    assume_single : apply the formula to every item with top eigenvalue > tol, without the
        rank test (what an attacker does on noisy statistics, which are never rank one).

    Returns
    -------
    items : indices j whose G_j has rank one;  values : +-(m_j - mu) for those items.
    """
    eig, vec = np.linalg.eigh(gram)                       # ascending eigenvalues
    top = eig[:, -1] - eig[:, 0]                          # ||u||^2 once c I is removed
    flat = eig[:, -2] - eig[:, 0] <= tol * np.maximum(top, 1.0)
    items = np.flatnonzero((top > tol) & (assume_single | flat))
    u = vec[items, :, -1] * np.sqrt(top[items])[:, None]
    vals = np.einsum("ij,ij->i", u, cross[items]) / np.einsum("ij,ij->i", u, u)
    return items, vals


def fix_offset(centred: np.ndarray, scale: tuple[float, float],
               prior_mean: float | None = None) -> np.ndarray:
    """Undo an unknown offset mu given integer ratings in ``scale``.

    The fractional part of mu makes every centred value + mu an integer; the integer part is
    a shift that keeps all values inside the scale; when several do, the one whose mean is
    closest to ``prior_mean`` (public knowledge such as the catalogue's average rating;
    default the middle of the scale).
    """
    if centred.size == 0:
        return centred
    prior = float(np.mean(scale)) if prior_mean is None else prior_mean
    frac = np.angle(np.exp(-2j * np.pi * centred).mean()) / (2 * np.pi)  # circular mean
    base = centred + frac
    lo, hi = np.ceil(scale[0] - base.min() - 1e-6), np.floor(scale[1] - base.max() + 1e-6)
    shift = np.round(prior - base.mean())
    return base + (np.clip(shift, lo, hi) if hi >= lo else shift)


def resolve_sign(signed: np.ndarray, scale: tuple[float, float], histogram: np.ndarray,
                 prior_mean: float | None = None) -> np.ndarray:
    """Ratings from centred values known up to sign: the sign whose ratings (after
    :func:`fix_offset`) are more likely under ``histogram`` (counts of each integer rating
    from scale[0] up, e.g. the public rating distribution)."""
    p = np.asarray(histogram, dtype=float) + 1.0
    logp = np.log(p / p.sum())
    best, best_ll = signed, -np.inf
    for s in (1.0, -1.0):
        r = fix_offset(s * signed, scale, prior_mean)
        k = np.rint(r - scale[0]).astype(int)
        ll = logp[k].sum() if k.size and k.min() >= 0 and k.max() < p.size else -np.inf
        if ll > best_ll or best_ll == -np.inf and s == 1.0:
            best, best_ll = r, ll
    return best


def clopper_pearson(k: np.ndarray | int, n: int, alpha: float = 0.05
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Clopper-Pearson interval, confidence 1 - alpha, of a binomial rate from
    ``k`` successes out of ``n`` (exact: beta quantiles; 0 and 1 at the ends)."""
    k = np.asarray(k, dtype=float)
    if n < 1 or np.any((k < 0) | (k > n)):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        hi = np.where(k < n, beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return lo, hi


def epsilon_from_rates(fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
    """max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR), 0), elementwise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0) / fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0) / fnr)
    return np.maximum(np.nan_to_num(np.maximum(a, b), nan=0.0, neginf=0.0), 0.0)


def epsilon_lower_bound(scores_in: np.ndarray, scores_out: np.ndarray, delta: float,
                        alpha: float = 0.05) -> dict:
    """Empirical epsilon lower bound of the test "score >= t means the canary was in".

    For every threshold t among the observed scores: FPR = share of "out" runs with score
    >= t, FNR = share of "in" runs below t, each replaced by its Clopper-Pearson upper
    bound (confidence 1 - alpha); the bound is the best threshold's
    :func:`epsilon_from_rates` (module docstring). The direction (higher = in) must be
    fixed before looking at the scores. The threshold is chosen on the same runs, as in
    the papers above, so the stated confidence is per threshold (no multiple-testing
    correction).

    Returns the bound, its threshold, the raw and upper-bounded rates, the run counts and
    ``max_measurable``: the bound a perfect attack would get with these run counts.
    """
    pos, neg = np.asarray(scores_in, dtype=float), np.asarray(scores_out, dtype=float)
    if pos.size == 0 or neg.size == 0:
        raise ValueError("need at least one run with and one without the canary")
    t = np.unique(np.concatenate([pos, neg]))
    fp = (neg[None, :] >= t[:, None]).sum(axis=1)
    fn = (pos[None, :] < t[:, None]).sum(axis=1)
    fpr_hi = clopper_pearson(fp, neg.size, alpha)[1]
    fnr_hi = clopper_pearson(fn, pos.size, alpha)[1]
    eps = epsilon_from_rates(fpr_hi, fnr_hi, delta)
    best = int(np.argmax(eps))
    return {"epsilon_lower_bound": float(eps[best]), "threshold": float(t[best]),
            "fpr": float(fp[best] / neg.size), "fnr": float(fn[best] / pos.size),
            "fpr_upper": float(fpr_hi[best]), "fnr_upper": float(fnr_hi[best]),
            "runs_in": int(pos.size), "runs_out": int(neg.size), "alpha": alpha,
            "delta": delta, "max_measurable": max_measurable_epsilon(
                pos.size, neg.size, delta, alpha)}


def max_measurable_epsilon(n_in: int, n_out: int, delta: float, alpha: float = 0.05
                           ) -> float:
    """The lower bound of a perfect attack (no error at all) with these run counts: no
    audit with so few runs can show more."""
    return float(epsilon_from_rates(clopper_pearson(0, n_out, alpha)[1],
                                     clopper_pearson(0, n_in, alpha)[1], delta))
