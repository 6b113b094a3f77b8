r"""Centralised matrix factorisation with a global mean and user / item biases, by ALS.

The reference every federated number is compared with: one party holds all ratings and
fits

.. math::
    \hat r_{ui} = \mu + b_u + c_i + p_u^T q_i

by alternating ridge regressions (ALS with weighted-lambda regularisation, Zhou et al.,
*Large-scale parallel collaborative filtering for the Netflix prize*, 2008), minimising

.. math::
    \tfrac12 \sum_{(u,i)\in\Omega} (r_{ui} - \hat r_{ui})^2
    + \tfrac\lambda2 \Big(\sum_u n_u \|p_u\|^2 + \sum_i n_i \|q_i\|^2\Big)
    + \tfrac{\lambda_b}2 \Big(\sum_u b_u^2 + \sum_i c_i^2\Big),

with n_u, n_i the training ratings of user u / item i and mu the training mean (fixed).
With the items fixed, each user's (p_u, b_u) is the solution of a (k+1)-dimensional ridge
problem on the design rows (q_i, 1) of the items it rated (:func:`half_step`); the items
step is the same with the roles swapped. Every step is an exact block minimisation, so the
objective never increases and the fit is deterministic given the initial item factors.
Not federated: used by ``bench/centralised.py`` as the ceiling the federated runs approach.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

_CHUNK_ELEMENTS = 8_000_000  # ratings x q^2 per chunk of outer products (~64 MB)


@dataclasses.dataclass(frozen=True)
class MFModel:
    """A fitted model: mean, user factors P (m x k), item factors Q (n x k), biases."""

    mean: float
    P: np.ndarray
    Q: np.ndarray
    user_bias: np.ndarray
    item_bias: np.ndarray

    def predict(self, users: np.ndarray, items: np.ndarray,
                scale: tuple[float, float] | None = None) -> np.ndarray:
        """mu + b_u + c_i + p_u . q_i for each (user, item) pair, clipped to ``scale``."""
        pred = (self.mean + self.user_bias[users] + self.item_bias[items]
                + np.einsum("tk,tk->t", self.P[users], self.Q[items]))
        return pred if scale is None else np.clip(pred, *scale)


def gram_sums(rows: np.ndarray, design: np.ndarray, n_rows: int) -> np.ndarray:
    """sum_{t: rows[t] = u} z_t z_t^T for every u, (n_rows, q, q), in bounded-memory chunks.

    Parameters
    ----------
    rows : int array (nnz,)
        The row (user or item) each observed rating belongs to.
    design : float array (nnz, q)
        The design row z_t of each rating.
    n_rows : int
        Number of rows u.
    """
    nnz, q = design.shape
    out = np.zeros((n_rows, q * q))
    step = max(1, _CHUNK_ELEMENTS // (q * q))
    for start in range(0, nnz, step):
        z = design[start:start + step]
        r = rows[start:start + step]
        outer = (z[:, :, None] * z[:, None, :]).reshape(len(r), q * q)
        indicator = sp.csr_matrix((np.ones(len(r)), (r, np.arange(len(r)))),
                                  shape=(n_rows, len(r)))
        out += indicator @ outer
    return out.reshape(n_rows, q, q)


def half_step(rows: np.ndarray, cols: np.ndarray, target: np.ndarray, other: np.ndarray,
              n_rows: int, lam: float, lam_bias: float, lam_fixed: float = 0.0,
              bias_rating: float = 0.0) -> np.ndarray:
    """One ALS half-step: for every row u, argmin over x = (p_u, b_u) of

    ``1/2 sum_{t: rows[t]=u} (target_t - z_t^T x)^2 + lam n_u/2 ||p_u||^2 + lam_bias/2 b_u^2``

    with design z_t = (other[cols[t]], 1), i.e. the ridge normal equations
    ``(Z_u^T Z_u + diag(lam n_u, ..., lam n_u, lam_bias)) x = Z_u^T y_u``, solved batched.
    ``lam_fixed`` adds a fixed weight to the factors' (``lam n_u + lam_fixed``) and
    ``bias_rating`` a weight per rating to the bias's (``lam_bias + bias_rating n_u``):
    the ridge family of FedMC-ADMM, whose lambda + lam_rating n_u applies to a user's
    factors and bias alike.

    Parameters
    ----------
    rows, cols : int arrays (nnz,)
        Index of the side being solved and of the fixed side for each rating.
    target : float array (nnz,)
        What z^T x must fit: the rating minus the mean and the fixed side's bias.
    other : float array (n_other, k)
        The fixed side's factors.
    n_rows : int
        Number of rows being solved (rows without ratings get x = 0).
    lam, lam_bias : float
        Ridge weights (factor weight scaled by the row's rating count n_u).
    lam_fixed, bias_rating : float
        A fixed weight on the factors, a weight per rating on the bias (default 0: ALS-WR).

    Returns
    -------
    (n_rows, k + 1) array: the factors in the first k columns, the bias in the last.
    """
    k = other.shape[1]
    design = np.empty((rows.shape[0], k + 1))
    design[:, :k] = other[cols]
    design[:, k] = 1.0
    gram = gram_sums(rows, design, n_rows)
    rhs = np.zeros((n_rows, k + 1))
    for a in range(k + 1):
        rhs[:, a] = np.bincount(rows, weights=design[:, a] * target, minlength=n_rows)
    counts = np.bincount(rows, minlength=n_rows).astype(float)
    diag = np.empty((n_rows, k + 1))
    diag[:, :k] = (lam * np.maximum(counts, 1.0) + lam_fixed)[:, None]
    diag[:, k] = np.maximum(lam_bias + bias_rating * counts, 1e-12)
    gram[:, np.arange(k + 1), np.arange(k + 1)] += diag
    x = np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]
    x[counts == 0] = 0.0
    return x


def objective(model: MFModel, users: np.ndarray, items: np.ndarray, values: np.ndarray,
              lam: float, lam_bias: float) -> float:
    """The penalised least-squares objective of the module docstring on the given ratings."""
    e = values - model.predict(users, items)
    n_u = np.bincount(users, minlength=model.P.shape[0])
    n_i = np.bincount(items, minlength=model.Q.shape[0])
    ridge = lam * (n_u @ np.sum(model.P**2, axis=1) + n_i @ np.sum(model.Q**2, axis=1))
    ridge_b = lam_bias * (model.user_bias @ model.user_bias + model.item_bias @ model.item_bias)
    return float(0.5 * (e @ e + ridge + ridge_b))


def fit_als(users: np.ndarray, items: np.ndarray, values: np.ndarray, n_users: int,
            n_items: int, *, rank: int, lam: float, lam_bias: float, iterations: int,
            rng: np.random.Generator, init_scale: float = 0.1,
            ridges: tuple[tuple[float, float, float, float],
                          tuple[float, float, float, float]] | None = None) -> MFModel:
    """Fit mu + b_u + c_i + p_u^T q_i by ``iterations`` ALS sweeps (users, then items).

    Parameters
    ----------
    users, items : int arrays (nnz,)
        Indices of the training ratings (0..n_users-1, 0..n_items-1).
    values : float array (nnz,)
        The training ratings.
    n_users, n_items : int
        Matrix shape (users / items without ratings predict mu + 0).
    rank : int
        k, the number of latent factors (>= 1).
    lam, lam_bias : float
        Weighted-lambda ridge on the factors and plain ridge on the biases (>= 0).
    iterations : int
        Number of sweeps (>= 1).
    rng : numpy.random.Generator
        Draws the initial item factors, Normal(0, init_scale^2); nothing else is random.
    init_scale : float
        Standard deviation of the initial item factors.
    ridges : ((lam, lam_bias, lam_fixed, bias_rating) of the users, the same of the items)
        Each side's weights for :func:`half_step`, replacing ``lam`` and ``lam_bias`` (whose
        objective, :func:`objective`, is the one of ALS-WR only).
    """
    if rank < 1 or iterations < 1:
        raise ValueError("rank and iterations must be at least 1")
    if lam < 0 or lam_bias < 0:
        raise ValueError("lam and lam_bias must be non-negative")
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    q = rng.normal(0.0, init_scale, size=(n_items, rank))
    c = np.zeros(n_items)
    p, b = np.zeros((n_users, rank)), np.zeros(n_users)
    user_w, item_w = ridges or ((lam, lam_bias, 0.0, 0.0),) * 2
    if min(*user_w, *item_w) < 0:
        raise ValueError("ridge weights must be non-negative")
    for _ in range(iterations):
        x = half_step(users, items, values - mean - c[items], q, n_users, *user_w)
        p, b = x[:, :rank], x[:, rank]
        x = half_step(items, users, values - mean - b[users], p, n_items, *item_w)
        q, c = x[:, :rank], x[:, rank]
    return MFModel(mean, p, q, b, c)


def rmse(model: MFModel, users: np.ndarray, items: np.ndarray, values: np.ndarray,
         scale: tuple[float, float] | None = None) -> tuple[float, float]:
    """(RMSE, MAE) of the model's predictions (clipped to ``scale``) on the given ratings."""
    err = model.predict(users, items, scale) - values
    return float(np.sqrt(err @ err / len(err))), float(np.abs(err).mean())


