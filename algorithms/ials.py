r"""Federated implicit ALS (iALS) for top-k recommendation, and its user-level DP version.

The model learns *which* items a user chose, not the rating values: Hu, Koren and Volinsky,
*Collaborative Filtering for Implicit Feedback Datasets* (ICDM 2008), in the form of
Rendle, Krichene, Zhang and Koren, *Revisiting the Performance of iALS on Item
Recommendation Benchmarks* (RecSys 2022). With ``x_u = [u_u, c]`` (rank + 1: the user
factor and a constant coordinate ``c = bias_coordinate`` whose partner is an item bias) and
``v_j`` (column j of V, rank + 1), the score is ``p_uj = x_u . v_j`` and the loss

.. math::
    \sum_{(u,j)\in\Omega} w_{uj} (1 - p_{uj})^2 + w_0 \sum_{u}\sum_{j} p_{uj}^2
    + \sum_u \lambda_u \|u_u\|^2 + \sum_j \lambda_j \|v_j\|^2

with the confidence ``w_uj = 1 + alpha (r_uj - scale_min) / (scale_max - scale_min)``
(ratings set the confidence, not the target), every item a weak negative of weight
``w0 = unobserved_weight``, and the frequency-scaled ridge of Rendle et al.
``lambda_u = lam (f_u + w0 n_items)^nu``, ``lambda_j = lam (f_j + w0 n_users)^nu`` (f the
sum of the user's / item's confidences, ``nu = ridge_power``).

The Gramian trick (Hu et al.) makes the sum over all items a d x d matrix: the user solve
is ``(sum_{j in Omega_u} w v_j v_j^T + w0 F + lambda_u I) u = sum w (1 - c beta_j) v_j -
w0 c F_beta`` with ``F = V_r V_r^T`` and ``F_beta = V_r beta`` (V_r the factor rows,
beta the bias row), and the item solve is ``(A_j + w0 G + lambda_j I) v_j = b_j`` with
``G = sum_u x_u x_u^T`` over all users and, per item, ``A_j = sum_{u: j in Omega_u} w
x_u x_u^T``, ``b_j = sum w x_u``.

Federated (Ammad-ud-din et al., *Federated Collaborative Filtering for Privacy-Preserving
Personalized Recommendation System*, 2019): user factors never leave the tenant; one sweep
is one round in which each tenant solves its users against V and uploads its A (with G as
an extra row n: a Gram every user adds to once) and b; the server sums them and solves V.
The counts in the ridge come from the sums themselves (``A_j[-1, -1] = c^2 f_j``,
``G[-1, -1] = c^2 n_users``). After ``sweeps`` sweeps the tenants stop uploading and a
last round re-solves every user against the final V (``rounds = sweeps + 1``).

``dp-ials`` is the same algorithm with user-level bounds on what is released, shaped as
DPALS's (:mod:`algorithms.dpals`; Chien et al., *Private Alternating Least Squares*, ICML
2021) so the same privacy layer (:mod:`privacy.user_level`) noises and accounts it:
``x_u`` with its factor clipped to ``user_factor_clip``; the released weights of a user
``w'_uj = w_uj a_j s_u`` with ``a_j = count_j^-eta`` (item counts estimated from the
previous release: weights adapted to item popularity, Krichene et al., *Multi-Task
Differential Privacy Under Distribution Skew*, ICML 2023) and ``s_u`` scaling the user to
``sum_j w'^2 = k`` (``max_ratings_per_user``; each weight at most ``max_weight``); targets
1. One user adds at most ``k + 1`` (k items and the Gramian row) weighted terms to the
grams and k to the right-hand sides (:func:`user_bounds` declares k + 1 for both). The
user solve inside the tenant uses all of the user's ratings with their plain confidences;
only the released sums are bounded. The server's item solve post-processes the noisy sums
(:func:`solve_items`: counts read off b, shrinkage toward the average Gram and PSD
projection as DPALS's, a ridge growing with the noise left unshrunk).

**Popularity prior.** The served score is ``x_u . v_j + beta z_j`` with ``z_j`` the
standardised ``log(1 + n_j)`` of the items' counts (:func:`popularity_row`) and ``beta =
popularity_prior``: a most-popular list is a strong top-k baseline (Cremonesi, Koren and
Turrin, *Performance of Recommender Algorithms on Top-N Recommendation Tasks*, RecSys 2010),
and where the factors carry little (users who rate once or twice, items chosen by
popularity) the iALS scores are nearly flat and the prior orders the list. The prior only
adds a column to the served factors (:func:`factors`): the iALS fit itself is unchanged.
The counts come from an extra array ``pop`` of each upload, one user adding their items'
indicators scaled by ``min(1, sqrt(k_p / n_u))`` (the DP popularity list's term,
:func:`algorithms.popularity.item_counts`, ``k_p = prior_items_per_user``; exact counts
without bounds). Under user-level DP it is declared as a small-norm array of the same
release (:class:`~algorithms.user_bounds.UserBounds` ``centre``, norm ``sqrt(k_p)``, the
share ``prior_share`` of each release's privacy, :func:`privacy.user_level.array_shares`):
noised and charged with the factors' sums, the server averaging the releases by inverse
noise variance. ``beta`` is a fixed public default; where a run has a validation
carve-out and no DP, :func:`choose_prior_weight` picks it from :data:`PRIOR_GRID`
(post-processing of the fitted model, nothing re-fitted). Under user-level DP,
``fedrec simulate --select-prior`` (and the ranking bench's "DP prior choice" rows) can
choose it privately: each tenant scores :data:`DP_PRIOR_GRID` on its carve-out
(:func:`prior_scores`) and :mod:`privacy.selection` releases the sums, charged as the
``selection_share`` of the run's budget, and picks the best. Service jobs do not run this
choice: a DP job keeps the fixed ``beta``.

**Items the count release cannot tell from noise** (opt-in, ``count_gate``). Under DP a
rarely chosen item's column v_j is solved from sums whose signal grows with its count and
whose noise does not, so the noise alone can give it a large score for some users. With ``t = count_gate > 0`` the served factor part of item j is
weighted by ``g_j = n_j / (n_j + t s)`` (:func:`count_weights`), ``n_j`` the prior's
released count (negative read as 0) and ``s`` the standard deviation of that release's
noise (known: the privatizer sets it): an item counted far above the noise keeps nearly
all of its factor score, one within a few ``s`` of zero reaches a list on its factors
only with a score ``(n_j + t s) / n_j`` times the one it must beat. It reads only the
released counts and their noise level, so it is post-processing of the DP releases (no
raw data, no privacy spent); without noise (``ials``, ``s = 0``) every ``g_j`` is 1. It
applies in :func:`factors`, the one scoring path of ranking reports, the DP choice of beta
and served lists. Off by default: where the counts themselves are within the noise for
most items it multiplies good factor scores by noise, and where the count release cannot
tell the items apart no weighting of it keeps rare items out of the lists (the ranking
benchmark's page has the measurements).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, ClassVar

import numpy as np
import scipy.sparse as sp
from pydantic import Field, model_validator

from algorithms import _user_kernels as UK
from algorithms import config_fields as CF
from algorithms import popularity as P
from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.dpals import psd_project, shrink_grams
from algorithms.messages import Message
from algorithms.pool import sum_arrays
from algorithms.ranking import pooled_ndcg, relevance_threshold, tenant_ranking
from algorithms.user_bounds import UserBounds

#: the sweeps and the item-Gram shrinkage of iALS, whose defaults dp-ials replaces
ItemSumSweeps = Annotated[int, Field(description="ALS sweeps, i.e. releases of the item sums")]
GramShrink = Annotated[float, Field(description="alpha in [0, 1]: noisy item Grams shrunk "
                                    "toward count_j times the average x x^T")]

#: default beta of the popularity prior (ials and dp-ials)
DEFAULT_PRIOR = 0.03
#: default share of each dp-ials release spent on the prior's item counts
DEFAULT_PRIOR_SHARE = 0.1
#: the betas a run with a validation carve-out chooses from (:func:`choose_prior_weight`)
PRIOR_GRID = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
#: the betas a user-level DP run chooses from (:func:`prior_scores`, a charged release):
#: fewer than :data:`PRIOR_GRID` (the release's noise grows with sqrt of their number), a
#: decade apart from "no prior" to "the popularity list, factors breaking ties"
DP_PRIOR_GRID = (0.0, 0.03, 0.3, 3.0, 30.0)
#: default share of a user-level job's privacy spent on choosing beta (:func:`prior_scores`)
DEFAULT_SELECTION_SHARE = 0.1
#: default t of the factor weights ``n_j / (n_j + t s)`` of noisy counts (:func:`count_weights`;
#: 0: off)
DEFAULT_COUNT_GATE = 0.0


class IALSConfig(AlgorithmConfig):
    """Settings of federated iALS (defaults: chosen on a validation carve-out of the
    training data, see docs/benchmarks/ranking.md)."""

    rank: CF.BiasRank = 32
    sweeps: ItemSumSweeps = 8
    unobserved_weight: float = Field(
        1.0, description="w0, weight of every (user, item) pair as a negative (Gramian)")
    lam: float = Field(0.001, description="lambda of the frequency-scaled ridge")
    ridge_power: float = Field(1.0, description="nu: ridge lam (f + w0 N)^nu")
    confidence: float = Field(
        3.0, description="alpha: a rating r has confidence 1 + alpha (r - scale_min) / "
        "(scale_max - scale_min)")
    bias_coordinate: float = Field(
        1.0, description="c, constant user coordinate paired with an item bias (its "
        "square times the count sits in each item's Gram)")
    scale_min: CF.ScaleMin
    scale_max: CF.ScaleMax
    init_scale: float = Field(0.1, description="std of the random initial V (public), "
                              "divided by sqrt(rank)")
    user_factor_clip: float | None = Field(
        None, description="Gamma_u, norm bound of a released user factor (None: none)")
    max_ratings_per_user: int | None = Field(
        None, description="k: each user's released weights have sum of squares k "
        "(None: unbounded, the plain confidences)")
    max_weight: float = Field(10.0, description="largest released weight of one rating")
    rare_item_power: float = Field(
        0.0, description="eta: released weights proportional to count_j^-eta (counts from "
        "the previous release)")
    gram_shrink: GramShrink = 0.0
    noise_reg: CF.NoiseRidge
    popularity_prior: float = Field(
        DEFAULT_PRIOR, description="beta: served score x_u . v_j + beta z_j, z_j the "
        "standardised log(1 + count_j) of the released item counts (0: no prior, no count "
        "release)")
    prior_items_per_user: int = Field(
        P.DP_ITEMS_PER_USER, description="k_p: with user-level bounds, a user's items add "
        "to the released counts with total L2 weight sqrt(k_p)")
    prior_share: float = Field(
        DEFAULT_PRIOR_SHARE, description="with user-level bounds: share of each release's "
        "privacy spent on the item counts of the popularity prior")

    count_gate: float = Field(
        DEFAULT_COUNT_GATE, description="t: with noisy released counts (user-level DP), "
        "item j's served factor score is weighted by n_j / (n_j + t s), n_j its released "
        "count, s the count noise's standard deviation (0: no weighting)")
    selection_share: float = Field(
        DEFAULT_SELECTION_SHARE, description="used by fedrec simulate's private choice of "
        "beta (its select-prior option) only; service jobs keep the fixed beta: share of "
        "the run's privacy spent on choosing beta from the prior grid (one charged release "
        "of the candidates' validation NDCG sums)")

    @model_validator(mode="after")
    def _check(self) -> IALSConfig:
        if self.rank < 1 or self.sweeps < 1:
            raise ValueError("rank and sweeps must be at least 1")
        if self.unobserved_weight < 0 or self.lam < 0 or self.confidence < 0:
            raise ValueError("unobserved_weight, lam and confidence must be non-negative")
        if not self.bias_coordinate > 0:
            raise ValueError("bias_coordinate must be positive (the counts are read off it)")
        if not self.scale_max > self.scale_min:
            raise ValueError("scale_max must exceed scale_min")
        if self.user_factor_clip is not None and not self.user_factor_clip > 0:
            raise ValueError("user_factor_clip must be positive")
        if self.max_ratings_per_user is not None and self.max_ratings_per_user < 1:
            raise ValueError("max_ratings_per_user must be at least 1")
        if not 0 <= self.gram_shrink <= 1:
            raise ValueError("gram_shrink must be in [0, 1]")
        if self.max_weight < 1 or self.rare_item_power < 0 or self.noise_reg < 0:
            raise ValueError("max_weight must be >= 1, rare_item_power and noise_reg >= 0")
        if not (np.isfinite(self.popularity_prior) and self.popularity_prior >= 0):
            raise ValueError("popularity_prior must be a finite number >= 0")
        if self.prior_items_per_user < 1:
            raise ValueError("prior_items_per_user must be at least 1")
        if not 0 < self.prior_share < 1:
            raise ValueError("prior_share must be in (0, 1)")
        if not (np.isfinite(self.count_gate) and self.count_gate >= 0):
            raise ValueError("count_gate must be a finite number >= 0")
        if not 0 < self.selection_share < 1:
            raise ValueError("selection_share must be in (0, 1)")
        return self

    @property
    def prior_counts_k(self) -> int | None:
        """k_p of the counts' per-user scaling, or None (exact counts) without bounds."""
        return None if self.max_ratings_per_user is None else self.prior_items_per_user

    @property
    def d(self) -> int:
        """Length of x_u and v_j: r factors + the bias coordinate."""
        return self.rank + 1

    @property
    def x_norm(self) -> float:
        """Gamma_x: bound of ||x_u|| (inf without a clip)."""
        clip = np.inf if self.user_factor_clip is None else self.user_factor_clip
        return float(np.hypot(clip, self.bias_coordinate))


