"""The accountant against Google's dp-accounting, opacus' pinned values and closed forms."""

import math
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from scipy.optimize import brentq

from privacy.accountant import (
    ORDERS,
    Event,
    compose,
    noise_for_epsilon,
    pure_epsilon,
    rdp_curve,
    spend,
)
from privacy.gaussian import analytic_delta


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


def test_opacus_pinned_value_reproduces_here():
    # opacus/tests/accountants_test.py::test_rdp_accountant (sampled, q = 0.04)
    acc = RDPAccountant()
    acc.history = [(1.5, 0.04, int(90 / 0.04))]
    assert acc.get_epsilon(delta=1e-5) == pytest.approx(7.32911117143)


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


def test_noise_for_epsilon_agrees_with_opacus_calibration():
    ours = noise_for_epsilon("gaussian", 8.0, 1e-5, 100)
    theirs = get_noise_multiplier(target_epsilon=8.0, target_delta=1e-5, sample_rate=1.0,
                                  steps=100, accountant="rdp", epsilon_tolerance=0.001)
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_event_validation_messages():
    with pytest.raises(ValueError, match="unknown mechanism 'exponential'"):
        Event("exponential", 1.0)
    with pytest.raises(ValueError, match="noise multiplier must be positive, got 0.0"):
        Event("gaussian", 0.0)


def test_spend_refuses_a_bad_delta():
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 0"):
        spend([Event("gaussian", 1.0)], 0)


def test_orders_start_with_opacus_default_alphas():
    from privacy.accountant import ORDERS

    n = len(RDPAccountant.DEFAULT_ALPHAS)
    assert list(ORDERS[:n]) == list(RDPAccountant.DEFAULT_ALPHAS)


def test_the_accountant_uses_opacus_public_modules_not_files_loaded_by_path():
    """The analysis is opacus' own importable module (a file loaded by path breaks the day
    opacus moves it), and nothing of fedrec's stands in for part of opacus."""
    import importlib
    import sys

    from privacy.accountant import opacus_prv, opacus_rdp, prv_epsilon

    assert spend([Event("gaussian", 2.0, 3)], 1e-5).epsilon > 0
    assert prv_epsilon([Event("gaussian", 3.0, 10, 0.5)], 1e-6) > 0
    assert opacus_rdp() is importlib.import_module("opacus.accountants.analysis.rdp")
    assert opacus_prv() is importlib.import_module("opacus.accountants.analysis.prv")
    assert not [m for m in sys.modules if m.startswith("fedrec_opacus")]
    source = (Path(__file__).resolve().parents[2] / "privacy" / "accountant.py").read_text()
    assert "spec_from_file_location" not in source and "Shim" not in source


def test_the_service_the_cli_and_the_worker_import_torch_only_when_they_account():
    """opacus' package imports torch (seconds): starting the API, the CLI or a worker must
    not; the first accounting does, through opacus' public modules."""
    import subprocess
    import sys

    code = ("import sys, app.main, app.cli, worker.celery_app\n"
            "print(sorted(m for m in ('torch', 'opacus') if m in sys.modules))\n"
            "from privacy.accountant import Event, prv_epsilon, spend\n"
            "assert spend([Event('gaussian', 2.0, 3)], 1e-5).epsilon > 0\n"
            "assert prv_epsilon([Event('gaussian', 3.0, 10, 0.5)], 1e-6) > 0\n"
            "print(sorted(m for m in ('torch', 'opacus') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["[]", "['opacus',", "'torch']"]


def test_the_served_api_imports_the_analyses_while_it_starts(tmp_path):
    """`fedrec serve`'s app pays opacus' and torch's import in its start-up (frozen with the
    rest of its heap), not in the first request that accounts."""
    import os
    import subprocess
    import sys

    code = ("import sys\n"
            "from fastapi.testclient import TestClient\n"
            "from app.db import migrate\n"
            "from app.main import create_served_app\n"
            "migrate(sys.argv[1])\n"
            "app = create_served_app()\n"
            "print('torch' in sys.modules)\n"
            "with TestClient(app) as client:\n"
            "    print('torch' in sys.modules, client.get('/health').status_code)\n")
    url = f"sqlite:///{tmp_path / 'served.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDREC_")}
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True,
                         timeout=300, env={**env, "FEDREC_DATABASE_URL": url},
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "200"]
