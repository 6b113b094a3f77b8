r"""DPALS: federated alternating least squares whose releases are bounded per user.

Chien, Jain, Krichene, Rendle, Song, Thakurta and Zhang, *Private Alternating Least
Squares: Practical Private Matrix Completion with Tighter Rates* (ICML 2021), in the
billboard (joint DP) model: each user's factor stays with the tenant that holds the user's
ratings; only item-side sums built from per-user-bounded terms leave the tenant.

Prediction of user u, item j: ``x_u . w_j + b_u + mu`` with

* ``x_u = [clip(u_u, Gamma_u), c]`` (rank + 1): the user factor clipped to norm
  ``user_factor_clip`` and a constant coordinate ``c = bias_coordinate`` whose partner in
  ``w_j`` is item j's bias;
* ``w_j = [v_j, beta_j]``: row j of the released item matrix V (global);
* ``b_u``: a user bias (local, never released), ``mu``: the centre, with
  ``release_centre`` (default) the mean over users of their mean rating, estimated from a
  small share of every release (:mod:`algorithms._centre`), else a public value
  (``public_centre``, default the middle of the public rating scale).

One sweep = one round. Each tenant (client step), given V:

1. solves every user's row exactly (ridge, batched d x d solves over the users):
   ``[u_u, b_u] = argmin sum_{j in Omega_u} (r_uj - mu - c beta_j - u.v_j - b)^2 + lam_u ||.||^2``
   over *all* the user's ratings (this never leaves the tenant), with ridge
   ``lam_u + lam_u_count * n_u`` (weighted-lambda ALS) on the factor and ``lam_bias +
   lam_u_count * n_u`` on the bias;
2. bounds the user: ``x_u`` as above (``||x_u||^2 <= Gamma_u^2 + c^2``), at most
   ``k = max_ratings_per_user`` ratings (a random subset drawn once, from the tenant's
   secret per-user draws when privacy is on, :mod:`privacy.randomness`), centred ratings
   ``s_uj = clip(r_uj - mu - b_u, +-rating_clip)``, and weights ``w_uj`` with
   ``sum_j w_uj^2 <= k`` (:func:`rating_weights`: a user with fewer than k ratings spends
   the whole budget, each weight at most ``max_weight``; optionally tilted toward rare
   items);
3. uploads, per item j over the kept ratings, ``A_j = sum_u w_uj x_u x_u^T`` and
   ``b_j = sum_u w_uj s_uj x_u``. The last diagonal entry of A_j is c^2 times the item's
   (weighted) count: the count is released inside A_j and covered by the same bound.

The server sums the uploads (noise is added by the privacy layer, :mod:`privacy.user_level`,
once to the sum or by each tenant, and the noise standard deviations travel as scalar fields
of the upload), estimates each item's count from the traces (:func:`count_estimate`),
shrinks each A_j toward count_j times the average ``x x^T`` (``gram_shrink``), projects it
onto the PSD cone (eigenvalues clipped at 0) and solves ``w_j = (A_j + lam_eff I)^{-1} b_j``
with ``lam_eff = lam_v + noise_reg * 2 sigma_A sqrt(d) + lam_v_count * count_j``
(``2 sigma sqrt(d)`` is the spectral norm of a d x d symmetric Gaussian noise matrix, so
the regulariser grows with the noise: a prior at 0 whose strength is tied to the noise).
All of this is post-processing of the released sums.

After ``sweeps`` sweeps the clients stop uploading; a further round only re-solves every
user against the final V (``run_defaults['rounds'] = sweeps + 1``), so the served U matches
the served V. Each sweep is one release per user; :func:`user_bounds` declares what the
privacy layer needs to calibrate it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from pydantic import Field, model_validator

from algorithms import _centre
from algorithms import _user_kernels as UK
from algorithms import config_fields as CF
from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.messages import Message
from algorithms.pool import map_tasks, sum_arrays, width
from algorithms.rng import UserDraws
from algorithms.scale import normalised, rating_factors
from algorithms.user_bounds import UserBounds


class DPALSConfig(CF.CentredScale, AlgorithmConfig):
    """Settings of DPALS (defaults: the setting tuned on a validation carve-out, see
    docs/benchmarks/dp_utility.md)."""

    rank: CF.BiasRank = 4
    sweeps: int = Field(4, description="ALS sweeps, i.e. releases of V per user")
    max_ratings_per_user: int = Field(
        1000, description="k, ratings of a user that enter the released sums (random subset)")
    user_factor_clip: float = Field(1.0, description="Gamma_u, norm bound of a user factor")
    bias_coordinate: float = Field(0.2, description="c, constant user coordinate paired "
                                   "with the item bias (its square counts the ratings)")
    rating_clip: float | None = Field(
        1.0, description="Gamma_r, bound of centred ratings in the released sums "
        "(None: half the width of the public rating scale)")
    scale_min: CF.ScaleMin
    scale_max: CF.ScaleMax
    public_centre: CF.PublicCentre
    release_centre: CF.ReleaseCentre
    centre_share: CF.CentreShare
    normalise: CF.Normalise
    lam_u: CF.LamU
    factor_min_ratings: CF.FactorMinRatings
    lam_bias: CF.LamBias
    lam_v: float = Field(1.0, description="ridge weight of the item solve (prior at 0)")
    lam_u_count: float = Field(
        0.0, description="extra user ridge per rating of the user (weighted-lambda ALS)")
    lam_v_count: float = Field(
        0.1, description="extra item ridge per rater of the item, estimated from the "
        "released (noisy) count in A (post-processing, no extra release)")
    gram_shrink: float = Field(
        1.0, description="alpha in [0, 1]: each item's A_j is shrunk toward count_j times "
        "the average x x^T over all items (post-processing; 0: off)")
    noise_reg: CF.NoiseRidge
    max_weight: float = Field(
        10.0, description="largest weight of one rating: a user with fewer than k kept "
        "ratings spends its whole budget sum_j w_uj^2 <= k with weights up to this (1: off)")
    rare_item_power: float = Field(
        0.0, description="eta: weights proportional to count_j^-eta (counts estimated from "
        "the previous release, post-processing), normalised to the user's budget k")
    user_sample_rate: float = Field(
        1.0, description="q, probability that a user enters a sweep's sums (Poisson, drawn "
        "inside the tenant; q < 1 amplifies privacy)")
    user_bias: CF.UserBias
    init_scale: CF.InitScaleV

    @model_validator(mode="after")
    def _check(self) -> DPALSConfig:
        if self.rank < 1:
            raise ValueError("rank must be at least 1")
        if self.sweeps < 1:
            raise ValueError("sweeps must be at least 1")
        if self.max_ratings_per_user < 1:
            raise ValueError("max_ratings_per_user must be at least 1")
        for name in ("user_factor_clip", "bias_coordinate", "init_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.rating_clip is not None and not self.rating_clip > 0:
            raise ValueError("rating_clip must be positive")
        self.check_centred_scale()
        if not 0 <= self.gram_shrink <= 1:
            raise ValueError("gram_shrink must be in [0, 1]")
        if not self.max_weight >= 1:
            raise ValueError("max_weight must be at least 1")
        if self.rare_item_power < 0:
            raise ValueError("rare_item_power must be non-negative")
        if not 0 < self.user_sample_rate <= 1:
            raise ValueError("user_sample_rate must be in (0, 1]")
        if min(self.lam_u, self.lam_v, self.noise_reg, self.lam_u_count,
               self.lam_v_count, self.lam_bias or 0.0) < 0:
            raise ValueError("lam_u, lam_v, lam_u_count, lam_v_count and noise_reg must be "
                             "non-negative")
        if self.lam_v == 0 and self.noise_reg == 0:
            raise ValueError("lam_v or noise_reg must be positive (the item solve needs a "
                             "ridge for items nobody rated)")
        return self

    @property
    def d(self) -> int:
        """Length of x_u and w_j: r factors + the bias coordinate."""
        return self.rank + 1

    @property
    def r_clip(self) -> float:
        """Gamma_r in units: ``rating_clip``, else half the scale's width."""
        return ((self.scale_max - self.scale_min) / 2 / self.unit if self.rating_clip is None
                else self.rating_clip)

    @property
    def x_norm(self) -> float:
        """Gamma_x: bound of ||x_u|| (clipped factor and constant coordinate)."""
        return float(np.hypot(self.user_factor_clip, self.bias_coordinate))