class DPIALSConfig(IALSConfig):
    """``dp-ials``: iALS with the per-user bounds user-level DP needs (defaults chosen on a
    validation carve-out under noise, see docs/benchmarks/ranking.md)."""

    rank: CF.BiasRank = 16
    sweeps: ItemSumSweeps = 2
    lam: float = Field(0.001, description="lambda of the frequency-scaled ridge (the "
                       "ridge grows with the user and item counts: a larger lam drowns "
                       "every factor and leaves the popularity list)")
    bias_coordinate: float = Field(
        0.01, description="c, constant user coordinate paired with an item bias; small, "
        "so the bound ||x_u|| = hypot(Gamma_u, c) and hence the noise go to the user "
        "factors rather than to the bias (the popularity part)")
    user_factor_clip: float | None = Field(
        0.3, description="Gamma_u, norm bound of a released user factor")
    max_ratings_per_user: int | None = Field(
        300, description="k: each user's released weights have sum of squares k")
    gram_shrink: GramShrink = 0.5

    @model_validator(mode="after")
    def _bounded(self) -> DPIALSConfig:
        if self.user_factor_clip is None or self.max_ratings_per_user is None:
            raise ValueError("dp-ials needs user_factor_clip and max_ratings_per_user")
        return self


def user_bounds(cfg: IALSConfig) -> UserBounds | None:
    """The per-user bounds of an upload (k + 1 terms: k items and the Gramian row), or
    None for a config without them (plain ``ials``)."""
    if cfg.user_factor_clip is None or cfg.max_ratings_per_user is None:
        return None
    bounds = UserBounds(cfg.max_ratings_per_user + 1, cfg.x_norm, 1.0, ("A",), ("b",),
                        {"A": "gram_noise", "b": "rhs_noise"})
    if cfg.popularity_prior > 0:  # the prior's counts: one user's term has norm sqrt(k_p)
        bounds = dataclasses.replace(
            bounds, centre=("pop",), centre_norm=float(np.sqrt(cfg.prior_items_per_user)),
            centre_share=cfg.prior_share,
            noise_fields={**bounds.noise_fields, "pop": "pop_noise"})
    return bounds


