r"""Felb and Felb-MU: federated Boolean matrix factorisation by proximal gradients.

Dalleiger, Vreeken and Kamp, *Federated Binary Matrix Factorization using Proximal
Optimization* (the Felb paper): Algorithm 1, eqs. 3 and 6-10, settings of Appendix D.

Data. Tenant i holds a Boolean matrix A_i (m_i users x n items) as a :class:`RatingBlock`
listing its 1s (``vals`` are used as given, normally all 1); every entry not listed is 0.
The matrix is fully observed, as the paper treats binarised ratings (MovieLens: rating
>= 3.5 -> 1, any other rating and every unrated pair -> 0). Kernels touch only the listed
entries and k x k / k x n dense products; no dense m_i x n matrix is formed.

Objective of tenant i (eq. 4, with the 1/2 loss convention of the gradient steps)

.. math:: \tfrac12\|A_i - U_i V_i\|_F^2 + R(U_i) + R(V_i) + \tfrac{\gamma}{2}\|V_i-\hat V\|_F^2,

:math:`R(x) = \min\{\kappa|x| + \tfrac{\lambda}{2}x^2,\ \kappa|x-1| + \tfrac{\lambda}{2}(x-1)^2\}`
element-wise on the box [0, 1] (eq. 3; the lambda/2 scaling makes eq. 6 its exact prox).

One round t (one "iteration" of Appendix D). Client: V_i <- V_hat, then T local steps of
eq. 8 (a U step, then a V step; iPALM extrapolation x + beta (x - x_prev) before each)
with lambda_t = lambda 1.05^t; upload V_i. Server: V_hat <- prox_{kappa, lambda_t}(mean
V_i) as Algorithm 1, line 16 prints it (``server_prox='alg1'``, the default; 'eq10' takes
kappa/C and lambda_t/C, the exact minimiser of eq. 10, which pulls V_hat C times less
towards {0, 1} and loses F1 at MovieLens' and at the paper's size,
docs/benchmarks/felb_table1.md). Steps: Felb 1/L with L = ||V V^T||_2 resp.
||U^T U||_2; Felb-MU the Lee-Seung matrices U / (U V V^T) and V / (U^T U V). Prediction:
the Boolean product of U_i and V_hat rounded at 1/2 (see :func:`factors`).

Start. Algorithm 1, line 1 draws U_i and V_hat uniformly on [0, 1] (``start='uniform'``,
the default). Then ||V_hat V_hat^T||_2 is about n k / 4 for n items: 3e5 at MovieLens 25M's
59,047 items. The first U steps shrink U_i to about 0.01 (B(U_i) empty); Felb-MU's V step
size, and with it the proximity weight xi gamma of eq. 8 (about 400), grows as 1/|U_i|^2,
so V_i stays pinned to a V_hat that never leaves its random start, while Felb's Lipschitz
steps spend the rounds removing the start's mean, and F1 stays near 0 at the paper's size.
``start='scaled'`` (a deviation from the paper, opt-in) draws V_hat^0 uniformly on
[0, 1/sqrt(n)], a function of the public catalogue size only (no data):
||V_hat^0 V_hat^0^T||_2 is then about k/4 + 1/12 whatever n. U_i^0 stays uniform on
[0, 1]; every update rule is the paper's. It is not the default because on ML-1M (3,706
items, ~121 users per tenant) it loses to the uniform start; docs/benchmarks/felb_table1.md
has both measurements.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.messages import Message

_EPS = 1e-12
_MAX_LOG_GROWTH = 50.0  # lambda_t stops growing at lambda e^50: already fully Boolean


class FelbConfig(AlgorithmConfig):
    """Felb hyper-parameters; defaults are the paper's (Appendix D)."""

    rank: int = Field(20, ge=1)
    """k, the number of Boolean components."""
    kappa: float = Field(0.001, ge=0)
    """kappa, the l1 weight of the Elb regulariser (eq. 3)."""
    lam: float = Field(0.1, ge=0)
    """lambda, the initial l2 weight of the Elb regulariser (eq. 3)."""
    lambda_growth: float = Field(1.05, ge=1, le=2)
    """lambda_t = lambda * lambda_growth**t, t the communication round (Theorem 2)."""
    inertia: float = Field(0.001, ge=0, lt=1)
    """beta, the iPALM inertial parameter."""
    proximity: float = Field(1.0, ge=0)
    """gamma, the weight of the proximity penalty gamma/2 ||V_i - V_hat||^2 (eq. 7)."""
    local_steps: int = Field(10, ge=1)
    """T, local steps between synchronisations (the paper uses 1, 10 or 50)."""
    step: Literal["lipschitz", "mu"] = "lipschitz"
    """'lipschitz' (Felb) or 'mu' (Felb-MU, Lee-Seung multiplicative step sizes)."""
    start: Literal["uniform", "scaled"] = "uniform"
    """V_hat^0: 'uniform' on [0, 1] (Algorithm 1, line 1) or 'scaled' uniform on
    [0, 1/sqrt(n)] for n items (a deviation for large catalogues, see the module docstring)."""
    proximity_scale: Literal["absolute", "curvature"] = "absolute"
    """'absolute': gamma as given. 'curvature': gamma times ||U_i^T U_i||_2, the curvature
    of tenant i's squared loss in V_i, recomputed at every V step, so the proximity penalty
    weighs the same against the data term whatever the tenant's number of users and
    density (gamma is then a ratio, free of the data's scale; see :func:`local_steps`)."""
    server_prox: Literal["eq10", "alg1"] = "alg1"
    """The server's Elb prox of the mean upload: 'alg1' with kappa and lambda_t (Algorithm 1,
    line 16 as printed) or 'eq10' with kappa/C and lambda_t/C (the exact minimiser of eq. 10
    for C uploads); see :func:`server_step`."""


