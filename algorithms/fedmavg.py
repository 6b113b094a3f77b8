r"""FedMAvg: federated matrix factorisation by model averaging, for matrix completion.

Wang and Chang, "Federated matrix factorization: algorithm design and application to data
clustering" (the FedMAvg/FedMGS paper), Algorithm 1, eqs. (6)-(14), in the matrix-completion
form recalled in the FedMC-ADMM paper Sec. 5.2. In fedrec notation the paper's shared
W (M x K) is V^T (r x n items) and its local H_p is U_i^T (U_i: m_i users x r).

Tenant i minimises f_i(U_i, V) = 1/2 ||P_Omega_i(M_i - U_i V)||^2 + R_U(U_i) and the
federation adds R_V(V). Two forms of the ridge terms (``reg``):

``"plain"`` (the papers')
    R_U = lambda/2 ||U_i||^2, R_V = gamma/2 ||V||^2 (each tenant carries gamma/(2p) of it).
``"per_rating"`` (fedrec's default, weighted-lambda ridge)
    R_U = lambda/2 sum_t n_t ||u_t||^2 with n_t the ratings of user t, and
    R_V = gamma/2 sum_j n_j ||v_j||^2 with n_j the ratings of item j, which splits exactly
    over tenants by their local counts n_j^(i): scale-free, so one setting fits small and
    large tenants, and the tenant's share of the objective is exact.

Write Lam = diag(lambda weights of the rows of U_i) and Gam = diag(gamma weights of the
items). One round k:

* every running client takes Q1 gradient steps on U_i with V^k fixed (eq. 11)::

      U <- U - C^-1 (P_Omega(U V^k - M_i) (V^k)^T + Lam U),
      C = diag(c_t), c_t = c_factor lambda_max(V V^T) + Lam_t

* then Q2^k gradient steps on W_i, restarting from V^k every round (eq. 13)::

      W <- W - (s U^T P_Omega(U W - M_i) + W Gam) D^-1,
      D = diag(d_j), d_j = d_factor lambda_max(U^T U) + Gam_j

  with s = 1/p when ``scale_by_p`` (the formula of FedMC-ADMM paper Sec. 5.2) else 1 (the
  paper's d_i has no Gam term; it only matters when gamma is not negligible);
  Q2^k = floor(Q_hat / k) + 1 when ``q_hat`` is set (diminishing Q2, Sec. III-A);
* the server averages the uploaded W_i (eq. 9): V^{k+1} = (1/m) sum_{i in A^k} W_i.

Two ways of using m < p clients per round (Sec. III-A):

``participation="pcc"`` (partial client communication, the paper's scheme and default)
    Every tenant runs the local updates every round (the ``select`` hook returns all
    clients); only the m tenants of A^k upload. The server draws A^k uniformly without
    replacement and names it in the global message by *tickets*: each tenant draws a random
    64-bit ticket at initialisation and sends it with its uploads; in round 1 every tenant
    uploads (A^0 = all, Algorithm 1), so from then on the server knows every ticket and
    broadcasts the m tickets of A^k. A ticket is an opaque pseudonym of the client the
    server already sees transmitting, never rating data. m is ``uploads_per_round`` (the
    server step does not see the simulator's ``per_round``, which pcc ignores). Uniform
    sampling is the MC comparison's (FedMC-ADMM paper Sec. 5.2); Algorithm 1 samples with
    replacement by omega_p = N_p / N (see :mod:`algorithms.clustering`, which does).
``participation="pcp"`` (partial participation)
    Only the per-round sample S_k (the simulator's ``per_round``) runs and uploads.

Predictions: U_i V plus, when ``center`` is set, the tenant's own mean training rating mu_i
(kept locally and folded into the factors as a column of mu_i paired with a row of ones,
so the federated split is untouched). With ``bias`` (the default) U_i V also carries a
user bias b_u (a column of U_i: local, never uploaded) and an item bias b_i (a row of V:
item-side, stepped in W_i and averaged as V), by U_i = [U | b_u | 1], V = [V ; 1 ; b_i]
with the two ones held fixed; the biases take the same ridge as the factors.

fedrec's defaults differ from the paper's scheme in three places, each measured on the
synthetic and MovieLens sets against a tuned centralised ALS (scale_defaults in
docs/benchmarks/): ``curvature="local"`` bounds each user row's (item column's) step by
its own curvature, lambda_max over the items it rated (the users who rated it), not all of
V (U_i); ``aggregate="raters"`` averages each item's column over the tenants whose W_i
moved it (the plain mean shrinks a rarely rated item's step by the share of tenants that
did not rate it); and one W step a round (``q2=1``, ``d_factor=0.5``) with every tenant
uploading, since several local W steps per round make the averaged model drift.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal

import numpy as np
import scipy.sparse as sp
from pydantic import Field

from algorithms import config_fields as CF
from algorithms.base import Algorithm, AlgorithmConfig, default_select
from algorithms.block import RatingBlock
from algorithms.centralised import gram_sums
from algorithms.messages import Message
from algorithms.rng import sample_clients
from algorithms.scale import centre_of, normalised, rating_factors, ridge_scale_of, unit_of

#: the default fixed ridge on the item biases (see :attr:`FedMAvgConfig.item_bias_ridge`):
#: off, as FedMC-ADMM's
ITEM_BIAS_RIDGE = 0.0


class FedMAvgConfig(AlgorithmConfig):
    """FedMAvg hyper-parameters; defaults are fedrec's recommended setting."""

    rank: CF.FactorRank
    q1: int = Field(10, ge=1, description="Q1: gradient steps on U_i per round")
    q2: int = Field(1, ge=1, description="Q2: gradient steps on W_i per round (constant)")
    q_hat: int | None = Field(None, ge=0, description="diminishing Q2^k = floor(q_hat/k)+1")
    lam: CF.RidgeU = 0.085
    gamma: float = Field(0.085, ge=0, description="gamma: ridge weight on V (on W_i locally)")
    reg: CF.RidgeForm
    c_factor: float = Field(
        1.0, gt=0, description="U step 1/c_t, c_t = c_factor*lmax(V V^T)+lam_t")
    d_factor: float = Field(
        0.5, gt=0, description="W step 1/d_j, d_j = d_factor*lmax(U^T U)+gam_j")
    scale_by_p: bool = Field(False, description="divide the W data gradient by p (Sec. 5.2)")
    participation: Literal["pcc", "pcp"] = Field(
        "pcc", description="pcc: all update, m upload; pcp: only the sampled run")
    uploads_per_round: int = Field(100, ge=1, description="m: uploads per round under pcc")
    init: CF.FactorInit
    init_scale: CF.FactorInitScale
    center: CF.Center
    bias: bool = Field(True, description="user biases (local) and item biases (averaged as V)")
    item_bias_ridge: float = Field(
        ITEM_BIAS_RIDGE, ge=0, description="fixed l2 weight (not per rating) on the bias of "
        "each item a tenant rated, in its f_i, on top of the per-rating gamma; shrinks the "
        "bias of lightly-rated items (see FedMC-ADMM's item_bias_ridge)")
    aggregate: Literal["mean", "raters"] = Field(
        "raters", description="V^{k+1}: mean of all W_i, or per item of the W_i that moved")
    curvature: Literal["global", "local"] = Field(
        "local", description="step bound: lmax of all of V (U^T U), or of each row's own")

    #: ``fedrec tune``'s search space (:mod:`algorithms.tuning`)
    search_space: ClassVar[dict[str, tuple]] = {
        "rank": ("choice", [5, 10, 20]), "lam": ("log", 0.01, 1.0),
        "gamma": ("log", 0.01, 1.0)}


    @classmethod
    def paper_settings(cls, **overrides: object) -> FedMAvgConfig:
        """The FedMAvg baseline exactly as FedMC-ADMM paper Sec. 5.2 states it.

        Q1 = Q2 = 10, lambda = gamma = 1e-6, d_i = 5 lambda_max(U^T U), the W gradient
        divided by p, U and V drawn from Uniform[0, 1], no centring, all tenants update and
        10 upload (rank 5 is the paper's ML-1M rank). c^k is not given there: we use
        lambda_max(V V^T). ``overrides`` replace fields.
        """
        base = dict(rank=5, q1=10, q2=10, lam=1e-6, gamma=1e-6, reg="plain", c_factor=1.0,
                    d_factor=5.0, scale_by_p=True, participation="pcc", uploads_per_round=10,
                    init="uniform", init_scale=1.0, center=False, bias=False,
                    item_bias_ridge=0.0, aggregate="mean", curvature="global")
        return cls(**{**base, **overrides})


