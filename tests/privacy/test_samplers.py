"""Exact integer samplers (privacy.samplers): distributions against the exact pmfs, grid
releases whose low bits carry nothing but the noisy integer, only the passed generator
used, and the discrete mechanisms' accounting cross-checked with dp-accounting."""

import math
from fractions import Fraction

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import stats

from privacy import samplers as S
from privacy.accountant import Event, laplace_shift, rdp_curve, spend
from privacy.gaussian import gaussian_noise, gaussian_release
from privacy.laplace import discrete_laplace_rdp, laplace_noise, laplace_rdp, laplace_release
from privacy.secagg import discrete_gaussian as secagg_discrete_gaussian


def _chi_square_p(samples, support, pmf):
    """p-value of a chi-square test of ``samples`` against ``pmf`` on ``support`` (the
    tails beyond it pooled into one cell)."""
    counts = np.array([(samples == k).sum() for k in support] + [
        ((samples < support[0]) | (samples > support[-1])).sum()])
    probs = np.append(pmf, 1.0 - pmf.sum())
    keep = probs * samples.size >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(probs[keep], probs[~keep].sum()) * samples.size
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize("sigma", [0.8, 1.5, 3.0])
def test_discrete_gaussian_matches_the_exact_pmf(sigma):
    s2 = float(S.gaussian_variance(sigma))
    assert s2 >= sigma ** 2 and s2 - sigma ** 2 < 1e-6
    ks = np.arange(-int(12 * sigma) - 2, int(12 * sigma) + 3)
    w = np.exp(-ks.astype(float) ** 2 / (2 * s2))
    x = S.discrete_gaussian((200_000,), sigma, np.random.default_rng(5))
    assert x.dtype == np.int64
    assert _chi_square_p(x, ks, w / w.sum()) > 1e-3
    assert abs(x.mean()) < 5 * sigma / math.sqrt(x.size)
    assert x.var() == pytest.approx((ks ** 2 * w).sum() / w.sum(), rel=0.02)


@pytest.mark.parametrize("t", [1, 2, 5])
def test_discrete_laplace_matches_the_exact_pmf(t):
    ks = np.arange(-15 * t, 15 * t + 1)
    w = np.exp(-np.abs(ks) / t)
    x = S.discrete_laplace((200_000,), t, np.random.default_rng(6))
    assert _chi_square_p(x, ks, w / w.sum()) > 1e-3
    q = math.exp(-1 / t)
    assert x.var() == pytest.approx(2 * q / (1 - q) ** 2, rel=0.03)


