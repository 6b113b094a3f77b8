"""The aggregated-BMF baseline of Felb (the Felb paper, Sec. 4, eqs. 11-13, Apx. B Alg. 2).

Every tenant factorises its Boolean matrix alone with Elbmf (the relaxed Elb machinery of
:mod:`algorithms.felb` without the proximity term: ``local_iters`` proximal-gradient steps
with lambda_t = lambda growth^t, Appendix D's Elbmf settings) and uploads its coefficient
matrix rounded at 1/2. The server combines the Boolean V_i once by rounded average (eq. 11),
majority vote (eq. 12) or logical OR (eq. 13). Afterwards each tenant refits its U_i against
the fixed aggregate (``refit_iters`` U steps) and uploads nothing more.

Round 1: fit and upload; server aggregates. Round 2 onwards: refit only.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.felb import (
    boolean,
    grown_lambda,
    local_steps,
    prox_grad_step,
    squared_error,
)
from algorithms.messages import Message


class BinaryBaselineConfig(AlgorithmConfig):
    """Local Elbmf + one aggregation; defaults are the paper's Elbmf settings (Apx. D)."""

    rank: int = Field(20, ge=1)
    """k, the number of Boolean components."""
    kappa: float = Field(0.01, ge=0)
    """kappa of the Elb regulariser."""
    lam: float = Field(0.01, ge=0)
    """initial lambda of the Elb regulariser."""
    lambda_growth: float = Field(1.02, ge=1, le=2)
    """lambda_t = lambda growth^t, t the local iteration."""
    inertia: float = Field(0.01, ge=0, lt=1)
    """iPALM inertial parameter."""
    local_iters: int = Field(1000, ge=1)
    """Elbmf iterations of the local fit (the paper's 1000)."""
    refit_iters: int = Field(100, ge=0)
    """U steps against the aggregate in each later round."""
    step: Literal["lipschitz", "mu"] = "lipschitz"
    """step sizes of the local fit: Lipschitz (Elbmf) or Lee-Seung."""
    aggregation: Literal["average", "vote", "or"] = "vote"
    """eq. 11 (rounded average), eq. 12 (majority vote) or eq. 13 (logical OR)."""


@dataclasses.dataclass(frozen=True)
class BaselineGlobal(Message):
    v_hat: np.ndarray  #: (k, n) aggregated Boolean coefficients as 0.0 / 1.0
    aggregated: bool  #: False until the server has combined the local fits


@dataclasses.dataclass(frozen=True)
class BaselineServer(Message):
    v_hat: np.ndarray
    aggregated: bool


@dataclasses.dataclass(frozen=True)
class BaselineLocal(Message):
    user_rows: ClassVar[tuple[str, ...]] = ("u",)
    u: np.ndarray  #: (m_i, k) relaxed U_i
    v: np.ndarray  #: (k, n) relaxed local V_i (the local model before aggregation)
    fitted: bool


@dataclasses.dataclass(frozen=True)
class BaselineUpload(Message):
    v: np.ndarray  #: (k, n) local V_i rounded at 1/2, as 0.0 / 1.0


# ----------------------------------------------------------------------- aggregations

def rounded_average(vs: np.ndarray) -> np.ndarray:
    """Eq. 11: round(mean_c V^c), numpy's rounding (a tie, mean exactly 1/2, goes to 0)."""
    return np.rint(np.mean(vs, axis=0)) >= 1.0


def majority_vote(vs: np.ndarray) -> np.ndarray:
    """Eq. 12: [sum_c V^c_ij >= C / 2]_ij (a tie goes to 1)."""
    return np.sum(vs, axis=0) >= vs.shape[0] / 2.0


def logical_or(vs: np.ndarray) -> np.ndarray:
    """Eq. 13: V^1 OR ... OR V^C."""
    return np.any(vs, axis=0)


AGGREGATIONS = {"average": rounded_average, "vote": majority_vote, "or": logical_or}


def aggregate(vs: np.ndarray, how: str) -> np.ndarray:
    """The Boolean aggregate of a (C, k, n) stack; uploads are read as Boolean at 1/2
    (so noise added by a privacy wrapper cannot turn a 0 into a 1 by being non-zero)."""
    return AGGREGATIONS[how](boolean(vs))


# ---------------------------------------------------------------------- local fitting

def elbmf(a, u: np.ndarray, v: np.ndarray, cfg: BinaryBaselineConfig
          ) -> tuple[np.ndarray, np.ndarray]:
    """Elbmf (Dalleiger and Vreeken 2022) on one tenant: ``local_iters`` iPALM steps of
    eq. 8 without proximity, lambda_t = lambda growth^t. Returns relaxed (U, V)."""
    u_prev, mu = u, cfg.step == "mu"
    for t in range(cfg.local_iters):
        lam_t = grown_lambda(cfg.lam, cfg.lambda_growth, t)
        u, u_prev, v = local_steps(a, u, u_prev, v, v, 1, cfg.kappa, lam_t, cfg.inertia,
                                   0.0, mu)
    return u, v