def user_bounds(cfg: DPALSConfig) -> UserBounds:
    """The per-user bounds of a DPALS upload under ``cfg`` (with the centre sums ``m``
    when the centre is released)."""
    bounds = UserBounds(cfg.max_ratings_per_user, cfg.x_norm, cfg.r_clip, ("A",), ("b",),
                        {"A": "gram_noise", "b": "rhs_noise"}, cfg.user_sample_rate,
                        count_coordinate=cfg.bias_coordinate)
    if _centre.released(cfg):
        bounds = bounds.with_centre(("m",), {"m": "centre_noise"}, cfg.centre_share)
    return bounds


@dataclasses.dataclass(frozen=True)
class GlobalModel(Message):
    """V (d x n: rank factor rows and the item-bias row), the sweeps released so far,
    each item's (weighted) rater count estimated from the last release (zeros before) and
    the released centre in units (None: the config's public one)."""

    V: np.ndarray
    sweep: int
    counts: np.ndarray
    centre: float | None = None


@dataclasses.dataclass(frozen=True)
class ServerState(Message):
    """The server keeps only the current V and counts (every sweep is solved from fresh
    sums) and the running centre sums (:func:`algorithms._centre.update`)."""

    V: np.ndarray
    sweep: int
    counts: np.ndarray
    centre_sums: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class LocalState(Message):
    """Tenant i's private state: ``U`` (m_i x r+1: factors and user bias), ``keep`` (the
    indices, into the block's entries, of the ratings that enter the released sums) and
    ``kept_of`` (the number of entries of the block ``keep`` was drawn on; -1 in states
    stored before the field existed); ``mu`` is in units of ``scale_unit``, which maps
    predictions back to the tenant's scale (1 in states stored before it)."""

    user_rows: ClassVar[tuple[str, ...]] = ("U",)

    U: np.ndarray
    keep: np.ndarray
    rank: int
    mu: float
    bias_coordinate: float
    kept_of: int = -1
    scale_unit: float = 1.0