def fit_ials(users: np.ndarray, items: np.ndarray, weights: np.ndarray, n_users: int,
             n_items: int, v0: np.ndarray, *, sweeps: int, unobserved_weight: float,
             lam: float, ridge_power: float = 1.0, bias_coordinate: float = 1.0
             ) -> tuple[np.ndarray, np.ndarray]:
    r"""Centralised implicit ALS (Hu, Koren, Volinsky, ICDM 2008; Rendle et al., *Revisiting
    the Performance of iALS on Item Recommendation Benchmarks*, RecSys 2022): the reference
    the federated ``ials`` equals without noise.

    Minimises ``sum_{(u,j) observed} w_uj (1 - x_u.v_j)^2 + w0 sum_{all (u,j)} (x_u.v_j)^2
    + ridge`` with ``x_u = [u_u, c]`` (c fixed), the frequency-scaled ridge
    ``lam (f + w0 N)^nu`` (f: the row's summed weights, N: the other side's size), by
    alternating exact solves, one user / item at a time, starting from ``v0`` (d x n).

    Returns
    -------
    (X, V): X (n_users x d) the rows ``[u_u, c]``, V (d x n_items).
    """
    d, c, w0 = v0.shape[0], bias_coordinate, unobserved_weight
    by_user = sp.csr_array((weights, (users, items)), shape=(n_users, n_items))
    by_item = by_user.T.tocsr()
    v = v0.copy()
    x = np.zeros((n_users, d))
    x[:, -1] = c
    for _ in range(sweeps):
        x[:, :-1] = _ials_rows(by_user, v.T, x_fixed=c, w0=w0, lam=lam, nu=ridge_power)
        v = _ials_rows(by_item, x, x_fixed=None, w0=w0, lam=lam, nu=ridge_power).T
    x[:, :-1] = _ials_rows(by_user, v.T, x_fixed=c, w0=w0, lam=lam, nu=ridge_power)
    return x, v