class FelbMUConfig(FelbConfig):
    """Felb-MU: Felb with Lee-Seung multiplicative step sizes."""

    step: Literal["lipschitz", "mu"] = "mu"
    """'mu' (Felb-MU, Lee-Seung multiplicative step sizes) or 'lipschitz' (Felb's)."""


@dataclasses.dataclass(frozen=True)
class FelbGlobal(Message):
    v_hat: np.ndarray  #: (k, n) relaxed shared coefficients in [0, 1]
    round: int  #: t of the next round (sets lambda_t)


@dataclasses.dataclass(frozen=True)
class FelbServer(Message):
    v_hat: np.ndarray
    round: int


@dataclasses.dataclass(frozen=True)
class FelbLocal(Message):
    user_rows: ClassVar[tuple[str, ...]] = ("u", "u_prev")
    u: np.ndarray  #: (m_i, k) relaxed U_i, never leaves the tenant
    u_prev: np.ndarray  #: U_i of the previous local step (iPALM inertia)


@dataclasses.dataclass(frozen=True)
class FelbUpload(Message):
    v: np.ndarray  #: (k, n) local V_i after T steps


# ----------------------------------------------------------------------------- maths

def elb_regulariser(x: np.ndarray, kappa, lam) -> np.ndarray:
    """R(x) of eq. 3, element-wise: the smaller of two elastic nets centred at 0 and 1."""
    return np.minimum(kappa * np.abs(x) + 0.5 * lam * x**2,
                      kappa * np.abs(x - 1) + 0.5 * lam * (x - 1) ** 2)


def elb_prox(x: np.ndarray, kappa, lam) -> np.ndarray:
    """argmin_y 1/2 (x - y)^2 + R(y) over y in [0, 1], element-wise (eq. 6).

    Eq. 6 is ``(x - kappa sign x) / (1 + lambda)`` for x <= 1/2 and
    ``(x - kappa sign(x-1) + lambda) / (1 + lambda)`` otherwise; the exact minimiser
    also soft-thresholds (no sign flip within kappa of the centre) and clips to the box.
    ``kappa`` and ``lam`` may be arrays (the Felb-MU element-wise steps).
    """
    # On the box both branches reduce to a shrinkage of the distance to the nearer centre:
    # x <= 1/2 -> max(x - kappa, 0) / (1 + lambda), x > 1/2 -> 1 - max(1 - x - kappa, 0) / (..)
    below = x <= 0.5
    q = np.maximum(np.minimum(x, 1.0 - x) - kappa, 0.0) / (1.0 + lam)
    return np.where(below, q, 1.0 - q)