@dataclasses.dataclass(frozen=True)
class Upload(Message):
    """Per-item sums over this tenant's users: ``A`` (n x d x d), ``b`` (n x d); the
    centre sums ``m`` (2,) with ``release_centre``; and the standard deviation of the
    noise already in them (0 before the privacy layer)."""

    A: np.ndarray
    b: np.ndarray
    gram_noise: float = 0.0
    rhs_noise: float = 0.0
    m: np.ndarray | None = None
    centre_noise: float = 0.0


def init_server(n_items: int, n_clients: int, cfg: DPALSConfig,
                rng: np.random.Generator) -> tuple[ServerState, GlobalModel]:
    """V^0: Normal(0, init_scale^2) factor rows, zero item biases (data-independent)."""
    v = np.zeros((cfg.d, n_items))
    v[: cfg.rank] = rng.normal(0.0, cfg.init_scale, size=(cfg.rank, n_items))
    zeros = np.zeros(n_items)
    return (ServerState(V=v, sweep=0, counts=zeros),
            GlobalModel(V=v.copy(), sweep=0, counts=zeros.copy()))


def cap_per_user(rows: np.ndarray, n_users: int, k: int, rng: np.random.Generator,
                 cols: np.ndarray | None = None, draws: UserDraws | None = None
                 ) -> np.ndarray:
    """Sorted indices of at most ``k`` entries per row, uniformly at random within a row.

    With ``draws`` (the tenant's secret per-user draws, :class:`algorithms.rng.
    UserDraws`, and ``cols``) a user's kept ratings depend only on that user's own
    ratings and the secret, not on the other users; else on ``rng``."""
    counts = np.bincount(rows, minlength=n_users)
    if draws is None:
        keys = rng.random(rows.shape[0])
    else:
        keys = draws.rating_uniforms("cap", rows, cols, np.flatnonzero(counts > k))
    order = np.lexsort((keys, rows))  # by row, random within a row
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    position = np.arange(rows.shape[0]) - np.repeat(starts, counts)
    return np.sort(order[position < k]).astype(np.int64)