def _ials_rows(mat: sp.csr_array, other: np.ndarray, *, x_fixed: float | None, w0: float,
               lam: float, nu: float) -> np.ndarray:
    """Each row's exact weighted ridge solution against ``other`` (its design rows): all
    coordinates free (``x_fixed`` None, the items), or the last one fixed at ``x_fixed``
    (the users: it multiplies the item bias, the last coordinate of ``other``)."""
    gram_all = other.T @ other
    n_other = other.shape[0]
    free = slice(None) if x_fixed is None else slice(0, other.shape[1] - 1)
    q = other[:, free].shape[1]
    out = np.zeros((mat.shape[0], q))
    for i in range(mat.shape[0]):
        idx = mat.indices[mat.indptr[i]:mat.indptr[i + 1]]
        w = mat.data[mat.indptr[i]:mat.indptr[i + 1]]
        y = other[idx]
        g = w0 * gram_all + (y * w[:, None]).T @ y
        t = w @ y  # sum w y: the target 1 of every observed entry
        if x_fixed is not None:  # move the fixed coordinate's part to the right-hand side
            t = t[free] - x_fixed * g[free, -1]
            g = g[free, free]
        g = g + lam * (w.sum() + w0 * n_other) ** nu * np.eye(q)
        out[i] = np.linalg.solve(g, t)
    return out
