"""The Laplace mechanism: noise, pure epsilon and its Renyi DP curve.

Noise is independent per entry, ``Laplace(0, b)`` (Dwork et al. 2006). With L1 sensitivity
Delta_1 the release is (Delta_1 / b, 0)-DP. We call ``z = b / Delta_1`` the Laplace noise
multiplier (as ``dp_accounting.LaplaceDpEvent`` does): one release is (1/z)-DP.

RFRec (eq. 9) adds ``Laplace(0, s)`` to ``Clip(V, delta)`` and reports ``epsilon = 2 delta / s``:
that is the guarantee of one *entry* of one transmission (an entry moves by at most 2 delta),
see :func:`rfrec_entry_epsilon`; the whole message of d entries has Delta_1 = 2 delta d.
"""

from __future__ import annotations

import numpy as np


def laplace_noise(shape: tuple[int, ...], scale: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """Independent ``Laplace(0, scale)`` noise of the given shape, drawn from ``rng``."""
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"Laplace scale must be a positive finite number, got {scale!r}")
    return rng.laplace(0.0, scale, size=shape)


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