@dataclasses.dataclass(frozen=True)
class GlobalModel(Message):
    """V (d x n: factor rows and the item-bias row), the sweeps released so far and each
    item's (weighted) count from the last release (zeros before); the popularity prior's
    row z (None: no prior) and its weight beta in the served score; each item's weight g_j
    of its factor score from the noisy released counts (:func:`count_weights`; None: all
    1)."""

    V: np.ndarray
    sweep: int
    counts: np.ndarray
    prior: np.ndarray | None = None
    prior_weight: float = 0.0
    item_weight: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class ServerState(Message):
    """The current V and counts (every sweep is solved from fresh sums); the prior's
    released counts so far, summed with inverse-noise-variance weights, and the weights'
    sum (None / 0 before any); the standard deviation of the noise in their weighted mean
    (0 without noise)."""

    V: np.ndarray
    sweep: int
    counts: np.ndarray
    pop_sum: np.ndarray | None = None
    pop_weight: float = 0.0
    pop_noise: float = 0.0


@dataclasses.dataclass(frozen=True)
class LocalState(Message):
    """Tenant i's private state: ``U`` (m_i x r, its users' factors) and ``c``."""

    user_rows: ClassVar[tuple[str, ...]] = ("U",)

    U: np.ndarray
    bias_coordinate: float


