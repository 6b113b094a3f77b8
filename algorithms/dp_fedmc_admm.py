r"""DP-FedMC-ADMM: the linearised ADMM of FedMC-ADMM with user-level differential privacy.

Hytla, Nghia, Phan and Rice, *A Linearized Alternating Direction Multiplier Method for
Federated Matrix Completion Problems* (the FedMC-ADMM paper), Algorithm 1 with the l2
closed forms of Sec. 5 (eqs. 66-68, 13), made user-level DP: what leaves a tenant is a sum
of per-user clipped terms (:mod:`algorithms._user_grad`), and every quantity the server
keeps is computed from the released (noisy) sums, i.e. is post-processing.

The paper's round for tenant i (penalty beta, p tenants, L_i = ||U_i^T U_i||_F)::

    U_i  <- N proximal-gradient steps of eq. (66) with W_i fixed
    W_i  <- ((L_i/p) W_i + beta V - grad_W f_i(U_i, W_i)/p - Y_i) / (L_i/p + beta)  (67)
    Y_i  <- Y_i + beta (W_i - V)                                                 (13)
    V    <- sum_i (beta W_i + Y_i) / (p beta + gamma)                            (68)

Here, each round (every tenant takes part; users are Poisson-sampled inside the tenants):

* U-step: every user's row ``[u_u, b_u]`` is solved exactly against the broadcast V^k
  (the limit of eq. (66)'s steps, linearised at V^k as fedrec's ``u_anchor='global'``);
  local, never released.
* W-step and duals, kept as *sums over the tenants* on the server: with the gradient of
  every tenant taken at the public V^k and one curvature L shared by all tenants, eq. (67)
  is the same affine map for every tenant, so ``Wbar = (1/p) sum_i W_i`` and ``Ybar =
  (1/p) sum_i Y_i`` follow exactly from the sum of the tenants' gradients::

      Wbar <- ((L/p) Wbar + beta V^k - G/p^2 - Ybar) / (L/p + beta)
      Ybar <- Ybar + beta (Wbar - V^k)
      V    <- (beta Wbar + Ybar) / (beta + gamma/p)      (= eq. (68): sum over p tenants)

  with ``G = sum_i grad_W f_i`` estimated by the released G / q (the users' clipped
  gradients at V^k) and, per item j, ``L_j = curvature_j / p`` (the average tenant's share
  of the released curvature trace, fedrec's blockwise Lipschitz bound of eq. (12) per item
  column, made public by releasing it; plus the noise term of
  :func:`algorithms._user_grad.gradient_and_curvature`).

How it departs from the paper, and why:

1. **Gradient at V^k, not at W_i^k**, and **N = 1 W-step per round**: a user's released
   term may depend only on its own ratings and public values. W_i^k is built from the
   tenant's other users (its exact gradients), so a term evaluated at W_i^k, or after
   several W-steps, would change when another user is removed, and the per-user bound C
   would not hold.
2. **Per-user clipping**: f_i becomes the sum of the tenant's users' losses, each weighted
   by ``min(1, C / ||its term||)`` (over at most k ratings a user): the bound that makes the
   sensitivity C. Residuals are clipped to +-``residual_clip``.
3. **L public**: the paper's L_i = ||U_i^T U_i||_F is a data-dependent constant; it is
   replaced by the released per-item curvature, shared by all tenants (which is also what
   lets the server keep Wbar and Ybar from sums alone, item 4).
4. **W_i and Y_i as server-side sums**: under central placement the server sees only the
   noisy total, never a tenant's own upload, so it keeps the tenants' average W and Y
   (exactly what eq. (68) needs) instead of each tenant's. Every tenant takes part in every
   round (``per_round`` 0): with the paper's 10-of-100 sampling the server would have to
   keep each tenant's last (W_i, Y_i), which it cannot compute from a central noisy sum.
   Users are sampled instead, inside the tenants (rate q), which the server cannot see.
5. **Biases and centre**: ratings are centred on the public centre (middle of the declared
   rating scale, not a data mean); a local user bias and a released item-bias row, as in
   DPALS, go through the same updates.
6. **Duals under noise**: Ybar accumulates beta (Wbar - V), a function of the released
   sums only; noise enters it through Wbar and is damped by beta.

At a fixed point Wbar = V, Ybar = (gamma/p) V and G + p gamma V = 0: the stationary point of
the sum of the users' clip-weighted losses plus (p gamma / 2) ||V||^2, as eq. (68)'s
fixed point is for the paper's objective.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from pydantic import Field, model_validator

from algorithms import _user_grad as UG
from algorithms.base import Algorithm
from algorithms.dpals import factors, objective
from algorithms.messages import Message


class DPFedMCADMMConfig(UG.UserGradConfig):
    """Settings of DP-FedMC-ADMM (defaults: chosen on a validation carve-out of MovieLens
    1M, see docs/benchmarks/dp_utility.md)."""

    beta: float = Field(0.006, description="ADMM penalty beta > 0 (paper scale, p tenants)")
    gamma: float = Field(0.01, description="gamma, weight of R(V) = gamma/2 ||V||^2 (eq. 68)")

    @model_validator(mode="after")
    def _check(self) -> DPFedMCADMMConfig:
        if not self.beta > 0:
            raise ValueError("beta must be positive")
        if self.gamma < 0:
            raise ValueError("gamma must be non-negative")
        return self


def user_bounds(cfg: DPFedMCADMMConfig):
    """The per-user bound of an upload: joint L2 norm C (:func:`UG.user_bounds`)."""
    return UG.user_bounds(cfg)


@dataclasses.dataclass(frozen=True)
class ServerState(Message):
    """V, the tenants' average local copy ``W`` and dual ``Y`` (W_i^0 = V^0, Y_i^0 = 0),
    the releases so far and p."""

    V: np.ndarray
    W: np.ndarray
    Y: np.ndarray
    round: int
    n_clients: int
    centre_sums: np.ndarray | None = None


def init_server(n_items: int, n_clients: int, cfg: DPFedMCADMMConfig,
                rng: np.random.Generator) -> tuple[ServerState, UG.GlobalModel]:
    v = UG.init_v(n_items, cfg, rng)
    return (ServerState(V=v, W=v.copy(), Y=np.zeros_like(v), round=0, n_clients=n_clients),
            UG.GlobalModel(V=v.copy(), round=0, n_clients=n_clients))


def admm_update(v: np.ndarray, w: np.ndarray, y: np.ndarray, g: np.ndarray,
                curv: np.ndarray, p: int, cfg: DPFedMCADMMConfig
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(V, Wbar, Ybar) after eqs. (67), (13), (68) on the tenants' averages (docstring)."""
    lip = curv / p ** 2  # L_j / p with L_j = curv_j / p, per item column
    beta = cfg.beta
    w = (lip * w + beta * v - g / p ** 2 - y) / (lip + beta)
    y = y + beta * (w - v)
    v = (beta * w + y) / (beta + cfg.gamma / p)
    return v, w, y


def server_step(state: ServerState, uploads: Mapping[int, UG.Upload],
                cfg: DPFedMCADMMConfig, rng: np.random.Generator
                ) -> tuple[ServerState, UG.GlobalModel]:
    """The ADMM round on the released sums; no uploads: keep V (the final refresh)."""
    sums, centre = UG.next_centre(state.centre_sums, uploads, cfg)
    if not uploads:
        return state, UG.GlobalModel(V=state.V.copy(), round=state.round,
                                     n_clients=state.n_clients, centre=centre)
    g, curv = UG.gradient_and_curvature(uploads, cfg)
    v, w, y = admm_update(state.V, state.W, state.Y, g, curv, state.n_clients, cfg)
    return (state.replace(V=v, W=w, Y=y, round=state.round + 1, centre_sums=sums),
            UG.GlobalModel(V=v.copy(), round=state.round + 1, n_clients=state.n_clients,
                           centre=centre))


ALGORITHM = Algorithm(
    name="dp-fedmc-admm", config=DPFedMCADMMConfig, init_server=init_server,
    init_client=UG.init_client, client_step=UG.client_step, server_step=server_step,
    factors=factors, objective=objective,
    run_defaults={"clients": 100, "per_round": 0, "rounds": 11})
