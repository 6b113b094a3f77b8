r"""Federated clustering by orthogonal NMF, solved by FedMAvg or FedMGS.

Wang and Chang (the FedMAvg/FedMGS paper), Sec. V, eq. (35)-(36); model of [44]. Samples are
the columns of X (M x N), split by columns over P clients (X_p: M x N_p). Shared W (M x K) lies
in the box [min X, max X]; local H_p (K x N_p) >= 0; the objective is

    F(W, H) = (1/N) ||X - W H||^2 + sum_p R_H(H_p),
    R_H(H_p) = rho/2 sum_j ((1^T h_j)^2 - ||h_j||^2) + nu/2 ||H_p||^2            (35)

The first term of R_H is zero exactly when each column has one non-zero entry, so as rho
grows (SNCP: rho <- 1.5 rho whenever the relative change of F drops below ``tol``) H
becomes a cluster assignment: the cluster of sample j is argmax h_j. rho and nu start at
1e-8 and 1e-10 times ||X||^2 / N.

Steps (fedrec's client/server mould, with its own messages since each client holds a
dense X_p instead of a rating block):

* client, both methods: Q1 projected gradient steps on H_p with W fixed (eqs. 11, 28),
  step 1 / (c_factor L_H), L_H = (2/N) lambda_max(W^T W) + rho (K - 1) + nu (an upper
  bound of the Lipschitz constant); c_factor = 0.51 as the paper's Sec. V-A
  "c = 1/2 lambda_max" (the authors' code divides by 0.51 times the largest eigenvalue of
  the H-Hessian), almost twice the safe 1/L step and still a descent step (< 2/L);
* FedMAvg (Algorithm 1): uploading clients then take Q2^k gradient steps on W_p from W^k
  (eq. 13, no projection), step 1 / (d_factor L_W) with d_factor = 5 and the federation's
  L_W = (2/N) lambda_max(H H^T) of this round's H, the same for every client (Sec. V-A
  "d^s = 5 lambda_max(H^{s,Q1} (H^{s,Q1})^T)", the whole H; so does the authors' code).
  It needs every client's H_p H_p^T after its H steps (a K x K secure sum; the
  simulation forms it directly). ``w_lipschitz="client"`` is fedrec's earlier step, the
  client's own L_p = (2/N_p) lambda_max(H_p H_p^T), which made the W steps of non-iid
  clients shorter (L_p is larger than L_W, most of all for a one-cluster client) and
  left FedMAvg short of Table I at the paper's size
  (docs/benchmarks/clustering_table1.md). The server averages the
  uploads and projects onto the box (eq. 9). Partial client communication: every client
  updates H_p each round, m upload (drawn with replacement by omega_p = N_p / N,
  Algorithm 1, also for m = P); ``full_communication`` makes m >= P every client with
  weight N_p instead (the expectation of those draws, as the authors' code does for the
  paper's "full participation (m = 100)"). Not the default: on the paper-size seed 1 it
  ended lower (81.3% against 84.0% at 500 rounds), as the noise of the draws makes the
  SNCP test fire more often;
* FedMGS (Algorithm 2): sampled clients send the change of H_p H_p^T and X_p H_p^T
  (eq. 31); the server keeps the sums and takes Q2 projected gradient steps on
  W with grad = (2/N)(W sum H H^T - sum X H^T) (eq. 32), step 1/(d_factor L_W),
  L_W = (2/N) lambda_max(sum H H^T), d_factor = 0.501 (Sec. V-A "d = 1/2 lambda_max",
  0.501 in the authors' code).
  Partial participation: unsampled clients are idle. Not privacy-preserving (X_p H_p^T
  of a one-sample client is that sample times h).

Federation-wide constants (N, ||X||^2, min X and max X) are taken as known to everybody, as
in the paper's experiments (a one-off secure sum in a deployment). The simulation driver
:func:`run` evaluates F centrally each round for the SNCP schedule and the stopping rule.

Also here: the synthetic generator of the authors' experiments (:func:`synthetic`), iid and
non-iid (k-means) partitions, k-means++ (the reference) and accuracy by best label matching.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp
from pydantic import Field
from scipy.optimize import linear_sum_assignment

from algorithms.base import AlgorithmConfig
from algorithms.fedmgs import full_statistics
from algorithms.messages import Message
from algorithms.rng import (
    SAMPLING,
    SERVER,
    client_init_rng,
    derive_rng,
    sample_clients,
)
from algorithms.simulate import RoundState, drive


class ClusterConfig(AlgorithmConfig):
    """Federated ONMF clustering; defaults follow the paper's Sec. V where it says."""

    method: Literal["fedmavg", "fedmgs"] = Field("fedmgs", description="solver")
    k: int = Field(20, ge=1, description="K: number of clusters")
    q1: int = Field(10, ge=1, description="Q1: H_p steps per round")
    q2: int = Field(10, ge=1, description="Q2: W steps per round (client or server)")
    q_hat: int | None = Field(50, ge=0, description="FedMAvg Q2^k=q_hat//k+1; None: q2")
    per_round: int = Field(10, ge=1, description="m: uploading (fedmavg) / active (fedmgs)")
    rounds: int = Field(500, ge=1, description="maximum communication rounds")
    rho0: float = Field(1e-8, gt=0, description="initial rho / (||X||^2/N)")
    nu0: float = Field(1e-10, ge=0, description="nu / (||X||^2/N)")
    growth: float = Field(1.5, gt=1, description="SNCP: rho <- growth * rho")
    tol: float | None = Field(None, gt=0, description="SNCP tolerance (1e-5 / 5e-5 if None)")
    stop_tol: float = Field(1e-8, gt=0, description="stop when the relative change is below")
    c_factor: float = Field(0.51, gt=0, description="H step 1/(c_factor L_H) (paper: 0.51)")
    d_factor: float | None = Field(None, gt=0, description="W step 1/(d_factor L_W); 5/0.501")
    full_communication: bool = Field(
        False, description="FedMAvg, m >= P: all clients send, weights N_p (else m draws)")
    w_lipschitz: Literal["federation", "client"] = Field(
        "federation", description="FedMAvg W step 1/(d_factor L): L of the whole H or of H_p")

    @property
    def w_step_factor(self) -> float:
        """d_factor, or the paper's 5 for FedMAvg's local steps and 0.501 for FedMGS's
        server (Sec. V-A "d = 1/2 lambda_max"; the authors' code uses 0.501)."""
        if self.d_factor is not None:
            return self.d_factor
        return 5.0 if self.method == "fedmavg" else 0.501

    @property
    def sncp_tol(self) -> float:
        """The paper's tolerance: 1e-5 for FedMAvg, 5e-5 for FedMGS, unless set."""
        if self.tol is not None:
            return self.tol
        return 1e-5 if self.method == "fedmavg" else 5e-5


