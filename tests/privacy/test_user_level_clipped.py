"""User-level DP of clipped-sum uploads (DP-FedMAvg, DP-FedMC-ADMM): the declared bound,
the noise it calibrates, and the subsampled-Gaussian accounting against dp-accounting."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest

from algorithms import dp_fedmavg as FA
from algorithms import dp_fedmc_admm as FC
from algorithms import dpals as D
from algorithms._user_grad import Upload
from algorithms.user_bounds import UserBounds
from privacy.accountant import ORDERS
from privacy.user_level import (
    AGGREGATE,
    UserLevelPrivatizer,
    add_noise,
    clipped_sensitivity,
    noise_stds,
    plan,
    sensitivities,
    sum_uploads,
)


def test_clipped_bounds_declare_sensitivity_c_and_noise_z_c_on_every_array():
    bounds = FC.user_bounds(FC.DPFedMCADMMConfig(clip_norm=1.7, release_centre=False))
    assert bounds.arrays == ("G", "H")
    assert clipped_sensitivity(bounds) == 1.7 and sensitivities(bounds) == {"clipped": 1.7}
    assert noise_stds(bounds, 2.5) == {"G": pytest.approx(4.25), "H": pytest.approx(4.25)}
    # DPALS keeps its own rules (gram/rhs shares), untouched by the clipped arrays
    dp = D.user_bounds(D.DPALSConfig(release_centre=False))
    assert dp.clipped == () and set(noise_stds(dp, 1.0)) == {"A", "b"}


@pytest.mark.parametrize("kwargs,message", [
    (dict(gram=("A",), clipped=("G",), clip_norm=1.0), "either gram/rhs arrays or clipped"),
    (dict(clipped=("G",), clip_norm=0.0), "clip_norm must be positive"),
    (dict(clipped=("G", "H"), clip_norm=1.0), "no noise field declared for H"),
])
def test_bounds_refuse_inconsistent_declarations(kwargs, message):
    base = dict(max_ratings=10, x_norm=0.0, rating_bound=0.0, gram=(), rhs=(),
                noise_fields={"G": "g", "A": "a"})
    with pytest.raises(ValueError, match=message):
        UserBounds(**{**base, **kwargs})


def test_noise_on_clipped_arrays_has_std_z_c_and_is_recorded():
    bounds = FA.user_bounds(FA.DPFedMAvgConfig(clip_norm=2.0, release_centre=False))
    up = Upload(G=np.zeros((5, 4000)), H=np.zeros(4000))
    out = add_noise(up, bounds, noise_stds(bounds, 1.5), np.random.default_rng(0))
    assert np.std(out.G) == pytest.approx(3.0, rel=0.02)
    assert np.std(out.H) == pytest.approx(3.0, rel=0.05)
    assert (out.grad_noise, out.curv_noise) == (3.0, 3.0)
    total = sum_uploads([out, out], bounds)
    np.testing.assert_array_equal(total.H, 2 * out.H)
    assert total.grad_noise == pytest.approx(3.0 * math.sqrt(2))


def test_plan_takes_the_algorithms_equal_release_shares_unless_the_request_overrides():
    bounds = FA.user_bounds(FA.DPFedMAvgConfig(releases=12))
    spec = plan({"epsilon": 8.0, "delta": 1e-6}, bounds, 6040, 12)
    assert spec.release_growth == 1.0
    assert len({e.noise_multiplier for e in spec.schedule()}) == 1
    assert plan({"epsilon": 8.0, "delta": 1e-6, "release_growth": 1.2}, bounds, 6040,
                12).release_growth == 1.2
    # DPALS declares no preference: the privacy layer's default stays
    assert plan({"epsilon": 8.0, "delta": 1e-6}, D.user_bounds(D.DPALSConfig()), 6040,
                4).release_growth == 2.5


@pytest.mark.parametrize("epsilon,q,releases", [
    (8.0, 1.0, 10), (8.0, 0.2, 10), (1.0, 0.2, 10), (8.0, 0.05, 30)])
def test_subsampled_gaussian_epsilon_is_cross_checked_by_dp_accountings_pld(
        epsilon, q, releases):
    """The noise solved for the target by the accountant's RDP: dp-accounting's RDP on the same
    Poisson-subsampled Gaussian events agrees (to 1e-5; 5e-4 below z = 1), and its PLD
    accountant (tighter) stays at or below the target and within 20% of it (measured
    0.85-0.94 of it here)."""
    cfg = FA.DPFedMAvgConfig(user_sample_rate=q, releases=releases)
    spec = plan({"epsilon": epsilon, "delta": 1e-6}, FA.user_bounds(cfg), 6040, releases)
    assert spec.sample_rate == q
    z = spec.noise_multiplier()
    gauss = dpa.GaussianDpEvent(z)
    event = gauss if q == 1 else dpa.PoissonSampledDpEvent(q, gauss)
    rdp = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    rdp.compose(event, releases)
    # 1e-5 apart, except at sigma < 1 with sampling, where dp-accounting drops the orders
    # 1.1-1.7 it cannot compute (its log-warning says so) and lands 2e-4 above
    assert rdp.get_epsilon(1e-6) == pytest.approx(epsilon, rel=1e-5 if z > 1 else 5e-4)
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event, releases)
    assert 0.8 * epsilon <= pld.get_epsilon(1e-6) <= epsilon


def test_a_central_run_charges_every_tenant_the_sampled_event_once_per_release():
    from algorithms.data import build_federation
    from algorithms.simulate import simulate
    from algorithms.synthetic import generate_ratings

    fed = build_federation(generate_ratings(300, 40, 3000, seed=1, scale="stars"), 3, 0)
    cfg = FC.DPFedMCADMMConfig(rank=2, releases=3, user_sample_rate=0.5, release_centre=False)
    bounds = FC.user_bounds(cfg)
    spec = plan({"epsilon": 2.0, "delta": 1e-4}, bounds, 300, 3)
    priv = UserLevelPrivatizer(spec, bounds, 3, seed=4)
    simulate(FC.ALGORITHM, cfg, fed, rounds=4, per_round=3, seed=4, privatizer=priv,
             aggregator=priv.aggregate)
    for t in range(3):  # equal shares: three identical events, merged by the ledger
        assert priv.ledger.history(t) == [spec.schedule()[0].times(3)]
        assert priv.ledger.history(t)[0].sample_rate == 0.5
    report = priv.report()
    assert [r["round"] for r in report["releases"]] == [1, 2, 3]  # round 4 only refreshes
    assert report["epsilon_max"] == pytest.approx(2.0, rel=1e-5)
    assert report["sensitivity"] == {"clipped": cfg.clip_norm}
    assert report["bounds"]["clip_norm"] == cfg.clip_norm
    z = report["releases"][0]["noise_multiplier"]
    assert report["noise_std"] == {"G": pytest.approx(z * cfg.clip_norm),
                                   "H": pytest.approx(z * cfg.clip_norm)}
    assert AGGREGATE == -1
