r"""RFRec and RFRecF: regularised federated recommendation (the RFRec paper).

Liu et al., "Efficient and Robust Regularized Federated Recommendation", CIKM 2024.
Every client i keeps a local model x_i = (U_i, V_(i)): its users' factors U_i (m_i x d)
and its own copy V_(i) (d x n) of the item factors. The federation solves eq. (5)

.. math::

    \min_x F(x) = \sum_i f_i(x_i) + \lambda \psi(x), \quad
    f_i = \|P_{\Omega_i}(R_i - U_i V_{(i)})\|^2 + \lambda_u \|U_i\|^2, \quad
    \psi = \tfrac12 \sum_i \|V_{(i)} - \bar V\|^2,

with :math:`\bar V` the mean of the V_(i) (no :math:`\lambda_v` term). Predictions use the
tenant's U_i and the global :math:`\bar V` (the paper's output, Algorithms 1-2 line 2).

RFRec (Algorithm 1, eq. 6), one iteration = one round: every client takes the gradient step
:math:`x_i \leftarrow x_i - \alpha(\nabla f_i(x_i) + \lambda(V_{(i)} - \bar V))` and
uploads V_(i); the server sets :math:`\bar V` to the mean of the uploads.

RFRecF (Algorithm 2, eqs. 7-8): the server draws :math:`\zeta_k \sim` Bernoulli(p) and sends
it with :math:`\bar V` (:math:`\zeta_{-1} = 0`, which is the pseudo-code's "or k = 0").

* :math:`\zeta_k = 0`, :math:`\zeta_{k-1} = 0`: main update
  :math:`x_i \leftarrow x_i - \frac{\alpha}{1-p} \nabla f_i(x_i)` (line 10);
* :math:`\zeta_k = 0`, :math:`\zeta_{k-1} = 1`: moving to average
  :math:`V_{(i)} \leftarrow V_{(i)} - \frac{\alpha}{p}\lambda(V_{(i)} - \bar V)` (line 12);
* :math:`\zeta_k = 1`, :math:`\zeta_{k-1} = 0`: clients upload V_(i), the server averages
  (lines 16, 19-21);
* :math:`\zeta_k = 1`, :math:`\zeta_{k-1} = 1`: nothing happens (the average is unchanged).

``client_step`` returns ``None`` whenever nothing is sent, so only the 0 -> 1 iterations
upload (expected p(1-p) per iteration; the 1 -> 0 broadcasts make the paper's 2p(1-p)).

Representation. Every client starts from :math:`V_{(i)} = \bar V^0` (the paper draws
:math:`\bar V \sim N(0, 10^{-4})`). A column j nobody in client i rated has
:math:`\nabla_{v_j} f_i = 0`, so it follows the same affine recursion toward :math:`\bar V`
in every client; its value H (d x n) is a function of the broadcast :math:`\bar V` sequence
alone. The global message carries H, and a client stores V_(i) only on the columns its
users rated: the dense V_(i) (what it uploads) is H with those columns replaced. This is
exact when every client steps every iteration (the paper's setting, ``per_round`` 0).
With client sampling (``per_round`` < number of clients) an absent client neither steps
nor uploads (the paper's dropped devices of Sec. 3.3 and Table 3 keep their local updates
instead: :func:`run_batched`'s ``absent='local'``) and the server averages the uploads it
got; on its return its never-rated columns are the broadcast H (they carry nothing of
its data, so adopting H is a protocol choice of ours: the paper does not say what a
returning device does), while its rated columns and U_i are as it left them.
With ``optimizer='adam'`` its bias-correction step t stays the global count (iterations
for RFRec, main updates for RFRecF), not the number of steps it took itself, and with
``momentum_on_return='restart'`` (RFRec's default) a client that missed an iteration
restarts its first moments (of U_i and V_(i)) at zero: RFRec's Adam step carries the
proximal pull lambda (V_(i) - V_bar), and the momentum a returning client kept points at
an average that has moved since, which with a strong tie makes the shared factors drift
(docs/benchmarks/rfrec_dropped.md). RFRecF's main update has no proximal term and keeps
its moments (``'keep'``, its default).
:func:`run_batched` runs all clients at once on this representation (6,040 per-user
clients on ML-1M).

Options. The defaults: Adam, the sigmoid link, the tenant's own rating range, bias terms
and a weighted-lambda ridge scaled by the tenant's rating variance (as fedrec's FedMC-ADMM
and FedMAvg defaults), rank 10; RFRec alpha 0.1, Adam betas (0.9, 0.9), lambda growing
from 0.25 to 2 over the run (``lam_start`` 0.125), lambda_u 0.3, lam_u_rating =
lam_v_rating = 0.002, K = 200; RFRecF the notebook schedule, p 0.8, alpha 0.04, torch's
Adam betas, lambda 40, lambda_u 0.3, lam_u_rating = lam_v_rating = 0.001, K = 400 (both
chosen on a validation carve-out, never the test ratings). The paper-reproduction benches
keep their own ``ours`` setting without bias terms (docs/benchmarks/rfrec_table2.md).
``paper_settings()`` gives the paper's Sec. 4.1.3 form: gd, identity link, no bias terms,
d = 20, K = 100, alpha = 0.05 / 0.025, lambda = 10, p = 0.5, N(0, 1e-4) init,
lambda_u = 0.1, Algorithm 2's schedule, a constant step and lambda, torch's Adam betas
(for the Adam variants of the benches).

``lr_final`` (default 1), ``lam_start`` (RFRec default 0.125, RFRecF 1)
    schedules over the K iterations, the same for every client (the server's iteration
    count sets them): the step decays from alpha to alpha lr_final along a half cosine
    (:func:`step_size`), psi's weight grows geometrically from lambda lam_start to lambda
    (:func:`penalty`), a continuation of the penalty. V_bar moves by about the mean of the
    clients' psi-pulls, so a weak tie early lets it follow the data fast, and the full one
    at the end leaves the local V_(i) close to it.

``rating_range="tenant"`` (default), ``(lo, hi)`` or ``None``
    train on (r - lo)/(hi - lo) and predict lo + (hi - lo) U_i V_bar, as the authors' code
    scales (the paper does not say); with ``"tenant"`` (lo, hi) is the tenant's declared
    scale or its data's range (:func:`algorithms.scale.scale_of`), kept in its local state,
    so any rating scale works; ``None`` trains on raw ratings.
``optimizer="adam"``
    RFRec: one Adam step (learning rate alpha) on f_i + lambda psi_i per iteration instead
    of eq. (6), as the authors' code trains; the never-rated columns share Adam moments
    too, carried in the global message, so the lazy representation stays exact. RFRecF:
    the main update is an Adam step (learning rate alpha/(1-p)) on f_i (zero on never-rated
    columns, which therefore do not move); moving to average is unchanged.
``link="sigmoid"``
    predict lo + (hi - lo) sigmoid(U_i V_bar) as the authors' code; ``factors`` then raises
    (not a matrix product): the registry's algorithms evaluate through
    ``predict_entries`` (:func:`predict_ratings`), which the simulator uses.
``schedule="code"`` (RFRecF)
    the authors' RFRecF notebook instead of Algorithm 2's schedule: every zeta = 0
    iteration is a main update; after an aggregation it is preceded by the move to the
    average at rate min(1, alpha lambda / p) (the notebook resets to V_bar). Algorithm 2
    spends the first zeta = 0 iteration after each aggregation on the move alone, so only
    about (1 - p)^2 of the iterations are main updates (25 of K = 100 at p = 0.5), which
    leaves the model near its initialisation (docs/benchmarks/rfrec_table2.md).
    Communication is unchanged
    (only when zeta changes).

The paper's GD form at the paper's settings diverges on MovieLens (alpha = 0.05 violates
the paper's own condition alpha <= 1/(L + lambda) of Theorem 3.4 once the factors grow;
docs/benchmarks/rfrec_table2.md). Privacy is
not applied here: the clip + Laplace of eq. (9) is the privacy layer's wrapper around the
client step (the algorithm uploads the clean V_(i)); :func:`paper_dp` gives the paper's
(delta, s).

``bias=True`` (default; the paper has none)
    prediction link(c_i + b_u + b_v + u_t v_j): the tenant's centre c_i (its mean target
    through the inverse link, a local constant), a user bias b_u (a column of U_i, next to
    a column of ones) and an item bias b_v (a row of V_(i) next to a row of ones). The item
    bias is part of V_(i), so psi pulls it to its average and the server averages it like
    any row; the ones row of V_bar is public and reset to one after each aggregation
    (clipping and noise of eq. 9 do not move it). The updates are Algorithms 1 and 2 on
    the augmented (U_i, V_(i)) with the fixed entries' gradient zero.
``lam_u_rating``, ``lam_v_rating``
    a weighted-lambda ridge inside f_i (as ALS-WR and fedrec's FedMC-ADMM and FedMAvg
    defaults): lam_u_rating n_t ||u_t||^2 per user and lam_v_rating n_j^(i) ||v_j||^2 per
    item the tenant rated n_j^(i) times (summed over tenants, n_j ||v_j||^2), both times
    the tenant's ridge scale :func:`algorithms.scale.ridge_scale_of`. The paper omits a
    lambda_v term (psi alone ties V); the per-rating form shrinks rarely rated items and
    light users more, which a fixed weight cannot. Adam's per-coordinate steps make
    FedMAvg's per-row step bounds unnecessary here (the paper's GD form keeps alpha).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import ClassVar, Literal

import numpy as np
import scipy.sparse as sp
from pydantic import ConfigDict, Field, model_validator
from scipy.special import expit, logit

from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.block import RatingBlock
from algorithms.data import Federation
from algorithms.fedmavg import bias_masks
from algorithms.messages import Message
from algorithms.rng import SERVER, derive_rng, sample_clients
from algorithms.scale import ridge_scale_of, scale_of, unit_of
from algorithms.simulate import (
    AGGREGATE,
    RoundRecord,
    RoundState,
    SimulationResult,
    drive,
    initialise,
    select_clients,
)


class RFRecConfig(AlgorithmConfig):
    """RFRec hyper-parameters. Defaults: Adam, the sigmoid link on the tenant's rating
    range, bias terms and the weighted-lambda ridge, 200 iterations (module docstring);
    :meth:`paper_settings` gives the paper's Sec. 4.1.3 GD form."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    rank: int = Field(10, ge=1)
    """d, the number of latent factors (paper 20)."""
    alpha: float = Field(0.1, gt=0)
    """Learning rate alpha (eq. 6; paper 0.05)."""
    lam: float = Field(2.0, ge=0)
    """Penalty lambda on psi = 1/2 sum_i ||V_(i) - V_bar||^2 (paper 10); the weight the run
    ends with (``lam_start``)."""
    lam_u: float = Field(0.3, ge=0)
    """lambda_u on ||U_i||^2; the paper sets 0.1 for its baselines and the code uses 0.1."""
    init_std: float = Field(0.01, gt=0)
    """Standard deviation of the Gaussian init of U_i and V_bar (N(0, 1e-4))."""
    iterations: int = Field(200, ge=1)
    """K, the recommended number of rounds (one iteration per round; paper 100)."""
    rating_range: tuple[float, float] | Literal["tenant"] | None = "tenant"
    """(lo, hi): train on (r - lo)/(hi - lo), as the authors' code does (the paper is silent);
    "tenant" (default): (lo, hi) is the tenant's declared scale, or its data's range
    (:func:`algorithms.scale.scale_of`), so any rating scale works; None trains on raw
    ratings."""
    optimizer: Literal["gd", "adam"] = "adam"
    """gd: the paper's gradient step (eq. 6). adam: one Adam step with learning rate alpha on
    f_i + lambda psi_i per iteration, as the authors' code does; in RFRecF the main update
    is an Adam step (learning rate alpha/(1-p)) on f_i and moving to average stays eq. 8."""
    link: Literal["identity", "sigmoid"] = "sigmoid"
    """identity: predict U V (the paper). sigmoid: predict lo + (hi - lo) sigmoid(U V) as the
    authors' code does (needs rating_range; not a matrix product, so evaluate with
    :func:`run_batched` or :func:`predict_ratings`, not ``factors``)."""
    adam_betas: tuple[float, float] = (0.9, 0.9)
    """Adam's (beta1, beta2); the authors' code has torch's (0.9, 0.999) (the paper preset),
    whose long memory of squared gradients kept the steps of the default run small and
    its curves still falling at K."""
    adam_eps: float = Field(1e-8, gt=0)
    """Adam's epsilon."""
    lr_final: float = Field(1.0, gt=0, le=1)
    """The step size at iteration K (``iterations``) as a fraction of alpha: it decays from
    alpha at the first iteration along a half cosine, and stays there after K
    (:func:`step_size`); 1: a constant alpha (the paper)."""
    lam_start: float = Field(0.125, gt=0, le=1)
    """psi's weight at the first iteration as a fraction of lambda: it grows geometrically
    to lambda at iteration K (``iterations``) and stays there (:func:`penalty`, a
    continuation of the penalty: a weak tie moves V_bar fast early, the full one keeps the
    consensus close at the end); 1: a constant lambda (the paper)."""
    bias: bool = True
    """User and item bias terms and the tenant's mean: the prediction is
    link(c_i + b_u + b_v + u V) with c_i the tenant's mean target through the inverse link
    (a local constant), b_u a column of U_i (local, never uploaded) and b_v a row of
    V_(i) (under psi and averaged as V, so the federation learns it as it learns V).
    False: the paper's plain link(U_i V_(i))."""
    lam_u_rating: float = Field(0.002, ge=0)
    """Weighted-lambda ridge on U_i (as ALS-WR): a user row (with its bias) with n ratings
    gets lam_u_rating n, times the tenant's ridge scale (its rating variance in units over
    MovieLens' 1.1257^2, from its own training ratings); on top of lambda_u."""
    lam_v_rating: float = Field(0.002, ge=0)
    """Weighted-lambda ridge on the tenant's rated columns of V_(i) (with the item bias): a
    column its users rated n times gets lam_v_rating n, times the same ridge scale, inside
    f_i (the paper omits lambda_v; a per-tenant term, psi is unchanged)."""
    momentum_on_return: Literal["restart", "keep", "decay"] = "restart"
    """With ``optimizer='adam'`` and dropped clients: ``restart`` zeroes the first moments
    of a client that missed an iteration before its next step; ``keep`` resumes them as it
    left them; ``decay`` ages them by the iterations it missed (first moments times
    beta1^missed, second times beta2^missed: the moments Adam would hold had the client
    seen a zero gradient meanwhile). No effect when every client takes part in every
    iteration."""
    #: ``fedrec tune``'s search space (:mod:`algorithms.tuning`), around the defaults
    search_space: ClassVar[dict[str, tuple]] = {
        "lam": ("log", 0.25, 4.0), "lam_u_rating": ("log", 0.001, 0.01),
        "alpha": ("log", 0.03, 0.3)}

    @model_validator(mode="after")
    def _check_options(self) -> RFRecConfig:
        if (isinstance(self.rating_range, tuple)
                and not self.rating_range[1] > self.rating_range[0]):
            raise ValueError("rating_range must be (lo, hi) with hi > lo")
        if self.link == "sigmoid" and self.rating_range is None:
            raise ValueError("link='sigmoid' needs rating_range")
        if not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError("adam_betas must lie in [0, 1)")
        return self

    @classmethod
    def paper_settings(cls, **overrides: object) -> RFRecConfig:
        """The paper's Sec. 4.1.3 run: the GD step of eq. (6), identity link, no bias terms
        nor weighted ridge, d = 20, K = 100, alpha = 0.05, lambda = 10, lambda_u = 0.1,
        N(0, 1e-4) init, on ratings scaled by the tenant's range as the authors' code does
        (the paper is silent).
        ``overrides`` replace fields. It diverges on MovieLens (module docstring)."""
        return cls(**{**_PAPER_RFREC, **overrides})

    @classmethod
    def paper_dp(cls) -> tuple[float, float]:
        """The paper's eq. (9) pair (clip delta, Laplace scale s) for RFRec (Sec. 4.7)."""
        return (0.2, 0.04)


