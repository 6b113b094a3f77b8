"""Laplace, Gaussian and Bernoulli mechanisms against independent computations."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import _laplace_rdp
from scipy import integrate, stats

from privacy.bernoulli import bernoulli_epsilon, bernoulli_xor, flip_prob_for_epsilon
from privacy.gaussian import analytic_delta, analytic_sigma, classic_sigma, gaussian_noise
from privacy.laplace import laplace_epsilon, laplace_noise, laplace_rdp, rfrec_entry_epsilon


def _renyi_laplace_numeric(t: float, alpha: float) -> float:
    """D_alpha(Lap(t, 1) || Lap(0, 1)) by numerical integration (independent of Mironov)."""
    lp, lq = stats.laplace(loc=t).logpdf, stats.laplace(loc=0.0).logpdf
    f = lambda x: math.exp(alpha * lp(x) + (1 - alpha) * lq(x))  # noqa: E731
    val = sum(integrate.quad(f, a, b, limit=200, epsabs=0, epsrel=1e-12)[0]
              for a, b in [(-80.0, 0.0), (0.0, t), (t, 80.0)])
    return math.log(val) / (alpha - 1)


@pytest.mark.parametrize("t,alpha", [(0.5, 2.0), (1.0, 3.5), (3.0, 1.5), (0.1, 10.0)])
def test_laplace_rdp_matches_numerical_renyi_divergence(t, alpha):
    got = laplace_rdp(1.0 / t, np.array([alpha]))[0]
    assert got == pytest.approx(_renyi_laplace_numeric(t, alpha), rel=1e-7)


def test_laplace_rdp_matches_dp_accounting():
    orders = np.array([1.5, 2.0, 8.0, 64.0, 1024.0])
    for z in (0.1, 1.0, 10.0):
        want = [_laplace_rdp(1.0 / z, a) for a in orders]
        np.testing.assert_allclose(laplace_rdp(z, orders), want, rtol=1e-9)


def test_laplace_rdp_is_superadditive_so_it_bounds_vector_releases():
    # two coordinates moved by a and b cost g(a) + g(b) <= g(a + b) (module docstring)
    orders = np.array([1.5, 4.0, 32.0])
    g = lambda t: laplace_rdp(1.0 / t, orders)  # noqa: E731
    assert np.all(g(0.3) + g(0.7) <= g(1.0) + 1e-15)


def test_laplace_rdp_tends_to_pure_epsilon_at_high_order():
    assert laplace_rdp(0.5, np.array([1e6]))[0] == pytest.approx(2.0, rel=1e-4)


def test_laplace_noise_has_the_laplace_scale():
    x = laplace_noise((200_000,), 0.5, np.random.default_rng(1))
    assert np.mean(np.abs(x)) == pytest.approx(0.5, rel=0.01)  # E|X| = b
    assert abs(np.mean(x)) < 0.01


def test_laplace_noise_is_reproducible_from_the_generator():
    a = laplace_noise((3, 4), 1.0, np.random.default_rng(7))
    b = laplace_noise((3, 4), 1.0, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


def test_pure_epsilon_of_laplace():
    assert laplace_epsilon(2.0, 0.5) == 4.0


def test_rfrec_figure_for_the_papers_chosen_pair():
    # RFRec Sec. 4.6: delta = 0.2, s = 0.04 -> epsilon = 2 * 0.2 / 0.04 = 10 (per entry)
    assert rfrec_entry_epsilon(0.2, 0.04) == pytest.approx(10.0)
    assert rfrec_entry_epsilon(0.2, 0.06) == pytest.approx(20.0 / 3.0)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-5), (1.0, 1e-5), (1.0, 1e-3), (5.0, 1e-6),
                                       (20.0, 1e-5)])
def test_analytic_sigma_matches_dp_accounting(eps, delta):
    assert analytic_sigma(eps, delta) == pytest.approx(
        dp_accounting.get_sigma_gaussian(eps, delta), rel=1e-8)


def test_analytic_sigma_scales_with_sensitivity_and_meets_delta():
    s = analytic_sigma(0.8, 1e-5, sensitivity=3.0)
    assert s == pytest.approx(3.0 * analytic_sigma(0.8, 1e-5), rel=1e-9)
    assert analytic_delta(0.8, s, 3.0) <= 1e-5
    assert analytic_delta(0.8, s * (1 - 1e-6), 3.0) > 1e-5


def test_analytic_delta_is_the_exact_hockey_stick_divergence():
    # delta(eps) = E_P[(1 - e^{eps - L})_+], L the privacy loss of N(D,s^2) vs N(0,s^2)
    d, s, eps = 1.0, 2.0, 0.7
    mu = d / s
    loss = lambda x: mu * x - mu**2 / 2  # noqa: E731  (x in units of sigma, under P)
    x0 = (eps + mu**2 / 2) / mu  # the loss exceeds eps for x > x0
    integrand = lambda x: stats.norm.pdf(x, loc=mu) * -math.expm1(eps - loss(x))  # noqa: E731
    want = integrate.quad(integrand, x0, x0 + 40.0, epsabs=0, epsrel=1e-12)[0]
    assert analytic_delta(eps, s, d) == pytest.approx(want, rel=1e-7)


def test_analytic_is_tighter_than_classic():
    for eps in (0.1, 0.5, 0.99):
        assert analytic_sigma(eps, 1e-5) < classic_sigma(eps, 1e-5)


def test_classic_sigma_formula():
    assert classic_sigma(0.5, 1e-5, sensitivity=2.0) == pytest.approx(
        2.0 * math.sqrt(2 * math.log(125_000.0)) / 0.5)


def test_classic_sigma_refuses_epsilon_of_one_or_more():
    with pytest.raises(ValueError, match=r"holds only for 0 < epsilon < 1"):
        classic_sigma(1.0, 1e-5)


def test_gaussian_noise_std_and_refusal():
    x = gaussian_noise((200_000,), 2.0, np.random.default_rng(3))
    assert np.std(x) == pytest.approx(2.0, rel=0.01)
    with pytest.raises(ValueError, match="Gaussian sigma must be a positive finite number"):
        gaussian_noise((2,), 0.0, np.random.default_rng(0))


def test_bernoulli_flips_at_the_given_rate_and_keeps_dtype():
    bits = np.zeros(100_000, dtype=bool)
    out = bernoulli_xor(bits, 0.1, np.random.default_rng(5))
    assert out.dtype == np.bool_ and out.mean() == pytest.approx(0.1, abs=0.003)
    assert not bits.any()


def test_bernoulli_xor_is_an_xor():
    bits = np.array([True, False, True, False])
    out = bernoulli_xor(bits, 0.3, np.random.default_rng(2))
    flips = np.random.default_rng(2).random(4) < 0.3
    np.testing.assert_array_equal(out, bits ^ flips)


def test_bernoulli_epsilon_is_randomized_response():
    assert bernoulli_epsilon(0.25) == pytest.approx(math.log(3.0))
    assert bernoulli_epsilon(0.25, n_bits=10) == pytest.approx(10 * math.log(3.0))
    assert flip_prob_for_epsilon(10 * math.log(3.0), n_bits=10) == pytest.approx(0.25)
    assert bernoulli_epsilon(0.0) == math.inf


def test_bernoulli_refuses_non_boolean_input():
    with pytest.raises(TypeError, match="needs a Boolean array, got dtype float64"):
        bernoulli_xor(np.zeros(2), 0.1, np.random.default_rng(0))
