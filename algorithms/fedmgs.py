r"""FedMGS: federated matrix factorisation by gradient sharing. NOT privacy-preserving.

Wang and Chang (the FedMAvg/FedMGS paper), Algorithm 2, eqs. (28)-(32). The gradient of the
squared loss in the shared factor is linear in per-client sufficient statistics (eq. 29), so
the clients send those statistics and the server rebuilds grad_V exactly and runs Q2
gradient steps on V itself.

Fully observed form (the paper's clustering model): client p sends H_p H_p^T and
X_p H_p^T (eq. 31), see :func:`full_statistics`. Matrix-completion form (fedrec notation,
V = W^T of r x n, U_i = H_p^T): with missing entries the gradient of
F(U, V) = sum_i 1/2 ||P_Omega_i(M_i - U_i V)||^2 + lambda/2 sum_i ||U_i||^2 + gamma/2 ||V||^2
in column v_j is ``G_j v_j - b_j + gamma v_j`` with, for every item j,

    G_j = sum_{t rated j} u_t u_t^T   (r x r)        b_j = sum_{t rated j} u_t m_tj   (r)

summed over every tenant's users (:func:`item_statistics`). With the per-rating ridge
(``reg="per_rating"``, see :mod:`algorithms.fedmavg`) the term gamma n_j v_j is folded
into the statistics: each tenant adds gamma n_j^(i) I to its G_j, and the server adds no
gamma v_j of its own. A sampled tenant takes Q1
gradient steps on U_i with V^k fixed (eq. 28, the same step as FedMAvg's eq. 11) and
uploads the *change* of its statistics since its last upload; the server keeps the running
sums G^s = G^{s-1} + sum_{i in A^s} (stats_i^s - stats_i^{s-1}) exactly as Algorithm 2 does,
then takes Q2 steps V <- V - grad_V / d with d = d_factor (max_j lambda_max(G_j) + gamma)
(eq. 32), or solves each column exactly when ``server_solver="exact"``.
Clients not sampled are inactive (partial participation, PCP). Round 1 runs every tenant
(``full_first_round``) so the server starts from the statistics of all data, as Algorithm
2's G_1^0, G_2^0 do.

Privacy warning: the upload covers all n items, zeros for the items a tenant did not rate,
so the zero pattern reveals which items were rated, and from G_j and b_j of an item rated
by one user the server reads m_tj = u_t^T b_j / ||u_t||^2 with u_t from G_j. Ratings are
recoverable (FedMC-ADMM paper Sec. 5 refuses to compare against FedMGS for this reason). The
method is in fedrec for comparison and for the privacy audit; its Algorithm is flagged
``privacy_preserving=False`` and so is its config (``privacy_preserving`` field, fixed).
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
from algorithms.fedmavg import (
    draw_factor,
    local_objective,
    mean_offset_factors,
    penalties,
    u_steps,
)
from algorithms.messages import Message
from algorithms.scale import centre_of, normalised, rating_factors, unit_of


class FedMGSConfig(AlgorithmConfig):
    """FedMGS hyper-parameters; defaults are fedrec's recommended setting."""

    rank: CF.FactorRank
    q1: int = Field(10, ge=1, description="Q1: gradient steps on U_i per round (client)")
    q2: int = Field(10, ge=1, description="Q2: gradient steps on V per round (server)")
    lam: CF.RidgeU = 0.1
    gamma: float = Field(0.1, ge=0, description="gamma: ridge weight on V")
    reg: CF.RidgeForm
    c_factor: float = Field(1.0, gt=0, description="U step 1/c, c = c_factor*lmax(VV^T)+lam")
    d_factor: float = Field(1.0, gt=0, description="V step 1/d, d = d_factor*(L_V + gamma)")
    server_solver: Literal["gd", "exact"] = Field(
        "gd", description="gd: Q2 gradient steps (eq. 32); exact: solve each column of V")
    full_first_round: bool = Field(True, description="round 1 runs every tenant (G^0 of Alg. 2)")
    init: CF.FactorInit
    init_scale: CF.FactorInitScale
    center: CF.Center
    privacy_preserving: Literal[False] = Field(
        False, description="always false: uploads reveal ratings (informational)")

    @classmethod
    def paper_settings(cls, **overrides: object) -> FedMGSConfig:
        """FedMGS in the form of the papers' matrix-completion baseline (FedMC-ADMM paper
        Sec. 5.2, as :meth:`FedMAvgConfig.paper_settings`): rank 5, Q1 = Q2 = 10, plain
        ridge lambda = gamma = 1e-6, U and V from Uniform[0, 1], no centring; the paper
        (Algorithm 2) gives no matrix-completion values of its own. ``overrides`` replace
        fields."""
        base = dict(rank=5, q1=10, q2=10, lam=1e-6, gamma=1e-6, reg="plain", init="uniform",
                    init_scale=1.0, center=False)
        return cls(**{**base, **overrides})