# --------------------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True)
class ClusterGlobal(Message):
    """Broadcast: W^k, rho^k and the federation constants N and ||X||^2 / N."""

    w: np.ndarray
    rho: float
    round: int
    n_total: int
    x_scale: float


@dataclasses.dataclass(frozen=True)
class ClusterServer(Message):
    """Server: W, rho, the last objective, the box and (FedMGS) the statistic sums."""

    w: np.ndarray
    rho: float
    round: int
    last_objective: float
    low: float
    high: float
    n_total: int
    x_scale: float
    hh: np.ndarray
    xh: np.ndarray


@dataclasses.dataclass(frozen=True)
class ClusterLocal(Message):
    """Client p: H_p and (FedMGS) the H_p whose statistics the server holds."""

    h: np.ndarray
    h_sent: np.ndarray


@dataclasses.dataclass(frozen=True)
class AvgUpload(Message):
    """FedMAvg upload: W_p after the local steps and its weight in the average."""

    w: np.ndarray
    weight: float


@dataclasses.dataclass(frozen=True)
class StatsUpload(Message):
    """FedMGS upload: change of H_p H_p^T (K x K) and X_p H_p^T (M x K)."""

    hh: np.ndarray
    xh: np.ndarray


# --------------------------------------------------------------------------- pure maths


def h_gradient(w: np.ndarray, h: np.ndarray, x: np.ndarray, rho: float, nu: float,
               n_total: int) -> np.ndarray:
    """grad_H of F: (2/N) W^T (W H - X) + rho (1 1^T - I) H + nu H (eqs. 35-36)."""
    col = h.sum(axis=0, keepdims=True)
    return (2.0 / n_total) * (w.T @ (w @ h - x)) + rho * (col - h) + nu * h