def init_client(block: RatingBlock, global_msg: GlobalModel, cfg: DPALSConfig,
                rng: np.random.Generator) -> LocalState:
    """U^0 = 0 (solved in the first step) and the capped subset of the block's ratings."""
    keep = capped(block, cfg, rng)
    return LocalState(U=np.zeros((block.n_users, cfg.rank + 1)), keep=keep, rank=cfg.rank,
                      mu=cfg.mu, bias_coordinate=cfg.bias_coordinate, kept_of=block.nnz,
                      scale_unit=cfg.unit)


def kept_entries(state: LocalState, block: RatingBlock, cfg: DPALSConfig,
                 rng: np.random.Generator) -> np.ndarray:
    """The capped subset of ``block``'s entries for this sweep: ``state.keep`` when it was
    drawn on this block, else (the block lost entries since, e.g. a forgotten user's) a
    fresh draw from ``rng``. Either way at most ``max_ratings_per_user`` per user: the
    bound the privacy layer calibrates on never rests on indices into another block."""
    keep = state.keep
    if state.kept_of >= 0:
        stale = state.kept_of != block.nnz
    else:  # a state stored before ``kept_of``: check the indices and the cap themselves
        stale = bool(keep.size) and (keep[-1] >= block.nnz or np.bincount(
            block.rows[keep], minlength=block.n_users).max() > cfg.max_ratings_per_user)
    if stale:
        keep = capped(block, cfg, rng)
    return keep


def capped(block: RatingBlock, cfg, rng: np.random.Generator) -> np.ndarray:
    """:func:`cap_per_user` of ``block`` at ``cfg.max_ratings_per_user``, from the block's
    secret per-user draws when it has them."""
    return cap_per_user(block.rows, block.n_users, cfg.max_ratings_per_user, rng,
                        block.cols, block.user_draws)


def sample_users(block: RatingBlock, rate: float, release: int, rng: np.random.Generator
                 ) -> np.ndarray:
    """Poisson sampling of release ``release``: each user in independently with
    probability ``rate``, from the block's secret per-user draws when it has them (a
    user's bit does not depend on the other users), else from ``rng``."""
    if rate >= 1:
        return np.ones(block.n_users, dtype=bool)
    if block.user_draws is None:
        return rng.random(block.n_users) < rate
    return block.user_draws.user_uniforms("sample", release, block.n_users) < rate


def _outer_flat(x: np.ndarray) -> np.ndarray:
    """Row-wise outer products, flattened: (rows, d*d)."""
    return np.einsum("ri,rj->rij", x, x).reshape(x.shape[0], -1)


def solve_users(v: np.ndarray, block: RatingBlock, cfg: DPALSConfig) -> np.ndarray:
    """Every user's exact ridge solution ``[u_u, b_u]`` (m x r+1) against V: the fused
    ``nogil`` kernel (:mod:`algorithms._user_kernels`) when numba is installed, else
    :func:`solve_users_numpy` (the same numbers to ~1e-13)."""
    if UK.HAVE_NUMBA:
        u = UK.solve_users(block.rows, block.cols, block.vals, v, block.n_users, cfg.rank,
                           cfg.user_bias, cfg.mu, cfg.bias_coordinate, cfg.lam_u,
                           cfg.lam_u_count, cfg.lam_bias)
    else:
        u = solve_users_numpy(v, block, cfg)
    return bias_only_fallback(u, v, block, cfg)


