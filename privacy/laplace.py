"""The Laplace mechanism: noise, pure epsilon and its Renyi DP curve.

Noise is independent per entry, ``Laplace(0, b)`` (Dwork et al. 2006), drawn as the exact
discrete Laplace on a grid (:mod:`privacy.samplers`: same pure epsilon, no float
sampler). With L1 sensitivity Delta_1 the release is (Delta_1 / b, 0)-DP. We call
``z = b / Delta_1`` the Laplace noise multiplier (as ``dp_accounting.LaplaceDpEvent``
does): one release is (1/z)-DP.

RFRec (eq. 9) adds ``Laplace(0, s)`` to ``Clip(V, delta)`` and reports ``epsilon = 2 delta / s``:
that is the guarantee of one *entry* of one transmission (an entry moves by at most 2 delta),
see :func:`rfrec_entry_epsilon`; the whole message of d entries has Delta_1 = 2 delta d.
"""

from __future__ import annotations

import math

import numpy as np

from privacy import samplers


def laplace_noise(shape: tuple[int, ...], scale: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """Independent Laplace noise of scale (at least) ``scale``, on a grid: ``gamma k`` with
    gamma = :func:`privacy.samplers.grid` (scale, 40 bits) and k the exact discrete
    Laplace of integer scale ceil(scale / gamma), from uniform integers of ``rng``
    (:mod:`privacy.samplers`). A release adds it to a value rounded to the same grid,
    :func:`laplace_release`; added to an arbitrary float it would reveal the value modulo
    gamma."""
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"Laplace scale must be a positive finite number, got {scale!r}")
    gamma = samplers.grid(scale, samplers.LAPLACE_GRID_BITS)
    return samplers.discrete_laplace(tuple(shape), math.ceil(scale / gamma), rng) * gamma


def laplace_release(value: np.ndarray, scale: float, rng: np.random.Generator,
                    sensitivity: float, entries: int | None = None) -> np.ndarray:
    """``value`` + Laplace noise, pure (``sensitivity / scale``)-DP with L1 sensitivity
    ``sensitivity``, released on a grid (:func:`privacy.samplers.laplace_release`: the
    rounding is paid for in the noise; ``entries`` = d, the entries that may change)."""
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"Laplace scale must be a positive finite number, got {scale!r}")
    return samplers.laplace_release(value, scale, rng, sensitivity, entries)


def laplace_epsilon(sensitivity: float, scale: float) -> float:
    """Pure epsilon of one Laplace release: ``Delta_1 / b`` (Dwork et al. 2006, Prop. 1)."""
    return float(sensitivity) / float(scale)


def rfrec_entry_epsilon(clip_delta: float, scale: float) -> float:
    """RFRec's figure ``2 delta / s`` (Sec. 3.3, after eq. 9).

    It is the pure epsilon of ONE entry of ONE transmission (the entry lies in
    [-delta, delta], so two inputs differ by at most 2 delta). It is not a per-tenant
    guarantee: a message of d entries spends d times that per transmission, and every
    transmission composes.
    """
    return 2.0 * float(clip_delta) / float(scale)


def laplace_rdp(noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """Renyi DP of one Laplace release with ``b / Delta_1 = noise_multiplier``.

    Mironov (2017), "Renyi differential privacy", Prop. 6 / Table II: for alpha > 1 and
    t = Delta_1 / b,

        eps(alpha) = 1/(alpha-1) log( alpha/(2 alpha-1) e^{(alpha-1) t}
                                      + (alpha-1)/(2 alpha-1) e^{-alpha t} ).

    Mironov states it for a scalar query. For a d-dimensional release with independent
    per-entry noise and ||f(x) - f(x')||_1 <= Delta_1, the divergence is the sum of the
    per-coordinate ones, sum_j g(|mu_j| / b), where g is the expression above; g is convex in
    t (log-sum-exp of affine functions) with g(0) = 0, hence superadditive, so the sum is at
    most g(Delta_1 / b). The formula therefore bounds the vector release too.

    Worked example: t = 1 (z = 1), alpha = 2: log(2/3 e + 1/3 e^{-2}) = 0.6191.
    Evaluated with ``logaddexp`` so large alpha and t do not overflow.
    """
    a = np.asarray(orders, dtype=np.float64)
    if np.any(a <= 1):
        raise ValueError("Renyi orders must be > 1")
    t = 1.0 / float(noise_multiplier)
    log_mix = np.logaddexp(np.log(a / (2 * a - 1)) + (a - 1) * t,
                           np.log((a - 1) / (2 * a - 1)) - a * t)
    return log_mix / (a - 1)


def discrete_laplace_rdp(noise_multiplier: float, shift: int, orders: np.ndarray
                         ) -> np.ndarray:
    """Renyi DP of the discrete Laplace (P(k) proportional to exp(-|k| / t)) between
    centres ``shift`` apart, at scale t = ``noise_multiplier`` x ``shift``: closed form.

    With a = 1/t, c = (1 - e^{-a}) / (1 + e^{-a}) and r = e^{-a (2 alpha - 1)}, the sum
    sum_k P(k)^alpha Q(k)^{1-alpha} / c splits at 0 and at the shift D into
        e^{-a(1-alpha)D} / (1 - e^{-a})                    (k <= 0)
      + e^{-a(1-alpha)D} r (1 - r^{D-1}) / (1 - r)           (0 < k < D)
      + e^{-a alpha D} / (1 - e^{-a})                        (k >= D),
    and D_alpha = log(c sum) / (alpha - 1). It exceeds the continuous Laplace's curve
    (:func:`laplace_rdp`) at the same multiplier, by less the larger the shift (the tests
    check this on a grid of multipliers, orders and shifts)."""
    a_ = np.asarray(orders, dtype=np.float64)
    d = int(shift)
    if d < 1:
        raise ValueError(f"shift must be a positive integer, got {shift!r}")
    a = 1.0 / (float(noise_multiplier) * d)
    la = np.log(-np.expm1(-a))                        # log(1 - e^{-a})
    lc = la - np.log1p(np.exp(-a))
    terms = [np.full_like(a_, -a * d) * (1 - a_) - la, -a * a_ * d - la]
    if d > 1:
        lr = -a * (2 * a_ - 1)
        terms.append(-a * (1 - a_) * d + lr + np.log(-np.expm1(lr * (d - 1)))
                     - np.log(-np.expm1(lr)))
    return (lc + np.logaddexp.reduce(np.stack(terms), axis=0)) / (a_ - 1)