@pytest.mark.parametrize("num,den", [(0, 1), (1, 3), (1, 1), (7, 3), (25, 4)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(num, den):
    n = 200_000
    hits = S.bernoulli_exp(np.random.default_rng(7), np.full(n, num), den).sum()
    assert stats.binomtest(int(hits), n, math.exp(-num / den)).pvalue > 1e-3


def test_large_sigma_moments_and_exact_square_reduction():
    sigma = 2.0 ** 28 + 12345.25
    x = S.discrete_gaussian((100_000,), sigma, np.random.default_rng(8))
    assert abs(x.mean()) < 5 * sigma / math.sqrt(x.size)
    assert x.std() == pytest.approx(sigma, rel=0.01)
    xs = np.array([0, 1, -3, 2 ** 31 + 7, -(2 ** 40) - 3, 2 ** 50 + 1], dtype=np.int64)
    den = 2 ** 61 - 1
    q, r = S._divmod_square(xs, den)
    for xi, qi, ri in zip(xs.tolist(), q.tolist(), r.tolist(), strict=True):
        assert (qi, ri) == divmod(xi * xi, den)


class _Spy:
    """A generator that records which of its methods are called."""

    def __init__(self, rng):
        self.rng, self.calls = rng, set()

    def __getattr__(self, name):
        self.calls.add(name)
        return getattr(self.rng, name)


def test_samplers_draw_only_uniform_integers_from_the_generator_passed_in():
    state = np.random.get_state()[1].copy()
    spy = _Spy(np.random.default_rng(9))
    a = gaussian_release(np.linspace(-3, 3, 500), 0.7, spy, 1.0)
    laplace_release(np.linspace(-3, 3, 500), 0.7, spy, 1.0)
    secagg_discrete_gaussian((500,), 11.0, spy)
    assert spy.calls == {"integers"}
    assert np.array_equal(np.random.get_state()[1], state)  # numpy's global stream untouched
    b = gaussian_release(np.linspace(-3, 3, 500), 0.7, np.random.default_rng(9), 1.0)
    np.testing.assert_array_equal(a, b)  # the generator passed in fixes the output


@pytest.mark.parametrize("release", [gaussian_release, laplace_release])
def test_release_lies_on_the_grid_and_its_low_bits_do_not_depend_on_the_input(release):
    scale = 0.3
    bits = S.GRID_BITS if release is gaussian_release else S.LAPLACE_GRID_BITS
    gamma = S.grid(scale, bits)
    assert gamma <= scale * 2.0 ** -bits < 2 * gamma and math.frexp(gamma)[0] == 0.5
    x = np.random.default_rng(10).normal(0, 5, 2000)
    out = release(x, scale, np.random.default_rng(11), 1.0)
    assert np.array_equal(out / gamma, np.rint(out / gamma))  # every output on the grid
    # inputs that round to the same grid point give bit-identical outputs: the output
    # depends on the input only through round(x / gamma)
    nudged = x + gamma * np.random.default_rng(12).uniform(-0.49, 0.49, x.size)
    nudged = np.where(np.rint(nudged / gamma) == np.rint(x / gamma), nudged, x)
    np.testing.assert_array_equal(release(nudged, scale, np.random.default_rng(11), 1.0), out)
    # whereas the textbook float sampler leaks x modulo gamma in the output's low bits
    leaky = x + np.random.default_rng(11).normal(0, scale, x.size)
    assert not np.array_equal(leaky / gamma, np.rint(leaky / gamma))


def test_noise_alone_is_on_the_grid_with_the_requested_scale():
    g = gaussian_noise((200_000,), 2.0, np.random.default_rng(13))
    assert np.array_equal(g / S.grid(2.0), np.rint(g / S.grid(2.0)))
    assert g.std() == pytest.approx(2.0, rel=0.01)
    lap = laplace_noise((200_000,), 0.5, np.random.default_rng(14))
    assert lap.std() == pytest.approx(math.sqrt(2) * 0.5, rel=0.02)


def test_release_pays_for_rounding_in_the_noise():
    # integer scale / integer sensitivity = sigma / Delta: Delta_int = Delta / gamma +
    # sqrt(d) (L2) or Delta / gamma + d (L1)
    sigma, delta_2, d = 3.0, 1.5, 10_000
    gamma = S.grid(sigma)
    s = S.integer_scale(sigma, gamma, delta_2, d, "l2")
    assert s / (delta_2 / gamma + math.sqrt(d)) == pytest.approx(sigma / delta_2, rel=1e-12)
    t = S.integer_scale(sigma, gamma, delta_2, d, "l1")
    assert t / (delta_2 / gamma + d) == pytest.approx(sigma / delta_2, rel=1e-12)
    # a worst case of the rounding bound: every entry moves by just over gamma / 2
    x = np.full(d, 0.5 * gamma * (1 - 1e-9))
    y = -x
    moved = np.linalg.norm(S.snap(x, gamma) - S.snap(y, gamma))
    assert moved <= np.linalg.norm(x - y) / gamma + math.sqrt(d)


def _renyi(logp, logq, alpha):
    """D_alpha(P || Q) from unnormalised log pmfs on a common support."""
    logp, logq = logp - np.logaddexp.reduce(logp), logq - np.logaddexp.reduce(logq)
    return float(np.logaddexp.reduce(alpha * logp + (1 - alpha) * logq) / (alpha - 1))


def test_discrete_gaussian_renyi_dp_is_the_continuous_curve_at_most():
    # CKS Prop. 5 / Thm. 4: D_alpha(N_Z(0, s^2) || N_Z(D, s^2)) <= alpha D^2 / (2 s^2)
    s2 = float(S.gaussian_variance(1.3))
    ks = np.arange(-80, 81)
    logp = -ks ** 2 / (2 * s2)
    for shift in (1, 2, 3):
        logq = -(ks - shift) ** 2 / (2 * s2)
        for alpha in (1.5, 2.0, 8.0, 32.0):
            assert _renyi(logp, logq, alpha) <= alpha * shift ** 2 / (2 * s2) + 1e-12


def test_discrete_laplace_renyi_dp_exceeds_the_continuous_formula_and_is_charged_so():
    # the discrete Laplace is NOT bounded by Mironov's continuous curve at the same
    # multiplier (t = 2, shift 1, alpha 1.5: 0.178 against 0.156); the closed form is
    # exact, decreases in the shift at a fixed multiplier (so the coarsest grid bounds
    # every release), and is convex in the shift at a fixed scale (vector releases)
    ks = np.arange(-4000, 4001)
    orders = np.array([1.5, 4.0, 16.0, 128.0])
    for z in (0.5, 2.0, 8.0):
        for shift in (1, 2, 5):
            t = z * shift
            logp, logq = -np.abs(ks) / t, -np.abs(ks - shift) / t
            exact = [_renyi(logp, logq, a) for a in orders]
            got = discrete_laplace_rdp(z, shift, orders)
            np.testing.assert_allclose(got, exact, rtol=1e-9)
            assert np.all(got >= laplace_rdp(z, orders))
            assert np.max(logp - logq) == pytest.approx(1 / z)  # pure eps = Delta / t
        curve = [discrete_laplace_rdp(z, n, orders) for n in (1, 2, 3, 8, 64, 2 ** 20)]
        assert all(np.all(a >= b - 1e-12) for a, b in zip(curve[:-1], curve[1:], strict=True))
    t = 3.0
    g = [_renyi(-np.abs(ks) / t, -np.abs(ks - n) / t, 4.0) for n in range(8)]
    assert g[0] == pytest.approx(0.0, abs=1e-12)
    assert all(g[n + 1] - g[n] >= g[n] - g[n - 1] - 1e-12 for n in range(1, 7))
    # the accountant charges the discrete curve at the coarsest shift of a grid release
    rdp = rdp_curve([Event("laplace", 2.0, 1)], orders)
    np.testing.assert_allclose(rdp, discrete_laplace_rdp(2.0, laplace_shift(2.0), orders),
                               rtol=1e-12)
    assert np.all(rdp >= laplace_rdp(2.0, orders))
    assert laplace_shift(2.0) == 2 ** 39


def test_discrete_mechanisms_accounting_is_cross_checked_by_dp_accounting():
    # the grid release of sigma = z Delta is the discrete Gaussian of integer scale s on
    # integer sensitivity Delta_int with s / Delta_int = z: fedrec charges Event(z)
    sigma, delta_2, d, z, rounds = 1.0, 0.25, 400, 4.0, 30
    gamma = S.grid(sigma)
    s = float(S.gaussian_variance(S.integer_scale(sigma, gamma, delta_2, d, "l2"))) ** 0.5
    sens = math.ceil(delta_2 / gamma + math.sqrt(d))  # a whole number at least Delta_int
    assert s / sens == pytest.approx(z, rel=1e-6)
    ours = spend([Event("gaussian", z, rounds)], 1e-5).epsilon
    # dp-accounting's PLD of the discrete Gaussian itself (truncated at a sigma ~ 2^28:
    # use the same multiplier at sigma_int 400 with sensitivity 100, a coarser grid)
    discrete = pld.from_discrete_gaussian_mechanism(400.0, sensitivity=100).self_compose(
        rounds).get_epsilon_for_delta(1e-5)
    continuous = dpa.pld.PLDAccountant().compose(
        dpa.GaussianDpEvent(z), rounds).get_epsilon(1e-5)
    assert discrete <= ours and discrete == pytest.approx(continuous, rel=0.02)
    # the PRV figure (continuous Gaussian losses) against the discrete mechanism's PLD
    prv = spend([Event("gaussian", z, rounds)], 1e-5, method="prv").epsilon_prv
    assert discrete <= prv * 1.01
    # discrete Laplace: pure Delta / t, PLD below the RDP and basic-composition figure
    lap = pld.from_discrete_laplace_mechanism(1 / 40, sensitivity=10).self_compose(
        rounds).get_epsilon_for_delta(1e-5)
    assert lap <= spend([Event("laplace", 4.0, rounds)], 1e-5).epsilon <= rounds / 4.0
    assert Fraction(S.gaussian_variance(3.0)) >= 9


def test_sigma_beyond_int64_acceptance_runs_on_python_integers():
    # secure aggregation's integer noise can exceed 2^30 (20 fractional bits): the
    # acceptance denominator 2 t c then passes 2^61 and is reduced exactly in Python ints
    sigma = 3.0e10
    t, c, b = S.gaussian_params(sigma)
    assert sigma > S.INT64_SIGMA and 2 * t * c * b >= 2 ** 61
    x = S.discrete_gaussian((50_000,), sigma, np.random.default_rng(15))
    assert x.dtype == np.int64 and abs(x.mean()) < 5 * sigma / math.sqrt(x.size)
    assert x.std() == pytest.approx(sigma, rel=0.02)
    bound = 3 * 2 ** 63 + 5
    u = S._uniform_below(np.random.default_rng(16), bound, 100_000)
    assert all(0 <= v < bound for v in u)
    counts = np.bincount([v * 10 // bound for v in u], minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-3