def refit_u(a, u: np.ndarray, v_hat: np.ndarray, cfg: BinaryBaselineConfig) -> np.ndarray:
    """``refit_iters`` proximal-gradient U steps for 1/2||A - U V_hat||^2 + R(U), V_hat fixed
    (Alg. 2, lines 9-11: the tenant adopts the aggregate and re-estimates its features)."""
    gram, cross = v_hat @ v_hat.T, a @ v_hat.T
    u_prev = u
    for t in range(cfg.refit_iters):
        lam_t = grown_lambda(cfg.lam, cfg.lambda_growth, t)
        u_new, _ = prox_grad_step(u, u_prev, gram, cross, cfg.kappa, lam_t, cfg.inertia,
                                  cfg.step == "mu")
        u, u_prev = u_new, u
    return u


# --------------------------------------------------------------------- the contract

def init_server(n_items: int, n_clients: int, cfg: BinaryBaselineConfig,
                rng: np.random.Generator):
    """No aggregate yet: an all-zero placeholder until the local fits arrive."""
    v_hat = np.zeros((cfg.rank, n_items))
    return BaselineServer(v_hat, False), BaselineGlobal(v_hat, False)


def init_client(block: RatingBlock, global_msg: BaselineGlobal, cfg: BinaryBaselineConfig,
                rng: np.random.Generator) -> BaselineLocal:
    """U_i and V_i uniform on [0, 1] (Elbmf's initialisation)."""
    u = rng.uniform(0.0, 1.0, size=(block.n_users, cfg.rank))
    v = rng.uniform(0.0, 1.0, size=(cfg.rank, block.n_items))
    return BaselineLocal(u, v, False)


def client_step(global_msg: BaselineGlobal, local: BaselineLocal, block: RatingBlock,
                cfg: BinaryBaselineConfig, rng: np.random.Generator):
    """Before aggregation: fit once and upload B(V_i). After: refit U_i, upload nothing."""
    if global_msg.aggregated:
        u = refit_u(block.csr, local.u, global_msg.v_hat, cfg)
        return BaselineLocal(u, local.v, True), None
    u, v = (local.u, local.v) if local.fitted else elbmf(block.csr, local.u, local.v, cfg)
    return BaselineLocal(u, v, True), BaselineUpload(boolean(v).astype(np.float64))


def server_step(state: BaselineServer, uploads, cfg: BinaryBaselineConfig,
                rng: np.random.Generator):
    """The first uploads are aggregated by eq. 11, 12 or 13; the aggregate is then fixed."""
    if state.aggregated or not uploads:
        return state, BaselineGlobal(state.v_hat, state.aggregated)
    vs = np.stack([uploads[i].v for i in sorted(uploads)])
    v_hat = aggregate(vs, cfg.aggregation).astype(np.float64)
    return BaselineServer(v_hat, True), BaselineGlobal(v_hat, True)


def _model(global_msg: BaselineGlobal, local: BaselineLocal) -> np.ndarray:
    return global_msg.v_hat if global_msg.aggregated else local.v


def factors(global_msg: BaselineGlobal, local: BaselineLocal):
    """Same form as :func:`algorithms.felb.factors`: ``A @ B`` >= 1 exactly on the Boolean
    product B(U_i) o V (V the aggregate, or the local B(V_i) before aggregation) and < 1/4
    elsewhere; eps U_i V ranks ties."""
    v = _model(global_msg, local)
    eps = 1.0 / (4.0 * local.u.shape[1])
    a = np.hstack([boolean(local.u).astype(np.float64), eps * local.u])
    return a, np.vstack([boolean(v).astype(np.float64), v])


def boolean_factors(global_msg: BaselineGlobal, local: BaselineLocal
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(B(U_i), B(V)) whose product :func:`factors` scores, V the model's coefficients."""
    return boolean(local.u), boolean(_model(global_msg, local))


def objective(global_msg: BaselineGlobal, local: BaselineLocal, block: RatingBlock,
              cfg: BinaryBaselineConfig) -> float:
    """1/2 ||A_i - U_i V||_F^2 with the relaxed U_i and the model's V."""
    return squared_error(local.u, _model(global_msg, local), block)


ALGORITHM = Algorithm(name="binary-baseline", config=BinaryBaselineConfig,
                      init_server=init_server, init_client=init_client,
                      client_step=client_step, server_step=server_step, factors=factors,
                      objective=objective, data_kind="binary")