@dataclasses.dataclass(frozen=True)
class Upload(Message):
    """Per-item sums over this tenant's users: ``A`` (n + 1 x d x d; row n the Gramian of
    all its users), ``b`` (n x d), ``pop`` (n, the prior's item counts; None without a
    prior); the standard deviation of the noise already in them."""

    A: np.ndarray
    b: np.ndarray
    gram_noise: float = 0.0
    rhs_noise: float = 0.0
    pop: np.ndarray | None = None
    pop_noise: float = 0.0


def init_server(n_items: int, n_clients: int, cfg: IALSConfig, rng: np.random.Generator
                ) -> tuple[ServerState, GlobalModel]:
    """V^0: Normal(0, init_scale^2 / r) factor rows, zero item biases (data-independent)."""
    v = initial_v(n_items, cfg, rng)
    zeros = np.zeros(n_items)
    return (ServerState(V=v, sweep=0, counts=zeros),
            GlobalModel(V=v.copy(), sweep=0, counts=zeros.copy()))


def initial_v(n_items: int, cfg: IALSConfig, rng: np.random.Generator) -> np.ndarray:
    """The random initial V (d x n) of :func:`init_server`."""
    v = np.zeros((cfg.d, n_items))
    v[: cfg.rank] = rng.normal(0.0, cfg.init_scale / np.sqrt(cfg.rank),
                               size=(cfg.rank, n_items))
    return v


