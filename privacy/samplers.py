r"""Exact integer noise samplers and grid releases (no floating-point noise anywhere).

Why: textbook samplers (``rng.normal``, ``rng.laplace``) turn uniform floats into noise
through ``log`` and ``sqrt``; the set of doubles they can output depends on the value
they are added to, and the low bits of ``value + noise`` reveal the value (Mironov, "On
significance of the least significant bits for differential privacy", CCS 2012). Here
every random bit comes from **uniform integers** drawn from the generator passed in
(``rng.integers``, never ``random``/``normal``/``geometric``), and all arithmetic on them
is exact integer arithmetic:

* :func:`bernoulli_exp` -- Bernoulli(exp(-gamma)) for rational gamma = num / den
  (Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy",
  NeurIPS 2020, Alg. 1);
* :func:`discrete_laplace` -- P(k) proportional to exp(-|k| / t), integer t (CKS Alg. 2);
* :func:`discrete_gaussian` -- P(k) proportional to exp(-k^2 / (2 sigma^2)) on the
  integers, sigma^2 rational (CKS Alg. 3, any integer t > 0 is valid; t = floor(sigma)+1).

All three are vectorised: each step draws for every still-undecided entry at once under a
mask; the loops run over *rounds* of rejection (a few dozen at most), never per sample.
Numerators and denominators are int64; a square that could pass 2^63 is reduced exactly
with wrapping uint64 arithmetic (:func:`_divmod_square`), and the rare entry whose
quotient is too large for that (|noise| beyond ~2^20 standard deviations) goes through
Python integers one by one.

Grid releases (:func:`gaussian_release`, :func:`laplace_release`). A float value x is
released as ``gamma * (round(x / gamma) + k)`` with gamma a power of two, deterministic
round-to-nearest, and k the integer noise. The output is then a function of the integer
``m(x) + k`` only (multiplying by a power of two and adding two integers are exact or
correctly rounded), so it is post-processing of an integer mechanism and its low bits
carry nothing else. Rounding is paid for in the sensitivity: with ``m(x) = x / gamma +
e(x)``, ``|e| <= 1/2`` per entry,

    ||m(x) - m(y)||_2 <= ||x - y||_2 / gamma + ||e(x) - e(y)||_2 <= Delta_2 / gamma + sqrt(d)
    ||m(x) - m(y)||_1 <= Delta_1 / gamma + d

for d entries that may change. The release scales the integer noise so that
``sigma_int / Delta_int = sigma / Delta`` (``t_int / Delta_int,1 = b / Delta_1``): the
noise multiplier the accountant charges is the integer mechanism's exactly, and the
rounding costs only a slightly larger noise (a factor ``1 + sqrt(d) gamma / Delta``, with
gamma about ``2^-GRID_BITS`` sigma). Privacy of the integer mechanisms:

* discrete Gaussian, integer sensitivity Delta_int: ``(Delta_int^2 / (2 sigma_int^2))``-
  concentrated DP (CKS Thm. 4), i.e. Renyi DP ``alpha / (2 z^2)`` at every order, the
  same curve as the continuous Gaussian of the same multiplier z (what the accountant
  composes). Its (epsilon, delta) curve is not identical to the continuous one (CKS
  Thm. 7); dp-accounting's discrete-Gaussian PLD cross-checks it in the tests;
* discrete Laplace of scale t, integer sensitivity Delta_int: pure ``Delta_int / t``-DP
  exactly as the continuous Laplace (the likelihood ratio of two shifted pmfs is at most
  exp(Delta_int / t)). Its Renyi curve is *above* Mironov's continuous formula at the
  same multiplier (the coarser the grid, the more), so the accountant charges the
  discrete curve (:func:`privacy.laplace.discrete_laplace_rdp`, at the coarsest shift a
  grid release can have: :func:`privacy.accountant.laplace_shift`).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

#: grid granularity of a Gaussian release: the largest power of two <= sigma * 2^-GRID_BITS
#: (integer noise sigma about 2^28, so sigma_int^2 < 2^61 stays within int64)
GRID_BITS = 28
#: the same for Laplace releases (the discrete Laplace needs only t < 2^62)
LAPLACE_GRID_BITS = 40
#: above this integer sigma the discrete Gaussian's acceptance denominator 2 t c no longer
#: fits int64: that step then runs on Python integers (numpy object arrays), still
#: vectorised (secure aggregation's noise at 20 fractional bits can reach 2^30 and more)
INT64_SIGMA = 2.0 ** 30
#: largest sigma accepted (|Y| of the discrete Laplace proposal must stay within int64)
MAX_SIGMA = 2.0 ** 55
#: above this estimated quotient the float estimate in :func:`_divmod_square` could be off
#: by more than one: such (astronomically rare) entries are reduced with Python integers
_EXACT_QUOTIENT = 2.0 ** 40


# --------------------------------------------------------------------------- Bernoulli

def _uniform_below(rng: np.random.Generator, bound: int, size: int) -> np.ndarray:
    """``size`` uniform integers in [0, bound), from ``rng`` only: int64 for bound < 2^63,
    else Python integers (object array) from 62-bit words by rejection."""
    if bound < 2 ** 63:
        return rng.integers(0, bound, size=size, dtype=np.int64)
    words = -(-bound.bit_length() // 62)
    span = 2 ** (62 * words)
    limit = span - span % bound  # accept V < limit: V % bound is then uniform
    out = np.empty(size, dtype=object)
    todo = np.arange(size)
    while todo.size:
        w = rng.integers(0, 2 ** 62, size=(todo.size, words), dtype=np.int64).astype(object)
        v = sum(w[:, i] * 2 ** (62 * i) for i in range(words))
        ok = v < limit
        out[todo[ok]] = v[ok] % bound
        todo = todo[~ok]
    return out


def _bernoulli_exp_fraction(rng: np.random.Generator, num: np.ndarray, den: int
                            ) -> np.ndarray:
    """Bernoulli(exp(-num / den)) for 0 <= num <= den (CKS Alg. 1, gamma in [0, 1]).

    K = 1; repeat: A ~ Bernoulli(gamma / K), stop when A = 0, else K += 1; output K odd.
    Every undecided entry has the same K in a round. Bernoulli(num / (den K)) is drawn as
    ``[U_K == 0] and [U_den < num]`` (U_K, U_den uniform below K and den, the second
    drawn only where the first is 0), so den K never has to fit a word."""
    k = np.ones(num.size, dtype=np.int64)
    alive = np.arange(num.size)
    kk = 1
    while alive.size:
        first = _uniform_below(rng, kk, alive.size) == 0
        alive = alive[first]
        alive = alive[_uniform_below(rng, den, alive.size) < num[alive]]
        kk += 1
        k[alive] = kk
    return (k & 1) == 1


def _bernoulli_exp1(rng: np.random.Generator, n: int) -> np.ndarray:
    """Bernoulli(exp(-1)), ``n`` draws: CKS Alg. 1 at gamma = 1 (A ~ Bernoulli(1 / K))."""
    k = np.ones(n, dtype=np.int64)
    alive = np.arange(n)
    kk = 1
    while alive.size:
        alive = alive[_uniform_below(rng, kk, alive.size) == 0]
        kk += 1
        k[alive] = kk
    return (k & 1) == 1


def bernoulli_exp(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Exact Bernoulli(exp(-num / den)) per entry, for int64 ``num >= 0`` and one integer
    ``1 <= den < 2^63``.

    CKS Alg. 1: exp(-gamma) = exp(-1)^floor(gamma) exp(-(gamma - floor(gamma))), so the
    output is 1 iff floor(gamma) draws of Bernoulli(exp(-1)) and one of
    Bernoulli(exp(-frac)) are all 1. Entries die at the first 0, so the loop over the
    integer part runs about as many rounds as the largest surviving floor(gamma) (each
    draw keeps a share 1/e of the survivors)."""
    num = np.asarray(num, dtype=np.int64).ravel()
    den = int(den)
    if np.any(num < 0) or not 1 <= den < 2 ** 63:
        raise ValueError("bernoulli_exp needs num >= 0 and 1 <= den < 2^63")
    whole, rem = np.divmod(num, den)
    return _bernoulli_exp_split(rng, whole, rem, den)