class RFRecFConfig(RFRecConfig):
    """RFRecF hyper-parameters. Defaults: Adam, sigmoid link, bias terms and the weighted
    ridge, the authors' schedule, p = 0.8, 400 iterations (module docstring);
    :meth:`paper_settings` gives the paper's Algorithm 2 with its Sec. 4.1.3 values."""

    alpha: float = Field(0.04, gt=0)
    """Learning rate alpha (eq. 8; paper 0.025)."""
    lam: float = Field(40.0, ge=0)
    """Penalty lambda on psi (paper 10; with the default schedule 'code', alpha lambda / p
    >= 1 makes the move to the average a full reset, as the authors' notebook)."""
    lam_u_rating: float = Field(0.001, ge=0)
    """As RFRec's (weighted-lambda ridge on U_i)."""
    lam_v_rating: float = Field(0.001, ge=0)
    """As RFRec's (weighted-lambda ridge on V_(i)'s rated columns)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """Adam's (beta1, beta2), torch's as the authors' code (RFRec's (0.9, 0.9) measured
    worse here)."""
    lam_start: float = Field(1.0, gt=0, le=1)
    """As RFRec's; 1 (a constant lambda) by default, so that the move to the average stays
    a full reset."""
    iterations: int = Field(400, ge=1)
    """K, the recommended number of rounds (paper 100)."""
    p: float = Field(0.8, gt=0, lt=1)
    """Probability of zeta = 1 (an aggregation iteration; paper 0.5, the notebook 0.8)."""
    momentum_on_return: Literal["restart", "keep", "decay"] = "keep"
    """As RFRec's, but ``keep`` by default: RFRecF's main update has no proximal term, and
    the restart measurably hurts it with dropped clients (module docstring)."""
    search_space: ClassVar[dict[str, tuple]] = {
        "lam_u_rating": ("log", 0.0005, 0.008), "lam_u": ("log", 0.05, 3.0),
        "alpha": ("log", 0.01, 0.16)}
    schedule: Literal["paper", "code"] = "code"
    """paper: Algorithm 2 as printed (the first zeta = 0 iteration after an aggregation only
    moves to the average, at rate alpha lambda / p). code: the authors' notebook, where every
    zeta = 0 iteration is a main update, preceded after an aggregation by the move to the
    average at rate min(1, alpha lambda / p) (the notebook resets to V_bar, rate 1)."""

    @classmethod
    def paper_settings(cls, **overrides: object) -> RFRecFConfig:
        """The paper's Algorithm 2 at its Sec. 4.1.3 values: RFRec's paper settings with
        alpha = 0.025, p = 0.5 and Algorithm 2's schedule. ``overrides`` replace fields."""
        return cls(**{**_PAPER_RFREC, **_PAPER_RFRECF, **overrides})

    @classmethod
    def paper_dp(cls) -> tuple[float, float]:
        """The paper's eq. (9) pair (clip delta, Laplace scale s) for RFRecF (Sec. 4.7)."""
        return (0.2, 0.06)