def init_client(block: RatingBlock, global_msg: GlobalModel, cfg: IALSConfig,
                rng: np.random.Generator) -> LocalState:
    """U^0 = 0 (solved in the first step)."""
    return LocalState(U=np.zeros((block.n_users, cfg.rank)),
                      bias_coordinate=cfg.bias_coordinate)


def confidences(vals: np.ndarray, cfg: IALSConfig) -> np.ndarray:
    """w_uj = 1 + alpha (r - scale_min) / (scale_max - scale_min), clipped to the scale."""
    spread = cfg.scale_max - cfg.scale_min
    return 1.0 + cfg.confidence * np.clip((vals - cfg.scale_min) / spread, 0.0, 1.0)


def ridge(freq: np.ndarray, others: float, cfg: IALSConfig) -> np.ndarray:
    """Frequency-scaled ridge ``lam (f + w0 N)^nu`` (Rendle et al. 2022)."""
    return cfg.lam * (np.maximum(freq, 0.0) + cfg.unobserved_weight * others) \
        ** cfg.ridge_power


def _outer_flat(x: np.ndarray) -> np.ndarray:
    """Row-wise outer products, flattened: (rows, d*d)."""
    return np.einsum("ri,rj->rij", x, x).reshape(x.shape[0], -1)


def solve_users(v: np.ndarray, rows: np.ndarray, cols: np.ndarray, w: np.ndarray,
                n_users: int, cfg: IALSConfig) -> np.ndarray:
    """Every user's exact factor u_u (n_users x r) against V (the module's user solve): the
    fused ``nogil`` kernel (:mod:`algorithms._user_kernels`) when numba is installed, else
    :func:`solve_users_numpy` (the same numbers to rounding)."""
    if UK.HAVE_NUMBA:
        return UK.ials_users(rows, cols, w, v, n_users, cfg.rank, cfg.bias_coordinate,
                             cfg.unobserved_weight, cfg.lam, cfg.ridge_power)
    return solve_users_numpy(v, rows, cols, w, n_users, cfg)


def solve_users_numpy(v: np.ndarray, rows: np.ndarray, cols: np.ndarray, w: np.ndarray,
                      n_users: int, cfg: IALSConfig) -> np.ndarray:
    """:func:`solve_users` in numpy and scipy.

    Gram matrices are one sparse product of the confidence pattern with the items' outer
    products, plus the Gramian ``w0 F``; then one batched solve. Users without a rating get
    the solve of an empty row (their factor only follows the item biases)."""
    r, c, w0 = cfg.rank, cfg.bias_coordinate, cfg.unobserved_weight
    vr, beta = v[:r].T, v[r]
    conf = sp.csr_array((w, (rows, cols)), shape=(n_users, v.shape[1]))
    gram = (conf @ _outer_flat(vr)).reshape(n_users, r, r)
    f_mat, f_beta = vr.T @ vr, vr.T @ beta
    freq = conf.sum(axis=1)
    lam = ridge(freq, v.shape[1], cfg)
    gram += w0 * f_mat + lam[:, None, None] * np.eye(r)
    target = sp.csr_array((w * (1.0 - c * beta[cols]), (rows, cols)),
                          shape=(n_users, v.shape[1]))
    rhs = target @ vr - w0 * c * f_beta
    return np.linalg.solve(gram, rhs[..., None])[..., 0]


