"""Bernoulli (XOR) noise for Boolean factors (Felb Sec. 4.1.3 and Appendix E.6).

Each bit is flipped independently with probability p < 1/2 (randomized response, Warner
1965). One bit is then ln((1-p)/p)-DP; a Boolean message of d bits whose every bit may
depend on the protected unit is d ln((1-p)/p)-DP per transmission (basic composition over
the bits; tight when all bits may differ).
"""

from __future__ import annotations

import math

import numpy as np


def bernoulli_xor(bits: np.ndarray, flip_prob: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """``bits XOR Bernoulli(flip_prob)``, entry-wise; returns a new bool array."""
    if not 0 <= flip_prob < 0.5:
        raise ValueError(f"flip probability must be in [0, 0.5), got {flip_prob!r}")
    b = np.asarray(bits)
    if b.dtype != np.bool_:
        raise TypeError(f"Bernoulli XOR noise needs a Boolean array, got dtype {b.dtype}")
    return np.logical_xor(b, rng.random(b.shape) < flip_prob)


def bernoulli_epsilon(flip_prob: float, n_bits: int = 1) -> float:
    """Pure epsilon of XOR noise on ``n_bits`` bits: n ln((1-p)/p) (inf when p = 0)."""
    if not 0 <= flip_prob < 0.5:
        raise ValueError(f"flip probability must be in [0, 0.5), got {flip_prob!r}")
    if flip_prob == 0:
        return math.inf
    return n_bits * math.log((1.0 - flip_prob) / flip_prob)


def flip_prob_for_epsilon(epsilon: float, n_bits: int = 1) -> float:
    """The flip probability giving ``epsilon`` over ``n_bits`` bits: 1 / (1 + e^{eps/n})."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon!r}")
    return 1.0 / (1.0 + math.exp(epsilon / n_bits))


def bernoulli_rdp(noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """Renyi DP of one XOR release that is (1 / ``noise_multiplier``)-DP.

    With eps = 1 / z the pure epsilon of one transmission (:func:`bernoulli_epsilon` over
    its bits), the pair of output distributions of randomized response with that eps,
    P = (e^eps, 1) / (1 + e^eps) and Q = (1, e^eps) / (1 + e^eps), dominates every eps-DP
    mechanism (Zhu, Dong and Wang 2022, pure DP), so for alpha > 1

        D_alpha <= 1/(alpha-1) log( (e^{alpha eps} + e^{(1-alpha) eps}) / (1 + e^eps) ),

    exact for a single bit. It never exceeds eps (Mironov 2017, Prop. 3) and is about
    alpha eps^2 / 2 for small eps. Evaluated with ``logaddexp`` to avoid overflow.
    """
    a = np.asarray(orders, dtype=np.float64)
    if np.any(a <= 1):
        raise ValueError("Renyi orders must be > 1")
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise multiplier must be positive, got {noise_multiplier!r}")
    eps = 1.0 / float(noise_multiplier)
    log_num = np.logaddexp(a * eps, (1.0 - a) * eps)
    return (log_num - np.logaddexp(0.0, eps)) / (a - 1)


def is_boolean(a: np.ndarray) -> bool:
    """True for a bool array or a numeric one whose entries are all 0 or 1."""
    a = np.asarray(a)
    return a.dtype == np.bool_ or bool(np.all((a == 0) | (a == 1)))