#: the paper's Sec. 4.1.3 settings (RFRec), and what RFRecF changes
_PAPER_RFREC: dict[str, object] = dict(
    rank=20, alpha=0.05, lam=10.0, lam_u=0.1, init_std=0.01, iterations=100,
    rating_range="tenant", optimizer="gd", link="identity", momentum_on_return="restart",
    bias=False, lam_u_rating=0.0, lam_v_rating=0.0, lr_final=1.0, lam_start=1.0,
    adam_betas=(0.9, 0.999))
_PAPER_RFRECF: dict[str, object] = dict(alpha=0.025, p=0.5, schedule="paper",
                                        momentum_on_return="keep")


def paper_dp(name: str) -> tuple[float, float]:
    """(clip delta, Laplace scale s) the paper chose for ``"rfrec"`` or ``"rfrecf"``."""
    configs = {"rfrec": RFRecConfig, "rfrecf": RFRecFConfig}
    if name not in configs:
        raise KeyError(f"no paper DP setting for {name!r}")
    return configs[name].paper_dp()


@dataclasses.dataclass(frozen=True)
class RFRecGlobal(Message):
    """What the server holds and broadcasts (also the server state).

    ``v_bar`` is the global item matrix, ``h`` the common value of every never-rated column
    of every V_(i), ``zeta``/``zeta_prev`` the RFRecF coins of this and the last iteration
    (0 for RFRec), ``offset``/``spread`` map the model's scale back to ratings, ``link`` is
    the prediction link; ``h_m1``/``h_m2`` are H's Adam moments (None with gd) and
    ``steps`` counts RFRecF's main updates so far (Adam's t).
    """

    v_bar: np.ndarray
    h: np.ndarray
    k: int
    zeta: int
    zeta_prev: int
    offset: float
    spread: float
    link: str = "identity"
    h_m1: np.ndarray | None = None
    h_m2: np.ndarray | None = None
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class RFRecLocal(Message):
    """Tenant state: U_i (m_i x d) and V_(i) on the tenant's rated items (d x |rated|),
    with their Adam moments when ``optimizer='adam'`` (None with gd); ``last`` is the last
    iteration the client took part in (0 before the first); ``offset``/``spread`` map the
    model's scale to this tenant's ratings with ``rating_range='tenant'`` (None: the global
    message's, as states stored before the field existed); ``centre`` is c_i, the tenant's
    mean target through the inverse link, added inside the link with ``bias`` (None: 0,
    as without bias terms and in states stored before the field existed). With ``bias``
    U_i is [U | b_u | 1] and V_(i) is [V ; 1 ; b_v] (d + 2 rows)."""

    user_rows: ClassVar[tuple[str, ...]] = ("u", "u_m1", "u_m2")

    u: np.ndarray
    v_rated: np.ndarray
    u_m1: np.ndarray | None = None
    u_m2: np.ndarray | None = None
    v_m1: np.ndarray | None = None
    v_m2: np.ndarray | None = None
    last: int = 0
    offset: float | None = None
    spread: float | None = None
    centre: float | None = None


@dataclasses.dataclass(frozen=True)
class RFRecUpload(Message):
    """The dense local item matrix V_(i) (d x n); eq. (9) noise is added by a wrapper."""

    v: np.ndarray


# --------------------------------------------------------------------------- steps


def init_server(n_items: int, n_clients: int, cfg: RFRecConfig, rng: np.random.Generator
                ) -> tuple[RFRecGlobal, RFRecGlobal]:
    """V_bar^0 ~ N(0, init_std^2) (Algorithms 1-2 line 3); RFRecF draws zeta_0."""
    v_bar = rng.normal(0.0, cfg.init_std, size=(cfg.rank, n_items))
    if cfg.bias:  # [V ; 1 ; b_v]: the ones pair with b_u, the item biases start at 0
        v_bar = np.vstack([v_bar, np.ones((1, n_items)), np.zeros((1, n_items))])
    zeta = _coin(cfg, rng)
    offset, spread = _scale(cfg)
    g = RFRecGlobal(v_bar, v_bar.copy(), 0, zeta, 0, offset, spread, cfg.link,
                    *_zero_moments(cfg, v_bar.shape))
    return g, g


def init_client(block: RatingBlock, global_msg: RFRecGlobal, cfg: RFRecConfig,
                rng: np.random.Generator) -> RFRecLocal:
    """U_i ~ N(0, init_std^2); V_(i) starts at V_bar^0 (stored on rated columns only).
    With ``bias``: [U | b_u | 1] with b_u = 0, and the tenant's centre c_i."""
    u = rng.normal(0.0, cfg.init_std, size=(block.n_users, cfg.rank))
    if cfg.bias:
        u = np.hstack([u, np.zeros((block.n_users, 1)), np.ones((block.n_users, 1))])
    v = global_msg.h[:, block.rated_items].copy()
    offset, spread = block_scale(block, cfg)
    return RFRecLocal(u, v, *_zero_moments(cfg, u.shape), *_zero_moments(cfg, v.shape),
                      offset=offset, spread=spread, centre=block_centre(block, cfg))


def rfrec_client_step(global_msg: RFRecGlobal, local: RFRecLocal, block: RatingBlock,
                      cfg: RFRecConfig, rng: np.random.Generator
                      ) -> tuple[RFRecLocal, RFRecUpload]:
    """Algorithm 1 lines 7-8: one step on f_i + lambda psi_i, then upload V_(i)."""
    items, t = block.rated_items, global_msg.k + 1
    local = _on_return(local, global_msg.k, cfg)
    g_u, g_v = grad_f(local.u, local.v_rated, block, cfg, local.centre or 0.0)
    g_v = g_v + penalty(cfg, t) * (local.v_rated - global_msg.v_bar[:, items])
    u, u_m = descend(local.u, g_u, (local.u_m1, local.u_m2), t, cfg)
    v, v_m = descend(local.v_rated, g_v, (local.v_m1, local.v_m2), t, cfg)
    h, _ = _step_h(global_msg, cfg)
    new = local.replace(u=u, v_rated=v, u_m1=u_m[0], u_m2=u_m[1], v_m1=v_m[0], v_m2=v_m[1],
                        last=t)
    return new, RFRecUpload(dense_v(h, v, items))


def rfrec_server_step(state: RFRecGlobal, uploads: Mapping[int, RFRecUpload],
                      cfg: RFRecConfig, rng: np.random.Generator
                      ) -> tuple[RFRecGlobal, RFRecGlobal]:
    """Algorithm 1 line 10: V_bar = mean of the uploads; H follows the never-rated columns."""
    h, (h_m1, h_m2) = _step_h(state, cfg)
    g = state.replace(v_bar=fix_ones(_mean(uploads, state.v_bar), cfg), h=h, k=state.k + 1,
                      h_m1=h_m1, h_m2=h_m2)
    return g, g