def user_vectors(u: np.ndarray, cfg: IALSConfig) -> np.ndarray:
    """x_u = [clip(u_u, Gamma_u), c] for every user (m x d)."""
    if cfg.user_factor_clip is not None:
        norms = np.linalg.norm(u, axis=1, keepdims=True)
        u = u * (cfg.user_factor_clip / np.maximum(norms, cfg.user_factor_clip))
    return np.hstack([u, np.full((u.shape[0], 1), cfg.bias_coordinate)])


def released_weights(rows: np.ndarray, cols: np.ndarray, conf: np.ndarray, n_users: int,
                     counts: np.ndarray, cfg: IALSConfig) -> np.ndarray:
    """The weights of a user's terms in the released sums: the confidences (no bound), or
    ``conf * count_j^-eta`` scaled per user to ``sum_j w^2 = k``, each at most
    ``max_weight`` (the cap only lowers a weight, so the bound holds)."""
    k = cfg.max_ratings_per_user
    if k is None:
        return conf
    base = conf.copy()
    if cfg.rare_item_power > 0 and np.any(counts > 0):
        base = base * np.maximum(counts[cols], 1.0) ** -cfg.rare_item_power
    spent = np.bincount(rows, weights=base ** 2, minlength=n_users)
    scale = np.sqrt(k / np.maximum(spent, 1e-300))
    return np.minimum(base * scale[rows], cfg.max_weight)