def h_steps(w: np.ndarray, h: np.ndarray, x: np.ndarray, rho: float, nu: float,
            n_total: int, steps: int, c_factor: float) -> np.ndarray:
    """Q1 projected gradient steps on H_p >= 0 (eq. 11), step 1 / (c_factor L_H)."""
    wtw, wtx = w.T @ w, w.T @ x
    k = w.shape[1]
    lip = 2.0 / n_total * float(np.linalg.eigvalsh(wtw)[-1]) + rho * (k - 1) + nu
    for _ in range(steps):
        col = h.sum(axis=0, keepdims=True)
        grad = (2.0 / n_total) * (wtw @ h - wtx) + rho * (col - h) + nu * h
        h = np.maximum(h - grad / (c_factor * lip), 0.0)
    return h


def w_local_steps(w: np.ndarray, h: np.ndarray, x: np.ndarray, steps: int,
                  d_factor: float, lipschitz: float | None = None) -> np.ndarray:
    """FedMAvg's Q2 gradient steps on W_p from W^k (eq. 13, no projection).

    grad = (2/N_p)(W H_p H_p^T - X_p H_p^T); step 1 / (d_factor L). L is ``lipschitz``, the
    federation's L_W = (2/N) lambda_max(H H^T) (:func:`w_lipschitz`), the same for every
    client (the paper's d^s = 5 lambda_max(H^{s,Q1} H^{s,Q1 T})); without it, the client's
    own L_p = (2/N_p) lambda_max(H_p H_p^T).
    """
    hh, xh = full_statistics(x, h)
    if lipschitz is None:  # the 2/N_p of the gradient and of L_p cancel
        denom = d_factor * float(np.linalg.eigvalsh(hh)[-1])
    else:
        denom = d_factor * lipschitz * x.shape[1] / 2.0
    if denom <= 0.0:
        return w.copy()
    for _ in range(steps):
        w = w - (w @ hh - xh) / denom
    return w


def w_lipschitz(hh: np.ndarray, n_total: int) -> float:
    """L_W = (2/N) lambda_max(sum_p H_p H_p^T): the Lipschitz constant of grad_W of F."""
    return 2.0 / n_total * float(np.linalg.eigvalsh(hh)[-1])


def w_server_steps(w: np.ndarray, hh: np.ndarray, xh: np.ndarray, low: float, high: float,
                   steps: int, d_factor: float) -> np.ndarray:
    """FedMGS's Q2 projected gradient steps on W from the summed statistics (eq. 32)."""
    top = float(np.linalg.eigvalsh(hh)[-1])
    if top <= 0.0:
        return w.copy()
    for _ in range(steps):
        w = np.clip(w - (w @ hh - xh) / (d_factor * top), low, high)
    return w


def objective(w: np.ndarray, hs: Sequence[np.ndarray], xs: Sequence[np.ndarray], rho: float,
              nu: float, n_total: int) -> float:
    """F(W, H) of eqs. (35)-(36), summed over the clients."""
    total = 0.0
    for h, x in zip(hs, xs, strict=True):
        total += float(np.sum((x - w @ h) ** 2)) / n_total
        col = h.sum(axis=0)
        total += 0.5 * rho * float(col @ col - np.sum(h * h)) + 0.5 * nu * float(np.sum(h * h))
    return total


def objective_from_statistics(w: np.ndarray, hh: np.ndarray, xh: np.ndarray, x_sq: float,
                              hs: Sequence[np.ndarray], rho: float, nu: float, n_total: int
                              ) -> float:
    """:func:`objective` from the sums hh = sum H_p H_p^T, xh = sum X_p H_p^T and
    x_sq = ||X||^2: ||X - W H||^2 = ||X||^2 - 2 <W, X H^T> + <W^T W, H H^T>, without forming
    the M x N residual (FedMGS's server already holds hh and xh)."""
    total = (x_sq - 2.0 * float(np.sum(w * xh)) + float(np.sum((w.T @ w) * hh))) / n_total
    for h in hs:
        col, sq = h.sum(axis=0), float(np.sum(h * h))
        total += 0.5 * rho * float(col @ col - sq) + 0.5 * nu * sq
    return total


def sncp_rho(rho: float, previous: float, current: float, tol: float, growth: float) -> float:
    """SNCP schedule [44]: multiply rho by ``growth`` when |dF| / F_prev < ``tol``."""
    if np.isfinite(previous) and abs(current - previous) / abs(previous) < tol:
        return rho * growth
    return rho


