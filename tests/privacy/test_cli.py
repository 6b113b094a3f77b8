"""``--dp`` options: defaults that mean something, solved noise, refusal, the report."""

import argparse
import json
import math

import pytest

from privacy.accountant import Event, spend
from privacy.cli import add_dp_arguments, default_delta, privatizer_from_args, sampling_plan
from privacy.ledger import BudgetExceeded


def _args(*argv):
    return add_dp_arguments(argparse.ArgumentParser(prog="t")).parse_args(list(argv))


def test_default_is_gaussian_solved_for_epsilon_8_over_every_round():
    priv = privatizer_from_args(_args(), n_clients=4, rounds=50, seed=0, n_users=943)
    z = priv.spec.noise_multiplier
    assert priv.spec.mechanism == "gaussian" and priv.spec.delta == 1e-5
    assert spend([Event("gaussian", z, 50)], 1e-5).epsilon == pytest.approx(8.0, abs=1e-4)
    assert spend([Event("gaussian", z, 50)], 1e-5).epsilon <= 8.0
    assert priv.ledger.budget(3).epsilon_max == 8.0


def test_default_delta_is_below_one_over_the_users():
    assert default_delta(943) == 1e-5
    assert default_delta(2_000_000) == pytest.approx(5e-7)
    assert default_delta(None) == 1e-5


def test_laplace_target_epsilon_and_delta_options():
    priv = privatizer_from_args(_args("--dp", "laplace", "--dp-epsilon", "3", "--dp-delta",
                                      "1e-6"), n_clients=2, rounds=10, seed=0)
    z = priv.spec.noise_multiplier
    assert priv.spec.clip_norm == "l1"
    assert spend([Event("laplace", z, 10)], 1e-6).epsilon == pytest.approx(3.0, abs=1e-4)


def test_noise_options_are_mutually_exclusive():
    with pytest.raises(SystemExit):
        _args("--dp-noise", "1", "--dp-epsilon", "2")


def test_explicit_noise_without_budget_is_unlimited_and_accounted():
    priv = privatizer_from_args(_args("--dp-noise", "0.5"), n_clients=2, rounds=100, seed=0)
    assert priv.ledger.budget(0).epsilon_max == math.inf
    assert priv.report()["budget_epsilon_max"] is None


def test_a_run_over_budget_is_refused_before_it_starts():
    want = spend([Event("gaussian", 1.0, 100)], 1e-5).epsilon
    with pytest.raises(BudgetExceeded) as err:
        privatizer_from_args(_args("--dp-noise", "1", "--budget-epsilon", "10"),
                             n_clients=3, rounds=100, seed=0)
    assert str(err.value) == (
        f"privacy budget exceeded: tenant 0 would spend epsilon {want:.4g} (0 already spent "
        "+ 100 planned transmissions) > epsilon_max 10 at delta 1e-05; 2 other tenant(s) too")


def test_sampling_plan_lets_the_noise_follow_the_real_transmissions():
    plan = sampling_plan(n_clients=20, rounds=30, per_round=2, seed=5)
    assert sum(plan.values()) == 60 and len(plan) == 20
    worst = privatizer_from_args(_args(), n_clients=20, rounds=30, seed=5)
    exact = privatizer_from_args(_args(), n_clients=20, rounds=30, seed=5, plan=plan)
    assert exact.spec.noise_multiplier < worst.spec.noise_multiplier
    z, n = exact.spec.noise_multiplier, max(plan.values())
    assert spend([Event("gaussian", z, n)], 1e-5).epsilon <= 8.0


def test_dp_none_reports_no_guarantee():
    priv = privatizer_from_args(_args("--dp", "none"), n_clients=2, rounds=3, seed=0)
    rep = priv.report()
    assert rep["mechanism"] == "none" and rep["epsilon_max"] is None
    json.dumps(rep, allow_nan=False)
