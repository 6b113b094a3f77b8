"""The privatizer inside ``algorithms.simulate.simulate`` with a real algorithm."""

import argparse

import numpy as np
import pytest

from algorithms import registry
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from privacy.accountant import Event, spend
from privacy.cli import add_dp_arguments, privatizer_from_args, sampling_plan
from privacy.ledger import Budget, Ledger
from privacy.wrapper import DPPrivatizer, DPSpec


@pytest.fixture(scope="module")
def fed():
    return build_federation(generate_ratings(60, 40, 1200, rank=3, seed=0), 6, 0)


@pytest.fixture(scope="module")
def admm():
    return registry.get("fedmc-admm")


def _run(alg, fed, priv, rounds=4, per_round=3, seed=0):
    return simulate(alg, alg.config(), fed, rounds=rounds, per_round=per_round, seed=seed,
                    privatizer=priv)


def test_every_real_upload_is_charged_once_in_its_round(admm, fed):
    priv = DPPrivatizer(DPSpec(noise_multiplier=2.0),
                        Ledger.open({i: Budget(1e9, 1e-5) for i in range(6)}), seed=0)
    res = _run(admm, fed, priv)
    plan = sampling_plan(6, 4, 3, 0)
    assert {t: len(priv.ledger.rounds(t)) for t in priv.ledger.tenants()} == plan
    assert sum(r.uploads for r in res.history) == 12
    for t, n in plan.items():
        assert priv.ledger.spent(t) == spend([Event("gaussian", 2.0, n)] if n else [], 1e-5)


def test_dp_noise_is_fresh_per_run_and_runs_without_it_are_reproducible(admm, fed):
    """Issue 29: two DP runs on one seed and one federation draw different noise (the
    seed is public); without privacy the same seed still gives bit-identical runs."""
    args = add_dp_arguments(argparse.ArgumentParser()).parse_args(["--dp-noise", "0.5"])
    a = _run(admm, fed, privatizer_from_args(args, 6, 4, seed=0))
    b = _run(admm, fed, privatizer_from_args(args, 6, 4, seed=0))
    clear = _run(admm, fed, None)
    assert not np.allclose(a.global_msg.V, b.global_msg.V)
    assert not np.allclose(a.global_msg.V, clear.global_msg.V)
    np.testing.assert_array_equal(_run(admm, fed, None).global_msg.V, clear.global_msg.V)


def test_tenants_out_of_budget_stop_transmitting_mid_run(admm, fed):
    cap = spend([Event("gaussian", 2.0, 1)], 1e-5).epsilon
    priv = DPPrivatizer(DPSpec(noise_multiplier=2.0),
                        Ledger.open({i: Budget(cap, 1e-5) for i in range(6)}), seed=0)
    res = _run(admm, fed, priv, rounds=6, per_round=6)
    assert [r.uploads for r in res.history] == [6, 0, 0, 0, 0, 0]
    assert priv.report()["stopped"] == {str(i): 2 for i in range(6)}
    assert np.isfinite(res.final.test_rmse)