# --------------------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True)
class FedMGSGlobal(Message):
    """Broadcast of round k: V^k, the round index, p and whether every tenant runs."""

    v: np.ndarray
    round: int
    n_clients: int
    run_all: bool


@dataclasses.dataclass(frozen=True)
class FedMGSServer(Message):
    """Server state: V^k and the running sums of the statistics (G: n x r x r, B: n x r)."""

    v: np.ndarray
    round: int
    n_clients: int
    gram: np.ndarray
    cross: np.ndarray


@dataclasses.dataclass(frozen=True)
class FedMGSLocal(Message):
    """Tenant state: U_i, the U_i whose statistics the server holds (if sent), mu_i (in the
    tenant's rating units) and the unit back to the tenant's scale (:mod:`algorithms.scale`)."""

    user_rows: ClassVar[tuple[str, ...]] = ("u", "u_sent")

    u: np.ndarray
    u_sent: np.ndarray
    sent: bool
    mean: float
    scale_unit: float = 1.0


@dataclasses.dataclass(frozen=True)
class FedMGSUpload(Message):
    """Change of the per-item statistics since the last upload (all n items)."""

    gram: np.ndarray
    cross: np.ndarray


# --------------------------------------------------------------------------- pure maths


def item_statistics(u: np.ndarray, block: RatingBlock, offset: float = 0.0,
                    gamma_cols: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per item j: G_j = sum_t u_t u_t^T (n, r, r) and b_j = sum_t u_t (m_tj - offset) (n, r).

    Sums run over the users t of ``block`` who rated j; unrated items get zeros.
    ``gamma_cols`` (n,), if given, is added to the diagonal of each G_j.
    """
    r, e = u.shape[1], block.nnz
    ur = u[block.rows]
    by_item = sp.csr_array((np.ones(e), (block.cols, np.arange(e))), shape=(block.n_items, e))
    gram = (by_item @ (ur[:, :, None] * ur[:, None, :]).reshape(e, r * r)).reshape(-1, r, r)
    if gamma_cols is not None:
        gram = gram + gamma_cols[:, None, None] * np.eye(r)
    cross = by_item @ (ur * (block.vals - offset)[:, None])
    return gram, cross


def full_statistics(x: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fully observed form (eq. 31): H_p H_p^T (K x K) and X_p H_p^T (M x K)."""
    return h @ h.T, x @ h.T


def grad_v(v: np.ndarray, gram: np.ndarray, cross: np.ndarray, gamma: float) -> np.ndarray:
    """grad_V F = [G_j v_j - b_j + gamma v_j]_j, the centralised gradient (eq. 29)."""
    return np.einsum("jab,bj->aj", gram, v) - cross.T + gamma * v


def server_gd(v: np.ndarray, gram: np.ndarray, cross: np.ndarray, gamma: float,
              steps: int, d_factor: float) -> np.ndarray:
    """Q2 gradient steps on V (eq. 32), step 1/d with d = d_factor (max_j lmax(G_j) + gamma)."""
    if not np.all(np.isfinite(gram)):
        raise ValueError("aggregated statistics are no longer finite: training diverged")
    top = float(np.linalg.eigvalsh(gram)[:, -1].max()) if gram.shape[0] else 0.0
    d = d_factor * (top + gamma)
    if d == 0.0:
        return v.copy()
    for _ in range(steps):
        v = v - grad_v(v, gram, cross, gamma) / d
    return v


def server_exact(v: np.ndarray, gram: np.ndarray, cross: np.ndarray, gamma: float
                 ) -> np.ndarray:
    """The minimiser over V: v_j = (G_j + gamma I)^{-1} b_j.

    Columns whose system is zero (an item nobody rated, with gamma = 0) keep their value.
    """
    a = gram + gamma * np.eye(gram.shape[1])
    ok = np.abs(a).sum(axis=(1, 2)) > 0
    out = v.copy()
    out[:, ok] = np.linalg.solve(a[ok], cross[ok][:, :, None])[:, :, 0].T
    return out


# --------------------------------------------------------------------------- the steps


def init_server(n_items: int, n_clients: int, cfg: FedMGSConfig,
                rng: np.random.Generator) -> tuple[FedMGSServer, FedMGSGlobal]:
    """V^0 drawn on the server; empty statistics."""
    v = draw_factor((cfg.rank, n_items), cfg, rng)
    gram = np.zeros((n_items, cfg.rank, cfg.rank))
    server = FedMGSServer(v, 0, n_clients, gram, np.zeros((n_items, cfg.rank)))
    return server, FedMGSGlobal(v, 0, n_clients, cfg.full_first_round)


def init_client(block: RatingBlock, global_msg: FedMGSGlobal, cfg: FedMGSConfig,
                rng: np.random.Generator) -> FedMGSLocal:
    """U_i^0 and the local mean rating (0 without centring); nothing sent yet."""
    u = draw_factor((block.n_users, cfg.rank), cfg, rng)
    unit = unit_of(block)
    block = normalised(block, unit)
    mean = centre_of(block, unit) if cfg.center else 0.0
    return FedMGSLocal(u, np.zeros_like(u), False, mean, unit)


def client_step(global_msg: FedMGSGlobal, local: FedMGSLocal, block: RatingBlock,
                cfg: FedMGSConfig, rng: np.random.Generator
                ) -> tuple[FedMGSLocal, FedMGSUpload]:
    """Q1 steps on U_i (eq. 28), then the change of the statistics of eq. 29/31, on the
    ratings in the tenant's units."""
    block = normalised(block, local.scale_unit)
    lam_rows, gamma_cols = penalties(block, cfg)
    u = u_steps(local.u, global_msg.v, block, cfg.q1, lam_rows, cfg.c_factor, local.mean)
    folded = gamma_cols if cfg.reg == "per_rating" else None
    g_new, b_new = item_statistics(u, block, local.mean, folded)
    g_old, b_old = item_statistics(local.u_sent, block, local.mean,
                                   folded if local.sent else None)
    new_local = local.replace(u=u, u_sent=u, sent=True)
    return new_local, FedMGSUpload(g_new - g_old, b_new - b_old)


def server_step(server: FedMGSServer, uploads: Mapping[int, FedMGSUpload],
                cfg: FedMGSConfig, rng: np.random.Generator
                ) -> tuple[FedMGSServer, FedMGSGlobal]:
    """Update the running sums, then Q2 gradient steps on V (or the exact solve)."""
    gram, cross = server.gram.copy(), server.cross.copy()
    for i in sorted(uploads):
        gram += uploads[i].gram
        cross += uploads[i].cross
    gamma = cfg.gamma if cfg.reg == "plain" else 0.0  # per_rating: already in the G_j
    if cfg.server_solver == "exact":
        v = server_exact(server.v, gram, cross, gamma)
    else:
        v = server_gd(server.v, gram, cross, gamma, cfg.q2, cfg.d_factor)
    k, p = server.round + 1, server.n_clients
    return FedMGSServer(v, k, p, gram, cross), FedMGSGlobal(v, k, p, False)


def select(global_msg: FedMGSGlobal, n_clients: int, per_round: int,
           rng: np.random.Generator) -> np.ndarray:
    """Every tenant in round 1 if so configured (Alg. 2's G^0), then S_k uniformly (PCP)."""
    if global_msg.run_all:
        return np.arange(n_clients)
    return default_select(global_msg, n_clients, per_round, rng)


def factors(global_msg: FedMGSGlobal, local: FedMGSLocal) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) with A @ B = U_i V + mu_i, mapped to the tenant's rating scale."""
    a, b = mean_offset_factors(local.u, local.mean, global_msg.v)
    return rating_factors(a, b, local.scale_unit)


def objective(global_msg: FedMGSGlobal, local: FedMGSLocal, block: RatingBlock,
              cfg: FedMGSConfig) -> float:
    """Tenant i's share: 1/2 ||P(M_i - U_i V - mu_i)||^2 + R_U(U_i) + its part of R_V(V)."""
    block = normalised(block, local.scale_unit)
    return local_objective(local.u, global_msg.v, block, cfg, global_msg.n_clients,
                           local.mean)


ALGORITHM = Algorithm(
    name="fedmgs", config=FedMGSConfig, init_server=init_server, init_client=init_client,
    client_step=client_step, server_step=server_step, factors=factors, objective=objective,
    select=select, privacy_preserving=False)
