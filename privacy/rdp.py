"""Renyi DP of the (Poisson-subsampled) Gaussian mechanism and its conversion to (eps, delta).

The Sampled Gaussian Mechanism (SGM) releases f(S) + N(0, sigma^2 I) where S is a Poisson
sample of the data at rate q and f has L2 sensitivity 1, so sigma is the noise multiplier
z. Its Renyi divergence of order alpha is (Mironov, Talwar and Zhang, "Renyi Differential
Privacy of the Sampled Gaussian Mechanism", 2019, Section 3.3)

    RDP(alpha) = log(A_alpha) / (alpha - 1),
    A_alpha = E_{x ~ N(0, sigma^2)} [((1 - q) + q exp((2x - 1) / (2 sigma^2)))^alpha],

with closed forms for A_alpha:

* integer alpha (binomial expansion, their eq. (6)):
  A_alpha = sum_k C(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2));
* fractional alpha (their Section 3.3): split the integral at
  z0 = sigma^2 log(1/q - 1) + 1/2, where the two mixture components cross, and expand each
  side as a convergent binomial series, A_alpha = A_0 + A_1 with

      A_0 = sum_k C(alpha, k) q^k (1 - q)^(alpha - k) exp((k^2 - k) / (2 sigma^2))
                  * erfc((k - z0) / (sqrt(2) sigma)) / 2,
      A_1 = sum_k C(alpha, k) q^(alpha - k) (1 - q)^k exp(((alpha-k)^2 - (alpha-k)) / (2 sigma^2))
                  * erfc((z0 - (alpha - k)) / (sqrt(2) sigma)) / 2,

  summed until both terms fall below e^-30 (A_alpha >= 1, so that is below 1e-13 of it).

At q = 1 the curve is the Gaussian's alpha / (2 sigma^2) (Mironov, "Renyi Differential
Privacy", 2017, Prop. 7). Everything is computed in log space.

Conversion (:func:`epsilon_from_rdp`): an (alpha, rho)-RDP mechanism is (eps, delta)-DP with

    eps = rho + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1)

(Balle, Barthe, Gaboardi, Hsu and Sato, "Hypothesis Testing Interpretations and Renyi
Differential Privacy", 2020, Thm. 21), minimised over the orders given.

These are the formulas opacus' ``opacus.accountants.analysis.rdp`` (and TF Privacy before
it) evaluates; the tests cross-check this module against Google's dp-accounting
(``dp_accounting.rdp.RdpAccountant``) over a grid of noise multipliers, rates and counts.
The binomial coefficients C(alpha, k) are evaluated as floats, as opacus does, so that
every figure stays what it was: at q < 1 the orders 2048 and 4096 of
:data:`privacy.accountant.ORDERS` overflow and give an infinite (valid, unused) bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

#: opacus' ``RDPAccountant.DEFAULT_ALPHAS`` (and TF Privacy's): the orders its PRV domain
#: sizing uses (:mod:`privacy.prv`); :data:`privacy.accountant.ORDERS` starts with them
DEFAULT_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)]
                                          + list(range(12, 64)))


def _log_add(a: float, b: float) -> float:
    """log(e^a + e^b)."""
    lo, hi = min(a, b), max(a, b)
    if lo == -math.inf:
        return hi
    return math.log1p(math.exp(lo - hi)) + hi


def _log_sub(a: float, b: float) -> float:
    """log(e^a - e^b) for a >= b."""
    if a < b:
        raise ValueError("log-space subtraction would be negative")
    if b == -math.inf:
        return a
    if a == b:
        return -math.inf
    try:
        return math.log(math.expm1(a - b)) + b
    except OverflowError:
        return a


def _log_erfc(x: float) -> float:
    """log(erfc(x)), accurate far into the tail."""
    return math.log(2) + float(special.log_ndtr(-x * math.sqrt(2)))


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """log A_alpha for an integer order: the binomial sum, in log space (a coefficient
    C(alpha, k) that overflows a float makes the bound infinite: see the module
    docstring)."""
    k = np.arange(alpha + 1, dtype=float)
    with np.errstate(over="ignore"):
        log_binom = np.log(special.binom(alpha, k))
    if not np.isfinite(log_binom).all():
        return math.inf
    terms = (log_binom + k * math.log(q) + (alpha - k) * math.log(1 - q)
             + (k * k - k) / (2 * sigma ** 2))
    return float(special.logsumexp(terms))


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """log A_alpha for a fractional order: the two series either side of z0."""
    log_a0 = log_a1 = -math.inf
    z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5
    log_q, log_1q = math.log(q), math.log(1 - q)
    k = 0
    while True:
        coef = float(special.binom(alpha, k))
        log_coef = math.log(abs(coef))
        j = alpha - k
        log_s0 = (log_coef + k * log_q + j * log_1q + (k * k - k) / (2 * sigma ** 2)
                  + math.log(0.5) + _log_erfc((k - z0) / (math.sqrt(2) * sigma)))
        log_s1 = (log_coef + j * log_q + k * log_1q + (j * j - j) / (2 * sigma ** 2)
                  + math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma)))
        if coef > 0:
            log_a0, log_a1 = _log_add(log_a0, log_s0), _log_add(log_a1, log_s1)
        else:
            log_a0, log_a1 = _log_sub(log_a0, log_s0), _log_sub(log_a1, log_s1)
        k += 1
        if max(log_s0, log_s1) < -30:
            return _log_add(log_a0, log_a1)


def sampled_gaussian_rdp(q: float, sigma: float, alpha: float) -> float:
    """RDP of one Poisson-subsampled Gaussian release (rate q, multiplier sigma) at order
    ``alpha`` > 1 (see the module docstring)."""
    if q == 0:
        return 0.0
    if q == 1.0:
        return alpha / (2 * sigma ** 2)
    if math.isinf(alpha):
        return math.inf
    if float(alpha).is_integer():
        return _log_a_integer(q, sigma, int(alpha)) / (alpha - 1)
    return _log_a_fractional(q, sigma, alpha) / (alpha - 1)


def gaussian_rdp_curve(q: float, sigma: float, count: int,
                       orders: Sequence[float]) -> np.ndarray:
    """RDP of ``count`` composed subsampled-Gaussian releases at each order (RDP adds up
    under composition: Mironov 2017, Prop. 1)."""
    return np.array([sampled_gaussian_rdp(q, sigma, a) for a in orders]) * count


def epsilon_from_rdp(orders: Sequence[float], rdp: Sequence[float],
                     delta: float) -> tuple[float, float]:
    """(epsilon, optimal order) at ``delta`` of an RDP curve (Balle et al. 2020, Thm. 21);
    (inf, nan) when no order gives a number."""
    a = np.atleast_1d(np.asarray(orders, dtype=float))
    r = np.atleast_1d(np.asarray(rdp, dtype=float))
    if len(a) != len(r):
        raise ValueError(f"{len(a)} orders but {len(r)} RDP values")
    with np.errstate(invalid="ignore"):  # inf - inf at an order whose RDP is infinite
        eps = r - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    if np.isnan(eps).all():
        return math.inf, math.nan
    best = int(np.nanargmin(eps))
    return float(eps[best]), float(a[best])