def proximity_prox(v: np.ndarray, v_hat: np.ndarray, weight) -> np.ndarray:
    """argmin_y 1/2 ||v - y||^2 + weight/2 ||y - v_hat||^2 = (v + w v_hat)/(1 + w) (eq. 7)."""
    return (v + weight * v_hat) / (1.0 + weight)


def grown_lambda(lam: float, growth: float, t: int) -> float:
    """lambda_t = lambda * growth^t (Appendix D), capped at lambda e^50 (Boolean by then)."""
    return lam * math.exp(min(t * math.log(growth), _MAX_LOG_GROWTH))


def prox_grad_step(x, x_prev, gram, cross, kappa, lam, inertia, mu):
    """One iPALM proximal-gradient step on X for 1/2 ||A - X F||^2 + R(X) (eq. 8).

    ``gram`` = F F^T (k x k) and ``cross`` = A F^T, so the gradient at the extrapolated
    point Y = X + beta (X - X_prev) is ``Y gram - cross``. Returns (X_new, eta), eta the
    step: 1 / ||gram||_2 (Felb) or the Lee-Seung matrix Y / (Y gram) (Felb-MU).
    """
    y = x + inertia * (x - x_prev)
    if mu:  # Lee-Seung steps are only defined at a non-negative point
        y = np.maximum(y, 0.0)
    y_gram = y @ gram
    if mu:
        eta = y / np.maximum(y_gram, _EPS)
    else:
        eta = 1.0 / max(float(np.linalg.norm(gram, 2)), _EPS)
    return elb_prox(y - eta * (y_gram - cross), eta * kappa, eta * lam), eta


def local_steps(a, u, u_prev, v, v_hat, steps, kappa, lam, inertia, proximity, mu,
                curvature=False):
    """``steps`` alternating updates of eq. 8 from V_i = v; returns (U, U_prev, V).

    The V step works on V^T (the same kernel as U) and ends with the proximity prox
    towards ``v_hat`` with weight eta * gamma; ``proximity=0`` gives the plain Elbmf step.
    ``curvature`` takes gamma = ``proximity`` * ||U^T U||_2 at each V step: the squared
    loss grows with the tenant's rows, so a fixed gamma binds a small tenant and leaves a
    large one free (with Felb's step 1/||U^T U||_2 the weight eta * gamma is then exactly
    ``proximity``).
    ``a`` is the tenant's sparse matrix. Each step is :func:`prox_grad_step` (and
    :func:`proximity_prox`) computed by :func:`_fused_step`, block of rows by block of rows.
    """
    vt = np.ascontiguousarray(v.T)
    vt_prev, vht = vt, np.ascontiguousarray(v_hat.T)
    at = a.T.tocsr()  # A^T as CSR: A^T U by rows, twice as fast as the CSC view
    for _ in range(steps):
        u_new = _fused_step(u, u_prev, vt.T @ vt, a @ vt, kappa, lam, inertia, mu)
        u, u_prev = u_new, u
        gram = u.T @ u
        gamma = proximity * float(np.linalg.norm(gram, 2)) if curvature else proximity
        vt_new = _fused_step(vt, vt_prev, gram, at @ u, kappa, lam, inertia, mu, vht, gamma)
        vt, vt_prev = vt_new, vt
    return u, u_prev, np.ascontiguousarray(vt.T)


_ROWS = 2048  # rows per block of :func:`_fused_step`: a few 2048 x k arrays stay in cache