def bias_only_fallback(u: np.ndarray, v: np.ndarray, block: RatingBlock, cfg
                       ) -> np.ndarray:
    """Users with fewer than ``factor_min_ratings`` ratings get no factor (u_u = 0) and
    their bias alone, solved exactly: ``b_u = sum_j (r_uj - mu - c beta_j) / (n_u +
    lam)`` (lam the bias ridge, :func:`solve_users`'s). A factor fitted to one or two
    ratings is noise on every other item."""
    k = getattr(cfg, "factor_min_ratings", 0)
    if k <= 1:
        return u
    n = np.bincount(block.rows, minlength=block.n_users)
    light = n < k
    if not light.any():
        return u
    r = cfg.rank
    u = u.copy()
    u[light, :r] = 0.0
    if cfg.user_bias:
        target = block.vals - cfg.mu - cfg.bias_coordinate * v[r, block.cols]
        total = np.bincount(block.rows, weights=target, minlength=block.n_users)
        lam = (cfg.lam_u if cfg.lam_bias is None else cfg.lam_bias) + cfg.lam_u_count * n
        u[light, r] = total[light] / (n[light] + lam[light])
    return u


def solve_users_numpy(v: np.ndarray, block: RatingBlock, cfg: DPALSConfig) -> np.ndarray:
    """:func:`solve_users` in numpy and scipy, batched.

    Gram matrices are one sparse product ``S @ outer(Y)`` (S the 0/1 pattern, Y the item
    designs), then one batched ``np.linalg.solve``; no Python loop over users or ratings.
    """
    r = cfg.rank
    y = v[:r].T if not cfg.user_bias else np.hstack([v[:r].T, np.ones((v.shape[1], 1))])
    target = block.vals - cfg.mu - cfg.bias_coordinate * v[r, block.cols]
    shape = block.shape
    pattern = sp.csr_array((np.ones(block.nnz), (block.rows, block.cols)), shape=shape)
    weighted = sp.csr_array((target, (block.rows, block.cols)), shape=shape)
    q = y.shape[1]
    per_rating = cfg.lam_u_count * np.bincount(block.rows, minlength=block.n_users)
    ridge = np.full(q, cfg.lam_u)
    if cfg.user_bias and cfg.lam_bias is not None:
        ridge[r] = cfg.lam_bias
    gram = ((pattern @ _outer_flat(y)).reshape(-1, q, q)
            + (per_rating[:, None] + ridge)[:, :, None] * np.eye(q))
    rhs = weighted @ y
    sol = np.linalg.solve(gram, rhs[..., None])[..., 0]
    u = np.zeros((block.n_users, r + 1))
    u[:, :q] = sol
    return u


def user_vectors(u: np.ndarray, cfg: DPALSConfig) -> np.ndarray:
    """x_u = [clip(u_u, Gamma_u), c] for every user (m x d)."""
    f = u[:, : cfg.rank]
    norms = np.linalg.norm(f, axis=1, keepdims=True)
    f = f * (cfg.user_factor_clip / np.maximum(norms, cfg.user_factor_clip))
    return np.hstack([f, np.full((u.shape[0], 1), cfg.bias_coordinate)])


