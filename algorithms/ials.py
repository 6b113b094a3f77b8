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
from algorithms._messages import Message
from algorithms._pool import sum_arrays
from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.dpals import psd_project, shrink_grams
from algorithms.user_bounds import UserBounds

#: the sweeps and the item-Gram shrinkage of iALS, whose defaults dp-ials replaces
ItemSumSweeps = Annotated[int, Field(description="ALS sweeps, i.e. releases of the item sums")]
GramShrink = Annotated[float, Field(description="alpha in [0, 1]: noisy item Grams shrunk "
                                    "toward count_j times the average x x^T")]


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
        return self

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
    return UserBounds(cfg.max_ratings_per_user + 1, cfg.x_norm, 1.0, ("A",), ("b",),
                      {"A": "gram_noise", "b": "rhs_noise"})


@dataclasses.dataclass(frozen=True)
class GlobalModel(Message):
    """V (d x n: factor rows and the item-bias row), the sweeps released so far and each
    item's (weighted) count from the last release (zeros before)."""

    V: np.ndarray
    sweep: int
    counts: np.ndarray


@dataclasses.dataclass(frozen=True)
class ServerState(Message):
    """The current V and counts (every sweep is solved from fresh sums)."""

    V: np.ndarray
    sweep: int
    counts: np.ndarray


@dataclasses.dataclass(frozen=True)
class LocalState(Message):
    """Tenant i's private state: ``U`` (m_i x r, its users' factors) and ``c``."""

    user_rows: ClassVar[tuple[str, ...]] = ("U",)

    U: np.ndarray
    bias_coordinate: float


@dataclasses.dataclass(frozen=True)
class Upload(Message):
    """Per-item sums over this tenant's users: ``A`` (n + 1 x d x d; row n the Gramian of
    all its users), ``b`` (n x d); the standard deviation of the noise already in them."""

    A: np.ndarray
    b: np.ndarray
    gram_noise: float = 0.0
    rhs_noise: float = 0.0


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
    return new, Upload(A=a, b=b)


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


def server_step(state: ServerState, uploads: Mapping[int, Upload], cfg: IALSConfig,
                rng: np.random.Generator) -> tuple[ServerState, GlobalModel]:
    """Sum the uploads (noise standard deviations add in quadrature) and solve V; no
    uploads: keep V."""
    if not uploads:
        return state, GlobalModel(V=state.V.copy(), sweep=state.sweep,
                                  counts=state.counts.copy())
    ups = [uploads[i] for i in sorted(uploads)]
    a, b = sum_arrays([u.A for u in ups]), sum_arrays([u.b for u in ups])
    sigma = float(np.sqrt(sum(u.gram_noise ** 2 for u in ups)))
    v, counts = solve_items(a, b, sigma, cfg)
    return (ServerState(V=v, sweep=state.sweep + 1, counts=counts),
            GlobalModel(V=v.copy(), sweep=state.sweep + 1, counts=counts.copy()))


def factors(global_msg: GlobalModel, state: LocalState) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B the scores ``u_u . v_j + c beta_j`` (a ranking, not a rating)."""
    u = state.U
    return np.hstack([u, np.full((u.shape[0], 1), state.bias_coordinate)]), global_msg.V


def objective(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
              cfg: IALSConfig) -> float:
    """Tenant i's share of the iALS loss (its users' terms; ridge of the users only)."""
    x, v = factors(global_msg, state)
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
