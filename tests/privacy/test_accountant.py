"""The accountant against Google's dp-accounting, published reference values and closed forms."""

import math
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from scipy.optimize import brentq

from privacy.accountant import (
    ORDERS,
    Event,
    compose,
    noise_for_epsilon,
    prv_epsilon,
    pure_epsilon,
    rdp_curve,
    spend,
)
from privacy.gaussian import analytic_delta
from privacy.rdp import DEFAULT_ORDERS, epsilon_from_rdp, gaussian_rdp_curve


def _dpa_epsilon(events, delta):
    acc = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    for mech, z, n in events:
        ev = dpa.GaussianDpEvent(z) if mech == "gaussian" else dpa.LaplaceDpEvent(z)
        acc.compose(ev, n)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("events,delta", [
    ([("gaussian", 10.0, 100)], 1e-5),
    ([("gaussian", 1.0, 1)], 1e-5),
    ([("gaussian", 3.0, 37)], 1e-6),
    ([("laplace", 10.0, 100)], 1e-5),
    ([("laplace", 50.0, 10)], 1e-3),
    ([("gaussian", 5.0, 20), ("laplace", 20.0, 30), ("gaussian", 8.0, 5)], 1e-5),
])
def test_rdp_epsilon_matches_dp_accounting(events, delta):
    got = spend([Event(*e) for e in events], delta).epsilon_rdp
    assert got == pytest.approx(_dpa_epsilon(events, delta), rel=1e-9)


def test_pinned_worked_examples():
    # the module docstring's examples; cross-checked above against dp-accounting
    g = spend([Event("gaussian", 10.0, 100)], 1e-5)
    assert (round(g.epsilon, 4), g.order) == (4.7285, 5.4)
    lap = spend([Event("laplace", 10.0, 100)], 1e-5)
    assert round(lap.epsilon_rdp, 4) == 4.5327 and lap.epsilon_pure == pytest.approx(10.0)
    assert lap.epsilon == lap.epsilon_rdp


def test_gaussian_rdp_is_the_closed_form_without_sampling():
    # q = 1: RDP(alpha) = T alpha / (2 z^2) (Mironov 2017, Prop. 7)
    curve = rdp_curve([Event("gaussian", 4.0, 25)])
    np.testing.assert_allclose(curve, 25 * np.array(ORDERS) / (2 * 16.0), rtol=1e-12)


def test_rdp_bound_is_above_the_exact_gaussian_composition():
    # T Gaussians at z compose exactly into one Gaussian at z / sqrt(T) (Dong et al. 2019);
    # its exact epsilon solves Balle & Wang's delta(eps) = delta; PLD (dp-accounting) agrees.
    z, t, delta = 10.0, 100, 1e-5
    exact = brentq(lambda e: analytic_delta(e, z / math.sqrt(t)) - delta, 1e-6, 100.0)
    pld = dpa.pld.PLDAccountant()
    pld.compose(dpa.GaussianDpEvent(z), t)
    assert pld.get_epsilon(delta) == pytest.approx(exact, rel=1e-3)
    assert exact < spend([Event("gaussian", z, t)], delta).epsilon < 1.15 * exact


def test_published_subsampled_value_reproduces_here():
    # opacus' tests/accountants_test.py::test_rdp_accountant (q = 0.04, z = 1.5, 2250
    # steps, delta 1e-5, its default orders): 7.32911117143
    curve = gaussian_rdp_curve(0.04, 1.5, int(90 / 0.04), DEFAULT_ORDERS)
    assert epsilon_from_rdp(DEFAULT_ORDERS, curve, 1e-5)[0] == pytest.approx(7.32911117143)


def _dpa_subsampled_epsilon(z, q, count, delta, orders):
    acc = dpa.rdp.RdpAccountant(orders=list(orders))
    g = dpa.GaussianDpEvent(z)
    acc.compose(g if q == 1 else dpa.PoissonSampledDpEvent(q, g), count)
    return acc.get_epsilon(delta)


#: integer orders up to 1024: where both binomial sums are exact in floats (above, the
#: coefficients overflow here and the bound is infinite; dp-accounting takes them in logs)
INTEGER_ORDERS = [a for a in ORDERS if float(a).is_integer() and a <= 1024]


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("q", [1.0, 0.3, 0.05, 0.001])
@pytest.mark.parametrize("count", [1, 30, 1000])
def test_subsampled_gaussian_rdp_matches_dp_accounting_over_a_grid(z, q, count):
    """The RDP curve and its conversion against dp-accounting's RdpAccountant at two deltas:
    to 1e-9 on the integer orders (q = 1: on all of ORDERS); the fractional ones below."""
    orders = ORDERS if q == 1 else INTEGER_ORDERS
    for delta in (1e-5, 1e-8):
        ours = spend([Event("gaussian", z, count, q)], delta, orders=orders).epsilon_rdp
        assert ours == pytest.approx(_dpa_subsampled_epsilon(z, q, count, delta, orders),
                                     rel=1e-9)


@pytest.mark.parametrize("z,q,count", [(1.0, 0.05, 100), (2.0, 0.01, 1000), (5.0, 0.5, 30)])
def test_fractional_orders_agree_with_dp_accounting_to_its_series_accuracy(z, q, count):
    """Fractional orders at q < 1: dp-accounting evaluates another series for A_alpha (and
    drops orders where it fails to converge); the two agree to 1.5e-4 on these cases."""
    frac = [a for a in ORDERS if not float(a).is_integer()]
    ours = spend([Event("gaussian", z, count, q)], 1e-5, orders=frac).epsilon_rdp
    assert ours == pytest.approx(_dpa_subsampled_epsilon(z, q, count, 1e-5, frac), rel=3e-4)


