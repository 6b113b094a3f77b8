"""Privacy accounting: compose a tenant's transmissions in Renyi DP and convert to (eps, delta).

A tenant's history is a list of :class:`Event` runs ``(mechanism, noise_multiplier, count)``
(the shape of an RDP accountant's history), one per group of identical transmissions.
The noise multiplier is the noise relative to the sensitivity of the release: sigma / Delta_2
for "gaussian", b / Delta_1 for "laplace" (see :mod:`privacy.wrapper` for Delta).

* Gaussian runs: the (subsampled) Gaussian curve of :mod:`privacy.rdp` with sampling rate q = 1.
  The server sees which tenants transmit, so client sampling gives no amplification
  against it: every transmission counts in full, and rounds in which a tenant did not
  transmit cost it nothing.
* Laplace runs: the closed-form RDP of the discrete Laplace (below), on the same orders;
  it is at least Mironov's (2017, Prop. 6) continuous formula (:func:`laplace_rdp`).

What the events stand for. fedrec's Gaussian and Laplace noise is integer noise on a grid
(:mod:`privacy.samplers`): a release rounds the value to a grid of granularity gamma and
adds the exact discrete Gaussian / discrete Laplace, scaled so that integer noise /
integer sensitivity = the event's multiplier z, the integer sensitivity including the
rounding (``Delta / gamma + sqrt(d)`` in L2, ``Delta / gamma + d`` in L1; proof in
:mod:`privacy.samplers`). So z is the multiplier of the mechanism that actually runs:

* discrete Gaussian: Renyi DP ``alpha / (2 z^2)`` (Canonne, Kamath and Steinke 2020,
  Thm. 4), the curve :mod:`privacy.rdp` computes at q = 1: unchanged. With q < 1 the
  subsampled curve is the continuous Gaussian's (Mironov, Talwar and Zhang 2019; the
  sampled mixture of discrete Gaussians is not covered by a proof here);
* ``method="prv"`` composes the *continuous* Gaussian's privacy loss: for the discrete
  Gaussian at fedrec's integer scales (about 2^28) the two privacy-loss distributions
  differ by a relative O(Delta_int / sigma_int^2), far below the PRV's own error, but
  that is not a proof; the default ``"rdp"`` figure is the proven bound, and the tests
  check the PRV figure against dp-accounting's discrete-Gaussian PLD;
* discrete Laplace: pure ``1 / z`` exactly as the continuous one, but its Renyi curve is
  *larger* than Mironov's continuous formula (by less the finer the grid). A Laplace
  event is therefore charged the discrete curve :func:`privacy.laplace.
  discrete_laplace_rdp` at the coarsest integer sensitivity a grid release can have,
  :func:`laplace_shift` (z) = floor(2^40 / z) (the grid is at most 2^-40 times the noise
  scale; the curve decreases in the shift at a fixed multiplier, and a vector release
  sums convex per-entry divergences, at most the divergence of the whole shift), which
  also bounds a continuous Laplace event of an older ledger.
* The RDP curves add up (Mironov 2017, Prop. 1, adaptive composition) and are converted to
  (epsilon, delta) by :func:`privacy.rdp.epsilon_from_rdp` (Balle et al. 2020, Thm. 21).
* Bernoulli (XOR) runs: a transmission whose bits are flipped with probability p is pure
  eps-DP with eps = d ln((1-p)/p) over its d bits (noise multiplier z = 1 / eps); its RDP
  is bounded by that of randomized response at eps (:func:`privacy.bernoulli.bernoulli_rdp`).
* A transmission without a DP guarantee (:data:`NOT_PRIVATE`: no noise, or an algorithm
  whose uploads reveal ratings) costs epsilon = infinity: a history holding one has no
  finite (epsilon, delta) left, whatever else it holds.
* For Laplace/Bernoulli-only histories, basic composition of pure DP (sum of 1/z) is also a valid
  (epsilon, 0) guarantee; the reported epsilon is the smaller of the two.

* ``method="prv"`` (Gaussian and subsampled-Gaussian histories): the numerical composition
  of privacy loss random variables (Gopi et al. 2021) by :mod:`privacy.prv`
  (:func:`prv_epsilon`: its upper bound at ``eps_error`` 0.01). It is
  tighter than the RDP conversion (Gaussian at q = 1: within 1% of the exact figure), and
  the reported epsilon is then min(RDP, PRV upper bound). Histories with Laplace or
  Bernoulli runs fall back to RDP (:mod:`privacy.prv` has the Gaussian's PRV only). The
  default stays ``"rdp"`` everywhere (budgets, ledgers, reports); dp-accounting's PLD
  accountant cross-checks both in the tests (PLD <= PRV <= RDP).

Worked example: 100 Gaussian transmissions at z = 10, delta = 1e-5 give epsilon = 4.7285
(optimal order 5.4; dp_accounting's RdpAccountant on the same orders agrees to 1e-9);
100 Laplace transmissions at z = 10 give 4.5327 by RDP against 10.0 by basic composition.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from privacy.bernoulli import bernoulli_rdp
from privacy.laplace import discrete_laplace_rdp, laplace_rdp
from privacy.rdp import DEFAULT_ORDERS, epsilon_from_rdp, gaussian_rdp_curve
from privacy.samplers import LAPLACE_GRID_BITS

#: a transmission without a DP guarantee (no noise, or an algorithm whose uploads reveal
#: ratings): charged like any other, it costs epsilon = infinity (see :data:`NOT_PRIVATE`)
NONE = "none"
MECHANISMS: tuple[str, ...] = ("gaussian", "laplace", "bernoulli", NONE)
#: mechanisms that are pure epsilon-DP per transmission (epsilon = 1 / noise multiplier)
PURE: tuple[str, ...] = ("laplace", "bernoulli")

#: the customary orders (:data:`privacy.rdp.DEFAULT_ORDERS`, opacus' and TF Privacy's
#: defaults), extended upwards so that large budgets (Laplace, few rounds) do not hit the
#: largest order.
ORDERS: tuple[float, ...] = DEFAULT_ORDERS + (
    64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024, 2048, 4096)


#: the accounting methods :func:`spend` offers
METHODS: tuple[str, ...] = ("rdp", "prv")


def prv_epsilon(history: Iterable[Event], delta: float, eps_error: float = 0.01) -> float:
    """Upper bound on epsilon at ``delta`` of a Gaussian (possibly Poisson-subsampled)
    history by PRV composition (:func:`privacy.prv.gaussian_epsilon_bounds`, Gopi et al.
    2021, with ``delta_error = delta / 1000``)."""
    history = compose(history)
    if any(ev.mechanism != "gaussian" for ev in history):
        raise ValueError("PRV accounting covers Gaussian events only")
    if not history:
        return 0.0
    # imported here: scipy.signal and scipy.integrate cost ~45 MB in every process that
    # imports the accountant (the API, the workers) and only PRV accounting needs them
    from privacy.prv import gaussian_epsilon_bounds

    runs = [(ev.sample_rate, ev.noise_multiplier, ev.count) for ev in history]
    with np.errstate(divide="ignore", over="ignore"):  # log(0) and exp overflow far out
        return gaussian_epsilon_bounds(runs, delta, delta / 1000, eps_error)[2]


@dataclasses.dataclass(frozen=True)
class Event:
    """``count`` identical transmissions of one mechanism at one noise multiplier.

    ``sample_rate`` q < 1 (Gaussian only): each protected unit takes part in a transmission
    with probability q by Poisson sampling that the adversary cannot observe (users sampled
    inside a tenant; never the choice of transmitting tenants, which the server sees).
    """

    mechanism: str
    noise_multiplier: float
    count: int = 1
    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {self.mechanism!r}; "
                             f"expected one of {', '.join(MECHANISMS)}")
        if self.mechanism == NONE:
            if self.noise_multiplier != 0:
                raise ValueError(f"a transmission without noise has noise multiplier 0, got "
                                 f"{self.noise_multiplier!r}")
        elif not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"noise multiplier must be positive, got {self.noise_multiplier!r}")
        if self.count < 0:
            raise ValueError(f"count must be non-negative, got {self.count!r}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample rate must be in (0, 1], got {self.sample_rate!r}")
        if self.sample_rate < 1 and self.mechanism != "gaussian":
            raise ValueError("amplification by sampling is accounted for the Gaussian "
                             "mechanism only")

    def times(self, count: int) -> Event:
        """The same event repeated ``count`` times."""
        return dataclasses.replace(self, count=int(count))

    def as_list(self) -> list:
        """[mechanism, z, count] (+ sample rate when below 1: old ledgers stay readable)."""
        out = [self.mechanism, float(self.noise_multiplier), int(self.count)]
        return out + [float(self.sample_rate)] if self.sample_rate < 1 else out

    @staticmethod
    def from_list(item: Sequence) -> Event:
        rate = float(item[3]) if len(item) > 3 else 1.0
        return Event(str(item[0]), float(item[1]), int(item[2]), rate)


#: one transmission without a DP guarantee: any history containing it spends epsilon = inf
NOT_PRIVATE = Event(NONE, 0.0, 1)


def not_private(history: Iterable[Event]) -> bool:
    """True when the history holds a transmission without a DP guarantee."""
    return any(ev.mechanism == NONE and ev.count > 0 for ev in history)


@dataclasses.dataclass(frozen=True)
class Spend:
    """What a history costs at one delta."""

    epsilon: float          #: the reported figure: min(epsilon_rdp, epsilon_pure)
    epsilon_rdp: float      #: RDP composition converted (Balle et al. 2020, Thm. 21)
    epsilon_pure: float     #: basic composition of pure DP (inf unless Laplace only)
    order: float | None     #: the optimal Renyi order (None for an empty history)
    transmissions: int
    #: PRV upper bound (``method="prv"`` on a Gaussian history), else None
    epsilon_prv: float | None = None
    #: how ``epsilon`` was obtained: "rdp" or "prv" (the smaller of RDP and PRV)
    method: str = "rdp"


def compose(history: Iterable[Event]) -> list[Event]:
    """Merge consecutive runs of the same mechanism and noise; drop empty runs."""
    out: list[Event] = []
    for ev in history:
        if ev.count == 0:
            continue
        if out and (out[-1].mechanism, out[-1].noise_multiplier, out[-1].sample_rate) == (
                ev.mechanism, ev.noise_multiplier, ev.sample_rate):
            out[-1] = out[-1].times(out[-1].count + ev.count)
        else:
            out.append(ev)
    return out


def rdp_curve(history: Iterable[Event], orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Total Renyi DP of ``history`` at each order (sum over events)."""
    total = np.zeros(len(orders))
    for ev in history:
        if ev.mechanism == NONE:
            total += math.inf if ev.count else 0.0
        elif ev.mechanism == "gaussian":
            total += gaussian_rdp_curve(ev.sample_rate, ev.noise_multiplier, ev.count,
                                        orders)
        elif ev.mechanism == "bernoulli":
            total += ev.count * bernoulli_rdp(ev.noise_multiplier, np.asarray(orders))
        else:  # the discrete curve, never below the continuous one (float rounding)
            a = np.asarray(orders)
            total += ev.count * np.maximum(laplace_rdp(ev.noise_multiplier, a),
                                           discrete_laplace_rdp(
                                               ev.noise_multiplier,
                                               laplace_shift(ev.noise_multiplier), a))
    return total