def q2_schedule(round_: int, cfg: ClusterConfig) -> int:
    """Q2^k for FedMAvg: floor(q_hat / k) + 1 (diminishing), or constant q2 without q_hat."""
    return cfg.q2 if cfg.q_hat is None else cfg.q_hat // max(round_, 1) + 1


# --------------------------------------------------------------------------- steps


def init_server(xs: Sequence[np.ndarray], cfg: ClusterConfig, rng: np.random.Generator
                ) -> tuple[ClusterServer, ClusterGlobal]:
    """W^0 ~ a U[0, 1] with a = sqrt(mean|X| / K) (the authors' init), rho^0, the box."""
    n_total = int(sum(x.shape[1] for x in xs))
    sq = float(sum(np.sum(x * x) for x in xs))
    mean_abs = float(sum(np.abs(x).sum() for x in xs)) / (n_total * xs[0].shape[0])
    low = float(min(x.min() for x in xs if x.size))
    high = float(max(x.max() for x in xs if x.size))
    w = np.sqrt(mean_abs / cfg.k) * rng.random((xs[0].shape[0], cfg.k))
    x_scale = sq / n_total
    rho = cfg.rho0 * x_scale
    server = ClusterServer(w, rho, 0, float("inf"), low, high, n_total, x_scale,
                           np.zeros((cfg.k, cfg.k)), np.zeros((xs[0].shape[0], cfg.k)))
    return server, ClusterGlobal(w, rho, 0, n_total, x_scale)


def init_client(x: np.ndarray, glob: ClusterGlobal, cfg: ClusterConfig,
                rng: np.random.Generator) -> ClusterLocal:
    """H_p^0 with the same scale as W^0."""
    a = np.sqrt(float(np.abs(glob.w).mean()) * 2.0 / cfg.k) if glob.w.size else 1.0
    h = a * rng.random((cfg.k, x.shape[1]))
    return ClusterLocal(h, np.zeros_like(h))


def client_step(glob: ClusterGlobal, local: ClusterLocal, x: np.ndarray, cfg: ClusterConfig,
                rng: np.random.Generator, weight: float, w_lip: float | None = None
                ) -> tuple[ClusterLocal, AvgUpload | StatsUpload | None]:
    """Q1 steps on H_p; then the method's upload if this client sends (``weight`` > 0).

    ``weight`` is the client's weight in FedMAvg's average: N_p in round 1 (eq. 8), its
    multiplicity in the sample A^k drawn with replacement by omega_p later (eq. 9).
    ``w_lip`` (FedMAvg with ``w_lipschitz="federation"``): the federation's L_W of this
    round's H (:func:`w_lipschitz`), which needs every client's H_p after its H steps;
    :class:`ClusterSteps` runs the two halves, :func:`client_h_step` and
    :func:`client_upload`, apart for that.
    """
    return client_upload(glob, client_h_step(glob, local, x, cfg), x, cfg, weight, w_lip)


def client_h_step(glob: ClusterGlobal, local: ClusterLocal, x: np.ndarray,
                  cfg: ClusterConfig) -> ClusterLocal:
    """The client's Q1 projected gradient steps on H_p (eqs. 11, 28)."""
    nu = cfg.nu0 * glob.x_scale
    return local.replace(h=h_steps(glob.w, local.h, x, glob.rho, nu, glob.n_total, cfg.q1,
                                   cfg.c_factor))


def client_upload(glob: ClusterGlobal, local: ClusterLocal, x: np.ndarray, cfg: ClusterConfig,
                  weight: float, w_lip: float | None = None
                  ) -> tuple[ClusterLocal, AvgUpload | StatsUpload | None]:
    """After the H steps (``local.h``), if ``weight`` > 0: FedMAvg's Q2^k local W steps and
    W_p, or FedMGS's change of the statistics since the last upload."""
    if weight <= 0:
        return local, None
    if cfg.method == "fedmavg":
        if cfg.w_lipschitz == "federation" and w_lip is None:
            raise ValueError("w_lipschitz='federation' needs the federation's w_lip")
        w = w_local_steps(glob.w, local.h, x, q2_schedule(glob.round + 1, cfg),
                          cfg.w_step_factor,
                          w_lip if cfg.w_lipschitz == "federation" else None)
        return local, AvgUpload(w, float(weight))
    hh_new, xh_new = full_statistics(x, local.h)
    hh_old, xh_old = full_statistics(x, local.h_sent)
    return ClusterLocal(local.h, local.h), StatsUpload(hh_new - hh_old, xh_new - xh_old)