def item_sums(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, w: np.ndarray,
              n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """(A, b): per item the weighted sums of x x^T and x over the users who rated it, with
    the Gramian ``sum_u x_u x_u^T`` of all the users appended as row n of A; the fused
    kernel when numba is installed, else :func:`item_sums_numpy`."""
    if UK.HAVE_NUMBA:
        return UK.ials_item_sums(rows, cols, w, x, n_items)
    return item_sums_numpy(x, rows, cols, w, n_items)


def item_sums_numpy(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, w: np.ndarray,
                    n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`item_sums` in numpy and scipy."""
    n_users, d = x.shape
    pattern_t = sp.csr_array((w, (cols, rows)), shape=(n_items, n_users))
    a = np.empty((n_items + 1, d, d))
    a[:n_items] = (pattern_t @ _outer_flat(x)).reshape(n_items, d, d)
    a[n_items] = x.T @ x
    return a, pattern_t @ x


def client_step(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
                cfg: IALSConfig, rng: np.random.Generator
                ) -> tuple[LocalState, Upload | None]:
    """Solve the tenant's users against V; upload the (bounded) item sums while sweeps
    remain."""
    conf = confidences(block.vals, cfg)
    u = solve_users(global_msg.V, block.rows, block.cols, conf, block.n_users, cfg)
    new = state.replace(U=u)
    if global_msg.sweep >= cfg.sweeps:  # final refresh: U now matches the released V
        return new, None
    w = released_weights(block.rows, block.cols, conf, block.n_users, global_msg.counts,
                         cfg)
    a, b = item_sums(user_vectors(u, cfg), block.rows, block.cols, w, block.n_items)
    pop = (P.item_counts(block, cfg.prior_counts_k) if cfg.popularity_prior > 0 else None)
    return new, Upload(A=a, b=b, pop=pop)


def solve_items(a: np.ndarray, b: np.ndarray, gram_noise: float, cfg: IALSConfig
                ) -> tuple[np.ndarray, np.ndarray]:
    """(V (d x n), counts) from the summed A (n + 1 rows, the last the Gramian) and b.

    Noise-free: the exact item solve. Noisy: each item's count read off the last
    coordinate of b (``sum w c``: far less noise relative to it than in A, whose share of
    the release is smaller and which spreads it over d^2 entries), Grams shrunk toward
    count times the average Gram (:func:`algorithms.dpals.shrink_grams`) and projected onto
    the PSD cone, and a ridge growing with the noise left in the unshrunk part; all
    post-processing of the released sums."""
    n, c, w0 = b.shape[0], cfg.bias_coordinate, cfg.unobserved_weight
    grams, gramian = a[:n], a[n]
    if gram_noise > 0:
        counts = np.maximum(b[:, -1] / c, 0.0)
        if cfg.gram_shrink > 0:
            grams = shrink_grams(grams, counts, cfg.gram_shrink)
        grams = psd_project(grams)
        gramian = psd_project(gramian[None])[0]
    else:
        counts = grams[:, -1, -1] / c ** 2
    n_users = max(float(gramian[-1, -1]) / c ** 2, 0.0)
    # the shrunk part of a Gram is an average over all items, whose noise has averaged out
    noise_ridge = cfg.noise_reg * 2.0 * gram_noise * np.sqrt(cfg.d) * (1 - cfg.gram_shrink)
    lam = ridge(counts, n_users, cfg) + noise_ridge
    m = grams + w0 * gramian + lam[:, None, None] * np.eye(cfg.d)
    return np.linalg.solve(m, b[..., None])[..., 0].T, counts


def popularity_row(counts: np.ndarray) -> np.ndarray:
    """z_j: ``log(1 + n_j)`` (negative noisy counts read as 0) standardised to mean 0 and
    standard deviation 1 over the catalogue (all zeros for a constant row), so that beta
    means the same on any catalogue size and rating volume."""
    lc = np.log1p(np.maximum(np.asarray(counts, dtype=float), 0.0))
    sd = float(lc.std())
    return (lc - lc.mean()) / sd if sd > 0 else np.zeros_like(lc)


def count_weights(counts: np.ndarray, noise_std: float, t: float) -> np.ndarray | None:
    """g_j = ``n_j / (n_j + t s)`` of the released counts ``n_j`` (negative read as 0)
    whose noise has standard deviation ``s = noise_std`` (module docstring: items the count
    release cannot tell from noise lose their factor score); None (all 1) without noise or
    with ``t = 0``. Post-processing of a DP release and its public noise level."""
    if not (noise_std > 0 and t > 0):
        return None
    n = np.maximum(np.asarray(counts, dtype=float), 0.0)
    return n / (n + t * noise_std)


def _global(state: ServerState, cfg: IALSConfig) -> GlobalModel:
    """The broadcast model of a server state (the prior's row and the items' factor
    weights from the counts so far)."""
    has = state.pop_sum is not None and state.pop_weight > 0
    counts = state.pop_sum / state.pop_weight if has else None
    return GlobalModel(V=state.V.copy(), sweep=state.sweep, counts=state.counts.copy(),
                       prior=popularity_row(counts) if has else None,
                       prior_weight=cfg.popularity_prior if has else 0.0,
                       item_weight=(count_weights(counts, state.pop_noise, cfg.count_gate)
                                    if has else None))


def server_step(state: ServerState, uploads: Mapping[int, Upload], cfg: IALSConfig,
                rng: np.random.Generator) -> tuple[ServerState, GlobalModel]:
    """Sum the uploads (noise standard deviations add in quadrature) and solve V; add the
    summed prior counts to the running inverse-noise-variance-weighted sum (weight 1
    without noise); no uploads: keep V."""
    if not uploads:
        return state, _global(state, cfg)
    ups = [uploads[i] for i in sorted(uploads)]
    a, b = sum_arrays([u.A for u in ups]), sum_arrays([u.b for u in ups])
    sigma = float(np.sqrt(sum(u.gram_noise ** 2 for u in ups)))
    v, counts = solve_items(a, b, sigma, cfg)
    pop_sum, pop_weight, pop_noise = state.pop_sum, state.pop_weight, state.pop_noise
    if all(u.pop is not None for u in ups):
        var = float(sum(u.pop_noise ** 2 for u in ups))
        w = 1.0 / var if var > 0 else 1.0
        total = w * sum_arrays([u.pop for u in ups])
        pop_sum = total if pop_sum is None else pop_sum + total
        pop_weight = pop_weight + w
        # the inverse-variance-weighted mean of noisy releases has variance 1 / sum(w)
        pop_noise = float(1.0 / np.sqrt(pop_weight)) if var > 0 else 0.0
    new = ServerState(V=v, sweep=state.sweep + 1, counts=counts, pop_sum=pop_sum,
                      pop_weight=pop_weight, pop_noise=pop_noise)
    return new, _global(new, cfg)


def factors(global_msg: GlobalModel, state: LocalState) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B the scores ``g_j (u_u . v_j + c beta_j)`` (a ranking, not a
    rating; g_j the items' weights from noisy counts, :func:`count_weights`, 1 without),
    plus ``prior_weight * z_j`` (an extra column of A and row of B) with a prior."""
    u = state.U
    x = np.hstack([u, np.full((u.shape[0], 1), state.bias_coordinate)])
    v = global_msg.V
    if global_msg.item_weight is not None:
        v = v * global_msg.item_weight[None, :]
    if global_msg.prior is None or not global_msg.prior_weight > 0:
        return x, v
    return (np.hstack([x, np.full((u.shape[0], 1), global_msg.prior_weight)]),
            np.vstack([v, global_msg.prior[None, :]]))


def choose_prior_weight(global_msg: GlobalModel, states, fit_blocks, valid_blocks, scales,
                        grid=PRIOR_GRID) -> tuple[float, dict[float, float]]:
    """(beta with the best pooled NDCG@10 on the validation carve-out, NDCG of each beta)
    for a fitted model: the tenants' ``states`` fitted on ``fit_blocks`` (their items are
    excluded from the ranking), ``valid_blocks`` the carve-out, one ``(lo, hi)`` scale per
    tenant. Post-processing of the model on data the fit never saw; ties go to the smaller
    beta. Not for a DP run: the choice would read private ratings uncharged."""
    if global_msg.prior is None:
        return 0.0, {}
    parts = list(zip(states, fit_blocks, valid_blocks, scales, strict=True))
    scores = {float(beta): pooled_ndcg(factors, global_msg.replace(prior_weight=float(beta)),
                                       parts)
              for beta in grid}
    finite = {b: s for b, s in scores.items() if np.isfinite(s)}
    if not finite:
        return global_msg.prior_weight, scores
    best = max(finite.values())
    return min(b for b, s in finite.items() if s == best), scores


def prior_scores(global_msg: GlobalModel, state: LocalState, fit: RatingBlock,
                 valid: RatingBlock, scale: tuple[float, float], grid=PRIOR_GRID
                 ) -> np.ndarray:
    """One tenant's input to the DP choice of beta (:mod:`privacy.selection`): for each
    beta of ``grid``, the sum over its users of their NDCG@10 on the carve-out ``valid``
    (the model's items ranked with ``fit``'s excluded, relevance at the scale's default
    cut; a user without a relevant carve-out item adds 0). Each user adds a number in
    [0, 1] to each entry, which is the selection's sensitivity. All zeros without a
    prior (every beta ranks alike)."""
    out = np.zeros(len(grid))
    if global_msg.prior is None:
        return out
    cut = relevance_threshold(scale)
    for i, beta in enumerate(grid):
        a, b = factors(global_msg.replace(prior_weight=float(beta)), state)
        out[i] = tenant_ranking(a, b, fit, valid, cut, 10).ndcg
    return out


def objective(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
              cfg: IALSConfig) -> float:
    """Tenant i's share of the iALS loss (its users' terms; ridge of the users only)."""
    x = np.hstack([state.U, np.full((state.U.shape[0], 1), state.bias_coordinate)])
    v = global_msg.V
    conf = confidences(block.vals, cfg)
    p = np.einsum("ij,ji->i", x[block.rows], v[:, block.cols])
    everything = np.einsum("ui,ij,uj->", x, v @ v.T, x)
    freq = np.bincount(block.rows, weights=conf, minlength=block.n_users)
    reg = ridge(freq, v.shape[1], cfg) @ np.sum(state.U ** 2, axis=1)
    return float(conf @ (1.0 - p) ** 2 + cfg.unobserved_weight * everything + reg)


_STEPS = dict(init_server=init_server, init_client=init_client, client_step=client_step,
              server_step=server_step, factors=factors, objective=objective)

ALGORITHM = Algorithm(name="ials", config=IALSConfig, **_STEPS,
                      run_defaults={"clients": 100, "per_round": 0, "rounds": 9})
ALGORITHMS = {
    "ials": ALGORITHM,
    "dp-ials": Algorithm(name="dp-ials", config=DPIALSConfig, **_STEPS,
                         run_defaults={"clients": 100, "per_round": 0, "rounds": 3}),
}