def laplace_shift(noise_multiplier: float) -> int:
    """The coarsest integer L1 sensitivity of a grid Laplace release of multiplier z:
    Delta_int >= Delta / gamma >= 2^40 / z (:data:`privacy.samplers.LAPLACE_GRID_BITS`),
    at least 1."""
    return max(1, math.floor(2.0 ** LAPLACE_GRID_BITS / noise_multiplier))


def pure_epsilon(history: Iterable[Event]) -> float:
    """Basic composition of pure DP: sum of count / z over Laplace and Bernoulli runs (inf if
    any Gaussian)."""
    eps = 0.0
    for ev in history:
        if ev.mechanism not in PURE:
            return math.inf
        eps += ev.count / ev.noise_multiplier
    return eps


def spend(history: Iterable[Event], delta: float, orders: Sequence[float] = ORDERS,
          method: str = "rdp") -> Spend:
    """(epsilon, delta) of a tenant's whole history (see the module docstring).

    ``method="prv"`` also bounds a Gaussian-only history by PRV composition and reports the
    smaller figure; other histories are accounted by RDP whatever the method."""
    if method not in METHODS:
        raise ValueError(f"unknown accounting method {method!r}; expected one of "
                         f"{', '.join(METHODS)}")
    history = compose(history)
    n = sum(ev.count for ev in history)
    if n == 0:
        return Spend(0.0, 0.0, 0.0, None, 0)
    if not_private(history):  # data left without noise: no epsilon bounds it
        return Spend(math.inf, math.inf, math.inf, None, n)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    eps_rdp, order = epsilon_from_rdp(orders, rdp_curve(history, orders), delta)
    eps_pure = pure_epsilon(history)
    eps = float(min(eps_rdp, eps_pure))
    if method == "prv" and all(ev.mechanism == "gaussian" for ev in history):
        eps_prv = prv_epsilon(history, delta)
        return Spend(min(eps, eps_prv), float(eps_rdp), float(eps_pure), float(order), n,
                     eps_prv, "prv" if eps_prv < eps else "rdp")
    return Spend(eps, float(eps_rdp), float(eps_pure), float(order), n)