def rfrecf_client_step(global_msg: RFRecGlobal, local: RFRecLocal, block: RatingBlock,
                       cfg: RFRecFConfig, rng: np.random.Generator
                       ) -> tuple[RFRecLocal, RFRecUpload | None]:
    """Algorithm 2 lines 6-13 and 19-21 for one client, or the notebook's schedule with
    ``schedule='code'`` (see the module docstring)."""
    zeta, prev = global_msg.zeta, global_msg.zeta_prev
    local = _on_return(local, global_msg.k, cfg).replace(last=global_msg.k + 1)
    if zeta == 1:
        if prev == 1:
            return local, None
        return local, RFRecUpload(dense_v(global_msg.h, local.v_rated, block.rated_items))
    if prev == 1:
        v_bar = global_msg.v_bar[:, block.rated_items]
        local = local.replace(v_rated=relax(local.v_rated, v_bar,
                                            move_rate(cfg, global_msg.k + 1)))
        if cfg.schedule == "paper":
            return local, None
    lr, t = step_size(cfg, global_msg.k + 1) / (1.0 - cfg.p), global_msg.steps + 1
    g_u, g_v = grad_f(local.u, local.v_rated, block, cfg, local.centre or 0.0)
    u, u_m = descend(local.u, g_u, (local.u_m1, local.u_m2), t, cfg, lr)
    v, v_m = descend(local.v_rated, g_v, (local.v_m1, local.v_m2), t, cfg, lr)
    return local.replace(u=u, v_rated=v, u_m1=u_m[0], u_m2=u_m[1], v_m1=v_m[0],
                         v_m2=v_m[1]), None


def rfrecf_server_step(state: RFRecGlobal, uploads: Mapping[int, RFRecUpload],
                       cfg: RFRecFConfig, rng: np.random.Generator
                       ) -> tuple[RFRecGlobal, RFRecGlobal]:
    """Algorithm 2 line 16 (aggregate when zeta = 1), then draw zeta_{k+1}."""
    v_bar = fix_ones(_mean(uploads, state.v_bar), cfg) if state.zeta == 1 else state.v_bar
    h = state.h
    if state.zeta == 0 and state.zeta_prev == 1:
        h = relax(state.h, state.v_bar, move_rate(cfg, state.k + 1))
    main = state.zeta == 0 and (state.zeta_prev == 0 or cfg.schedule == "code")
    g = state.replace(v_bar=v_bar, h=h, k=state.k + 1, zeta=_coin(cfg, rng),
                      zeta_prev=state.zeta, steps=state.steps + int(main))
    return g, g


def move_rate(cfg: RFRecFConfig, k: int | None = None) -> float:
    """Rate of the move to the average: alpha lambda / p (Algorithm 2 line 12), capped at
    1 (a full reset to V_bar, as the authors' notebook) with ``schedule='code'``; lambda
    of iteration k (:func:`penalty`; None: ``lam``)."""
    rate = cfg.alpha * (cfg.lam if k is None else penalty(cfg, k)) / cfg.p
    return min(1.0, rate) if cfg.schedule == "code" else rate


def select(global_msg: Message, n_clients: int, per_round: int,
           rng: np.random.Generator) -> np.ndarray:
    """The clients that take part in an iteration (Sec. 3.3 and Table 3's dropped devices).

    ``per_round`` <= 0 or >= n_clients: every client (Algorithms 1-2). Otherwise ``per_round``
    clients drawn uniformly without replacement; the others neither step nor upload and
    the server averages the uploads it received (Sec. 3.3).
    """
    if per_round <= 0 or per_round >= n_clients:
        return np.arange(n_clients)
    return sample_clients(rng, n_clients, per_round)


def factors(global_msg: RFRecGlobal, local: RFRecLocal) -> tuple[np.ndarray, np.ndarray]:
    """Prediction offset + spread (c_i + U_i V_bar) as [spread U_i, offset + spread c_i] @
    [V_bar; 1] (the tenant's own offset, spread and centre). With ``link='sigmoid'``: the
    raw (U_i, V_bar), with [U_i | c_i] and [V_bar; 1] when the tenant has a centre, whose
    product goes through :func:`serving_link` (the prediction is no matrix product)."""
    ones = np.ones((1, global_msg.v_bar.shape[1]))
    if global_msg.link != "identity":
        if local.centre is None:
            return local.u.copy(), global_msg.v_bar.copy()
        # [U_i | c_i] @ [V_bar ; 1]: the centre goes inside the link
        return (np.hstack([local.u, np.full((local.u.shape[0], 1), local.centre)]),
                np.vstack([global_msg.v_bar, ones]))
    offset, spread = local_scale(global_msg, local)
    offset += spread * (local.centre or 0.0)
    a = np.hstack([spread * local.u, np.full((local.u.shape[0], 1), offset)])
    return a, np.vstack([global_msg.v_bar, ones])


def serving_link(global_msg: RFRecGlobal, local: RFRecLocal) -> tuple[float, float] | None:
    """(offset, spread) of ``offset + spread * sigmoid(U_i V_bar)`` for the sigmoid link
    (the same function as :func:`predict_ratings`); None for the identity link."""
    if global_msg.link != "sigmoid":
        return None
    offset, spread = local_scale(global_msg, local)
    return float(offset), float(spread)


def objective(global_msg: RFRecGlobal, local: RFRecLocal, block: RatingBlock,
              cfg: RFRecConfig) -> float:
    """F_i = f_i + lambda/2 ||V_(i) - V_bar||^2 (eq. 5), in the model's rating scale, f_i
    with the weighted-lambda ridge terms (the fixed ones of the bias terms not penalised)."""
    items = block.rated_items
    resid = residual(local.u, local.v_rated, block, cfg, local.centre or 0.0)
    u, v = _free(local.u, local.v_rated, cfg)
    w_u, w_v = ridge_weights(block, cfg)
    f = (float(resid @ resid) + cfg.lam_u * float(np.sum(u * u))
         + float(w_u @ np.sum(u * u, axis=1)) + float(w_v @ np.sum(v * v, axis=0)))
    unrated = np.ones(global_msg.v_bar.shape[1], dtype=bool)
    unrated[items] = False
    d_rated = local.v_rated - global_msg.v_bar[:, items]
    d_free = (global_msg.h - global_msg.v_bar)[:, unrated]
    return f + 0.5 * cfg.lam * float(np.sum(d_rated * d_rated) + np.sum(d_free * d_free))


# --------------------------------------------------------------------------- maths


def predict_ratings(global_msg: RFRecGlobal, local: RFRecLocal, rows: np.ndarray,
                    cols: np.ndarray) -> np.ndarray:
    """Predicted ratings of entries (rows[t], cols[t]) for either link."""
    z = np.einsum("td,dt->t", local.u[rows], global_msg.v_bar[:, cols]) + (local.centre or 0.0)
    offset, spread = local_scale(global_msg, local)
    return offset + spread * _link(z, global_msg.link)[0]


def local_scale(global_msg: RFRecGlobal, local: RFRecLocal) -> tuple[float, float]:
    """(offset, spread) mapping this tenant's model scale to its ratings."""
    if local.offset is None:
        return global_msg.offset, global_msg.spread
    return local.offset, local.spread


def targets(block: RatingBlock, cfg: RFRecConfig) -> np.ndarray:
    """Ratings in the model's scale: raw, or (r - lo)/(hi - lo) with ``rating_range``."""
    offset, spread = block_scale(block, cfg)
    return (block.vals - offset) / spread


def residual(u: np.ndarray, v_rated: np.ndarray, block: RatingBlock,
             cfg: RFRecConfig, centre: float = 0.0) -> np.ndarray:
    """link(c_i + U_i V_(i)) - R_i on the observed entries (length nnz)."""
    return _residual_and_weight(u, v_rated, block, cfg, centre)[0]


