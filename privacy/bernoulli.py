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