def paper_settings(rank: int = 5) -> FedMAvgConfig:
    """:meth:`FedMAvgConfig.paper_settings` at rank ``rank`` (kept for existing callers)."""
    return FedMAvgConfig.paper_settings(rank=rank)


# --------------------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True)
class FedMAvgGlobal(Message):
    """Broadcast of round k: V^k, the round index, p and the tickets of A^k (pcc)."""

    v: np.ndarray
    round: int
    n_clients: int
    pcc: bool  # partial client communication: every client runs, only A^k uploads
    upload_tickets: np.ndarray  # int64; empty: every running client uploads


@dataclasses.dataclass(frozen=True)
class FedMAvgServer(Message):
    """Server state: V^k, the round index and the last ticket of each client (0: unseen)."""

    v: np.ndarray
    round: int
    tickets: np.ndarray


@dataclasses.dataclass(frozen=True)
class FedMAvgLocal(Message):
    """Tenant state, never uploaded: U_i, its ticket and its mean training rating, in the
    tenant's rating units; ``scale_unit`` maps predictions back to the tenant's
    scale (:mod:`algorithms.scale`; the defaults are the identity of older states)."""

    user_rows: ClassVar[tuple[str, ...]] = ("u",)

    u: np.ndarray
    ticket: int
    mean: float
    scale_unit: float = 1.0


