"""The Gaussian mechanism: noise (exact discrete Gaussian on a grid) and two calibrations
of sigma.

* :func:`classic_sigma`: sigma = Delta_2 sqrt(2 ln(1.25/delta)) / epsilon, the bound Felb uses
  (Sec. 3.3, citing Dwork & Roth 2014, Thm A.1). Proven only for 0 < epsilon < 1.
* :func:`analytic_sigma`: the smallest sigma for which the Gaussian mechanism is
  (epsilon, delta)-DP, from the exact condition of Balle & Wang (2018), "Improving the Gaussian
  mechanism for differential privacy: analytical calibration and optimal denoising", Thm. 8:

      Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D) <= delta

  (D = Delta_2, the L2 sensitivity),

  solved by bisection on log sigma (the left side decreases in sigma). Valid for every
  epsilon > 0 and always at most the classic value.

Composition over rounds is done in Renyi DP by :mod:`privacy.accountant`, not here.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr, ndtr

from privacy import samplers


def gaussian_noise(shape: tuple[int, ...], sigma: float, rng: np.random.Generator
                   ) -> np.ndarray:
    """Independent Gaussian noise of standard deviation (at least) ``sigma``, on a grid.

    ``gamma k`` with gamma = :func:`privacy.samplers.grid` (sigma), a power of two about
    sigma 2^-28, and k ~ N_Z(0, (sigma / gamma)^2) the exact discrete Gaussian drawn from
    uniform integers of ``rng`` (:mod:`privacy.samplers`; no floating-point sampler whose
    low bits leak, Mironov CCS 2012). Adding it to an arbitrary float would still reveal
    the value modulo gamma: a release adds it to a value rounded to the same grid,
    :func:`gaussian_release`, which also pays for the rounding in the noise.
    """
    if not np.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"Gaussian sigma must be a positive finite number, got {sigma!r}")
    gamma = samplers.grid(sigma)
    return samplers.discrete_gaussian(tuple(shape), sigma / gamma, rng) * gamma


def gaussian_release(value: np.ndarray, sigma: float, rng: np.random.Generator,
                     sensitivity: float, entries: int | None = None) -> np.ndarray:
    """``value`` + Gaussian noise of multiplier ``sigma / sensitivity`` (L2), released on
    a grid so that the output's bits depend on the value only through the noisy integer
    (:func:`privacy.samplers.gaussian_release`: the rounding is paid for in the noise;
    ``entries`` = the entries of the whole release that may change, default its size)."""
    if not np.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"Gaussian sigma must be a positive finite number, got {sigma!r}")
    return samplers.gaussian_release(value, sigma, rng, sensitivity, entries)


def classic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth, Thm A.1; Felb Sec. 3.3)."""
    if not 0 < epsilon < 1:
        raise ValueError("the classic Gaussian bound holds only for 0 < epsilon < 1 "
                         "(Dwork & Roth 2014, Thm A.1); use analytic_sigma")
    _check_delta(delta)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def analytic_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """The exact delta of the Gaussian mechanism at epsilon (Balle & Wang 2018, Thm. 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return float(ndtr(a - b) - math.exp(epsilon + log_ndtr(-a - b)))


def analytic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0,
                   rtol: float = 1e-12) -> float:
    """Smallest sigma making ``N(0, sigma^2)`` noise (epsilon, delta)-DP (Balle & Wang 2018).

    Bisection on log sigma of :func:`analytic_delta` (decreasing in sigma) to relative
    tolerance ``rtol``; the upper end is returned, so the guarantee holds.
    Example (Delta = 1): epsilon = 1, delta = 1e-5 gives sigma = 3.7306; the classic bound
    does not apply at epsilon = 1; at epsilon = 0.5 it gives 9.6896 against 7.0318 here.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon!r}")
    _check_delta(delta)
    lo, hi = 1e-3 * sensitivity, sensitivity
    while analytic_delta(epsilon, hi, sensitivity) > delta:
        lo, hi = hi, hi * 2.0
    while analytic_delta(epsilon, lo, sensitivity) <= delta:
        lo, hi = lo / 2.0, lo
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if analytic_delta(epsilon, mid, sensitivity) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