def _fused_step(x, x_prev, gram, cross, kappa, lam, inertia, mu, v_hat=None, proximity=0.0,
                rows: int | None = None) -> np.ndarray:
    """:func:`prox_grad_step`, then :func:`proximity_prox` towards ``v_hat`` with weight
    eta * ``proximity`` when ``proximity`` > 0, in the same floating-point operations.

    Rows are independent given ``gram``, so they are processed ``rows`` at a time with
    in-place operations: the dozen element-wise passes of the step then run on blocks
    that fit in the CPU cache instead of streaming n x k arrays through memory (about 3x
    faster for MovieLens 25M's 59k items, the paper-size run of the Felb Table 1 bench).
    """
    rows = rows or _ROWS
    out = np.empty_like(x)
    lip = None if mu else 1.0 / max(float(np.linalg.norm(gram, 2)), _EPS)
    for s in range(0, x.shape[0], rows):
        xs, o = x[s:s + rows], out[s:s + rows]
        y = np.subtract(xs, x_prev[s:s + rows])
        y *= inertia
        y += xs  # y = x + beta (x - x_prev)
        if mu:
            np.maximum(y, 0.0, out=y)
        z = y @ gram
        if mu:
            eta = np.maximum(z, _EPS)
            np.divide(y, eta, out=eta)  # eta = y / (y gram)
        else:
            eta = lip
        z -= cross[s:s + rows]
        z *= eta
        np.subtract(y, z, out=z)  # z = y - eta (y gram - cross); y is free from here
        # elb_prox(z, eta kappa, eta lam): q = max(min(z, 1 - z) - eta kappa, 0) / (1 + eta lam)
        np.subtract(1.0, z, out=y)
        np.minimum(z, y, out=y)
        y -= eta * kappa
        np.maximum(y, 0.0, out=y)
        y /= 1.0 + eta * lam
        np.subtract(1.0, y, out=o)
        np.copyto(o, y, where=z <= 0.5)
        if proximity:  # (o + w v_hat) / (1 + w), w = eta gamma
            w = eta * proximity
            o += w * v_hat[s:s + rows]
            o /= 1.0 + w
    return out


def squared_error(u: np.ndarray, v: np.ndarray, block: RatingBlock) -> float:
    """1/2 ||A - U V||_F^2 from the listed entries only: ||A||^2 - 2<A, UV> + <U'U, VV'>."""
    fitted = np.einsum("ij,ji->i", u[block.rows], v[:, block.cols])
    inner = float(block.vals @ fitted)
    return 0.5 * (float(block.vals @ block.vals) - 2.0 * inner + float(
        np.sum((u.T @ u) * (v @ v.T))))


def boolean(x: np.ndarray) -> np.ndarray:
    """A relaxed factor rounded at 1/2 (the final Boolean factors of Sec. 3)."""
    return np.asarray(x) >= 0.5