@pytest.mark.parametrize("z,q,count", [(1.0, 1.0, 10), (2.0, 0.1, 100), (0.8, 0.5, 20),
                                       (5.0, 0.01, 1000)])
def test_prv_upper_bound_is_within_its_error_of_dp_accounting_pld(z, q, count):
    """PRV composition (eps_error 0.01: the truth lies within 2 x 0.01 below its upper
    bound) against dp-accounting's PLD accountant (pessimistic, discretisation 1e-3)."""
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    g = dpa.GaussianDpEvent(z)
    pld.compose(g if q == 1 else dpa.PoissonSampledDpEvent(q, g), count)
    exact = pld.get_epsilon(1e-5)
    prv = prv_epsilon([Event("gaussian", z, count, q)], 1e-5)
    assert exact - 0.005 <= prv <= exact + 0.02 + 0.005


def test_laplace_reports_the_smaller_of_rdp_and_basic_composition():
    few = spend([Event("laplace", 2.0, 2)], 1e-5)  # pure: 1.0; RDP conversion is worse
    assert few.epsilon_pure == pytest.approx(1.0) and few.epsilon_rdp > 1.0
    assert few.epsilon == few.epsilon_pure


def test_pure_epsilon_is_infinite_with_a_gaussian_event():
    assert pure_epsilon([Event("laplace", 1.0, 3), Event("gaussian", 1.0, 1)]) == math.inf
    assert pure_epsilon([Event("laplace", 4.0, 3)]) == pytest.approx(0.75)


def test_empty_history_costs_nothing():
    s = spend([], 1e-5)
    assert (s.epsilon, s.transmissions, s.order) == (0.0, 0, None)


def test_compose_merges_identical_runs_and_drops_empty_ones():
    got = compose([Event("gaussian", 2.0, 1), Event("gaussian", 2.0, 3),
                   Event("laplace", 2.0, 0), Event("gaussian", 3.0, 1)])
    assert got == [Event("gaussian", 2.0, 4), Event("gaussian", 3.0, 1)]


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_noise_for_epsilon_is_the_smallest_noise_meeting_the_target(mechanism):
    z = noise_for_epsilon(mechanism, 8.0, 1e-5, 100)
    assert spend([Event(mechanism, z, 100)], 1e-5).epsilon <= 8.0
    assert spend([Event(mechanism, z * (1 - 1e-5), 100)], 1e-5).epsilon > 8.0


def test_noise_for_epsilon_agrees_with_dp_accounting_calibration():
    ours = noise_for_epsilon("gaussian", 8.0, 1e-5, 100)

    def event(z):
        return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 100)

    theirs = dpa.calibrate_dp_mechanism(
        lambda: dpa.rdp.RdpAccountant(orders=list(ORDERS)), event, 8.0, 1e-5,
        dpa.LowerEndpointAndGuess(0.1, 1.0), tol=1e-7)
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_event_validation_messages():
    with pytest.raises(ValueError, match="unknown mechanism 'exponential'"):
        Event("exponential", 1.0)
    with pytest.raises(ValueError, match="noise multiplier must be positive, got 0.0"):
        Event("gaussian", 0.0)


def test_spend_refuses_a_bad_delta():
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 0"):
        spend([Event("gaussian", 1.0)], 0)


def test_orders_start_with_the_customary_default_orders():
    # opacus' and TF Privacy's defaults: 1.1, 1.2, ..., 10.9, then 12, ..., 63
    assert ORDERS[:len(DEFAULT_ORDERS)] == DEFAULT_ORDERS
    assert DEFAULT_ORDERS[:3] == (1.1, 1.2, 1.3) and DEFAULT_ORDERS[98:101] == (10.9, 12, 13)
    assert DEFAULT_ORDERS[-1] == 63 and len(DEFAULT_ORDERS) == 151


def test_accounting_imports_neither_torch_nor_opacus():
    """The accountant is fedrec's own (privacy/rdp.py, privacy/prv.py): starting the API,
    the CLI or a worker, and accounting by RDP and PRV, loads no torch."""
    import subprocess
    import sys

    code = ("import sys, app.main, app.cli, worker.celery_app\n"
            "from privacy.accountant import Event, prv_epsilon, spend\n"
            "assert spend([Event('gaussian', 2.0, 3)], 1e-5).epsilon > 0\n"
            "assert prv_epsilon([Event('gaussian', 3.0, 10, 0.5)], 1e-6) > 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'opacus')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["[]"]


def test_the_api_loads_the_prv_machinery_only_when_it_composes_prvs():
    """scipy.signal and scipy.integrate (~45 MB) wait for the first PRV accounting: the API
    and the workers import the accountant, and most of them only ever account by RDP."""
    import subprocess
    import sys

    code = ("import sys, app.main, app.training.jobs, worker.celery_app\n"
            "from privacy.accountant import Event, prv_epsilon, spend\n"
            "spend([Event('gaussian', 2.0, 3)], 1e-5)\n"
            "print('privacy.prv' in sys.modules, 'scipy.signal' in sys.modules)\n"
            "prv_epsilon([Event('gaussian', 3.0, 10)], 1e-6)\n"
            "print('privacy.prv' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["False", "False", "True"]