def _bernoulli_exp_split(rng: np.random.Generator, whole: np.ndarray, rem: np.ndarray,
                         den: int) -> np.ndarray:
    """Bernoulli(exp(-(whole + rem / den))) with 0 <= rem < den (see :func:`bernoulli_exp`)."""
    out = _bernoulli_exp_fraction(rng, rem, den)
    alive = np.flatnonzero(out & (whole > 0))
    left = whole[alive]
    while alive.size:  # up to `chunk` Bernoulli(exp(-1)) per entry and round, all must be 1
        chunk = _chunk(alive.size)
        want = np.arange(chunk)[None, :] < np.minimum(left, chunk)[:, None]
        hits = _bernoulli_exp1(rng, int(want.sum()))
        ok = np.ones(want.shape, dtype=bool)
        ok[want] = hits
        good = ok.all(axis=1)
        out[alive[~good]] = False
        left = left - chunk
        keep = good & (left > 0)
        alive, left = alive[keep], left[keep]
    return out


def _chunk(alive: int) -> int:
    """Bernoulli(exp(-1)) draws per entry and round: one while many entries are undecided
    (most stop at the first), eight for the few left (fewer rounds of numpy calls)."""
    return 1 if alive > 4096 else 8


# --------------------------------------------------------------------------- Laplace