@dataclasses.dataclass(frozen=True)
class FedMAvgUpload(Message):
    """W_i after Q1 + Q2 local steps, and the tenant's ticket."""

    w: np.ndarray
    ticket: int


# --------------------------------------------------------------------------- pure maths


def draw_factor(shape: tuple[int, int], cfg: FedMAvgConfig,
                rng: np.random.Generator) -> np.ndarray:
    """An initial factor: N(0, init_scale^2) or Uniform[0, init_scale] entries."""
    if cfg.init == "normal":
        return rng.normal(0.0, cfg.init_scale, size=shape)
    return rng.uniform(0.0, cfg.init_scale, size=shape)


def residual_matrix(u: np.ndarray, v: np.ndarray, block: RatingBlock,
                    offset: float = 0.0) -> sp.csr_array:
    """P_Omega(U V + offset - M) as a CSR array with the pattern of ``block.csr``."""
    csr = block.csr
    rows = np.repeat(np.arange(block.n_users), np.diff(csr.indptr))
    pred = np.einsum("ij,ji->i", u[rows], v[:, csr.indices])
    return sp.csr_array((pred + offset - csr.data, csr.indices, csr.indptr), shape=block.shape)


def lambda_max(a: np.ndarray) -> float:
    """Largest eigenvalue of A^T A (0 for an empty A)."""
    if a.size == 0:
        return 0.0
    if not np.all(np.isfinite(a)):
        raise ValueError("factors are no longer finite: training diverged (with DP, the "
                         "noise overwhelmed the updates; raise the clip or lower the noise)")
    return float(np.linalg.eigvalsh(a.T @ a)[-1])


def penalties(block: RatingBlock, cfg) -> tuple[np.ndarray, np.ndarray]:
    """Ridge weights of the rows of U_i (m_i,) and of the items in W_i (n,).

    plain: lambda and gamma everywhere; per_rating: lambda n_t and gamma n_j^(i), times the
    tenant's ridge scale (its rating variance in units relative to MovieLens,
    :func:`algorithms.scale.ridge_scale_of`; ``block`` is in the tenant's units).
    """
    if cfg.reg == "plain":
        return np.full(block.n_users, cfg.lam), np.full(block.n_items, cfg.gamma)
    ridge = ridge_scale_of(block, 1.0)
    n_t = np.bincount(block.rows, minlength=block.n_users).astype(float)
    n_j = np.bincount(block.cols, minlength=block.n_items).astype(float)
    return ridge * cfg.lam * n_t, ridge * cfg.gamma * n_j


def item_penalties(block: RatingBlock, cfg, gamma_cols: np.ndarray, q: int) -> np.ndarray:
    """Ridge weights of W_i's entries: ``gamma_cols`` (n,) for every row, or, with bias
    terms and ``item_bias_ridge`` w, a (q, n) array whose item-bias row (the last) also
    has w on each item the tenant rated (a fixed weight per tenant and item, not per
    rating: an item rated once is shrunk as much as one rated by every user)."""
    w = getattr(cfg, "item_bias_ridge", 0.0)
    if not (getattr(cfg, "bias", False) and w):
        return gamma_cols
    out = np.repeat(gamma_cols[None, :], q, axis=0)
    out[-1] += w * (np.bincount(block.cols, minlength=block.n_items) > 0)
    return out


