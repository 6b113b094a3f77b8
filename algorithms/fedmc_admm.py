r"""FedMC-ADMM: linearised ADMM for federated matrix completion.

Hytla, Nghia, Phan and Rice, *A Linearized Alternating Direction Multiplier Method for
Federated Matrix Completion Problems* (the FedMC-ADMM paper), Algorithm 1 with the closed
forms of Sec. 5. Tenant i splits the shared V into a local copy W_i = V with dual Y_i and
minimises

.. math::
    \frac1p \sum_i \Big[\tfrac12 \|P_{\Omega_i}(M_i - U_i W_i)\|^2 + R_i(U_i)\Big]
    + \sum_i \Big[\langle Y_i, W_i - V\rangle + \tfrac\beta2 \|W_i - V\|^2\Big] + R(V).

Round k, for each sampled tenant i in S_k: N proximal-gradient steps on U_i with W_i^k
fixed (eq. 66 for l2, eq. 71 for l1, with L_W = ||W_i W_i^T||_F), N linearised steps on
W_i from W_i^k (eq. 67, L_U = ||U_i^T U_i||_F), then Y_i += beta (W_i - V^k) (eq. 13). The
tenant uploads (W_i, Y_i), full r x n matrices. The server keeps every tenant's last
contribution and sets V by eq. (68) (l2) or eq. (73) (l1).

Bias terms and a mean keep the federated split (:func:`factors` folds them in):

* ``user_bias``: a learned column b of U_i (local) paired with a constant row of ones
  appended to V; it is optimised with U_i in the U-step.
* ``item_bias``: a learned extra row c of W_i / V (shared, goes through the ADMM exactly
  like the factor rows) paired with a constant column of ones appended to U_i.
* ``centre='tenant'``: the tenant's own training mean, a local constant offset.

The regularisers apply to the bias entries as to the factors. On top of them the item-bias
row has a fixed ridge of its own, ``item_bias_ridge`` (w): the federation minimises
sum_i f_i + (w/2) ||c||^2 (in the paper's scaling R(V) gains (w/2p) ||c||^2, so eq. (68)'s
closed form divides that row by p beta + gamma + w/p at the server). The per-rating ridge
alone shrinks an item's bias by n_j / (n_j (1 + gamma_rating)), hardly at all for an item
with a handful of ratings, whose bias then tops many ranked lists; a fixed w shrinks it by
n_j / (n_j + w), as a centralised ALS's bias ridge. A bias is linear in the ratings, so
unlike a ridge on factors this one needs no ridge scale to mean the same on every scale.
It is off by default: on MovieLens 1M it doubles precision@10 (0.035 to 0.069 at w = 10)
but stays far below the item bias switched off (0.127) even at w = 100, while synthetic
sets with many moderately rated items lose 2.6-3% RMSE already at w = 10.

Two options go beyond Algorithm 1 and are on in the recommended defaults (both off in
:meth:`FedMCADMMConfig.paper_settings`, which runs the paper's equations exactly):

* ``u_anchor='global'``: the U-step (eqs. 66/71) linearises around the V^k just received
  instead of the tenant's own, possibly many rounds old, W_i^k. Eq. (67) and the dual
  step are unchanged. This is a heuristic (the analysis of Sec. 4.2 assumes W_i^k); on a
  validation carve-out of ML-100k it lowers RMSE after 100 rounds from ~0.95 to ~0.915.
* ``lipschitz='blockwise'``: f_i is a sum of one term per user row (for U) and per item
  column (for W), so each row / column may use the bound of eq. (12) computed over its own
  ratings only, ``||sum_{j in Omega_t} w_j w_j^T||_F``, instead of the global
  ``||W W^T||_F``; still a majoriser, far less conservative (the global bound counts
  every item, including the ones column of the user bias). ``'diagonal'`` uses
  per-coordinate Gershgorin bounds.

The recommended ridge is not the paper's R_i(U_i) = lambda/2 ||U_i||^2 and R(V) but a
weighted-lambda one (as ALS-WR): ``lam_rating`` n_t on each user row t of U_i with n_t its
ratings, and, inside each tenant's f_i, ``gamma_rating`` n_ij on item column j of W_i
with n_ij the tenant's own ratings of j (summed over tenants at consensus: gamma_rating
n_j ||v_j||^2, with no count leaving a tenant). Both are multiplied by the tenant's ridge
scale, its rating variance in units over MovieLens' (:func:`algorithms.scale.ridge_scale_of`):
a ridge on factors is not invariant under rescaling the ratings, so without it one weight
would be too strong on data spread over less of the declared range (-10..10 sets) and too
weak on 0/1 data. The U-step's prox and the W-step's bound simply add these per-row /
per-column weights; lambda and gamma (0 by default) still apply as in the paper.

Other deviations, all as in the authors' code: Y_i^0 = 0 (so the server knows every
tenant's initial contribution; the paper's Y_i^0 = -(1/p) grad f_i would need a round-0
upload), a floor on L_W and L_U, and small random initial factors.

Server memory: eqs. (68)/(73) need only S = sum_i (beta W_i + Y_i), but replacing tenant
i's term needs its previous value, which cannot be recovered from the new upload (it
depends on W_i from i's previous round), so the server keeps one q_w x n contribution per
tenant plus S (not separate W_i and Y_i copies) and updates S by difference.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from algorithms import mf_kernels as K
from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.messages import Message
from algorithms.pool import copy_parts, map_tasks, run_all, width
from algorithms.scale import centre_of, normalised, rating_factors, ridge_scale_of, unit_of

#: the default fixed ridge on the item-bias row (see :attr:`FedMCADMMConfig.item_bias_ridge`):
#: off, because no value helps ranking without costing RMSE elsewhere (ML-1M precision@10
#: 0.035 -> 0.069 at 10, 0.072 at 100, while synthetic 1-5 stars lose 2.6% at 10;
#: measured with ``fedrec simulate --item-bias-ridge W``)
ITEM_BIAS_RIDGE = 0.0


class FedMCADMMConfig(AlgorithmConfig):
    """Settings of FedMC-ADMM. Defaults are the tuned, recommended setting
    (docs/benchmarks/scale_defaults.md); :meth:`paper_settings` gives the paper's / authors' run."""

    rank: int = Field(10, description="r, number of latent factors (bias rows/cols extra)")
    regulariser: Literal["l2", "l1"] = Field(
        "l2", description="R_i and R: 'l2' (eqs. 65-68) or 'l1' (eqs. 70-73)")
    lam: float = Field(0.0, description="lambda, weight of R_i(U_i) (eqs. 65/70)")
    gamma: float = Field(0.0, description="gamma, weight of R(V) (eqs. 68/73)")
    lam_rating: float = Field(
        0.085, description="l2 weight per rating on each user row of U_i, added to lambda "
        "(weighted-lambda, as ALS-WR: a user with n ratings gets lambda + lam_rating n), "
        "times the tenant's ridge scale (see the module docstring)")
    gamma_rating: float = Field(
        0.085, description="l2 weight per rating on each item column, in each tenant's f_i "
        "over its own ratings of the item (summed: a weighted-lambda ridge on V), times the "
        "tenant's ridge scale")
    beta: float = Field(0.006, description="ADMM penalty beta > 0")
    inner_steps: int = Field(10, description="N, inner steps per round on U_i and on W_i")
    init: Literal["uniform", "normal"] = Field(
        "normal", description="initial U_i, V: Uniform(0, scale) or Normal(0, scale^2)")
    init_scale: float = Field(0.1, description="scale of the initial factors (> 0)")
    u_anchor: Literal["local", "global"] = Field(
        "global", description="W held fixed in the U-step: 'local' W_i^k (eq. 14, Algorithm 1)"
        " or 'global' the V^k just received (a deviation; see the module docstring)")
    lipschitz: Literal["global", "blockwise", "diagonal"] = Field(
        "blockwise", description="L_W, L_U: 'global' ||W W^T||_F, ||U^T U||_F (eqs. 66-67); "
        "'blockwise', the same bound per user row / item column over its ratings only; "
        "'diagonal', per row and coordinate, the absolute row sums of that Gram matrix")
    lipschitz_floor: float = Field(1e-4, description="lower bound on L_W and L_U (authors')")
    user_bias: bool = Field(True, description="learn a user-bias column of U_i")
    item_bias: bool = Field(True, description="learn an item-bias row of V")
    item_bias_ridge: float = Field(
        ITEM_BIAS_RIDGE, description="fixed l2 weight on each item's bias (not per rating): "
        "the federation's objective gains item_bias_ridge/2 ||c||^2, as a centralised ALS's "
        "bias ridge (R(V) gets it over p: eq. 68 on the item-bias row); shrinks the bias of "
        "lightly-rated items, which helps ranking on MovieLens at some RMSE cost elsewhere")
    centre: Literal["none", "tenant"] = Field(
        "tenant", description="subtract the tenant's own training mean (local constant)")
    kernel: Literal["auto", "numba", "numpy"] = Field(
        "auto", description="inner loops: fused numba if installed ('auto'), or plain numpy")

    #: ``fedrec tune``'s search space (:mod:`algorithms.tuning`): field -> ("log", lo, hi)
    #: for a log-uniform draw or ("choice", [values]). Both ridge forms are drawn, so a draw
    #: mixes them: the weighted (per-rating) weights around the defaults' 0.085 and below,
    #: and the fixed ones, lambda per user row and gamma on V (gamma acts as p gamma per
    #: item column, about 1 to 30 with the default 100 tenants). On MovieLens 1M a
    #: centralised ALS of this model gains most from the mix; ``fedrec tune`` on ML-1M
    #: chooses it too (lambda 5, lam_rating 0.02, p gamma 10, gamma_rating 0.02:
    #: bench/results/tune_ml-1m.json, written by ``fedrec tune --json``).
    #: A drawn lambda is scaled with the rank
    #: (:func:`algorithms.tuning.couple_rank_and_lambda`), the per-rating weights are not:
    #: ALS's best weighted lambda is 0.06 to 0.08 at ranks 10, 20 and 40 alike. Rank 40
    #: because a round costs far less than (r + 1)^2 / 121 times rank 10's (ML-1M, CPU
    #: per round: rank 20 1.4x, 40 2.7x).
    search_space: ClassVar[dict[str, tuple]] = {
        "rank": ("choice", [5, 10, 20, 40]), "lam": ("log", 1.0, 20.0),
        "gamma": ("log", 0.03, 0.3), "lam_rating": ("log", 0.005, 0.2),
        "gamma_rating": ("log", 0.005, 0.2), "beta": ("log", 0.002, 0.02),
        "item_bias_ridge": ("log", 1.0, 30.0)}
    #: configs ``fedrec tune`` always tries beside the default (:mod:`algorithms.tuning`):
    #: the mixed-ridge point a centralised ALS of this model chose on MovieLens 1M's
    #: validation carve-out (test RMSE 0.8447 there, the default 0.8532; 16 draws in this
    #: space's 8 dimensions rarely land that close). On other data it is one more trial,
    #: kept only if it wins on validation.
    search_anchors: ClassVar[tuple[dict, ...]] = (
        {"lam": 5.0, "gamma": 0.1, "lam_rating": 0.02, "gamma_rating": 0.02},)

    @model_validator(mode="after")
    def _check(self) -> FedMCADMMConfig:
        if self.rank < 1:
            raise ValueError("rank must be at least 1")
        if self.inner_steps < 1:
            raise ValueError("inner_steps must be at least 1")
        if min(self.lam, self.gamma, self.lam_rating, self.gamma_rating,
               self.item_bias_ridge) < 0:
            raise ValueError("lam, gamma, lam_rating, gamma_rating and item_bias_ridge must "
                             "be non-negative")
        if not self.beta > 0 or not self.init_scale > 0 or not self.lipschitz_floor > 0:
            raise ValueError("beta, init_scale and lipschitz_floor must be positive")
        if self.kernel == "numba" and not K.HAVE_NUMBA:
            raise ValueError("kernel='numba' needs numba installed")
        return self

    @classmethod
    def paper_settings(cls, **overrides: object) -> FedMCADMMConfig:
        """The paper's Sec. 5.2 run as the authors' code does it: rank 5, lambda = gamma =
        1e-6, N = 10, beta = 1e4, U, V ~ Uniform(0, 2e-4), the global L_W, L_U of eqs.
        (66)-(67) with floor 1e-4, U-step at W_i^k, no biases; ratings centred (the authors
        z-score globally, which needs every tenant's data; here each tenant centres on its
        own mean). ``overrides`` replace fields (e.g. ``rank=50``, the authors' script)."""
        base = dict(rank=5, regulariser="l2", lam=1e-6, gamma=1e-6, lam_rating=0.0,
                    gamma_rating=0.0, beta=1e4, inner_steps=10,
                    init="uniform", init_scale=2e-4, u_anchor="local", lipschitz="global",
                    lipschitz_floor=1e-4, user_bias=False, item_bias=False,
                    item_bias_ridge=0.0, centre="tenant")
        return cls(**{**base, **overrides})

    @property
    def q_u(self) -> int:
        """Learned columns of U_i: r factors (+ user bias)."""
        return self.rank + int(self.user_bias)

    @property
    def q_w(self) -> int:
        """Rows of W_i, Y_i and V: r factors (+ item bias)."""
        return self.rank + int(self.item_bias)

    def use_numba(self) -> bool:
        """Whether the fused numba kernels run (same numbers as numpy to ~1e-13)."""
        return self.kernel == "numba" or (self.kernel == "auto" and K.HAVE_NUMBA)


@dataclasses.dataclass(frozen=True)
class GlobalModel(Message):
    """Broadcast V^k (q_w x n) and the number of tenants p."""

    V: np.ndarray
    n_clients: int


@dataclasses.dataclass(frozen=True)
class ServerState(Message):
    """What the server keeps, item-major: ``C[i] = (beta W_i + Y_i)^T``, tenant i's last
    contribution (p x n x q_w; W_i^0 = V^0 and Y_i^0 = 0 until i first uploads), and
    ``S = sum_i C[i]`` (n x q_w), updated by difference. Eqs. (68)/(73) need only S."""

    client_parts: ClassVar[tuple[str, ...]] = ("C",)

    C: np.ndarray
    S: np.ndarray


@dataclasses.dataclass(frozen=True)
class LocalState(Message):
    """Tenant i's private state: U_i (m_i x q_u), W_i and Y_i (q_w x n), its mean offset
    and the rank r (columns of U / rows of V beyond r are bias terms); ratings are divided by
    the tenant's unit and ``scale_unit`` maps predictions back to the
    tenant's (:mod:`algorithms.scale`; the defaults are the identity of older states)."""

    user_rows: ClassVar[tuple[str, ...]] = ("U",)

    U: np.ndarray
    W: np.ndarray
    Y: np.ndarray
    mean: float
    rank: int
    scale_unit: float = 1.0
    ridge_scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Upload(Message):
    """(W_i^{k+1}, Y_i^{k+1}), full q_w x n matrices: no rating, no rated-item index."""

    W: np.ndarray
    Y: np.ndarray


def _draw(shape: tuple[int, int], cfg: FedMCADMMConfig, rng: np.random.Generator) -> np.ndarray:
    if cfg.init == "uniform":
        return rng.uniform(0.0, cfg.init_scale, size=shape)
    return rng.normal(0.0, cfg.init_scale, size=shape)


def init_server(n_items: int, n_clients: int, cfg: FedMCADMMConfig,
                rng: np.random.Generator) -> tuple[ServerState, GlobalModel]:
    """V^0 drawn from the init scheme (item-bias row 0); every C[i] = beta V^0."""
    v = np.zeros((cfg.q_w, n_items))
    v[: cfg.rank] = _draw((cfg.rank, n_items), cfg, rng)
    c = np.repeat((cfg.beta * v.T)[None], n_clients, axis=0)
    return ServerState(C=c, S=c.sum(axis=0)), GlobalModel(V=v, n_clients=n_clients)


def init_client(block: RatingBlock, global_msg: GlobalModel, cfg: FedMCADMMConfig,
                rng: np.random.Generator) -> LocalState:
    """U_i^0 from the init scheme (user-bias column 0), W_i^0 = V^0, Y_i^0 = 0."""
    u = np.zeros((block.n_users, cfg.q_u))
    u[:, : cfg.rank] = _draw((block.n_users, cfg.rank), cfg, rng)
    unit = unit_of(block)
    block = normalised(block, unit)
    mean = centre_of(block, unit) if cfg.centre == "tenant" else 0.0
    return LocalState(U=u, W=global_msg.V.copy(), Y=np.zeros_like(global_msg.V), mean=mean,
                      rank=cfg.rank, scale_unit=unit, ridge_scale=ridge_scale_of(block, 1.0))


def u_design_t(w: np.ndarray, cfg: FedMCADMMConfig) -> np.ndarray:
    """Right factor of the U-step, transposed (n x q_u): W's factor rows (+ ones column)."""
    bt = np.ones((w.shape[1], cfg.q_u))
    bt[:, : cfg.rank] = w[: cfg.rank].T
    return bt


def w_design(u: np.ndarray, cfg: FedMCADMMConfig) -> np.ndarray:
    """Left factor of the W-step (m x q_w): U's factor columns (+ ones column)."""
    a = np.ones((u.shape[0], cfg.q_w))
    a[:, : cfg.rank] = u[:, : cfg.rank]
    return a


def u_target(vals: np.ndarray, cols: np.ndarray, w: np.ndarray, mean: float,
             cfg: FedMCADMMConfig) -> np.ndarray:
    """What U_i W fits in the U-step: ratings minus the mean and item bias (fixed offsets)."""
    return vals - mean - (w[cfg.rank, cols] if cfg.item_bias else 0.0)


def w_target(vals: np.ndarray, rows: np.ndarray, u: np.ndarray, mean: float,
             cfg: FedMCADMMConfig) -> np.ndarray:
    """What U_i W fits in the W-step: ratings minus the mean and user bias (fixed offsets)."""
    return vals - mean - (u[rows, cfg.rank] if cfg.user_bias else 0.0)


_FUSED_MODE = {"global": K.LIP_GIVEN, "blockwise": K.LIP_BLOCK_FRO,
               "diagonal": K.LIP_BLOCK_DIAG}


def lipschitz(indptr: np.ndarray, indices: np.ndarray, x: np.ndarray,
              cfg: FedMCADMMConfig) -> np.ndarray:
    """L per compressed row and coordinate, (rows, q): the paper's ``||X^T X||_F`` for all
    (Remark 4.1), or per user / item over its own ratings ('blockwise': Frobenius norm of
    its Gram matrix; 'diagonal': absolute row sums, a per-coordinate majoriser). Each user
    row / item column is a separate term of f_i, so any of these majorises it."""
    if cfg.lipschitz == "global":
        return np.full((len(indptr) - 1, x.shape[1]), K.gram_fro(x, cfg.lipschitz_floor))
    return K.block_lipschitz(indptr, indices, x, cfg.lipschitz_floor,
                             cfg.lipschitz == "diagonal")


def _fused_lipschitz(x: np.ndarray, cfg: FedMCADMMConfig) -> tuple[int, float]:
    """(mode, given L) for the fused kernels, which compute blockwise bounds themselves."""
    given = K.gram_fro(x, cfg.lipschitz_floor) if cfg.lipschitz == "global" else 0.0
    return _FUSED_MODE[cfg.lipschitz], given


def u_update(state: LocalState, block: RatingBlock, cfg: FedMCADMMConfig) -> np.ndarray:
    """U_i^{k+1}: N steps of eq. (66) (l2) or eq. (71) (l1) with W_i^k fixed."""
    csr = block.csr
    target = u_target(csr.data, csr.indices, state.W, state.mean, cfg)
    l1 = cfg.regulariser == "l1"
    if cfg.use_numba() and cfg.lipschitz != "global" and 2 * block.nnz < block.n_items:
        # each user row's bound and gradient read only the columns of W it rated: on a
        # sparse tenant, the design over its rated items (renumbered, same order), not
        # the catalogue (a tenant rating most items keeps the catalogue's: no gather)
        items, part = block.compact
        bt = u_design_t(state.W[:, items], cfg)
        pcsr = part.csr
        mode, given = _fused_lipschitz(bt, cfg)
        return K.u_prox_steps_numba(pcsr.indptr, pcsr.indices, target, state.U, bt, mode,
                                    given, cfg.lipschitz_floor, cfg.lam, l1, cfg.inner_steps,
                                    lam_rating=cfg.lam_rating * state.ridge_scale)
    bt = u_design_t(state.W, cfg)
    if cfg.use_numba():
        mode, given = _fused_lipschitz(bt, cfg)
        return K.u_prox_steps_numba(csr.indptr, csr.indices, target, state.U, bt, mode, given,
                                    cfg.lipschitz_floor, cfg.lam, l1, cfg.inner_steps,
                                    lam_rating=cfg.lam_rating * state.ridge_scale)
    lip = lipschitz(csr.indptr, csr.indices, bt, cfg)
    return K.u_prox_steps_numpy(csr.indptr, csr.indices, target, state.U, bt, lip, cfg.lam,
                                l1, cfg.inner_steps, lam_rating=cfg.lam_rating * state.ridge_scale)


def w_update(u: np.ndarray, v: np.ndarray, p: int, state: LocalState, block: RatingBlock,
             cfg: FedMCADMMConfig) -> tuple[np.ndarray, np.ndarray]:
    """(W_i^{k+1}, Y_i^{k+1}): N steps of eq. (67) from W_i^k, then eq. (13)."""
    a = w_design(u, cfg)
    if cfg.use_numba():
        csc = block.csc
        target = w_target(csc.data, csc.indices, u, state.mean, cfg)
        mode, given = _fused_lipschitz(a, cfg)
        wt, yt = K.w_linearised_steps_numba(csc.indptr, csc.indices, target, a, state.W.T,
                                            v.T, state.Y.T, mode, given, cfg.lipschitz_floor,
                                            cfg.beta, p, cfg.inner_steps,
                                            mu_rating=cfg.gamma_rating * state.ridge_scale)
    else:
        csr, csc = block.csr, block.csc
        rows = np.repeat(np.arange(block.n_users, dtype=np.int32), np.diff(csr.indptr))
        target = w_target(csr.data, rows, u, state.mean, cfg)
        lip = lipschitz(csc.indptr, csc.indices, a, cfg)
        wt, yt = K.w_linearised_steps_numpy(csr.indptr, csr.indices, target, a, state.W.T,
                                            v.T, state.Y.T, lip, cfg.beta, p, cfg.inner_steps,
                                            mu_rating=cfg.gamma_rating * state.ridge_scale)
    return wt.T, yt.T  # views: W, Y are stored as transposes of item-major arrays


def client_step(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
                cfg: FedMCADMMConfig, rng: np.random.Generator
                ) -> tuple[LocalState, Upload]:
    """Step 4 of Algorithm 1 for one sampled tenant; deterministic (``rng`` unused)."""
    if state.U.shape[0] != block.n_users or global_msg.V.shape[1] != block.n_items:
        # the compiled kernels do not check bounds: refuse a mismatch before entering them
        raise ValueError(f"block of shape {block.shape} does not match U with "
                         f"{state.U.shape[0]} rows and V with {global_msg.V.shape[1]} items")
    anchor = state if cfg.u_anchor == "local" else state.replace(W=global_msg.V)
    block = normalised(block, state.scale_unit)
    u = u_update(anchor, block, cfg)
    w, y = w_update(u, global_msg.V, global_msg.n_clients, state, block, cfg)
    return state.replace(U=u, W=w, Y=y), Upload(W=w, Y=y)


def aggregate(s: np.ndarray, p: int, cfg: FedMCADMMConfig) -> np.ndarray:
    """V^{k+1} (item-major, n x q_w) from S = sum_i (beta W_i + Y_i): eq. (68) (l2) or eq.
    (73) (l1). With ``item_bias_ridge`` w, R(V) has the extra term (w / 2p) ||c||^2 on the
    item-bias column c, so its closed form divides that column by p beta + gamma + w / p
    (l1: the soft threshold of gamma first, then the same division)."""
    if cfg.regulariser == "l1":
        v = K.soft_threshold(s / (p * cfg.beta), cfg.gamma / (p * cfg.beta))
    else:
        v = s / (p * cfg.beta + cfg.gamma)
    if cfg.item_bias and cfg.item_bias_ridge:
        extra = cfg.item_bias_ridge / p
        if cfg.regulariser == "l1":  # prox of gamma|c| + (p beta + w/p)/2 c^2 - s c
            v[:, cfg.rank] *= p * cfg.beta / (p * cfg.beta + extra)
        else:
            v[:, cfg.rank] *= (p * cfg.beta + cfg.gamma) / (p * cfg.beta + cfg.gamma + extra)
    return v


PREPARE_PARTS = 16
"""Slices of C the round engine copies alongside the client steps (:func:`server_prepare`):
small enough to fill the gaps the tenants of different sizes leave on the threads."""


def _row_parts(rows: np.ndarray, parts: int) -> list[slice]:
    """``rows`` (sorted) as slices of consecutive tenants, runs longer than about
    ``len(rows) / parts`` split, so the copy tasks stay small enough to balance."""
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    size = max(1, -(-rows.size // max(1, parts)))
    out = []
    for run in np.split(rows, breaks):
        for lo in range(0, run.size, size):
            chunk = run[lo:lo + size]
            out.append(slice(int(chunk[0]), int(chunk[-1]) + 1))
    return out


def server_prepare(state: ServerState, cfg: FedMCADMMConfig, parts: int = PREPARE_PARTS,
                   expected: Sequence[int] = ()) -> tuple[ServerState, list]:
    """The part of :func:`server_step` that does not depend on the uploads: a fresh copy of
    C and S (the 31 MiB of C on MovieLens 1M; filling new memory costs more than the step's
    arithmetic), returned unfilled with the tasks that fill C (:func:`_pool.copy_parts`).
    The round engine runs them on its threads alongside the client steps.

    The rows of the ``expected`` tenants (this round's, whose uploads replace them) are
    not copied: :func:`server_apply`, given the same ``expected`` and the state as
    ``previous``, reads their old values there and copies only those of the expected
    tenants that did not upload. With every tenant every round (the default run) nothing
    is copied: the copy was a pass over p x n x q_w values per round, whatever the
    tenants rated."""
    skip = np.unique(np.asarray(expected, dtype=np.int64))
    if skip.size == 0:
        c, fill = copy_parts(state.C, parts)
        return ServerState(C=c, S=state.S.copy()), fill
    c = np.empty_like(state.C)
    keep = np.setdiff1d(np.arange(state.C.shape[0]), skip)
    fill = [functools.partial(np.copyto, c[sl], state.C[sl]) for sl in _row_parts(keep, parts)]
    return ServerState(C=c, S=state.S.copy()), fill


def server_apply(fresh: ServerState, uploads: Mapping[int, Upload], cfg: FedMCADMMConfig,
                 rng: np.random.Generator, previous: ServerState | None = None,
                 expected: Sequence[int] = ()) -> tuple[ServerState, GlobalModel]:
    """The rest of :func:`server_step` on ``fresh`` (from :func:`server_prepare`, filled),
    which it modifies: replace the uploaders' contributions and solve eq. (16). Every item
    is updated on its own, so slices of the items run on the pool's threads (the same
    numbers). ``previous`` and ``expected``: the state and tenants given to
    :func:`server_prepare` (whose rows of ``fresh.C`` it left unfilled)."""
    c, s = fresh.C, fresh.S
    order = sorted(uploads)
    pending = {int(i) for i in expected}
    if pending and previous is None:
        raise ValueError("server_apply needs the previous state for the expected tenants")
    old = {i: (previous.C[i] if i in pending else c[i]) for i in order}
    missing = sorted(i for i in pending if i not in uploads)  # expected, nothing arrived
    p = c.shape[0]
    v = np.empty_like(s)

    def part(sl: slice) -> None:
        s_part = s[sl]
        for i in missing:
            c[i, sl] = previous.C[i, sl]
        for i in order:
            new = cfg.beta * uploads[i].W.T[sl] + uploads[i].Y.T[sl]
            s_part += new
            s_part -= old[i][sl]
            c[i, sl] = new
        v[sl] = aggregate(s_part, p, cfg)

    n = s.shape[0]
    bounds = np.linspace(0, n, max(1, min(width(), n // 256 + 1)) + 1).astype(int)
    map_tasks(part, [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])
    # V is returned as the transpose of an item-major array: clients read it item-major
    return ServerState(C=c, S=s), GlobalModel(V=v.T, n_clients=p)


def server_step(state: ServerState, uploads: Mapping[int, Upload], cfg: FedMCADMMConfig,
                rng: np.random.Generator) -> tuple[ServerState, GlobalModel]:
    """Replace the uploaders' contributions (others keep theirs) and solve eq. (16):
    :func:`server_prepare` (the other tenants' rows of C copied on every core), then
    :func:`server_apply`."""
    expected = sorted(uploads)
    fresh, fill = server_prepare(state, cfg, width(), expected)
    run_all(fill)
    return server_apply(fresh, uploads, cfg, rng, state, expected)


def factors(global_msg: GlobalModel, state: LocalState) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B = U V + user bias + item bias + mean, from the shapes of U and V."""
    u, v, rank = state.U, global_msg.V, state.rank
    ones_m, ones_n = np.ones((u.shape[0], 1)), np.ones((1, v.shape[1]))
    a_cols, b_rows = [u[:, :rank]], [v[:rank]]
    if u.shape[1] > rank:  # user bias column x ones row
        a_cols.append(u[:, rank:rank + 1])
        b_rows.append(ones_n)
    if v.shape[0] > rank:  # ones column x item bias row
        a_cols.append(ones_m)
        b_rows.append(v[rank:rank + 1])
    a_cols.append(np.full((u.shape[0], 1), state.mean))
    b_rows.append(ones_n)
    return rating_factors(np.hstack(a_cols), np.vstack(b_rows), state.scale_unit)


def _entry_factors(global_msg: GlobalModel, state: LocalState, rows: np.ndarray,
                   cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(A[rows], B[:, cols])`` of :func:`factors`, built from the entries' rows and
    columns only when there are fewer entries than items (the same values: an evaluation
    then costs its entries, not the catalogue), else by gathering the full factors."""
    u, v, rank = state.U, global_msg.V, state.rank
    if rows.shape[0] >= v.shape[1]:
        a, b = factors(global_msg, state)
        return a[rows], b[:, cols]
    ones = np.ones((1, cols.shape[0]))
    a_cols, b_rows = [u[rows, :rank]], [v[:rank, cols]]
    if u.shape[1] > rank:
        a_cols.append(u[rows, rank:rank + 1])
        b_rows.append(ones)
    if v.shape[0] > rank:
        a_cols.append(np.ones((rows.shape[0], 1)))
        b_rows.append(v[rank:rank + 1, cols])
    a_cols.append(np.full((rows.shape[0], 1), state.mean))
    b_rows.append(ones)
    return rating_factors(np.hstack(a_cols), np.vstack(b_rows), state.scale_unit)


def predict_entries(global_msg: GlobalModel, state: LocalState, rows: np.ndarray,
                    cols: np.ndarray) -> np.ndarray:
    """The prediction ``(A @ B)[rows, cols]`` of :func:`factors` on the given entries, the
    same numbers as :func:`algorithms.base.predict`'s product of the gathered factors."""
    a, b = _entry_factors(global_msg, state, rows, cols)
    return np.einsum("ij,ji->i", a, b)


#: entries whose factor rows are gathered at once by :func:`_entry_errors`: 2^16 entries
#: of rank + 2 factors take about 13 MB (twice, plus the transposed copy), where a whole
#: 500k-rating block took 140 MB
ENTRY_CHUNK = 1 << 16


def _entry_errors(global_msg: GlobalModel, state: LocalState, block: RatingBlock
                  ) -> np.ndarray:
    """Prediction minus rating on every entry of ``block``, :data:`ENTRY_CHUNK` entries at a
    time (each entry's value is computed alone, so the numbers are those of one pass). The
    factors are gathered as :func:`_entry_factors` would for the whole block: from the full
    factors when it has at least as many entries as there are items."""
    rows, cols, vals = block.rows, block.cols, block.vals
    full = factors(global_msg, state) if rows.shape[0] >= global_msg.V.shape[1] else None
    e = np.empty(rows.shape[0])
    for lo in range(0, rows.shape[0], ENTRY_CHUNK):
        r, c = rows[lo:lo + ENTRY_CHUNK], cols[lo:lo + ENTRY_CHUNK]
        a, b = (full[0][r], full[1][:, c]) if full else _entry_factors(global_msg, state, r, c)
        e[lo:lo + ENTRY_CHUNK] = (np.einsum("ij,ij->i", a, np.ascontiguousarray(b.T))
                                  - vals[lo:lo + ENTRY_CHUNK])
    return e


def objective(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
              cfg: FedMCADMMConfig) -> float:
    """Tenant i's share of F: (1/p)[f_i(U_i, V) + R_i(U_i)] + R(V)/p (problem 1), in the
    tenant's rating units."""
    p, block = global_msg.n_clients, normalised(block, state.scale_unit)
    e = _entry_errors(global_msg, state.replace(scale_unit=1.0), block)
    if cfg.regulariser == "l1":
        r_u, r_v = cfg.lam * np.abs(state.U).sum(), cfg.gamma * np.abs(global_msg.V).sum()
    else:
        r_u = 0.5 * cfg.lam * float(np.sum(state.U**2))
        r_v = 0.5 * cfg.gamma * float(np.sum(global_msg.V**2))
    if cfg.item_bias and cfg.item_bias_ridge and global_msg.V.shape[0] > cfg.rank:
        r_v += 0.5 * cfg.item_bias_ridge / p * float(np.sum(global_msg.V[cfg.rank] ** 2))
    if cfg.lam_rating or cfg.gamma_rating:  # the weighted-lambda terms, part of f_i
        csr, ridge = block.csr, 0.5 * state.ridge_scale
        n_u = np.diff(csr.indptr).astype(float)
        items, part = block.compact  # n_j is 0 on the items the tenant did not rate
        n_j = np.bincount(part.cols, minlength=items.shape[0]).astype(float)
        r_u += ridge * cfg.lam_rating * float(n_u @ np.sum(state.U**2, axis=1))
        r_u += ridge * cfg.gamma_rating * float(n_j @ np.sum(global_msg.V[:, items]**2, axis=0))
    return float((0.5 * e @ e + r_u + r_v) / p)


ALGORITHM = Algorithm(
    name="fedmc-admm", config=FedMCADMMConfig, init_server=init_server,
    init_client=init_client, client_step=client_step, server_step=server_step,
    factors=factors, objective=objective, predict_entries=predict_entries,
    server_prepare=server_prepare, server_apply=server_apply,
    # every tenant every round: the weighted-lambda defaults converge in about 60 rounds so
    # (docs/benchmarks/scale_defaults.md); 10 a round needed several hundred
    run_defaults={"clients": 100, "per_round": 100, "rounds": 100})
