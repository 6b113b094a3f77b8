r"""DP-FedMAvg: FedMAvg's model averaging with user-level differential privacy.

A user-level variant of FedMAvg (Wang and Chang, *Federated matrix factorization:
algorithm design and application to data clustering*, Algorithm 1) in the style of
DP-FedAvg (McMahan, Ramage, Talwar and Zhang, *Learning differentially private recurrent
language models*, ICLR 2018): the unit of the average is a user, each user's update is
clipped, users are Poisson-sampled, and Gaussian noise is added to the sum.

Client step (:mod:`algorithms._user_grad`): every user of the tenant solves its own
``[u_u, b_u]`` exactly against V^k (local, never released; FedMAvg's Q1 steps on U_i taken
to convergence); each Poisson-sampled user (rate q, drawn inside the tenant) forms its
gradient on V^k over at most k of its ratings together with its curvature trace, clips the
pair to L2 norm C, and the tenant uploads the sums G, H.

Server step (from the released, possibly noisy sums only): with ``L_j`` the curvature of
item j estimated from H (:func:`algorithms._user_grad.gradient_and_curvature`),

    step_j = (G_j / q + gamma w_j) / (d_factor L_j + gamma)
    M <- momentum M + step;    V <- V - lr M

i.e. FedMAvg's W-step (eq. 13, ``W <- W - (U^T P(UW - M) + W Gam) / d``) taken once from
V^k on the sum of the users' clipped gradients instead of each tenant's exact one, with a
per-item step constant from the released curvature in place of the tenant's
``d_i = 5 lambda_max(U_i^T U_i)`` (a data-dependent constant the server must not use
unreleased), and server momentum (DP-FedAvg's server optimiser). The normaliser of the
noisy total is the released curvature (itself noisy and charged in the same release), not
a count of users: nothing unaccounted and data-dependent is used. ``gamma`` is the ridge of
R(V) = gamma/2 ||V||^2 on the sum of the users' losses.

Differences from FedMAvg: one averaging unit per user instead of per tenant; one gradient
step per release instead of Q2 local steps on W_i (more local steps on V would make a user's
term depend on the other users of its tenant through W_i, breaking the per-user bound);
every tenant takes part in every round (``per_round`` 0), users are sampled inside the
tenants instead. Privacy: :func:`user_bounds` (sensitivity C per release), accounted by
:mod:`privacy.user_level`.
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


class DPFedMAvgConfig(UG.UserGradConfig):
    """Settings of DP-FedMAvg (defaults: chosen on a validation carve-out of MovieLens 1M,
    see docs/benchmarks/dp_utility.md)."""

    lr: float = Field(1.0, description="server learning rate")
    momentum: float = Field(0.0, description="server momentum (0: plain steps)")
    d_factor: float = Field(1.0, description="step constant per unit of item curvature")
    gamma: float = Field(1.0, description="ridge weight of V (on the sum of user losses)")

    @model_validator(mode="after")
    def _check(self) -> DPFedMAvgConfig:
        if not self.lr > 0 or not self.d_factor > 0:
            raise ValueError("lr and d_factor must be positive")
        if not 0 <= self.momentum < 1:
            raise ValueError("momentum must be in [0, 1)")
        if self.gamma < 0:
            raise ValueError("gamma must be non-negative")
        return self


def user_bounds(cfg: DPFedMAvgConfig):
    """The per-user bound of an upload: joint L2 norm C (:func:`UG.user_bounds`)."""
    return UG.user_bounds(cfg)


@dataclasses.dataclass(frozen=True)
class ServerState(Message):
    """V, the momentum buffer M (same shape), the releases so far and p."""

    V: np.ndarray
    M: np.ndarray
    round: int
    n_clients: int
    centre_sums: np.ndarray | None = None


def init_server(n_items: int, n_clients: int, cfg: DPFedMAvgConfig,
                rng: np.random.Generator) -> tuple[ServerState, UG.GlobalModel]:
    v = UG.init_v(n_items, cfg, rng)
    return (ServerState(V=v, M=np.zeros_like(v), round=0, n_clients=n_clients),
            UG.GlobalModel(V=v.copy(), round=0, n_clients=n_clients))


def server_step(state: ServerState, uploads: Mapping[int, UG.Upload], cfg: DPFedMAvgConfig,
                rng: np.random.Generator) -> tuple[ServerState, UG.GlobalModel]:
    """One preconditioned momentum step on the summed clipped gradients; no uploads: keep
    V (the final refresh round)."""
    sums, centre = UG.next_centre(state.centre_sums, uploads, cfg)
    if not uploads:
        return state, UG.GlobalModel(V=state.V.copy(), round=state.round,
                                     n_clients=state.n_clients, centre=centre)
    g, curv = UG.gradient_and_curvature(uploads, cfg)
    step = (g + cfg.gamma * state.V) / (cfg.d_factor * curv + cfg.gamma)
    m = cfg.momentum * state.M + step
    v = state.V - cfg.lr * m
    return (state.replace(V=v, M=m, round=state.round + 1, centre_sums=sums),
            UG.GlobalModel(V=v.copy(), round=state.round + 1, n_clients=state.n_clients,
                           centre=centre))


ALGORITHM = Algorithm(
    name="dp-fedmavg", config=DPFedMAvgConfig, init_server=init_server,
    init_client=UG.init_client, client_step=UG.client_step, server_step=server_step,
    factors=factors, objective=objective,
    run_defaults={"clients": 100, "per_round": 0, "rounds": 11})