def _residual_and_weight(u: np.ndarray, v_rated: np.ndarray, block: RatingBlock,
                         cfg: RFRecConfig, centre: float = 0.0
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Residual e and e * link'(z), the factor of the gradients (chain rule)."""
    pos = np.searchsorted(block.rated_items, block.cols)
    z = np.einsum("td,dt->t", u[block.rows], v_rated[:, pos]) + centre
    pred, slope = _link(z, cfg.link)
    e = pred - targets(block, cfg)
    return e, e * slope


def _link(z: np.ndarray, link: str) -> tuple[np.ndarray, np.ndarray | float]:
    """The prediction link and its derivative: identity, or the authors' sigmoid."""
    if link == "identity":
        return z, 1.0
    s = expit(z)  # 1 / (1 + exp(-z)) without overflow warnings for large |z|
    return s, s * (1.0 - s)


def grad_f(u: np.ndarray, v_rated: np.ndarray, block: RatingBlock, cfg: RFRecConfig,
           centre: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of f_i (eq. 12 without the psi part) w.r.t. U_i and the rated V_(i) columns.

    grad_U = 2 E V^T + 2 lambda_u U + 2 W_u U and grad_V = 2 U^T E + 2 V W_v,
    E = P_Omega(c_i + U V - R) (times the link's derivative with the sigmoid option), W_u
    and W_v the weighted-lambda ridge (:func:`ridge_weights`); zero on the fixed ones of
    the bias terms.
    """
    pos = np.searchsorted(block.rated_items, block.cols)
    e = sp.csr_array((_residual_and_weight(u, v_rated, block, cfg, centre)[1],
                      (block.rows, pos)), shape=(block.n_users, v_rated.shape[1]))
    w_u, w_v = ridge_weights(block, cfg)
    g_u = 2.0 * (e @ v_rated.T) + 2.0 * (cfg.lam_u + w_u)[:, None] * u
    g_v = 2.0 * (e.T @ u).T + 2.0 * v_rated * w_v[None, :]
    return _free(g_u, g_v, cfg)


def ridge_weights(block: RatingBlock, cfg: RFRecConfig) -> tuple[np.ndarray, np.ndarray]:
    """The weighted-lambda ridge of U_i's rows (m_i,) and of V_(i)'s rated columns
    (|rated|,): lam_u_rating n_t s and lam_v_rating n_j s, n_t the user's ratings, n_j the
    tenant's ratings of item j and s the tenant's ridge scale
    (:func:`algorithms.scale.ridge_scale_of`, from its own training ratings)."""
    if cfg.lam_u_rating == 0 and cfg.lam_v_rating == 0:
        return np.zeros(block.n_users), np.zeros(block.rated_items.shape[0])
    s = ridge_scale_of(block, unit_of(block))
    n_t = np.bincount(block.rows, minlength=block.n_users).astype(float)
    n_j = np.bincount(np.searchsorted(block.rated_items, block.cols),
                      minlength=block.rated_items.shape[0]).astype(float)
    return s * cfg.lam_u_rating * n_t, s * cfg.lam_v_rating * n_j


def _free(u: np.ndarray, v: np.ndarray, cfg: RFRecConfig) -> tuple[np.ndarray, np.ndarray]:
    """(U, V) with the fixed ones of the bias terms zeroed (as they are, without bias)."""
    u_free, v_free = bias_masks(cfg)
    if u_free is None or u.shape[1] != u_free.size:
        return u, v
    return u * u_free[None, :], v * v_free[:, None]


def block_centre(block: RatingBlock, cfg: RFRecConfig) -> float | None:
    """c_i, the tenant's mean target through the inverse link (logit for the sigmoid,
    the mean clipped to [0.01, 0.99] of the range first), with ``bias``; else None."""
    if not cfg.bias:
        return None
    if block.nnz == 0:
        return 0.0
    mean = float(targets(block, cfg).mean())
    if cfg.link == "sigmoid":
        mean = float(logit(np.clip(mean, 0.01, 0.99)))
    return mean


def fix_ones(v_bar: np.ndarray, cfg: RFRecConfig) -> np.ndarray:
    """V_bar with its row of ones (paired with the user biases) exactly one again: the
    row is public and fixed, and clipping or noise of the uploads must not move it."""
    if cfg.bias and v_bar.shape[0] == cfg.rank + 2:
        v_bar = v_bar.copy()
        v_bar[cfg.rank] = 1.0
    return v_bar


Moments = tuple[np.ndarray | None, np.ndarray | None]


def descend(x: np.ndarray, g: np.ndarray, moments: Moments, t: int, cfg: RFRecConfig,
            lr: float | None = None) -> tuple[np.ndarray, Moments]:
    """x - lr g (eq. 6), or Adam step t (Kingma and Ba, Alg. 1); lr defaults to the step
    size of iteration t (:func:`step_size`: RFRec's t is its iteration)."""
    lr = step_size(cfg, t) if lr is None else lr
    if cfg.optimizer == "gd":
        return x - lr * g, moments
    b1, b2 = cfg.adam_betas
    m1 = b1 * moments[0]
    m1 += (1.0 - b1) * g
    m2 = g * g
    m2 *= 1.0 - b2
    m2 += b2 * moments[1]
    # step = (m1 / (1 - b1^t)) / (sqrt(m2 / (1 - b2^t)) + eps), with fewer temporaries
    den = m2 / (1.0 - b2**t)
    np.sqrt(den, out=den)
    den += cfg.adam_eps
    np.divide(m1, den, out=den)
    den *= lr / (1.0 - b1**t)
    return x - den, (m1, m2)


def step_size(cfg: RFRecConfig, k: int) -> float:
    """alpha at iteration k (1 = the first): alpha (lr_final + (1 - lr_final)(1 + cos(pi x))
    / 2) with x = (k - 1) / (K - 1) capped at 1, K = ``iterations``; alpha throughout with
    ``lr_final`` 1. The server knows k, so every client (and H) takes the same step."""
    if cfg.lr_final >= 1.0:
        return cfg.alpha
    x = min(max(k - 1, 0) / max(cfg.iterations - 1, 1), 1.0)
    cosine = 0.5 * (1.0 + math.cos(math.pi * x))
    return cfg.alpha * (cfg.lr_final + (1.0 - cfg.lr_final) * cosine)


def penalty(cfg: RFRecConfig, k: int) -> float:
    """lambda at iteration k (1 = the first): lambda lam_start^(1 - x), x = (k - 1) / (K - 1)
    capped at 1, K = ``iterations``; lambda throughout with ``lam_start`` 1. The
    objective (:func:`objective`) keeps ``lam``, the weight the run ends with."""
    if cfg.lam_start >= 1.0:
        return cfg.lam
    x = min(max(k - 1, 0) / max(cfg.iterations - 1, 1), 1.0)
    return cfg.lam * cfg.lam_start ** (1.0 - x)


def _step_h(g: RFRecGlobal, cfg: RFRecConfig) -> tuple[np.ndarray, Moments]:
    """RFRec's step on the never-rated columns: grad f = 0 there, so only lambda psi acts."""
    lam = penalty(cfg, g.k + 1)
    return descend(g.h, lam * (g.h - g.v_bar), (g.h_m1, g.h_m2), g.k + 1, cfg)


def _on_return(local: RFRecLocal, k: int, cfg: RFRecConfig) -> RFRecLocal:
    """The state a client steps from at iteration k + 1: with Adam, when it missed an
    iteration since its last (``last`` < k), first moments zeroed
    (``momentum_on_return='restart'``) or both aged by the k - last iterations it missed
    (``'decay'``)."""
    if cfg.optimizer != "adam" or cfg.momentum_on_return == "keep" or local.last >= k:
        return local
    f1, f2 = _return_factors(cfg, k - local.last)
    return local.replace(u_m1=f1 * local.u_m1, v_m1=f1 * local.v_m1, u_m2=f2 * local.u_m2,
                         v_m2=f2 * local.v_m2)


def _return_factors(cfg: RFRecConfig, missed: np.ndarray | int
                    ) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Factors of the (first, second) moments of a client that missed ``missed`` (> 0)
    iterations, under ``momentum_on_return`` 'restart' or 'decay'."""
    if cfg.momentum_on_return == "restart":
        return 0.0, 1.0
    b1, b2 = cfg.adam_betas
    return np.power(b1, missed), np.power(b2, missed)


def _zero_moments(cfg: RFRecConfig, shape: tuple[int, ...]) -> Moments:
    if cfg.optimizer == "gd":
        return None, None
    return np.zeros(shape), np.zeros(shape)


def relax(v: np.ndarray, v_bar: np.ndarray, c: float) -> np.ndarray:
    """One step V - c (V - V_bar) toward the average (the psi gradient step, c = alpha lambda)."""
    return v - c * (v - v_bar)


def dense_v(h: np.ndarray, v_rated: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The dense V_(i): H with the client's rated columns replaced."""
    v = h.copy()
    v[:, items] = v_rated
    return v


def _mean(uploads: Mapping[int, RFRecUpload], default: np.ndarray) -> np.ndarray:
    """(1/n) sum_i V~_(i) over the clients that uploaded; unchanged when nobody did."""
    if not uploads:
        return default
    total = np.zeros_like(default)
    for i in sorted(uploads):
        total += uploads[i].v
    return total / len(uploads)


def _coin(cfg: RFRecConfig, rng: np.random.Generator) -> int:
    """zeta ~ Bernoulli(p) for RFRecF; always 0 for RFRec (no draw)."""
    if isinstance(cfg, RFRecFConfig):
        return int(rng.random() < cfg.p)
    return 0


def _scale(cfg: RFRecConfig) -> tuple[float, float]:
    """(offset, spread) of the global message: the configured range, or the identity when
    each tenant's own scale is used (it is then in the tenant's local state)."""
    if not isinstance(cfg.rating_range, tuple):
        return 0.0, 1.0
    lo, hi = cfg.rating_range
    return float(lo), float(hi - lo)


def block_scale(block: RatingBlock, cfg: RFRecConfig) -> tuple[float, float]:
    """(offset, spread) of the tenant owning ``block``: the tenant's scale with
    ``rating_range='tenant'``, else the configured one."""
    if cfg.rating_range == "tenant":
        lo, hi = scale_of(block)
        return float(lo), float(hi - lo)
    return _scale(cfg)



# --------------------------------------------------------------------------- fast path


@dataclasses.dataclass(frozen=True, eq=False)
class _Layout:
    """Index structure of all clients at once; a *pair* is (client, item it rated)."""

    user_start: np.ndarray   # first global user row of each client (n_clients + 1)
    pair_start: np.ndarray   # first pair of each client (n_clients + 1)
    pair_item: np.ndarray    # item of each pair
    rows: np.ndarray         # global user row of each rating, sorted by (row, pair)
    pair: np.ndarray         # pair of each rating
    y: np.ndarray            # target of each rating (model scale)
    indptr: np.ndarray       # CSR (users x pairs) structure of the ratings
    by_item: sp.csr_array    # (items x pairs) 0/1: sums pairs into items
    scales: np.ndarray       # (offset, spread) of each client (n_clients x 2)
    centres: np.ndarray      # c_i of each client (n_clients,; 0 without bias terms)
    centre: np.ndarray       # c_i of each rating's client, sorted as ``rows``
    w_u: np.ndarray          # lambda_u + weighted-lambda ridge of each user row
    w_p: np.ndarray          # weighted-lambda ridge of each pair


def _layout(blocks: list[RatingBlock], cfg: RFRecConfig) -> _Layout:
    """Concatenate the clients' blocks into one (users x pairs) structure."""
    n_users = np.array([b.n_users for b in blocks])
    n_pairs = np.array([b.rated_items.shape[0] for b in blocks])
    user_start = np.concatenate([[0], np.cumsum(n_users)])
    pair_start = np.concatenate([[0], np.cumsum(n_pairs)])
    rows = np.concatenate([b.rows + user_start[i] for i, b in enumerate(blocks)])
    pair = np.concatenate([np.searchsorted(b.rated_items, b.cols) + pair_start[i]
                           for i, b in enumerate(blocks)])
    y = np.concatenate([targets(b, cfg) for b in blocks])
    order = np.lexsort((pair, rows))
    indptr = np.searchsorted(rows[order], np.arange(user_start[-1] + 1))
    pair_item = np.concatenate([b.rated_items for b in blocks])
    ones = np.ones(pair_item.shape[0])
    by_item = sp.csr_array((ones, (pair_item, np.arange(pair_item.shape[0]))),
                           shape=(blocks[0].n_items, pair_item.shape[0]))
    scales = np.array([block_scale(b, cfg) for b in blocks], dtype=float)
    centres = np.array([block_centre(b, cfg) or 0.0 for b in blocks], dtype=float)
    centre = np.repeat(centres, [b.nnz for b in blocks])[order]
    ridges = [ridge_weights(b, cfg) for b in blocks]
    w_u = cfg.lam_u + np.concatenate([w[0] for w in ridges])
    w_p = np.concatenate([w[1] for w in ridges])
    return _Layout(user_start, pair_start, pair_item, rows[order], pair[order], y[order],
                   indptr, by_item, scales, centres, centre, w_u, w_p)


@dataclasses.dataclass(frozen=True, eq=False)
class _Clients:
    """Every client's U_i stacked (users x d), V_(i) rated columns as rows (pairs x d), and
    their Adam moments ((None, None) with gd)."""

    u: np.ndarray
    p: np.ndarray
    u_m: Moments = (None, None)
    p_m: Moments = (None, None)


def _batched_grad(lay: _Layout, c: _Clients, cfg: RFRecConfig
                  ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`grad_f` of every client at once (V_(i) columns as rows of ``c.p``)."""
    z = np.einsum("td,td->t", c.u[lay.rows], c.p[lay.pair]) + lay.centre
    pred, slope = _link(z, cfg.link)
    mat = sp.csr_array(((pred - lay.y) * slope, lay.pair, lay.indptr),
                       shape=(c.u.shape[0], c.p.shape[0]))
    g_u = 2.0 * (mat @ c.p) + 2.0 * lay.w_u[:, None] * c.u
    g_p = 2.0 * (mat.T @ c.u) + 2.0 * lay.w_p[:, None] * c.p
    g_u, g_pt = _free(g_u, g_p.T, cfg)
    return g_u, g_pt.T


@dataclasses.dataclass(frozen=True, eq=False)
class _Active:
    """Who takes part in an iteration: per client, per user row and per pair."""

    n: int
    users: np.ndarray | None   # None: everybody
    pairs: np.ndarray | None


def _active(lay: _Layout, chosen: np.ndarray) -> _Active:
    """Masks of the chosen clients (no masks when every client is chosen)."""
    n_clients = lay.pair_start.shape[0] - 1
    if chosen.shape[0] == n_clients:
        return _Active(n_clients, None, None)
    on = np.zeros(n_clients, dtype=bool)
    on[chosen] = True
    return _Active(int(chosen.shape[0]), np.repeat(on, np.diff(lay.user_start)),
                   np.repeat(on, np.diff(lay.pair_start)))


def _keep(new: np.ndarray | None, old: np.ndarray | None, mask: np.ndarray | None
          ) -> np.ndarray | None:
    """Rows of ``new`` where ``mask`` (the active clients), else the old rows."""
    if mask is None or new is None:
        return new
    return np.where(mask[:, None], new, old)


def _on_return_all(lay: _Layout, c: _Clients, cfg: RFRecConfig, missed: np.ndarray
                   ) -> _Clients:
    """:func:`_on_return` for every client at once; ``missed`` is, per client, how many
    iterations it missed before taking part now (0 for the others)."""
    if cfg.optimizer != "adam" or cfg.momentum_on_return == "keep" or not missed.any():
        return c
    f1, f2 = _return_factors(cfg, missed)
    back = missed > 0
    f1, f2 = np.where(back, f1, 1.0), np.where(back, f2, 1.0)
    by_user, by_pair = np.diff(lay.user_start), np.diff(lay.pair_start)
    u1, u2 = np.repeat(f1, by_user)[:, None], np.repeat(f2, by_user)[:, None]
    p1, p2 = np.repeat(f1, by_pair)[:, None], np.repeat(f2, by_pair)[:, None]
    return _Clients(c.u, c.p, (u1 * c.u_m[0], u2 * c.u_m[1]),
                    (p1 * c.p_m[0], p2 * c.p_m[1]))


def _keep_all(lay_act: _Active, c: _Clients, u: np.ndarray, p: np.ndarray, u_m: Moments,
              p_m: Moments) -> _Clients:
    """The updated clients, with the absent clients' rows left as they were."""
    mu, mp = lay_act.users, lay_act.pairs
    return _Clients(_keep(u, c.u, mu), _keep(p, c.p, mp),
                    (_keep(u_m[0], c.u_m[0], mu), _keep(u_m[1], c.u_m[1], mu)),
                    (_keep(p_m[0], c.p_m[0], mp), _keep(p_m[1], c.p_m[1], mp)))


def _batched_total(lay: _Layout, p: np.ndarray, h: np.ndarray, clip: float | None,
                   act: _Active) -> np.ndarray:
    """Sum of the active clients' dense (clipped) V_(i):
    n_t H + sum over their pairs of (V_p - H_j)."""
    cl = (lambda x: x) if clip is None else (lambda x: np.clip(x, -clip, clip))
    diff = cl(p) - cl(h[:, lay.pair_item].T)
    if act.pairs is not None:
        diff = diff * act.pairs[:, None]
    return act.n * cl(h) + (lay.by_item @ diff).T


def _batched_eval(lay: _Layout, g: RFRecGlobal, u: np.ndarray, tests: list[RatingBlock],
                  scale: tuple[float, float] | None) -> tuple[float, float]:
    """Test RMSE and MAE of :func:`predict_ratings`, clipped to ``scale`` (as simulate)."""
    rows = np.concatenate([t.rows + lay.user_start[i] for i, t in enumerate(tests)])
    cols = np.concatenate([t.cols for t in tests])
    vals = np.concatenate([t.vals for t in tests])
    client = np.repeat(np.arange(len(tests)), [t.nnz for t in tests])
    z = np.einsum("td,dt->t", u[rows], g.v_bar[:, cols]) + lay.centres[client]
    pred = lay.scales[client, 0] + lay.scales[client, 1] * _link(z, g.link)[0]
    if scale is not None:
        pred = np.clip(pred, *scale)
    err = pred - vals
    return float(np.sqrt(err @ err / err.shape[0])), float(np.abs(err).mean())


def _batched_objective(lay: _Layout, g: RFRecGlobal, c: _Clients, cfg: RFRecConfig) -> float:
    """Sum over clients of :func:`objective`, without forming any dense V_(i)."""
    pred, _ = _link(np.einsum("td,td->t", c.u[lay.rows], c.p[lay.pair]) + lay.centre,
                    cfg.link)
    e = pred - lay.y
    d_free = g.h - g.v_bar
    d_pair = c.p - g.v_bar[:, lay.pair_item].T
    d_h = d_free[:, lay.pair_item]
    n_clients = lay.pair_start.shape[0] - 1
    psi = n_clients * np.sum(d_free * d_free) + np.sum(d_pair * d_pair) - np.sum(d_h * d_h)
    u, pt = _free(c.u, c.p.T, cfg)
    ridge = lay.w_u @ np.sum(u * u, axis=1) + lay.w_p @ np.sum(pt * pt, axis=0)
    return float(e @ e + ridge + 0.5 * cfg.lam * psi)


@dataclasses.dataclass(frozen=True, eq=False)
class _BatchUpload:
    """What all active clients send together in one iteration of the batched path: the
    sum ``total`` of their (clipped) dense V_(i) (None when nobody uploads), how many
    (``n``) and who (``clients``). ``pending`` is the broadcast as every client advanced
    it (H and its moments, RFRecF's step count), which the server step completes."""

    pending: RFRecGlobal
    total: np.ndarray | None
    n: int
    clients: np.ndarray
    v_bar: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Batch:
    """The batched path's client states: stacked arrays, each client's last iteration and,
    with ``absent='local'``, the V_bar each pair last received (pairs x d); with
    ``aggregate='latest'``, the server's store of every client's latest upload."""

    c: _Clients
    last: np.ndarray
    p_bar: np.ndarray | None = None
    store: _Latest | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Latest:
    """The latest dense V_(i) the server received from every client, kept lazily: client i
    uploaded at iteration ``t[i]`` the never-rated columns H_t (``h_of[t]``) and, on its
    rated columns (pairs), H_t plus ``resid``; ``free`` is sum_i H_(t[i]), so the sum of the
    latest uploads is ``free`` plus the residuals summed into their items."""

    t: np.ndarray
    h_of: dict[int, np.ndarray]
    free: np.ndarray
    resid: np.ndarray

    @classmethod
    def start(cls, h0: np.ndarray, n_clients: int, n_pairs: int) -> _Latest:
        """Before the first iteration every V_(i) is V_bar^0 = H^0."""
        return cls(np.zeros(n_clients, dtype=np.int64), {0: h0}, n_clients * h0,
                   np.zeros((n_pairs, h0.shape[0])))

    def update(self, lay: _Layout, k: int, h: np.ndarray, p: np.ndarray, chosen: np.ndarray,
               pairs: np.ndarray | None) -> _Latest:
        """The store after the ``chosen`` clients uploaded (never-rated columns ``h``,
        rated columns the rows ``p`` of their ``pairs`` mask, None: everybody)."""
        old = np.bincount(self.t[chosen], minlength=k + 1)
        free = self.free + chosen.shape[0] * h
        for t in np.flatnonzero(old):
            free = free - old[t] * self.h_of[t]
        resid = p - h[:, lay.pair_item].T
        if pairs is not None:
            resid = np.where(pairs[:, None], resid, self.resid)
        t_new = self.t.copy()
        t_new[chosen] = k
        live = set(np.unique(t_new).tolist())
        h_of = {t: v for t, v in self.h_of.items() if t in live}
        h_of[k] = h
        return _Latest(t_new, h_of, free, resid)

    def total(self, lay: _Layout) -> np.ndarray:
        """Sum over all clients of their latest dense upload."""
        return self.free + (lay.by_item @ self.resid).T


def _batched_rfrec(lay: _Layout, g: RFRecGlobal, c: _Clients, cfg: RFRecConfig,
                   clip: float | None, act: _Active, stepping: _Active | None = None,
                   anchor: np.ndarray | None = None
                   ) -> tuple[RFRecGlobal, _Clients, np.ndarray | None]:
    """Algorithm 1's client side: (broadcast with H advanced, clients, sum of the active
    clients' uploads). ``stepping`` (default ``act``) are the clients that step and
    ``anchor`` (pairs x d, default the broadcast V_bar) the V_bar each pair is pulled to."""
    t = g.k + 1
    anchor = g.v_bar[:, lay.pair_item].T if anchor is None else anchor
    g_u, g_p = _batched_grad(lay, c, cfg)
    g_p = g_p + penalty(cfg, t) * (c.p - anchor)
    u, u_m = descend(c.u, g_u, c.u_m, t, cfg)
    p, p_m = descend(c.p, g_p, c.p_m, t, cfg)
    c = _keep_all(act if stepping is None else stepping, c, u, p, u_m, p_m)
    h, (h_m1, h_m2) = _step_h(g, cfg)
    return g.replace(h=h, h_m1=h_m1, h_m2=h_m2), c, _batched_total(lay, c.p, h, clip, act)


def _batched_rfrecf(lay: _Layout, g: RFRecGlobal, c: _Clients, cfg: RFRecFConfig,
                    clip: float | None, act: _Active, stepping: _Active | None = None,
                    anchor: np.ndarray | None = None, moving: _Active | None = None
                    ) -> tuple[RFRecGlobal, _Clients, np.ndarray | None]:
    """Algorithm 2's client side (zeta not yet redrawn): the active clients upload; the
    move to the average is taken by ``moving`` (default ``act``: the clients that received
    V_bar) toward ``anchor`` (pairs x d, default the broadcast V_bar; with absent clients
    that keep their local updates, the V_bar each pair last received), the main update by
    ``stepping`` (default ``act``)."""
    if g.zeta == 1:
        if g.zeta_prev == 1:
            return g, c, None
        return g, c, _batched_total(lay, c.p, g.h, clip, act)
    if g.zeta_prev == 1:
        rate = move_rate(cfg, g.k + 1)
        target = g.v_bar[:, lay.pair_item].T if anchor is None else anchor
        p = _keep(relax(c.p, target, rate), c.p,
                  (act if moving is None else moving).pairs)
        g, c = g.replace(h=relax(g.h, g.v_bar, rate)), _Clients(c.u, p, c.u_m, c.p_m)
        if cfg.schedule == "paper":
            return g, c, None
    lr, t = step_size(cfg, g.k + 1) / (1.0 - cfg.p), g.steps + 1
    g_u, g_p = _batched_grad(lay, c, cfg)
    u, u_m = descend(c.u, g_u, c.u_m, t, cfg, lr)
    p, p_m = descend(c.p, g_p, c.p_m, t, cfg, lr)
    c = _keep_all(act if stepping is None else stepping, c, u, p, u_m, p_m)
    return g.replace(steps=t), c, None


#: what a client left out of an iteration does (:func:`run_batched`)
Absent = Literal["idle", "local", "lost"]
ABSENT: tuple[str, ...] = ("idle", "local", "lost")
#: what the server averages (:func:`run_batched`)
Aggregate = Literal["received", "latest"]
AGGREGATES: tuple[str, ...] = ("received", "latest")


class BatchedSteps:
    """:class:`algorithms.simulate.Steps` of the batched path: every active client's step
    at once on the lazy representation, the upload being the sum of their (clipped) V_(i)
    (an aggregator may add the noise to it), and the server's mean of it."""

    def __init__(self, cfg: RFRecConfig, fed: Federation, seed: int, per_round: int,
                 clip: float | None = None, absent: Absent = "idle",
                 aggregate: Aggregate = "received") -> None:
        if absent not in ABSENT:
            raise ValueError(f"absent must be one of {', '.join(ABSENT)}, not {absent!r}")
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, "
                             f"not {aggregate!r}")
        if aggregate == "latest" and clip is not None:
            raise ValueError("aggregate='latest' keeps clean uploads: no clip or noise")
        self.fast = isinstance(cfg, RFRecFConfig)
        self.alg = ALGORITHMS["rfrecf" if self.fast else "rfrec"]
        self.cfg, self.fed, self.seed, self.per_round, self.clip, self.absent = (
            cfg, fed, int(seed), per_round, clip, absent)
        self.aggregate = aggregate
        self.lay = _layout(fed.train, cfg)

    def start(self) -> RoundState:
        """Round 0, from the same :func:`algorithms.simulate.initialise` as the generic
        driver."""
        _, g, locals_ = initialise(self.alg, self.cfg, self.fed.train, self.seed)
        c = _stack(locals_)
        store = (_Latest.start(g.h, self.fed.n_clients, c.p.shape[0])
                 if self.aggregate == "latest" else None)
        return RoundState(0, g, g, _Batch(c, np.zeros(self.fed.n_clients, dtype=np.int64),
                                          store=store))

    def select(self, k: int, state: RoundState) -> np.ndarray:
        return select_clients(self.alg, state.global_msg, self.fed.n_clients, self.per_round,
                              self.seed, k)

    def clients(self, k: int, state: RoundState, chosen: np.ndarray
                ) -> tuple[_Batch, dict[int, _BatchUpload]]:
        g, b = state.global_msg, state.local_states
        c, last, p_bar = b.c, b.last.copy(), b.p_bar
        act = _active(self.lay, chosen)
        missed = np.zeros(self.fed.n_clients, dtype=np.int64)
        missed[chosen] = np.maximum(k - 1 - last[chosen], 0)  # iterations missed
        stepping = moving = None
        if self.absent == "lost" and act.pairs is not None:
            # every client received the broadcast and steps from it; only the chosen
            # clients' uploads reach the server (nobody missed a step: no return)
            stepping = moving = _Active(self.fed.n_clients, None, None)
            missed[:] = 0
            last[:] = k
        elif self.absent == "local" and act.pairs is not None:
            # absent clients keep stepping, pulled to the V_bar they last received; only
            # the active ones upload (a reconnecting client's anchor jumps to the new
            # V_bar, so momentum_on_return applies on reconnection)
            now = g.v_bar[:, self.lay.pair_item].T
            p_bar = now if p_bar is None else np.where(act.pairs[:, None], now, p_bar)
            stepping = _Active(self.fed.n_clients, None, None)
        c = _on_return_all(self.lay, c, self.cfg, missed)
        last[chosen] = k
        anchor = p_bar if self.absent == "local" and act.pairs is not None else None
        if self.fast:
            if anchor is not None:  # the move to the average is a local update too
                moving = _Active(self.fed.n_clients, None, None)
            pending, c, total = _batched_rfrecf(self.lay, g, c, self.cfg, self.clip, act,
                                                stepping, anchor, moving)
        else:
            pending, c, total = _batched_rfrec(self.lay, g, c, self.cfg, self.clip, act,
                                               stepping, anchor)
        store, v_bar = b.store, None
        if store is not None and total is not None:
            store = store.update(self.lay, k, pending.h, c.p, chosen, act.pairs)
            v_bar = store.total(self.lay) / self.fed.n_clients
        return (_Batch(c, last, p_bar, store),
                {AGGREGATE: _BatchUpload(pending, total, act.n, chosen, v_bar)})

    def server(self, k: int, server_state: RFRecGlobal,
               received: Mapping[int, _BatchUpload]) -> tuple[RFRecGlobal, RFRecGlobal]:
        up = received[AGGREGATE]
        g = up.pending if up.total is None else up.pending.replace(
            v_bar=fix_ones(up.total / up.n if up.v_bar is None else up.v_bar, self.cfg))
        g = g.replace(k=g.k + 1, zeta=_coin(self.cfg, derive_rng(self.seed, k, SERVER))
                      if self.fast else 0, zeta_prev=g.zeta)
        return g, g

    def record(self, state: RoundState, due: bool) -> tuple[RoundState, RoundRecord, bool]:
        g, c = state.global_msg, state.local_states.c
        rmse = mae = obj = float("nan")
        if due:
            rmse, mae = _batched_eval(self.lay, g, c.u, self.fed.test, self.fed.scale)
            obj = _batched_objective(self.lay, g, c, self.cfg)
        up = state.uploads[AGGREGATE]
        ups = up.n if up.total is not None else 0
        rec = RoundRecord(state.round, obj, rmse, mae, state.seconds, up.n, ups,
                          ups * g.v_bar.nbytes)
        return state, rec, False

    def result(self, history: list[RoundRecord], state: RoundState) -> SimulationResult:
        return SimulationResult(history, state.global_msg, state.global_msg,
                                _unpack(self.lay, state.local_states.c,
                                        state.local_states.last, self.cfg.bias))


def noise_aggregator(noise: Callable[[int, int, tuple[int, int]], np.ndarray]
                     ) -> Callable[[Mapping[int, _BatchUpload], int], dict[int, _BatchUpload]]:
    """The batched path's aggregator: ``noise(round, client, shape)`` of every client that
    uploaded, added to the sum (each tenant's upload noised, summed)."""
    def aggregate(uploads: Mapping[int, _BatchUpload], round_: int
                  ) -> dict[int, _BatchUpload]:
        up = uploads[AGGREGATE]
        if up.total is None:
            return dict(uploads)
        noise_sum = sum(noise(round_, int(i), up.total.shape) for i in up.clients)
        return {AGGREGATE: dataclasses.replace(up, total=up.total + noise_sum)}
    return aggregate


def run_batched(cfg: RFRecConfig, fed: Federation, *, rounds: int, seed: int,
                clip: float | None = None,
                noise: Callable[[int, int, tuple[int, int]], np.ndarray] | None = None,
                evaluate_every: int = 1, per_round: int = 0,
                on_round: Callable[[RoundRecord], None] | None = None,
                on_global: Callable[[RFRecGlobal], None] | None = None,
                absent: Absent = "idle", aggregate: Aggregate = "received"
                ) -> SimulationResult:
    """All clients of :func:`algorithms.simulate.simulate` at once, on the lazy representation.

    The round engine (:func:`algorithms.simulate.drive`) with :class:`BatchedSteps`: same
    seeds, draws and update equations as the generic driver (up to floating-point
    summation order), so it returns the same :class:`SimulationResult`; with ``clip`` and
    ``noise(round, client, shape)`` each upload is ``clip(V_(i)) + noise`` (a stand-in for
    the privacy layer's element-wise wrapper; the engine's aggregator adds the noise to
    the sum). ``per_round`` is the simulator's: 0 (or at least the number of clients)
    means everybody, otherwise that many clients drawn by :func:`select` from the same
    stream. ``on_global`` sees the broadcast of every round (e.g. for a stopping rule on
    V_bar). ``absent`` is what a client left out of an iteration does: ``idle`` (as the
    generic driver: it neither steps nor uploads); ``local``, the RFRec paper's
    Sec. 3.3 reading of a device that lost its connection ("each client can continue
    local updates even without connection to the server"): it keeps taking its step
    (RFRec: pulled toward the last V_bar it received; RFRecF: the main updates and the
    move to the last V_bar it received, both local updates of Algorithm 2's zeta = 0
    branch) and uploads nothing; or ``lost``: it
    received the broadcast and steps like everybody (RFRecF: the move to the average
    too), but its upload does not reach the server, which averages the uploads it got.
    ``lost`` isolates the server side of Sec. 3.3 (the mean of n_t uploads standing for
    the mean of all n), since no client works from a stale V_bar. ``aggregate`` is what
    the server averages when it receives uploads: ``received`` (Sec. 3.3: the mean of the
    n_t uploads of this iteration) or ``latest``: the mean over all n clients of the latest
    upload it holds from each (an absent client's stale one), as MIFA does (Gu et al.,
    "Fast Federated Learning in the Presence of Arbitrary Device Unavailability", NeurIPS
    2021); not the paper's, and only without ``clip`` and ``noise``. Per round
    O(nnz d + n d) plus the noise draws.
    """
    def see(state: RoundState) -> bool:
        if on_global is not None:
            on_global(state.global_msg)
        return False

    if aggregate == "latest" and noise is not None:
        raise ValueError("aggregate='latest' keeps clean uploads: no clip or noise")
    steps = BatchedSteps(cfg, fed, seed, per_round, clip, absent, aggregate)
    history, last = drive(steps, steps.start(), rounds,
                          aggregator=None if noise is None else noise_aggregator(noise),
                          evaluate_every=evaluate_every, on_round=on_round, on_state=see)
    return steps.result(history, last)


def _stack(states: list[RFRecLocal]) -> _Clients:
    """The per-client local states as one :class:`_Clients`."""
    def cat(name: str, transpose: bool) -> np.ndarray | None:
        parts = [getattr(s, name) for s in states]
        if parts[0] is None:
            return None
        return np.concatenate([x.T if transpose else x for x in parts])
    return _Clients(cat("u", False), cat("v_rated", True), (cat("u_m1", False),
                    cat("u_m2", False)), (cat("v_m1", True), cat("v_m2", True)))


def _unpack(lay: _Layout, c: _Clients, last: np.ndarray, bias: bool) -> list[RFRecLocal]:
    """Per-client local states from the batched arrays."""
    us, ps = lay.user_start, lay.pair_start

    def part(x: np.ndarray | None, i: int, users: bool) -> np.ndarray | None:
        if x is None:
            return None
        return x[us[i]:us[i + 1]].copy() if users else x[ps[i]:ps[i + 1]].T.copy()
    return [RFRecLocal(part(c.u, i, True), part(c.p, i, False), part(c.u_m[0], i, True),
                       part(c.u_m[1], i, True), part(c.p_m[0], i, False),
                       part(c.p_m[1], i, False), int(last[i]), *map(float, lay.scales[i]),
                       centre=float(lay.centres[i]) if bias else None)
            for i in range(us.shape[0] - 1)]


#: the validated runs (the lab's ``ours`` setting): every client every iteration; the paper's
#: one client per user is ``clients`` = the number of users (use :func:`run_batched` then)
_RUN_DEFAULTS = {"clients": 200, "per_round": 0, "rounds": 200}
_RUN_DEFAULTS_F = {"clients": 50, "per_round": 0, "rounds": 400}

ALGORITHMS = {
    "rfrec": Algorithm(
        name="rfrec", config=RFRecConfig, init_server=init_server, init_client=init_client,
        client_step=rfrec_client_step, server_step=rfrec_server_step, factors=factors,
        objective=objective, select=select, run_defaults=_RUN_DEFAULTS,
        predict_entries=predict_ratings, serving_link=serving_link),
    "rfrecf": Algorithm(
        name="rfrecf", config=RFRecFConfig, init_server=init_server, init_client=init_client,
        client_step=rfrecf_client_step, server_step=rfrecf_server_step, factors=factors,
        objective=objective, select=select, run_defaults=_RUN_DEFAULTS_F,
        predict_entries=predict_ratings, serving_link=serving_link),
}