def rating_weights(rows: np.ndarray, cols: np.ndarray, n_users: int, counts: np.ndarray,
                   cfg: DPALSConfig) -> np.ndarray:
    """w_uj of the kept ratings with sum_j w_uj^2 <= k for every user.

    Base ``count_j^-eta`` (1 without counts or eta = 0), scaled per user to spend the budget
    k exactly, each weight capped at ``max_weight``; the cap only lowers a weight, so the
    budget still holds. With the defaults every weight is 1 (at most k kept ratings).
    """
    k = cfg.max_ratings_per_user
    base = np.ones(rows.shape[0])
    if cfg.rare_item_power > 0 and np.any(counts > 0):
        base = np.maximum(counts[cols], 1.0) ** -cfg.rare_item_power
    spent = np.bincount(rows, weights=base ** 2, minlength=n_users)
    scale = np.sqrt(k / np.maximum(spent, 1e-300))
    return np.minimum(base * scale[rows], cfg.max_weight)


def item_sums(u: np.ndarray, keep: np.ndarray, block: RatingBlock, cfg: DPALSConfig,
              counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(A, b): per item, the weighted sums of x x^T and s x over the kept ratings; the fused
    ``nogil`` kernel when numba is installed, else :func:`item_sums_numpy`."""
    if UK.HAVE_NUMBA:
        return UK.item_sums(block.rows, block.cols, block.vals, keep, u,
                            np.zeros(block.n_items) if counts is None else counts,
                            block.n_users, block.n_items, cfg.rank, cfg.user_bias, cfg.mu,
                            cfg.bias_coordinate, cfg.user_factor_clip, cfg.r_clip,
                            cfg.max_ratings_per_user, cfg.rare_item_power, cfg.max_weight)
    return item_sums_numpy(u, keep, block, cfg, counts)


def item_sums_numpy(u: np.ndarray, keep: np.ndarray, block: RatingBlock, cfg: DPALSConfig,
                    counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`item_sums` in numpy and scipy."""
    x = user_vectors(u, cfg)
    rows, cols = block.rows[keep], block.cols[keep]
    s = np.clip(block.vals[keep] - cfg.mu - (u[rows, cfg.rank] if cfg.user_bias else 0.0),
                -cfg.r_clip, cfg.r_clip)
    w = rating_weights(rows, cols, block.n_users,
                       np.zeros(block.n_items) if counts is None else counts, cfg)
    shape = (block.n_items, block.n_users)
    pattern_t = sp.csr_array((w, (cols, rows)), shape=shape)
    weighted_t = sp.csr_array((w * s, (cols, rows)), shape=shape)
    a = (pattern_t @ _outer_flat(x)).reshape(block.n_items, cfg.d, cfg.d)
    return a, weighted_t @ x


def client_step(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
                cfg: DPALSConfig, rng: np.random.Generator
                ) -> tuple[LocalState, Upload | None]:
    """Solve the users against V (centred on the released centre, once there is one);
    upload the bounded item sums while sweeps remain (over the users drawn at rate
    ``user_sample_rate`` from ``rng``; with the centre sums over the same users when the
    centre is released); ratings in units."""
    block = normalised(block, cfg.unit)
    cfg = _centre.with_centre(cfg, global_msg.centre)
    u = solve_users(global_msg.V, block, cfg)
    if global_msg.sweep >= cfg.sweeps:  # final refresh: U now matches the released V
        return state.replace(U=u, mu=cfg.mu), None
    keep = kept_entries(state, block, cfg, rng)
    new = state.replace(U=u, keep=keep, kept_of=block.nnz, mu=cfg.mu)
    present = np.ones(block.n_users, dtype=bool)
    if cfg.user_sample_rate < 1:  # Poisson sampling of users, unseen outside the tenant
        present = sample_users(block, cfg.user_sample_rate, global_msg.sweep, rng)
        keep = keep[present[block.rows[keep]]]
    a, b = item_sums(u, keep, block, cfg, global_msg.counts)
    m = (_centre.client_sums(block.rows, block.vals, block.n_users, present, cfg)
         if _centre.released(cfg) else None)
    return new, Upload(A=a, b=b, m=m)


def psd_project(a: np.ndarray) -> np.ndarray:
    """Each symmetric block projected onto the PSD cone (negative eigenvalues set to 0)."""
    sym = (a + np.swapaxes(a, -1, -2)) / 2
    w, q = np.linalg.eigh(sym)
    return np.einsum("nij,nj,nkj->nik", q, np.maximum(w, 0.0), q)


def item_ridge(gram_noise: float, cfg: DPALSConfig, counts: np.ndarray | float = 0.0
               ) -> np.ndarray | float:
    """lam_v + noise_reg * 2 sigma_A sqrt(d) + lam_v_count * count (module docstring)."""
    return (cfg.lam_v + cfg.noise_reg * 2.0 * gram_noise * np.sqrt(cfg.d)
            + cfg.lam_v_count * counts)


def count_estimate(a: np.ndarray, cfg: DPALSConfig) -> np.ndarray:
    """Each item's (weighted) rater count from the summed A, post-processing only.

    The bias entry ``A_j[-1, -1] = c^2 count_j`` carries the count but, with a small c, its
    noise is large relative to it; the trace ``tr A_j`` has far less relative noise and is
    proportional to the count on average, so ``count_j ~ tr A_j * (sum A[-1,-1] / c^2) /
    sum tr A``, the ratio taken over all items (where the noise averages out) and clipped
    to its possible range.
    """
    tr = np.trace(a, axis1=1, axis2=2)
    c2 = cfg.bias_coordinate ** 2
    # count / trace = 1 / mean ||x||^2 lies in [1 / G_x^2, 1 / c^2] since c <= ||x|| <= G_x:
    # clip the noisy ratio there (very noisy sums can make either total tiny or negative)
    ratio = float(a[:, -1, -1].sum()) / c2 / max(float(tr.sum()), 1e-300)
    per_trace = min(max(ratio, 1.0 / cfg.x_norm ** 2), 1.0 / c2)
    return np.maximum(tr * per_trace, 0.0)


def shrink_grams(a: np.ndarray, counts: np.ndarray, alpha: float,
                 avg: np.ndarray | None = None) -> np.ndarray:
    """``(1 - alpha) A_j + alpha count_j S`` with ``S = sum_j A_j / sum_j count_j`` the
    average ``x x^T`` over all ratings: a prior shared by the items, whose noise averages
    out over the items, for the per-item Gram matrices drowned in noise. ``avg``: S when
    ``a`` and ``counts`` are a slice of the items (:func:`solve_items`)."""
    if avg is None:
        avg = a.sum(axis=0) / max(float(counts.sum()), 1e-300)
    return (1.0 - alpha) * a + alpha * counts[:, None, None] * avg


def solve_items(a: np.ndarray, b: np.ndarray, gram_noise: float, cfg: DPALSConfig
                ) -> np.ndarray:
    """V (d x n) from the summed (possibly noisy) A and b. Items are solved independently
    (shrinkage, PSD projection, a d x d solve each): in slices of items on the pool's
    threads (:mod:`algorithms.pool`), by the fused ``nogil`` kernel when numba is
    installed (:func:`algorithms._user_kernels.solve_items_into`), else by
    :func:`solve_items_numpy` (each item as in one batch)."""
    counts = count_estimate(a, cfg)
    avg = a.sum(axis=0) / max(float(counts.sum()), 1e-300) if cfg.gram_shrink > 0 else None
    lam = np.broadcast_to(np.asarray(item_ridge(gram_noise, cfg, counts), dtype=float),
                          counts.shape)
    n = a.shape[0]
    out = np.empty((n, cfg.d))

    def part(sl: slice) -> None:
        if UK.HAVE_NUMBA:
            UK.solve_items_into(out, sl.start, sl.stop, a, b, counts, avg, cfg.gram_shrink,
                                lam)
        else:
            out[sl] = _solve_items_numpy(a[sl], b[sl], counts[sl], avg, lam[sl], cfg)

    bounds = np.linspace(0, n, max(1, min(width(), n // 512 + 1)) + 1).astype(int)
    map_tasks(part, [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])
    return out.T


def _solve_items_numpy(a: np.ndarray, b: np.ndarray, counts: np.ndarray,
                       avg: np.ndarray | None, lam: np.ndarray, cfg: DPALSConfig
                       ) -> np.ndarray:
    if avg is not None:
        a = shrink_grams(a, counts, cfg.gram_shrink, avg)
    g = psd_project(a) + lam[:, None, None] * np.eye(cfg.d)
    return np.linalg.solve(g, b[..., None])[..., 0]


def solve_items_numpy(a: np.ndarray, b: np.ndarray, gram_noise: float, cfg: DPALSConfig
                      ) -> np.ndarray:
    """:func:`solve_items` in numpy, in one batch."""
    counts = count_estimate(a, cfg)
    avg = a.sum(axis=0) / max(float(counts.sum()), 1e-300) if cfg.gram_shrink > 0 else None
    lam = np.broadcast_to(np.asarray(item_ridge(gram_noise, cfg, counts), dtype=float),
                          counts.shape)
    return _solve_items_numpy(a, b, counts, avg, lam, cfg).T


def server_step(state: ServerState, uploads: Mapping[int, Upload], cfg: DPALSConfig,
                rng: np.random.Generator) -> tuple[ServerState, GlobalModel]:
    """Sum the uploads (noise std adds in quadrature) and solve V; update the released
    centre; no uploads: keep V."""
    centre = _centre.centre_of(state.centre_sums, cfg)
    if not uploads:
        return state, GlobalModel(V=state.V.copy(), sweep=state.sweep,
                                  counts=state.counts.copy(), centre=centre)
    ups = [uploads[i] for i in sorted(uploads)]
    a = sum_arrays([u.A for u in ups])  # np.sum(..., axis=0)'s numbers, on every core
    b = sum_arrays([u.b for u in ups])
    sigma = float(np.sqrt(sum(u.gram_noise ** 2 for u in ups)))
    v, counts = solve_items(a, b, sigma, cfg), count_estimate(a, cfg)
    sums = state.centre_sums
    if _centre.released(cfg) and all(u.m is not None for u in ups):
        sums = _centre.update(sums, [u.m for u in ups], [u.centre_noise for u in ups])
        centre = _centre.centre_of(sums, cfg)
    return (ServerState(V=v, sweep=state.sweep + 1, counts=counts, centre_sums=sums),
            GlobalModel(V=v.copy(), sweep=state.sweep + 1, counts=counts.copy(),
                        centre=centre))


def factors(global_msg: GlobalModel, state: LocalState) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B = u.v + c beta + b_u + mu (the clip applies only to uploads)."""
    u, v, r = state.U, global_msg.V, state.rank
    m, n = u.shape[0], v.shape[1]
    a = np.hstack([u[:, :r], np.full((m, 1), state.bias_coordinate), u[:, r:r + 1],
                   np.full((m, 1), state.mu)])
    b = np.vstack([v[:r], v[r:r + 1], np.ones((2, n))])
    return rating_factors(a, b, state.scale_unit)


def objective(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
              cfg: DPALSConfig) -> float:
    """Tenant i's share of the ALS objective: 1/2 squared error + 1/2 lam_u ||U||^2."""
    a, b = factors(global_msg, state)
    pred = np.einsum("ij,ji->i", a[block.rows], b[:, block.cols])
    e = block.vals - pred
    return float(0.5 * e @ e + 0.5 * cfg.lam_u * np.sum(state.U ** 2))


ALGORITHM = Algorithm(
    name="dpals", config=DPALSConfig, init_server=init_server, init_client=init_client,
    client_step=client_step, server_step=server_step, factors=factors, objective=objective,
    run_defaults={"clients": 100, "per_round": 0, "rounds": 5})