def server_step(server: ClusterServer, uploads: Mapping[int, AvgUpload | StatsUpload],
                cfg: ClusterConfig, rng: np.random.Generator
                ) -> tuple[ClusterServer, ClusterGlobal]:
    """FedMAvg: average and project (eq. 9); FedMGS: update sums, Q2 PGD steps (eq. 32)."""
    hh, xh, w = server.hh, server.xh, server.w
    order = sorted(uploads)
    if cfg.method == "fedmavg" and order:
        weights = np.array([uploads[i].weight for i in order])
        mean = np.tensordot(weights / weights.sum(), np.stack([uploads[i].w for i in order]), 1)
        w = np.clip(mean, server.low, server.high)
    elif cfg.method == "fedmgs":
        hh = hh + sum((uploads[i].hh for i in order), np.zeros_like(hh))
        xh = xh + sum((uploads[i].xh for i in order), np.zeros_like(xh))
        w = w_server_steps(w, hh, xh, server.low, server.high, cfg.q2, cfg.w_step_factor)
    k = server.round + 1
    new = dataclasses.replace(server, w=w, round=k, hh=hh, xh=xh)
    return new, ClusterGlobal(w, server.rho, k, server.n_total, server.x_scale)


def with_objective(server: ClusterServer, glob: ClusterGlobal, value: float,
                   cfg: ClusterConfig) -> tuple[ClusterServer, ClusterGlobal]:
    """Record F of this round and apply the SNCP schedule to rho."""
    rho = sncp_rho(server.rho, server.last_objective, value, cfg.sncp_tol, cfg.growth)
    return (dataclasses.replace(server, rho=rho, last_objective=value),
            dataclasses.replace(glob, rho=rho))


# --------------------------------------------------------------------------- driver


@dataclasses.dataclass
class ClusterRound:
    round: int
    objective: float
    rho: float
    accuracy: float
    seconds: float
    uploads: int


@dataclasses.dataclass
class ClusterResult:
    history: list[ClusterRound]
    labels: np.ndarray  # predicted cluster of every sample, in the order of the parts
    w: np.ndarray

    @property
    def accuracy(self) -> float:
        return self.history[-1].accuracy if self.history else float("nan")


def _who(cfg: ClusterConfig, k: int, sizes: np.ndarray, rng: np.random.Generator
         ) -> tuple[np.ndarray, dict[int, float]]:
    """(clients that run, upload weight of each sender) in round k.

    Round 1: everybody, weights N_p (eq. 8, A^0 = all). Then FedMAvg (PCC): everybody
    runs, A^k is m draws with replacement by omega_p = N_p / N, weight = multiplicity
    (Algorithm 1), or with m >= P and ``full_communication`` everybody with weight N_p
    (the expectation of those draws; the paper's "full participation (m = 100)");
    FedMGS (PCP): m clients uniformly without replacement run and send.
    """
    everyone = np.arange(sizes.size)
    if k == 1 or (cfg.method == "fedmavg" and cfg.per_round >= sizes.size
                  and cfg.full_communication):
        return everyone, {int(i): float(sizes[i]) for i in everyone}
    if cfg.method == "fedmgs":
        chosen = sample_clients(rng, sizes.size, cfg.per_round)
        return chosen, {int(i): 1.0 for i in chosen}
    draws = rng.choice(sizes.size, size=cfg.per_round, replace=True, p=sizes / sizes.sum())
    ids, counts = np.unique(draws, return_counts=True)
    return everyone, {int(i): float(c) for i, c in zip(ids, counts, strict=True)}