def discrete_laplace(shape: tuple[int, ...], t: int, rng: np.random.Generator) -> np.ndarray:
    """Exact discrete Laplace: P(k) proportional to exp(-|k| / t) on the integers, int64.

    CKS Alg. 2 with s = 1: U uniform in [0, t), accept with Bernoulli(exp(-U / t));
    V = the number of Bernoulli(exp(-1)) successes before the first failure; X = U + t V
    is then geometric, P(X = x) proportional to exp(-x / t); a fair sign B, rejecting
    (B = 1, X = 0) so that 0 is not counted twice. Returns Z = (1 - 2B) X."""
    t = int(t)
    if not 1 <= t < 2 ** 62:
        raise ValueError(f"discrete Laplace scale must be an integer in [1, 2^62), got {t!r}")
    size = int(np.prod(shape))
    out = np.empty(0, dtype=np.int64)
    while out.size < size:
        n = int((size - out.size) * 1.7) + 16
        out = np.concatenate([out, _laplace_candidates(rng, n, t)])
    return out[:size].reshape(shape)


def _laplace_candidates(rng: np.random.Generator, n: int, t: int) -> np.ndarray:
    """One vectorised pass of CKS Alg. 2: the accepted samples among ``n`` attempts."""
    u = _uniform_below(rng, t, n)
    keep = _bernoulli_exp_fraction(rng, u, t)
    u = u[keep]
    v = _geometric_exp1(rng, u.size)
    x = u + t * v
    b = rng.integers(0, 2, size=x.size, dtype=np.int64)
    ok = ~((b == 1) & (x == 0))
    return ((1 - 2 * b) * x)[ok]


def _geometric_exp1(rng: np.random.Generator, n: int) -> np.ndarray:
    """Number of Bernoulli(exp(-1)) successes before the first failure, per entry (drawn
    a chunk at a time per entry: the first failure among them ends the count)."""
    v = np.zeros(n, dtype=np.int64)
    alive = np.arange(n)
    while alive.size:
        chunk = _chunk(alive.size)
        hits = _bernoulli_exp1(rng, alive.size * chunk).reshape(alive.size, chunk)
        first = np.where(hits.all(axis=1), chunk, np.argmin(hits, axis=1))
        v[alive] += first
        alive = alive[first == chunk]
    return v