def boolean_product(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(U o V)_ij = OR_l (U_il AND V_lj) of Boolean factors, as a bool array."""
    return (u.astype(np.float64) @ v.astype(np.float64)) > 0.5


# --------------------------------------------------------------------- the contract

def init_server(n_items: int, n_clients: int, cfg: FelbConfig, rng: np.random.Generator):
    """V_hat^0 uniform on [0, 1] (Algorithm 1, line 1; ``start='uniform'``) or on
    [0, 1/sqrt(n_items)] (``start='scaled'``, a deviation, see the module docstring)."""
    high = 1.0 if cfg.start == "uniform" else 1.0 / math.sqrt(n_items)
    v_hat = rng.uniform(0.0, high, size=(cfg.rank, n_items))
    return FelbServer(v_hat, 0), FelbGlobal(v_hat, 0)


def init_client(block: RatingBlock, global_msg: FelbGlobal, cfg: FelbConfig,
                rng: np.random.Generator) -> FelbLocal:
    """U_i^0 uniform on [0, 1] (Algorithm 1, line 1)."""
    u = rng.uniform(0.0, 1.0, size=(block.n_users, cfg.rank))
    return FelbLocal(u, u.copy())


def client_step(global_msg: FelbGlobal, local: FelbLocal, block: RatingBlock,
                cfg: FelbConfig, rng: np.random.Generator):
    """V_i <- V_hat, T local steps of eq. 8 at lambda_t, upload V_i (Algorithm 1, 3-9)."""
    lam_t = grown_lambda(cfg.lam, cfg.lambda_growth, global_msg.round)
    u, u_prev, v = local_steps(block.csr, local.u, local.u_prev, global_msg.v_hat,
                               global_msg.v_hat, cfg.local_steps, cfg.kappa, lam_t,
                               cfg.inertia, cfg.proximity, cfg.step == "mu",
                               cfg.proximity_scale == "curvature")
    return FelbLocal(u, u_prev), FelbUpload(v)


def server_step(state: FelbServer, uploads, cfg: FelbConfig, rng: np.random.Generator):
    """V_hat <- prox_{eta kappa, eta lambda_t}(mean of the C uploaded V_i) (Sec. 3.2).

    The paper leaves the server's step eta_V_hat open; Algorithm 1, line 16 prints
    prox_{kappa, lambda}: ``server_prox='alg1'`` (the default) takes eta = 1 as printed.
    ``'eq10'`` takes eta = 1/C: argmin_Y sum_i 1/2 ||Y - V_i||^2 + R(Y) = argmin_Y C/2
    ||Y - mean||^2 + R(Y), the exact minimiser of eq. 10 with squared norms, whose pull of
    V_hat towards {0, 1} is C times weaker (the same rounding B(V_hat) of one V_hat, which
    only depends on the side of 1/2, but the next round starts from a less Boolean V_hat).
    No upload: V_hat is kept.
    """
    v_hat = state.v_hat
    if uploads:
        c = len(uploads)
        eta = 1.0 / c if cfg.server_prox == "eq10" else 1.0
        lam_t = grown_lambda(cfg.lam, cfg.lambda_growth, state.round)
        mean = np.mean(np.stack([uploads[i].v for i in sorted(uploads)]), axis=0)
        v_hat = elb_prox(mean, eta * cfg.kappa, eta * lam_t)
    return FelbServer(v_hat, state.round + 1), FelbGlobal(v_hat, state.round + 1)


def factors(global_msg: FelbGlobal, local: FelbLocal) -> tuple[np.ndarray, np.ndarray]:
    """A = [B(U_i), eps U_i], B = [B(V_hat); V_hat] with B() rounding at 1/2, eps = 1/(4k).

    ``A @ B`` is the number of Boolean components covering (t, j) plus eps times the
    relaxed score: >= 1 exactly where the Boolean product U_i o V_hat is 1 and < 1/4
    elsewhere (so rounding at 1/2, or clipping to [0, 1] and rounding, gives the Boolean
    product); the relaxed term only breaks ties when ranking.
    """
    k = local.u.shape[1]
    eps = 1.0 / (4.0 * k)
    a = np.hstack([boolean(local.u).astype(np.float64), eps * local.u])
    b = np.vstack([boolean(global_msg.v_hat).astype(np.float64), global_msg.v_hat])
    return a, b


def boolean_factors(global_msg: FelbGlobal, local: FelbLocal) -> tuple[np.ndarray, np.ndarray]:
    """(B(U_i), B(V_hat)): the final Boolean factors whose product :func:`factors` scores
    (for :func:`algorithms.binary_metrics.boolean_quality`)."""
    return boolean(local.u), boolean(global_msg.v_hat)


def objective(global_msg: FelbGlobal, local: FelbLocal, block: RatingBlock,
              cfg: FelbConfig) -> float:
    """1/2 ||A_i - U_i V_hat||_F^2 with the relaxed factors (regularisers left out: they
    grow with lambda_t by design, so they would hide progress of the fit)."""
    return squared_error(local.u, global_msg.v_hat, block)


def _algorithm(name: str, config: type[FelbConfig]) -> Algorithm:
    return Algorithm(name=name, config=config, init_server=init_server,
                     init_client=init_client, client_step=client_step,
                     server_step=server_step, factors=factors, objective=objective,
                     data_kind="binary")


ALGORITHM = _algorithm("felb", FelbConfig)
FELB_MU = _algorithm("felb-mu", FelbMUConfig)
ALGORITHMS = {"felb": ALGORITHM, "felb-mu": FELB_MU}