class ClusterSteps:
    """:class:`algorithms.simulate.Steps` of federated ONMF: who runs and who sends (with
    its weight) from the round's sampling stream, the clients' H_p/W steps, the server
    step; the record evaluates F (from the statistics H H^T and X H^T,
    :func:`objective_from_statistics`), applies the SNCP schedule to rho and stops when F
    settles (``stop_tol``)."""

    def __init__(self, xs: Sequence[np.ndarray], cfg: ClusterConfig, seed: int,
                 labels: Sequence[np.ndarray] | None = None) -> None:
        self.xs, self.cfg, self.seed = xs, cfg, int(seed)
        self.truth = np.concatenate(labels) if labels is not None else None
        self.sizes = np.array([x.shape[1] for x in xs], dtype=float)
        self.x_sq = float(sum(np.sum(x * x) for x in xs))
        self._senders: dict[int, float] = {}

    def start(self) -> RoundState:
        server, glob = init_server(self.xs, self.cfg, derive_rng(self.seed, 0, SERVER))
        locs = [init_client(x, glob, self.cfg, client_init_rng(self.seed, p))
                for p, x in enumerate(self.xs)]
        return RoundState(0, glob, server, locs)

    def select(self, k: int, state: RoundState) -> np.ndarray:
        runners, self._senders = _who(self.cfg, k, self.sizes,
                                      derive_rng(self.seed, k, SAMPLING))
        return runners

    def clients(self, k: int, state: RoundState, selected: np.ndarray
                ) -> tuple[list[ClusterLocal], dict[int, Message]]:
        locs, uploads, glob = list(state.local_states), {}, state.global_msg
        order = [int(i) for i in selected]
        for p in order:
            locs[p] = client_h_step(glob, locs[p], self.xs[p], self.cfg)
        w_lip = None
        if self.cfg.method == "fedmavg" and self.cfg.w_lipschitz == "federation":
            # d^s of the paper from H^{s,Q1} of every client (PCC: all of them ran): a sum
            # of the K x K Grams H_p H_p^T, which a deployment would collect by secure sum
            w_lip = w_lipschitz(sum((lc.h @ lc.h.T for lc in locs),
                                    np.zeros((self.cfg.k, self.cfg.k))), glob.n_total)
        for p in order:
            locs[p], up = client_upload(glob, locs[p], self.xs[p], self.cfg,
                                        self._senders.get(p, 0.0), w_lip)
            if up is not None:
                uploads[p] = up
        return locs, uploads

    def server(self, k: int, server_state: ClusterServer, received: Mapping[int, Message]
               ) -> tuple[ClusterServer, ClusterGlobal]:
        return server_step(server_state, received, self.cfg, derive_rng(self.seed, k, SERVER))

    def record(self, state: RoundState, due: bool
               ) -> tuple[RoundState, ClusterRound, bool]:
        server, glob, hs = state.server_state, state.global_msg, [lc.h for lc in
                                                                  state.local_states]
        if self.cfg.method == "fedmgs":  # the server's sums are those of every current H_p
            hh, xh = server.hh, server.xh
        else:
            hh = sum((h @ h.T for h in hs), np.zeros((self.cfg.k, self.cfg.k)))
            xh = sum((x @ h.T for x, h in zip(self.xs, hs, strict=True)),
                     np.zeros_like(glob.w))
        value = objective_from_statistics(glob.w, hh, xh, self.x_sq, hs, server.rho,
                                          self.cfg.nu0 * server.x_scale, server.n_total)
        previous = server.last_objective
        server, glob = with_objective(server, glob, value, self.cfg)
        acc = accuracy(self.truth, assignments(hs)) if self.truth is not None else float("nan")
        rec = ClusterRound(state.round, value, server.rho, acc, state.seconds,
                           len(state.uploads))
        stop = bool(np.isfinite(previous)
                    and abs(value - previous) / abs(previous) < self.cfg.stop_tol)
        return dataclasses.replace(state, server_state=server, global_msg=glob), rec, stop


def run(xs: Sequence[np.ndarray], cfg: ClusterConfig, seed: int,
        labels: Sequence[np.ndarray] | None = None,
        on_round: Callable[[ClusterRound], None] | None = None) -> ClusterResult:
    """Simulate the federation on the parts ``xs`` (X_p, M x N_p) until the stopping rule.

    The round engine (:func:`algorithms.simulate.drive`) with :class:`ClusterSteps`.
    ``labels`` (true cluster of each column of each part) enables the accuracy column.
    Seconds per round count client and server work, not the objective evaluation.
    """
    steps = ClusterSteps(xs, cfg, seed, labels)
    history, last = drive(steps, steps.start(), cfg.rounds, on_round=on_round)
    return ClusterResult(history, assignments([lc.h for lc in last.local_states]),
                         last.global_msg.w)


# --------------------------------------------------------------------------- data & metrics


def assignments(hs: Sequence[np.ndarray]) -> np.ndarray:
    """Cluster of every sample: argmax of its column of H (parts concatenated)."""
    return np.concatenate([h.argmax(axis=0) for h in hs]) if hs else np.zeros(0, int)


