"""The user-level DP audit (bench/dp_audit.py): the canary, and that the empirical epsilon
stays below the claim while the same attack without noise clearly succeeds."""

import numpy as np
import pytest

from algorithms import dpals
from algorithms.data import build_federation
from algorithms.synthetic import generate_ratings
from bench.dp_audit import audit, canary_federation


@pytest.fixture(scope="module")
def setting():
    fed = build_federation(generate_ratings(300, 200, 6000, seed=0), 5, 0)
    with_canary, top, low = canary_federation(fed, 10)
    return fed, with_canary, (top, low)


def test_canary_is_one_extra_user_of_tenant_0_on_the_least_rated_items(setting):
    fed, with_canary, (top, low) = setting
    old, new = fed.train[0], with_canary.train[0]
    assert new.n_users == old.n_users + 1 and with_canary.test[0].n_users == new.n_users
    assert with_canary.train[1:] == fed.train[1:]
    mine = new.rows == old.n_users
    assert mine.sum() == 20 and np.array_equal(new.vals[~mine], old.vals)
    rated = dict(zip(new.cols[mine].tolist(), new.vals[mine].tolist(), strict=True))
    assert {rated[j] for j in top} == {5.0} and {rated[j] for j in low} == {1.0}
    counts = np.bincount(np.concatenate([b.cols for b in fed.train]), minlength=fed.n_items)
    others = np.setdiff1d(np.arange(fed.n_items), np.r_[top, low])
    assert counts[np.r_[top, low]].max() <= counts[others].min()


def test_empirical_epsilon_stays_below_the_claim_and_the_control_breaks_through(setting):
    fed, with_canary, items = setting
    cfg = dpals.DPALSConfig()
    control = audit(cfg, fed, with_canary, items, None, 100)
    private = audit(cfg, fed, with_canary, items, 1.0, 100)
    # without noise the attack separates every run: the bound is the most 100 runs can show
    assert control["auc"] == 1.0
    assert control["epsilon_lower_bound"] == pytest.approx(control["max_measurable"])
    assert control["epsilon_lower_bound"] > 2.5 * 1.0
    # at epsilon 1 the same attack cannot show more than the claim
    assert private["runs"] == 100 and private["claimed_epsilon"] == 1.0
    assert private["epsilon_lower_bound"] < 1.0
    assert private["auc"] < 0.8
    # the check has teeth: noise solved for epsilon 30 but claimed as 1 (a broken
    # accountant) is caught by the same 100 runs
    lax = audit(cfg, fed, with_canary, items, 30.0, 100)
    assert lax["epsilon_lower_bound"] > 1.5
