r"""The client side shared by the user-level gradient methods (DP-FedMAvg, DP-FedMC-ADMM).

Model (as DPALS's, :mod:`algorithms.dpals`): user u predicts item j as
``u_u . v_j + c beta_j + b_u + mu`` with V = [v_j; beta_j] the released (r + 1) x n item
matrix, ``c = bias_coordinate``, a local user bias b_u and the centre mu: with
``release_centre`` (default) the mean of the users' mean ratings estimated from a share of
each release (:mod:`algorithms._centre`: the upload's ``m``), else the public centre (the
middle of the tenant-declared public rating scale).

Client step of tenant i, given the broadcast V^k:

1. every user's ``[u_u, b_u]`` is solved exactly against V^k on all of the user's ratings
   (ridge; local, never released: :func:`algorithms.dpals.solve_users`);
2. each user enters the release independently with probability q (Poisson sampling drawn
   from the tenant's secret per-user draws, :mod:`privacy.randomness`: the server cannot
   see or recompute who was drawn, so the amplification by subsampling counts);
3. each drawn user's term, over at most k of its ratings (a fixed random subset drawn once
   at initialisation), is

   * ``g_uj = e_uj x_u`` for each kept item j: the gradient of 1/2 e_uj^2 with respect to
     w_j at V^k, with residual ``e_uj = clip(pred_uj - r_uj, +-residual_clip)`` and
     ``x_u = [clip(u_u, user_factor_clip), c]``;
   * ``h_uj = kappa ||x_u||^2``: kappa times the trace of the user's curvature
     ``x_u x_u^T`` at item j (the server's per-item step sizes come from it);

   and the whole term (all its g and h entries together) is scaled to L2 norm at most C
   (:func:`algorithms.user_bounds.clipped_item_sums`): the user's loss is in effect
   weighted by ``min(1, C / ||term||)``, the same weight in g and h;
4. the tenant uploads ``G = sum_u g_u`` (r + 1 x n) and ``H = sum_u h_u`` (n): item-side
   arrays only, no user count, no row index.

Removing a user removes exactly its clipped term (another user's term depends only on that
user's ratings and the public V^k), so the sensitivity of (G, H) is C
(:func:`user_bounds`); :mod:`privacy.user_level` adds ``N(0, (z C)^2)`` to every entry
(once to the sum, placement central; or per tenant) and accounts the release. The servers
read ``G / q`` and ``H / (kappa q)`` (unbiased for the un-sampled sums; q and kappa are
public) and derive per-item curvatures ``L_j = max(H_j, 0) / (kappa q) + noise_reg
sigma_H / (kappa q)``: post-processing of released sums, no unaccounted data-dependent
constant.

After ``releases`` rounds the clients stop uploading; one more round re-solves the users
against the final V (``rounds = releases + 1``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from pydantic import Field, model_validator

from algorithms import _centre
from algorithms import _user_kernels as UK
from algorithms import config_fields as CF
from algorithms.base import AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.dpals import (
    LocalState,
    capped,
    sample_users,
    solve_users,
    user_vectors,
)
from algorithms.messages import Message
from algorithms.pool import sum_arrays
from algorithms.scale import normalised
from algorithms.user_bounds import UserBounds, clipped_item_sums


class UserGradConfig(CF.CentredScale, AlgorithmConfig):
    """Settings shared by the user-level gradient methods."""

    rank: int = Field(4, description="r, latent factors (one item-bias row extra)")
    releases: int = Field(10, description="rounds whose uploads are released")
    max_ratings_per_user: int = Field(
        200, description="k, ratings of a user that enter its term (random subset)")
    clip_norm: float = Field(2.0, description="C, L2 bound of one user's whole term")
    user_sample_rate: float = Field(
        1.0, description="q, probability that a user enters a release (Poisson, drawn "
        "inside the tenant; q < 1 amplifies privacy)")
    curvature_weight: float = Field(
        0.5, description="kappa: weight of the curvature entries in a user's term")
    residual_clip: float | None = Field(
        2.0, description="bound of each residual in the gradient (None: off)")
    user_factor_clip: float = Field(1.0, description="bound of ||u_u|| in the term")
    bias_coordinate: float = Field(1.0, description="c, user coordinate paired with the "
                                   "item bias")
    lam_u: CF.LamU
    factor_min_ratings: CF.FactorMinRatings
    lam_bias: CF.LamBias
    lam_u_count: float = Field(0.0, description="extra user ridge per rating of the user")
    noise_reg: float = Field(
        5.0, description="extra curvature per unit of the curvature noise's std")
    curvature_floor: float = Field(1e-4, description="lower bound of each item curvature")
    user_bias: CF.UserBias
    scale_min: CF.ScaleMin
    scale_max: CF.ScaleMax
    public_centre: CF.PublicCentre
    release_centre: CF.ReleaseCentre
    centre_share: CF.CentreShare
    normalise: CF.Normalise
    init_scale: CF.InitScaleV

    @model_validator(mode="after")
    def _check_shared(self) -> UserGradConfig:
        if self.rank < 1 or self.releases < 1 or self.max_ratings_per_user < 1:
            raise ValueError("rank, releases and max_ratings_per_user must be at least 1")
        for name in ("clip_norm", "curvature_weight", "user_factor_clip", "bias_coordinate",
                     "init_scale", "curvature_floor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.residual_clip is not None and not self.residual_clip > 0:
            raise ValueError("residual_clip must be positive")
        if not 0 < self.user_sample_rate <= 1:
            raise ValueError("user_sample_rate must be in (0, 1]")
        self.check_centred_scale()
        if min(self.lam_u, self.lam_u_count, self.noise_reg, self.lam_bias or 0.0) < 0:
            raise ValueError("lam_u, lam_bias, lam_u_count and noise_reg must be "
                             "non-negative")
        return self

    @property
    def d(self) -> int:
        return self.rank + 1


def user_bounds(cfg: UserGradConfig) -> UserBounds:
    """One user's term in (G, H) has joint L2 norm at most C (and its centre term in m,
    when the centre is released, norm at most sqrt 2).

    With a residual clip R, each item's gradient column is also bounded by its curvature
    entry: a user's ``g_uj = e_uj x_u`` and ``h_uj = kappa ||x_u||^2`` carry the same clip
    weight, ``|e_uj| <= R`` and ``||x_u|| >= c`` (its constant coordinate), so
    ``||g_uj|| <= R h_uj / (kappa c)``, and summed over users ``||G_j|| <= R H_j / (kappa
    c)``: the coordinator's check of an agent's values (``item_ratio``)."""
    ratio = (None if cfg.residual_clip is None else
             ("G", "H", cfg.residual_clip / (cfg.curvature_weight * cfg.bias_coordinate)))
    bounds = dataclasses.replace(
        UserBounds.clipped_sum(("G", "H"), cfg.clip_norm,
                               {"G": "grad_noise", "H": "curv_noise"},
                               cfg.max_ratings_per_user, cfg.user_sample_rate),
        item_ratio=ratio)
    if _centre.released(cfg):
        bounds = bounds.with_centre(("m",), {"m": "centre_noise"}, cfg.centre_share)
    return bounds


@dataclasses.dataclass(frozen=True)
class GlobalModel(Message):
    """V (r + 1 x n: factor rows and the item-bias row), the releases so far, p and the
    released centre in units (None: the config's public one)."""

    V: np.ndarray
    round: int
    n_clients: int
    centre: float | None = None


@dataclasses.dataclass(frozen=True)
class Upload(Message):
    """Per-item sums of the tenant's clipped user terms: ``G`` (r + 1 x n) the gradients,
    ``H`` (n) the curvature traces times kappa; the centre sums ``m`` (2,) with
    ``release_centre``; and the std of the noise in them."""

    G: np.ndarray
    H: np.ndarray
    grad_noise: float = 0.0
    curv_noise: float = 0.0
    m: np.ndarray | None = None
    centre_noise: float = 0.0


def init_v(n_items: int, cfg: UserGradConfig, rng: np.random.Generator) -> np.ndarray:
    """V^0: Normal(0, init_scale^2) factor rows, zero item biases (data-independent)."""
    v = np.zeros((cfg.d, n_items))
    v[: cfg.rank] = rng.normal(0.0, cfg.init_scale, size=(cfg.rank, n_items))
    return v


def init_client(block: RatingBlock, global_msg: GlobalModel, cfg: UserGradConfig,
                rng: np.random.Generator) -> LocalState:
    """U^0 = 0 (solved in the first step) and the capped subset of the block's ratings."""
    keep = capped(block, cfg, rng)
    return LocalState(U=np.zeros((block.n_users, cfg.rank + 1)), keep=keep, rank=cfg.rank,
                      mu=cfg.mu, bias_coordinate=cfg.bias_coordinate, scale_unit=cfg.unit)


def user_terms(u: np.ndarray, v: np.ndarray, keep: np.ndarray, block: RatingBlock,
               cfg: UserGradConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, g terms (n_kept x d), h terms (n_kept,)) of the kept ratings, before
    the per-user clip."""
    rows, cols = block.rows[keep], block.cols[keep]
    x = user_vectors(u, cfg)
    r = cfg.rank
    pred = (np.einsum("ij,ji->i", u[rows, :r], v[:r, cols]) + cfg.bias_coordinate * v[r, cols]
            + (u[rows, r] if cfg.user_bias else 0.0) + cfg.mu)
    e = pred - block.vals[keep]
    if cfg.residual_clip is not None:
        e = np.clip(e, -cfg.residual_clip, cfg.residual_clip)
    g = e[:, None] * x[rows]
    h = cfg.curvature_weight * np.sum(x * x, axis=1)[rows]
    return rows, cols, g, h


def clipped_sums(u: np.ndarray, v: np.ndarray, keep: np.ndarray, block: RatingBlock,
                 cfg: UserGradConfig) -> tuple[np.ndarray, np.ndarray]:
    """(G (d x n), H (n)): per item, the sums of the users' clipped terms over ``keep``:
    the fused ``nogil`` kernel when numba is installed, else :func:`clipped_sums_numpy`
    (the same numbers to ~1e-13)."""
    if UK.HAVE_NUMBA:
        return UK.clipped_sums(block.rows, block.cols, block.vals, keep, u, v,
                               block.n_users, block.n_items, cfg.rank, cfg.user_bias, cfg.mu,
                               cfg.bias_coordinate, cfg.residual_clip, cfg.curvature_weight,
                               cfg.user_factor_clip, cfg.clip_norm)
    return clipped_sums_numpy(u, v, keep, block, cfg)


def clipped_sums_numpy(u: np.ndarray, v: np.ndarray, keep: np.ndarray, block: RatingBlock,
                       cfg: UserGradConfig) -> tuple[np.ndarray, np.ndarray]:
    """:func:`clipped_sums` in numpy (:func:`user_terms`, then
    :func:`algorithms.user_bounds.clipped_item_sums`)."""
    rows, cols, g, h = user_terms(u, v, keep, block, cfg)
    (gs, hs), _ = clipped_item_sums(rows, cols, [g, h], block.n_users, block.n_items,
                                    cfg.clip_norm)
    return gs.T.copy(), hs


def client_step(global_msg: GlobalModel, state: LocalState, block: RatingBlock,
                cfg: UserGradConfig, rng: np.random.Generator
                ) -> tuple[LocalState, Upload | None]:
    """Solve the users against V; while releases remain, upload the clipped sums over the
    users drawn at rate q from ``rng`` (the tenant's client stream of the round); ratings
    in units of the public scale (:func:`algorithms.scale.public_unit`)."""
    block = normalised(block, cfg.unit)
    cfg = _centre.with_centre(cfg, global_msg.centre)
    u = solve_users(global_msg.V, block, cfg)
    new = state.replace(U=u, mu=cfg.mu)
    if global_msg.round >= cfg.releases:
        return new, None  # final refresh: U now matches the released V
    keep = state.keep
    present = np.ones(block.n_users, dtype=bool)
    if cfg.user_sample_rate < 1:
        present = sample_users(block, cfg.user_sample_rate, global_msg.round, rng)
        keep = keep[present[block.rows[keep]]]
    g, h = clipped_sums(u, global_msg.V, keep, block, cfg)
    m = (_centre.client_sums(block.rows, block.vals, block.n_users, present, cfg)
         if _centre.released(cfg) else None)
    return new, Upload(G=g, H=h, m=m)


def summed(uploads: Mapping[int, Upload]) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(G, H, sigma_G, sigma_H) of the uploads' sum (noise stds add in quadrature)."""
    ups = [uploads[i] for i in sorted(uploads)]
    g = sum_arrays([u.G for u in ups])  # np.sum(..., axis=0)'s numbers, on every core
    h = sum_arrays([u.H for u in ups])
    sg = float(np.sqrt(sum(u.grad_noise ** 2 for u in ups)))
    sh = float(np.sqrt(sum(u.curv_noise ** 2 for u in ups)))
    return g, h, sg, sh


def next_centre(sums: np.ndarray | None, uploads: Mapping[int, Upload], cfg: UserGradConfig
                ) -> tuple[np.ndarray | None, float | None]:
    """(running centre sums, centre in units or None) after this round's uploads
    (:mod:`algorithms._centre`)."""
    ups = [uploads[i] for i in sorted(uploads)]
    if _centre.released(cfg) and ups and all(u.m is not None for u in ups):
        sums = _centre.update(sums, [u.m for u in ups], [u.centre_noise for u in ups])
    return sums, _centre.centre_of(sums, cfg)


def gradient_and_curvature(uploads: Mapping[int, Upload], cfg: UserGradConfig
                           ) -> tuple[np.ndarray, np.ndarray]:
    """(G / q, L): the estimated gradient of the sum of the users' (clip-weighted) losses
    at V^k and each item's curvature ``max(H, 0) / (kappa q) + noise_reg sigma_H /
    (kappa q)`` (at least ``curvature_floor``); post-processing of the released sums."""
    g, h, _, sh = summed(uploads)
    q, kappa = cfg.user_sample_rate, cfg.curvature_weight
    curv = (np.maximum(h, 0.0) + cfg.noise_reg * sh) / (kappa * q)
    return g / q, np.maximum(curv, cfg.curvature_floor)