# --------------------------------------------------------------------------- Gaussian

def gaussian_params(sigma: float) -> tuple[int, int, int]:
    """(t, c, b) with sigma^2 <= t c / b: the exact variance parameter the discrete
    Gaussian sampler uses for a requested ``sigma``.

    t = floor(sigma) + 1 (CKS Alg. 3), b = the largest power of two with
    2 sigma^2 b^2 < 2^60 (at most 2^30), c = ceil(sigma^2 b / t): then sigma^2 / t = c / b
    is a fraction whose denominator keeps every step in int64, and the variance parameter
    exceeds the request by less than t / b (relative 1 / (b sigma))."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"discrete Gaussian sigma must be positive and finite, got {sigma!r}")
    if sigma > MAX_SIGMA:
        raise ValueError(f"discrete Gaussian sigma {sigma:.4g} exceeds {MAX_SIGMA:.4g}")
    s2 = Fraction(sigma) ** 2
    t = math.floor(sigma) + 1
    b = 1
    while b < 2 ** 30 and 2 * s2 * (2 * b) ** 2 < 2 ** 60:
        b *= 2
    c = math.ceil(s2 * b / t)
    return t, c, b


def gaussian_variance(sigma: float) -> Fraction:
    """The exact variance parameter sigma^2 of :func:`discrete_gaussian`'s pmf for a
    requested ``sigma`` (at least sigma^2)."""
    t, c, b = gaussian_params(sigma)
    return Fraction(t * c, b)


def discrete_gaussian(shape: tuple[int, ...], sigma: float, rng: np.random.Generator
                      ) -> np.ndarray:
    """Exact discrete Gaussian N_Z(0, s^2), P(k) proportional to exp(-k^2 / (2 s^2)), int64,
    with s^2 = :func:`gaussian_variance` (``sigma``) >= sigma^2.

    CKS Alg. 3: Y ~ discrete Laplace of scale t, accepted with Bernoulli(exp(-gamma)),
    gamma = (|Y| - s^2 / t)^2 / (2 s^2). With s^2 = t c / b (:func:`gaussian_params`):
    gamma = (b |Y| - c)^2 / (2 t c b), one integer square over one int64 denominator."""
    t, c, b = gaussian_params(sigma)
    size = int(np.prod(shape))
    out = np.empty(0, dtype=np.int64)
    while out.size < size:
        n = int((size - out.size) * 1.9) + 16
        y = discrete_laplace((n,), t, rng)
        x = b * np.abs(y) - c
        den = 2 * t * c * b
        whole, rem = _divmod_square(x, den)
        accept = _bernoulli_exp_split(rng, whole, rem, den)
        out = np.concatenate([out, y[accept]])
    return out[:size].reshape(shape)


def _divmod_square(x: np.ndarray, den: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact (x^2 // den, x^2 % den) for int64 x and 1 <= den < 2^61, without overflow.

    The quotient is estimated in floating point (off by at most one while below
    2^40); the remainder x^2 - q den is computed modulo 2^64 (wrapping uint64), which is
    exact because the true value lies in (-den, 2 den); one correction step each way.
    Entries whose estimate exceeds 2^40 are reduced with Python integers; so is every
    entry when den >= 2^61 (object arrays, remainders as Python integers)."""
    if den >= 2 ** 61:
        sq = x.astype(object) ** 2
        q = np.minimum(sq // den, 2 ** 62).astype(np.int64)
        return q, sq % den
    xf = x.astype(np.float64)
    q = np.floor(xf * xf / den)
    big = q > _EXACT_QUOTIENT
    q = np.where(big, 0.0, q).astype(np.int64)
    xu = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        r = (xu * xu - q.astype(np.uint64) * np.uint64(den)).view(np.int64)
    low = r < 0
    q, r = q - low, r + low * den
    high = r >= den
    q, r = q + high, r - high * den
    for i in np.flatnonzero(big):  # |x| beyond ~2^20 standard deviations: never in practice
        qi, ri = divmod(int(x[i]) ** 2, den)
        q[i], r[i] = min(qi, 2 ** 62), ri
    return q, r


# --------------------------------------------------------------------------- grid releases

def grid(scale: float, bits: int = GRID_BITS) -> float:
    """The granularity of a release of noise ``scale``: the largest power of two at most
    ``scale * 2^-bits``."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"noise scale must be a positive finite number, got {scale!r}")
    e = math.frexp(scale)[1] - 1 - bits  # 2^e <= scale 2^-bits < 2^(e+1)
    if e < -1000:
        raise ValueError(f"noise scale {scale!r} is too small for a grid release")
    return math.ldexp(1.0, e)


def snap(value: np.ndarray, gamma: float) -> np.ndarray:
    """round(value / gamma) as floats (integer-valued), deterministic nearest (ties to
    even); refuses values that are not finite."""
    v = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ValueError("cannot release a value that is not finite")
    return np.rint(v / gamma)


def integer_scale(scale: float, gamma: float, sensitivity: float | None, entries: int,
                  norm: str) -> float:
    """The integer noise scale of a grid release: ``scale / gamma`` plus the rounding's
    share, ``(scale / sensitivity) sqrt(d)`` (L2) or ``(scale / sensitivity) d`` (L1), so
    that integer scale / integer sensitivity = scale / sensitivity (module docstring).
    ``sensitivity`` None: noise alone, no value rounded (nothing to pay)."""
    base = scale / gamma
    if sensitivity is None:
        return base
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be positive, got {sensitivity!r}")
    spread = math.sqrt(entries) if norm == "l2" else float(entries)
    return base + scale / sensitivity * spread


def gaussian_release(value: np.ndarray, sigma: float, rng: np.random.Generator,
                     sensitivity: float, entries: int | None = None) -> np.ndarray:
    """``value`` plus Gaussian noise of standard deviation (at least) ``sigma``, released
    on the grid gamma = :func:`grid` (sigma): ``gamma (round(value / gamma) + k)``, k ~
    N_Z(0, s^2) with s / (Delta_2 / gamma + sqrt(d)) >= sigma / Delta_2 (``sensitivity``
    = Delta_2 of the whole release, ``entries`` = d, the entries that may change, default
    ``value.size``; see the module docstring for the bound)."""
    v = np.asarray(value, dtype=np.float64)
    gamma = grid(sigma)
    d = v.size if entries is None else int(entries)
    s = integer_scale(sigma, gamma, sensitivity, d, "l2")
    return (snap(v, gamma) + discrete_gaussian(v.shape, s, rng)) * gamma


def laplace_release(value: np.ndarray, scale: float, rng: np.random.Generator,
                    sensitivity: float, entries: int | None = None) -> np.ndarray:
    """``value`` plus Laplace noise of scale (at least) ``scale`` on the grid gamma =
    :func:`grid` (scale, LAPLACE_GRID_BITS): ``gamma (round(value / gamma) + k)``, k
    discrete Laplace of integer scale t >= (Delta_1 / gamma + d) scale / Delta_1, so the
    release is pure (Delta_1 / scale)-DP (``sensitivity`` = Delta_1, ``entries`` = d)."""
    v = np.asarray(value, dtype=np.float64)
    gamma = grid(scale, LAPLACE_GRID_BITS)
    d = v.size if entries is None else int(entries)
    t = math.ceil(integer_scale(scale, gamma, sensitivity, d, "l1"))
    return (snap(v, gamma) + discrete_laplace(v.shape, t, rng)) * gamma
