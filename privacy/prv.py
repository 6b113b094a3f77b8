"""Numerical composition of privacy loss random variables (PRVs) of the Gaussian mechanism.

Gopi, Lee and Wutschitz, "Numerical Composition of Differential Privacy" (2021): the
privacy loss Y = log(P(o) / Q(o)), o ~ P, of a mechanism determines its whole
(eps, delta) curve, delta(eps) = E[(1 - e^(eps - Y))^+]; the loss of a composition is the
sum of the losses, so composing means convolving their distributions. The algorithm:

1. Truncate each PRV to [-L, L] and discretise it on a mesh of width h, the mass of
   [t - h/2, t + h/2) at t, then shift the grid so the discrete mean equals the truncated
   continuous mean (their Algorithm 1; the mean matching is what makes the error
   O(h sqrt(k)) rather than O(h k)).
2. Compose: a PRV repeated k times by one FFT (power of its transform), different PRVs by
   pairwise convolution, all on the same window [-L, L] (their Section 5).
3. Read epsilon off delta(eps) on the grid; with delta_error and eps_error from their
   Theorem 5.5 the true epsilon at ``delta`` lies within [eps_lower, eps_upper].

L follows their Remark 5.6 (from the RDP tails of the composition and of each single PRV)
and h = eps_error / sqrt(k log(12 / delta_error) / 2). The Poisson-subsampled Gaussian's
PRV (their Propositions B.1 and B.4): with z(t) = log((e^t + q - 1) / q),

    F(t) = 1 - q/2 erfc((2 z sigma^2 - 1) / (2 sqrt(2) sigma))
             - (1 - q)/2 erfc((2 z sigma^2 + 1) / (2 sqrt(2) sigma))   for t > log(1 - q),

and F(t) = 0 below log(1 - q). The parameter choices (domain, mesh, the error split
delta_error = delta / 1000 in :func:`privacy.accountant.prv_epsilon`) are those of
Microsoft's prv_accountant and opacus' ``PRVAccountant`` so that the figure is the same
as theirs (the procedure follows opacus' ``opacus.accountants.analysis.prv``, Apache-2.0:
see NOTICE); the tests bound it by dp-accounting's PLD accountant from below and by the
RDP figure from above.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
from scipy import integrate, signal
from scipy.special import erfc

from privacy.rdp import DEFAULT_ORDERS, epsilon_from_rdp, gaussian_rdp_curve


@dataclasses.dataclass(frozen=True)
class SubsampledGaussianPRV:
    """The privacy loss of one Poisson-subsampled Gaussian release (rate q, multiplier
    sigma)."""

    sample_rate: float
    noise_multiplier: float

    def cdf(self, t: np.ndarray | float) -> np.ndarray:
        q, sigma = self.sample_rate, self.noise_multiplier
        t = np.asarray(t, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):  # log(1 - q) = -inf at q = 1
            above = t > np.log(1 - q)
            z = np.log(np.where(above, (np.exp(t) + q - 1) / q, 1.0))
        r2s = 2 * math.sqrt(2) * sigma
        return np.where(above, 1.0 - q * erfc((2 * z * sigma ** 2 - 1) / r2s) / 2
                        - (1 - q) * erfc((2 * z * sigma ** 2 + 1) / r2s) / 2, 0.0)


@dataclasses.dataclass(frozen=True)
class Grid:
    """The mesh t_min, t_min + h, ..., t_max (an even number of points); ``shift`` is how
    far the points have been moved from the aligned mesh (mean matching, composition)."""

    t_min: float
    t_max: float
    size: int
    shift: float = 0.0

    @staticmethod
    def aligned(t_min: float, t_max: float, h: float) -> Grid:
        """Multiples of h covering [t_min, t_max], one more at the top if their count is
        odd (the FFT self-composition's index arithmetic wants t_min = -(size/2 - 1) h)."""
        lo, hi = math.floor(t_min / h) * h, math.ceil(t_max / h) * h
        size = int(round((hi - lo) / h)) + 1
        if size % 2:
            size, hi = size + 1, hi + h
        return Grid(lo, hi, size)

    @property
    def h(self) -> float:
        return (self.t_max - self.t_min) / (self.size - 1)

    @property
    def ts(self) -> np.ndarray:
        return np.linspace(self.t_min, self.t_max, self.size)

    def moved(self, dt: float) -> Grid:
        return Grid(self.t_min + dt, self.t_max + dt, self.size, self.shift + dt)


@dataclasses.dataclass(frozen=True)
class DiscretePRV:
    """A privacy loss distribution on a grid: ``pmf[i]`` at ``grid.ts[i]``."""

    pmf: np.ndarray
    grid: Grid

    def epsilon(self, delta: float) -> float:
        """The smallest grid-read epsilon with delta(eps) <= delta, where
        delta(eps) = sum_{t > eps} p(t) (1 - e^(eps - t))."""
        t, p = self.grid.ts, self.pmf
        tail = np.cumsum(p[::-1])[::-1]                    # P(Y >= t_i)
        tail_e = np.cumsum((p * np.exp(-t))[::-1])[::-1]   # E[e^-Y; Y >= t_i]
        minus_delta = np.exp(t) * tail_e - tail            # -delta(t_i), increasing
        i = int(np.searchsorted(minus_delta, -delta, side="left"))
        if i <= 0:
            raise RuntimeError("the PRV grid is too narrow for this delta")
        return float(np.log((tail[i] - delta) / tail_e[i]))

    def bounds(self, delta: float, delta_error: float,
               eps_error: float) -> tuple[float, float, float]:
        """(lower bound, estimate, upper bound) of epsilon at ``delta`` (Gopi et al.,
        Thm. 5.5)."""
        if np.finfo(np.longdouble).eps * self.grid.size > delta - delta_error:
            raise ValueError("delta too small for this grid: rounding errors would dominate")
        return (self.epsilon(delta + delta_error) - eps_error, self.epsilon(delta),
                self.epsilon(delta - delta_error) + eps_error)


def _truncated_mean(prv: SubsampledGaussianPRV, lo: float, hi: float) -> float:
    """E[Y | lo <= Y < hi] by E = hi - integral_lo^hi F_trunc(t) dt, integrated piecewise on
    log-spaced points either side of 0 (the loss concentrates near 0)."""
    mass = prv.cdf(hi) - prv.cdf(lo)

    def cdf(t: float) -> float:
        return float((prv.cdf(t) - prv.cdf(lo)) / mass) if t < hi else 1.0

    points = np.concatenate([[lo], -np.logspace(int(np.log10(abs(lo))), -5, 10), [0.0],
                             np.logspace(-5, int(np.log10(hi)), 10), [hi]])
    mean = 0.0
    for left, right in itertools.pairwise(points):
        area, _ = integrate.quad(cdf, left, right, limit=500)
        mean += right * cdf(right) - left * cdf(left) - area
    return mean


def discretise(prv: SubsampledGaussianPRV, grid: Grid) -> DiscretePRV:
    """The PRV truncated to the grid's range, as masses of the cells around the grid points,
    the grid moved so that the discrete mean is the truncated continuous one."""
    lo, hi = grid.t_min, grid.t_max
    mass = prv.cdf(hi) - prv.cdf(lo)
    ts = grid.ts

    def cdf(t: np.ndarray) -> np.ndarray:
        inside = (prv.cdf(t) - prv.cdf(lo)) / mass
        return np.where(t < lo, 0.0, np.where(t < hi, inside, 1.0))

    pmf = cdf(ts + grid.h / 2) - cdf(ts - grid.h / 2)
    shift = _truncated_mean(prv, lo, hi) - float(np.dot(ts, pmf))
    if abs(shift) >= grid.h / 2:
        raise RuntimeError("the discretised PRV's mean is off by half a cell or more")
    return DiscretePRV(pmf, grid.moved(shift))


def self_compose(d: DiscretePRV, k: int) -> DiscretePRV:
    """The k-fold sum of ``d`` with itself on the same window, by FFT: the circular
    convolution's index sum_i - (k - 1) a lands on the grid t_min = -a h (a = size/2 - 1)."""
    n = d.grid.size
    if n % 2:
        raise ValueError("self-composition needs an even grid")
    pmf = np.fft.irfft(np.fft.rfft(d.pmf) ** k, n)
    roll = k - 1 + (n // 2 if k % 2 == 0 else 0)   # -(k - 1) a mod n, a = n/2 - 1
    return DiscretePRV(np.roll(pmf, roll), d.grid.moved(d.grid.shift * (k - 1)))


def compose_two(a: DiscretePRV, b: DiscretePRV) -> DiscretePRV:
    """The sum of two PRVs on the same window (the centred part of the full convolution)."""
    return DiscretePRV(signal.convolve(a.pmf, b.pmf, mode="same"), a.grid.moved(b.grid.shift))


def compose(dprvs: Sequence[DiscretePRV], counts: Sequence[int]) -> DiscretePRV:
    """Each PRV ``counts[i]`` times with itself (FFT), then all of them pairwise (a tree of
    convolutions)."""
    parts = [self_compose(d, k) for d, k in zip(dprvs, counts, strict=True)]
    while len(parts) > 1:
        nxt = [parts.pop()] if len(parts) % 2 else []
        nxt += [compose_two(x, y) for x, y in zip(parts[:-1:2], parts[1::2], strict=True)]
        parts = nxt
    return parts[0]


def safe_half_width(prvs: Sequence[SubsampledGaussianPRV], counts: Sequence[int],
                    eps_error: float, delta_error: float) -> float:
    """L of Gopi et al.'s Remark 5.6: beyond [-L, L] the composed loss and each single loss
    carry at most a fraction of ``delta_error`` (bounded by their RDP tails, on
    :data:`privacy.rdp.DEFAULT_ORDERS`)."""
    total = sum(counts)
    curve = sum(gaussian_rdp_curve(p.sample_rate, p.noise_multiplier, k, DEFAULT_ORDERS)
                for p, k in zip(prvs, counts, strict=True))
    width = epsilon_from_rdp(DEFAULT_ORDERS, curve, delta_error / 4)[0]
    for p in prvs:
        one = gaussian_rdp_curve(p.sample_rate, p.noise_multiplier, 1, DEFAULT_ORDERS)
        width = max(width, epsilon_from_rdp(DEFAULT_ORDERS, one,
                                            delta_error / (8 * total))[0])
    return max(width, eps_error) + 3


def gaussian_epsilon_bounds(runs: Sequence[tuple[float, float, int]], delta: float,
                            delta_error: float,
                            eps_error: float) -> tuple[float, float, float]:
    """(lower, estimate, upper) epsilon at ``delta`` of composed subsampled-Gaussian runs
    ``(sample rate, noise multiplier, count)``."""
    prvs = [SubsampledGaussianPRV(q, z) for q, z, _ in runs]
    counts = [k for _, _, k in runs]
    width = safe_half_width(prvs, counts, eps_error, delta_error)
    h = eps_error / math.sqrt(sum(counts) * math.log(12 / delta_error) / 2)
    grid = Grid.aligned(-width, width, h)
    if abs(grid.h - h) / h >= 1e-8:
        raise RuntimeError("the aligned grid lost its mesh width")
    return compose([discretise(p, grid) for p in prvs], counts).bounds(
        delta, delta_error, eps_error)