def row_curvature(other: np.ndarray, rows: np.ndarray, cols: np.ndarray, n_rows: int
                  ) -> np.ndarray:
    """lambda_max(sum_{t: rows[t] = a} o_t o_t^T) for every row a, o_t = other[:, cols[t]]:
    the curvature of row a's own squared-error term (0 for a row without ratings).

    Only the rows that have ratings are summed and decomposed: for the item side of a
    small tenant (a few users, a catalogue of thousands of items) the work follows its
    ratings, not the catalogue (each client step decomposed one matrix per item of the
    catalogue; 15 minutes were not enough for 100 default rounds on a 40,000-rating set
    of 4,659 items). A row with k < q ratings has a Gram matrix of rank at
    most k, whose nonzero eigenvalues are those of the k x k matrix of its ratings' inner
    products O^T O: k = 1 gives ||o||^2, k = 2 the larger root of a 2 x 2 matrix, and
    3 <= k < q a k x k decomposition (on sparse data most rows: one or two ratings of
    most items per tenant); rows with k >= q decompose their q x q Gram matrix as before.
    Each is lambda_max to rounding (a few ulps; the tests compare with the q x q
    decomposition at 1e-12)."""
    if not np.all(np.isfinite(other)):
        lambda_max(other)  # raises the divergence error
    out = np.zeros(n_rows)
    if rows.size == 0:
        return out
    q = other.shape[0]
    counts = np.bincount(rows, minlength=n_rows)
    primal = counts >= q
    if primal.any():  # q x q Gram matrices, summed in the order of the ratings
        keep = primal[rows]
        present, local = np.unique(rows[keep], return_inverse=True)
        gram = gram_sums(local, np.ascontiguousarray(other[:, cols[keep]].T), present.size)
        out[present] = np.linalg.eigvalsh(gram)[:, -1]
    if primal.all() or q < 2:
        return out
    order = np.argsort(rows, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    o = np.ascontiguousarray(other[:, cols[order]].T)  # (nnz, q), grouped by row
    for k in range(1, q):
        sel = np.flatnonzero(counts == k)
        if sel.size == 0:
            continue
        x = o[starts[sel][:, None] + np.arange(k)]  # (rows, k, q)
        if k == 1:
            out[sel] = np.einsum("ijc,ijc->i", x, x)
            continue
        dual = np.einsum("iac,ibc->iab", x, x)  # (rows, k, k) inner products
        if k == 2:  # larger root of [[a, b], [b, d]], both terms non-negative
            a, b, d = dual[:, 0, 0], dual[:, 0, 1], dual[:, 1, 1]
            out[sel] = 0.5 * (a + d) + np.hypot(0.5 * (a - d), b)
        else:
            out[sel] = np.linalg.eigvalsh(dual)[:, -1]
    return out


def u_steps(u: np.ndarray, v: np.ndarray, block: RatingBlock, steps: int,
            lam_rows: np.ndarray, c_factor: float, offset: float = 0.0,
            free: np.ndarray | None = None, local: bool = False) -> np.ndarray:
    """Q1 gradient steps on U with V fixed (eq. 11; FedMC-ADMM paper Sec. 5.2).

    U <- U - C^-1 (P_Omega(U V - M) V^T + Lam U), Lam = diag(lam_rows), with a step per
    user row, C = diag(c_t), c_t = c_factor lambda_max(V V^T) + Lam_t: the rows are
    independent terms and c_t bounds row t's curvature (with the papers' constant lambda
    every c_t is the same; with the per-rating ridge one heavy user no longer shrinks
    every other user's step). With ``local`` c_t uses row t's own curvature,
    lambda_max(sum_{j rated by t} v_j v_j^T), instead of all of V's (a user with 20 of
    1,500 items gets a step about as many times larger). ``free`` (0/1 per column of U)
    masks the gradient: a fixed column (the ones paired with the item biases) stays put.
    """
    vf = v if free is None else v * free[:, None]
    if local:
        c = c_factor * row_curvature(vf, block.rows, block.cols, block.n_users) + lam_rows
    else:
        c = c_factor * lambda_max(vf.T) + lam_rows
    if not np.any(c):
        return u.copy()
    c = np.where(c > 0, c, 1.0)[:, None]  # c_t = 0 only if V = 0 and Lam_t = 0: no step
    mask = 1.0 if free is None else free[None, :]
    vt = np.ascontiguousarray(v.T)  # scipy would copy v.T at every step
    for _ in range(steps):
        grad = residual_matrix(u, v, block, offset) @ vt + lam_rows[:, None] * u
        u = u - mask * grad / c
    return u


def w_steps(u: np.ndarray, v: np.ndarray, block: RatingBlock, steps: int,
            gamma_cols: np.ndarray, d_factor: float, scale: float, offset: float = 0.0,
            free: np.ndarray | None = None, local: bool = False) -> np.ndarray:
    """Q2 gradient steps on W_i starting from V^k with U fixed (eq. 13).

    W <- W - (scale U^T P_Omega(U W - M) + W Gam) D^-1, Gam = diag(gamma_cols), with a step
    per item column, D = diag(d_j), d_j = d_factor lambda_max(U^T U) + Gam_j (as for U);
    with ``local``, d_j = d_factor scale lambda_max(sum_{t rated j} u_t u_t^T) + Gam_j.
    ``gamma_cols`` may also be (q, n), a weight per entry of W (:func:`item_penalties`);
    then the step is per entry, d_cj = d_factor ... + Gam_cj, still a majoriser.
    ``free`` (0/1 per row of W) masks the gradient (the ones row paired with the user
    biases stays put).
    """
    uf = u if free is None else u * free[None, :]
    if local:
        d = d_factor * scale * row_curvature(uf.T, block.cols, block.rows, block.n_items)
        d = d + gamma_cols
    else:
        d = d_factor * lambda_max(uf) + gamma_cols
    w = v.copy()
    if not np.any(d):
        return w
    d = np.where(d > 0, d, 1.0)
    d = d[None, :] if d.ndim == 1 else d
    mask = 1.0 if free is None else free[:, None]
    for _ in range(steps):
        grad = scale * (residual_matrix(u, w, block, offset).T @ u).T + w * gamma_cols
        w = w - mask * grad / d
    return w


def bias_masks(cfg) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The free columns of U_i and free rows of V with bias terms, else (None, None).

    With ``bias`` U_i is [U | b_u | 1] and V is [V ; 1 ; b_i] (rank + 2), so U_i V is
    U V + b_u + b_i: b_u is a column of the tenant's U_i (local, as U_i), b_i a row of V
    (item-side, averaged as V); the two ones stay fixed.
    """
    if not getattr(cfg, "bias", False):
        return None, None
    ones = np.ones(cfg.rank)
    return np.r_[ones, 1.0, 0.0], np.r_[ones, 0.0, 1.0]


def q2_schedule(round_: int, cfg: FedMAvgConfig) -> int:
    """Q2^k: constant ``q2``, or floor(q_hat / k) + 1 when ``q_hat`` is set (Sec. III-A)."""
    if cfg.q_hat is None:
        return cfg.q2
    return cfg.q_hat // max(round_, 1) + 1


def average(ws: list[np.ndarray]) -> np.ndarray:
    """Model averaging (eq. 9): the plain mean of the uploaded W_i."""
    return np.mean(np.stack(ws), axis=0)


def average_raters(ws: list[np.ndarray], v: np.ndarray) -> np.ndarray:
    """Per item, the mean of the uploaded columns W_i[:, j] that differ from V^k[:, j] (the
    tenants that rated j: without ratings of j a tenant's column has no gradient and comes
    back unchanged); V^k[:, j] where none moved. The server sees which columns moved in
    the W_i themselves, so this uses nothing beyond eq. 9's uploads; the plain mean
    instead shrinks each item's step by the share of tenants that did not rate it.

    One upload at a time, adding only its moved columns (in upload order, as a sum over
    the stacked uploads would: the same numbers), so no uploads x rank x items array is
    formed (192 MB for 100 uploads of a 20,000-item catalogue at rank 10)."""
    total = np.zeros(v.shape)
    count = np.zeros(v.shape[1], dtype=np.int64)
    for w in ws:
        moved = np.flatnonzero(np.any(w != v, axis=0))
        total[:, moved] += w[:, moved]
        count[moved] += 1
    return np.where(count > 0, total / np.maximum(count, 1), v)


def local_objective(u: np.ndarray, v: np.ndarray, block: RatingBlock, cfg,
                    n_clients: int, offset: float = 0.0) -> float:
    """Tenant i's share of the training objective: f_i(U_i, V) + its part of R_V(V).

    plain: gamma/(2p) ||V||^2; per_rating: gamma/2 sum_j n_j^(i) ||v_j||^2 (with bias
    terms the fixed ones are not penalised, the biases are, as the factors). Per rating,
    every term of an item the tenant did not rate is 0, so only its rated items are
    evaluated when they are fewer than its ratings (an evaluation of 100 tenants of a
    20,000-item catalogue made 100 passes over all of V).
    """
    if cfg.reg == "per_rating" and block.nnz < block.n_items:
        items, block = block.compact
        v = v[:, items]
    res = residual_matrix(u, v, block, offset).data
    lam_rows, gamma_cols = penalties(block, cfg)
    u_free, v_free = bias_masks(cfg)
    r_b = 0.0
    if u_free is not None and u.shape[1] == u_free.size:  # factors with the bias terms
        u, v = u * u_free[None, :], v * v_free[:, None]
        fixed = item_penalties(block, cfg, np.zeros(block.n_items), v.shape[0])
        r_b = float(np.sum(fixed * v * v))  # the item-bias ridge (0 without it)
    v_sq = np.sum(v * v, axis=0)
    r_v = cfg.gamma * v_sq.sum() / n_clients if cfg.reg == "plain" else gamma_cols @ v_sq
    return float(0.5 * res @ res + 0.5 * lam_rows @ np.sum(u * u, axis=1) + 0.5 * (r_v + r_b))


# --------------------------------------------------------------------------- the steps


def init_server(n_items: int, n_clients: int, cfg: FedMAvgConfig,
                rng: np.random.Generator) -> tuple[FedMAvgServer, FedMAvgGlobal]:
    """V^0 drawn on the server; no ticket known yet, so round 1 has everybody upload."""
    v = draw_factor((cfg.rank, n_items), cfg, rng)
    if cfg.bias:
        v = np.vstack([v, np.ones((1, n_items)), np.zeros((1, n_items))])
    server = FedMAvgServer(v, 0, np.zeros(n_clients, dtype=np.int64))
    pcc = cfg.participation == "pcc"
    return server, FedMAvgGlobal(v, 0, n_clients, pcc, np.zeros(0, dtype=np.int64))


def init_client(block: RatingBlock, global_msg: FedMAvgGlobal, cfg: FedMAvgConfig,
                rng: np.random.Generator) -> FedMAvgLocal:
    """U_i^0, a random non-zero ticket and the local mean rating (0 without centring)."""
    u = draw_factor((block.n_users, cfg.rank), cfg, rng)
    if cfg.bias:
        u = np.hstack([u, np.zeros((block.n_users, 1)), np.ones((block.n_users, 1))])
    ticket = int(rng.integers(1, 2**62))
    unit = unit_of(block)
    block = normalised(block, unit)
    mean = centre_of(block, unit) if cfg.center else 0.0
    return FedMAvgLocal(u, ticket, mean, unit)


def client_step(global_msg: FedMAvgGlobal, local: FedMAvgLocal, block: RatingBlock,
                cfg: FedMAvgConfig, rng: np.random.Generator
                ) -> tuple[FedMAvgLocal, FedMAvgUpload | None]:
    """Q1 steps on U_i, then (if this tenant uploads) Q2^k steps on W_i from V^k, on the
    ratings in the tenant's units."""
    v, offset, block = global_msg.v, local.mean, normalised(block, local.scale_unit)
    u_free, v_free = bias_masks(cfg)
    local_curv = cfg.curvature == "local"
    # with per-item curvature and the per-rating ridge an unrated item's column has no
    # gradient, no ridge and no step (W_i keeps V^k there): the steps run on the rated
    # items only (the same numbers), and the work follows the tenant's ratings
    rated_only = local_curv and cfg.reg == "per_rating"
    items, part = block.compact if rated_only else (None, block)
    v_part = v[:, items] if rated_only else v
    lam_rows, gamma_cols = penalties(part, cfg)
    u = u_steps(local.u, v_part, part, cfg.q1, lam_rows, cfg.c_factor, offset, u_free,
                local_curv)
    new_local = local.replace(u=u)
    tickets = global_msg.upload_tickets
    if tickets.size and local.ticket not in tickets:
        return new_local, None  # pcc: W_i restarts from V^{k+1} next round, unseen
    scale = 1.0 / global_msg.n_clients if cfg.scale_by_p else 1.0
    q2 = q2_schedule(global_msg.round + 1, cfg)
    gamma_w = item_penalties(part, cfg, gamma_cols, v.shape[0])
    w = w_steps(u, v_part, part, q2, gamma_w, cfg.d_factor, scale, offset, v_free, local_curv)
    if rated_only:
        w, w_part = v.copy(), w
        w[:, items] = w_part
    return new_local, FedMAvgUpload(w, local.ticket)


def choose_uploaders(tickets: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """A^k for pcc: the tickets of m clients drawn uniformly without replacement.

    Empty (everybody uploads) while some ticket is unknown or when m >= p.
    """
    if np.any(tickets == 0) or m >= tickets.size:
        return np.zeros(0, dtype=np.int64)
    return np.sort(tickets[sample_clients(rng, tickets.size, m)])


def server_step(server: FedMAvgServer, uploads: Mapping[int, FedMAvgUpload],
                cfg: FedMAvgConfig, rng: np.random.Generator
                ) -> tuple[FedMAvgServer, FedMAvgGlobal]:
    """V^{k+1} = mean of the uploaded W_i (eq. 9); under pcc also draw A^{k+1}."""
    tickets = server.tickets.copy()
    for i, up in uploads.items():
        tickets[i] = up.ticket
    ws = [uploads[i].w for i in sorted(uploads)]
    if not ws:
        v = server.v
    elif cfg.aggregate == "raters":
        v = average_raters(ws, server.v)
    else:
        v = average(ws)
    pcc = cfg.participation == "pcc"
    chosen = np.zeros(0, dtype=np.int64)
    if pcc:
        chosen = choose_uploaders(tickets, cfg.uploads_per_round, rng)
    k = server.round + 1
    return FedMAvgServer(v, k, tickets), FedMAvgGlobal(v, k, tickets.size, pcc, chosen)


def select(global_msg: FedMAvgGlobal, n_clients: int, per_round: int,
           rng: np.random.Generator) -> np.ndarray:
    """Who runs ``client_step``: everybody under pcc, else S_k uniform without replacement.

    The participation mode is read from the global message: pcc broadcasts tickets (or,
    before every ticket is known, nobody is excluded), so all clients run.
    """
    return np.arange(n_clients) if global_msg.pcc else default_select(
        global_msg, n_clients, per_round, rng)


def mean_offset_factors(u: np.ndarray, mean: float, v: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B = U V + mean: the mean as a column of A and a row of ones in B."""
    return (np.hstack([u, np.full((u.shape[0], 1), mean)]),
            np.vstack([v, np.ones((1, v.shape[1]))]))


def factors(global_msg: FedMAvgGlobal, local: FedMAvgLocal) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B = U_i V + mu_i, mapped to the tenant's rating scale."""
    a, b = mean_offset_factors(local.u, local.mean, global_msg.v)
    return rating_factors(a, b, local.scale_unit)


def predict_entries(global_msg: FedMAvgGlobal, local: FedMAvgLocal, rows: np.ndarray,
                    cols: np.ndarray) -> np.ndarray:
    """``(A @ B)[rows, cols]`` of :func:`factors` from the entries' rows and columns only:
    the same numbers as the product of the gathered full factors, without building the
    catalogue-sized B per tenant (when there are fewer entries than items)."""
    if rows.shape[0] >= global_msg.v.shape[1]:
        a, b = factors(global_msg, local)
        return np.einsum("ij,ji->i", a[rows], b[:, cols])
    a, b = mean_offset_factors(local.u[rows], local.mean, global_msg.v[:, cols])
    a, b = rating_factors(a, b, local.scale_unit)
    return np.einsum("ij,ji->i", a, b)


def objective(global_msg: FedMAvgGlobal, local: FedMAvgLocal, block: RatingBlock,
              cfg: FedMAvgConfig) -> float:
    """Tenant i's share: 1/2 ||P(M_i - U_i V - mu_i)||^2 + R_U(U_i) + its part of R_V(V),
    in the tenant's rating units."""
    block = normalised(block, local.scale_unit)
    return local_objective(local.u, global_msg.v, block, cfg, global_msg.n_clients,
                           local.mean)


ALGORITHM = Algorithm(
    name="fedmavg", config=FedMAvgConfig, init_server=init_server, init_client=init_client,
    client_step=client_step, server_step=server_step, factors=factors, objective=objective,
    select=select, predict_entries=predict_entries)