def schedule_events(mechanism: str, z: float, weights: Sequence[float],
                    sample_rate: float = 1.0) -> list[Event]:
    """One event per transmission k at noise multiplier ``z / sqrt(w_k)``: transmission k
    gets a share of the privacy proportional to w_k (for the Gaussian at q = 1, RDP is
    proportional to 1 / z^2, so the shares add exactly)."""
    return [Event(mechanism, z / math.sqrt(w), 1, sample_rate) for w in weights]


def noise_for_epsilon(mechanism: str, target_epsilon: float, delta: float,
                      transmissions: int, rtol: float = 1e-6, sample_rate: float = 1.0,
                      weights: Sequence[float] | None = None, method: str = "rdp") -> float:
    """Smallest noise multiplier z with ``spend([Event(mechanism, z, T, q)], delta) <= target``.

    Bisection on log z (epsilon decreases as z grows); the upper end is returned so the
    target is met. ``transmissions`` is the number of uploads the tenant may make (or of
    releases a user takes part in); ``sample_rate`` see :class:`Event`. With ``weights``
    (one positive number per transmission), transmission k uses ``z / sqrt(w_k)``
    (:func:`schedule_events`) and the returned z meets the target for the whole schedule.
    ``method`` is :func:`spend`'s (``"prv"`` solves a smaller z for Gaussian histories;
    use ``rtol`` >= 1e-4 with it, each PRV evaluation costs tens of milliseconds).
    """
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be positive, got {target_epsilon!r}")
    if transmissions <= 0:
        raise ValueError(f"transmissions must be positive, got {transmissions!r}")

    if weights is not None and (len(weights) != transmissions or min(weights) <= 0):
        raise ValueError(f"weights must be {transmissions} positive numbers, got {weights!r}")

    def eps(z: float) -> float:
        if weights is not None:
            return spend(schedule_events(mechanism, z, weights, sample_rate), delta,
                         method=method).epsilon
        return spend([Event(mechanism, z, transmissions, sample_rate)], delta,
                     method=method).epsilon

    lo, hi = 1e-3, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2.0
    while eps(lo) <= target_epsilon:
        lo, hi = lo / 2.0, lo
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if eps(mid) > target_epsilon else (lo, mid)
    return hi