def accuracy(truth: np.ndarray, pred: np.ndarray) -> float:
    """Clustering accuracy under the best one-to-one label matching (Hungarian)."""
    if truth.shape != pred.shape:
        raise ValueError("truth and pred must have the same shape")
    if truth.size == 0:
        return float("nan")
    _, t = np.unique(truth, return_inverse=True)
    _, q = np.unique(pred, return_inverse=True)
    confusion = np.zeros((t.max() + 1, q.max() + 1))
    np.add.at(confusion, (t, q), 1.0)
    rows, cols = linear_sum_assignment(-confusion)
    return float(confusion[rows, cols].sum() / truth.size)


def _cluster_sizes(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Unbalanced sizes as in the authors' generator: each drawn from [1%, 150%] of fair."""
    sizes, rest = [], n
    for i in range(k - 1):
        fair = rest / (k - i)
        size = int(rng.integers(max(1, int(0.01 * fair)), max(2, int(1.5 * fair))))
        size = min(size, rest - (k - 1 - i))
        sizes.append(size)
        rest -= size
    sizes.append(rest)
    return np.array(sizes)


def synthetic(m: int, n: int, k: int, snr_db: float, rng: np.random.Generator,
              outliers: float = 0.03) -> tuple[np.ndarray, np.ndarray]:
    """X = W H + E at a given SNR = 10 log10(||WH||^2 / ||E||^2) dB, and the labels.

    The Gaussian linear model of [45] as the authors generate it: W ~ U[0, 1] (m x k);
    H one-hot with unbalanced cluster sizes; E Gaussian, X kept non-negative by alternately
    clipping at 0 and rescaling E to the SNR; then a fraction ``outliers`` of samples
    replaced by 5 U[0, 1] vectors (they keep their labels).
    """
    w = rng.uniform(0.0, 1.0, size=(m, k))
    labels = rng.permutation(np.repeat(np.arange(k), _cluster_sizes(n, k, rng)))
    signal = w[:, labels]
    e = rng.standard_normal((m, n))
    target, power = 10.0 ** (snr_db / 10.0), float(np.sum(signal * signal))
    for _ in range(200):
        x = np.maximum(signal + e, 0.0)
        e = x - signal
        snr = power / float(np.sum(e * e))
        if abs(snr - target) <= 1e-10 * target:
            break
        e *= np.sqrt(snr / target)
    x = signal + e
    idx = rng.integers(0, n, size=int(outliers * n))
    x[:, idx] = 5.0 * rng.uniform(size=(m, idx.size))
    return x, labels


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 100) -> np.ndarray:
    """k-means++ seeding then Lloyd iterations on the columns of x; returns the labels."""
    sq = np.sum(x * x, axis=0)
    centres = [int(rng.integers(x.shape[1]))]
    dist = sq - 2.0 * x[:, centres[0]] @ x + sq[centres[0]]
    for _ in range(1, k):
        prob = np.maximum(dist, 0.0)
        j = int(rng.choice(x.shape[1], p=prob / prob.sum())) if prob.sum() > 0 else 0
        centres.append(j)
        dist = np.minimum(dist, sq - 2.0 * x[:, j] @ x + sq[j])
    c = x[:, centres].copy()
    labels = np.full(x.shape[1], -1)
    for _ in range(iters):
        new = np.argmin(np.sum(c * c, axis=0)[:, None] - 2.0 * c.T @ x, axis=0)
        if np.array_equal(new, labels):
            break
        labels = new
        counts = np.bincount(labels, minlength=k)
        onehot = sp.csr_array((np.ones(labels.size), (np.arange(labels.size), labels)),
                              shape=(labels.size, k))
        sums = (onehot.T @ x.T).T
        keep = counts > 0
        c[:, keep] = sums[:, keep] / counts[keep]
    return labels


def partition(x: np.ndarray, n_clients: int, kind: Literal["iid", "noniid"],
              rng: np.random.Generator) -> list[np.ndarray]:
    """Column indices of each client: iid (random, balanced) or non-iid (k-means groups).

    Non-iid follows the paper's Case 2: k-means into ``n_clients`` groups, one per client
    (empty groups are dropped, so there may be fewer clients).
    """
    if kind == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(x.shape[1]), n_clients)]
    groups = kmeans(x, n_clients, rng, iters=20)
    return [np.flatnonzero(groups == g) for g in range(n_clients) if np.any(groups == g)]
