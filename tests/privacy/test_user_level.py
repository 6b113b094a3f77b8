"""User-level DP: sensitivity against brute force, accounting against dp-accounting,
placement of the noise, refusals."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from pydantic import ValidationError

from algorithms import RatingBlock
from algorithms import dpals as D
from privacy.accountant import ORDERS, Event, spend
from privacy.ledger import BudgetExceeded
from privacy.user_level import (
    AGGREGATE,
    UserLevelPrivatizer,
    UserLevelSpec,
    add_noise,
    bound_problem,
    gram_sensitivity,
    noise_stds,
    rhs_sensitivity,
    sum_uploads,
    symmetric_noise,
)


def _random_block(rng, m=12, n=9):
    mask = rng.random((m, n)) < 0.6
    mask[:, 0] = True
    rows, cols = np.nonzero(mask)
    return RatingBlock(rows, cols, rng.integers(1, 6, size=rows.size).astype(float), m, n)


def _upper(a):
    iu = np.triu_indices(a.shape[-1])
    return a[:, iu[0], iu[1]]


@pytest.mark.parametrize("seed,max_weight,power", [
    (0, 1.0, 0.0), (1, 1.0, 0.0), (2, 10.0, 0.0), (3, 10.0, 0.5), (4, 3.0, 1.0)])
def test_removing_any_user_moves_the_releases_by_at_most_the_declared_sensitivity(
        seed, max_weight, power):
    """Brute force: neighbouring datasets (one user removed), on random data and V, with
    cap, both clips and the weights active; the bound must hold for every user."""
    rng = np.random.default_rng(seed)
    cfg = D.DPALSConfig(rank=3, max_ratings_per_user=4, user_factor_clip=0.7,
                        bias_coordinate=0.5, rating_clip=1.2, lam_u=0.05,
                        max_weight=max_weight, rare_item_power=power)
    block = _random_block(rng)
    v = rng.normal(0, 2.0, size=(cfg.d, block.n_items))
    counts = rng.uniform(0, 30, size=block.n_items)  # a previous release's estimate
    keep = D.cap_per_user(block.rows, block.n_users, cfg.max_ratings_per_user, rng)
    u = D.solve_users(v, block, cfg)
    a, b = D.item_sums(u, keep, block, cfg, counts)
    bounds = D.user_bounds(cfg)
    worst_g = worst_r = 0.0
    for user in range(block.n_users):
        others = block.rows[keep] != user
        rest = keep[others]
        # the other users' factors do not depend on the removed user's ratings
        a2, b2 = D.item_sums(u, rest, block, cfg, counts)
        worst_g = max(worst_g, float(np.linalg.norm(_upper(a) - _upper(a2))))
        worst_r = max(worst_r, float(np.linalg.norm(b - b2)))
        assert np.linalg.norm(a - a2) <= math.sqrt(4) * cfg.x_norm ** 2 + 1e-12
    assert worst_g <= gram_sensitivity(bounds) + 1e-12
    assert worst_r <= rhs_sensitivity(bounds) + 1e-12
    assert gram_sensitivity(bounds) == pytest.approx(2 * (0.7 ** 2 + 0.5 ** 2))
    assert rhs_sensitivity(bounds) == pytest.approx(2 * 1.2 * math.hypot(0.7, 0.5))
    assert worst_g > 0.5 * gram_sensitivity(bounds)  # the bound is not vacuous


def test_symmetric_noise_has_variance_sigma_squared_on_and_above_the_diagonal():
    z = symmetric_noise((20000, 3, 3), 2.0, np.random.default_rng(0))
    np.testing.assert_array_equal(z, np.swapaxes(z, -1, -2))
    assert np.var(z[:, 0, 0]) == pytest.approx(4.0, rel=0.05)
    assert np.var(z[:, 0, 2]) == pytest.approx(4.0, rel=0.05)
    assert abs(np.corrcoef(z[:, 0, 1], z[:, 1, 2])[0, 1]) < 0.03


@pytest.mark.parametrize("share", [0.5, 0.2, 0.9])
def test_the_gram_and_rhs_noise_together_are_one_gaussian_of_multiplier_z(share):
    bounds = D.user_bounds(D.DPALSConfig(max_ratings_per_user=50, rating_clip=1.5,
                                         release_centre=False))
    stds = noise_stds(bounds, 3.0, share)
    joint = math.hypot(gram_sensitivity(bounds) / stds["A"], rhs_sensitivity(bounds) / stds["b"])
    assert joint == pytest.approx(1 / 3.0)
    assert (gram_sensitivity(bounds) / stds["A"]) ** 2 * 9 == pytest.approx(share)


@pytest.mark.parametrize("epsilon,delta,releases,q", [
    (8.0, 1e-6, 3, 1.0), (1.0, 1e-6, 3, 1.0), (8.0, 1e-6, 5, 1.0), (2.0, 1e-6, 4, 0.2)])
def test_noise_for_the_target_meets_it_by_dp_accounting(epsilon, delta, releases, q):
    spec = UserLevelSpec(epsilon=epsilon, delta=delta, n_users=6040, releases=releases,
                         sample_rate=q, release_growth=1.0)
    z = spec.noise_multiplier()
    gauss = dpa.GaussianDpEvent(z)
    event = gauss if q == 1 else dpa.PoissonSampledDpEvent(q, gauss)
    rdp = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    rdp.compose(event, releases)
    assert rdp.get_epsilon(delta) == pytest.approx(epsilon, rel=1e-5)
    # fedrec's (privacy.rdp) and dp-accounting's subsampled-Gaussian RDP differ in the 6th digit
    assert rdp.get_epsilon(delta) <= epsilon * (1 + (1e-9 if q == 1 else 1e-5))
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event, releases)
    assert pld.get_epsilon(delta) <= epsilon  # the tighter accountant never exceeds it
    # and a slightly smaller multiplier would not meet the target
    assert spend([Event("gaussian", z * 0.999, releases, q)], delta).epsilon > epsilon


def test_event_with_a_sample_rate_round_trips_and_old_lists_still_read():
    ev = Event("gaussian", 2.5, 3, 0.25)
    assert Event.from_list(ev.as_list()) == ev
    assert Event.from_list(["gaussian", 2.5, 3]) == Event("gaussian", 2.5, 3)
    assert Event("gaussian", 2.5).as_list() == ["gaussian", 2.5, 1]
    with pytest.raises(ValueError, match="sample rate must be in"):
        Event("gaussian", 1.0, 1, 0.0)


@pytest.mark.parametrize("kwargs,field", [
    (dict(delta=1e-3), "delta must be below 1 / number of users"),
    (dict(delta=1.5), "delta"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=float("inf")), "epsilon"),
    (dict(epsilon=500.0), "epsilon must be at most 100"),
    (dict(releases=0), "releases"),
])
def test_spec_refuses_out_of_range_values_naming_the_field(kwargs, field):
    base = dict(epsilon=8.0, delta=1e-6, n_users=6040, releases=3)
    with pytest.raises(ValidationError, match=field):
        UserLevelSpec(**{**base, **kwargs})


def _uploads(cfg, n_tenants=4, seed=0):
    rng = np.random.default_rng(seed)
    _, glob = D.init_server(9, n_tenants, cfg, rng)
    out = {}
    for i in range(n_tenants):
        block = _random_block(rng)
        st = D.init_client(block, glob, cfg, rng)
        out[i] = D.client_step(glob, st, block, cfg, rng)[1]
    return out


def test_central_placement_noises_the_sum_once_and_charges_every_contributor():
    cfg = D.DPALSConfig(rank=2)
    bounds = D.user_bounds(cfg)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=cfg.sweeps)
    priv = UserLevelPrivatizer(spec, bounds, 4, seed=3)
    ups = _uploads(cfg)
    passed = {i: priv(u, i, 1) for i, u in ups.items()}
    for i in ups:  # the bounded sums pass unchanged to the aggregation step
        np.testing.assert_array_equal(passed[i].A, ups[i].A)
    out = priv.aggregate(passed, 1)
    assert list(out) == [AGGREGATE]
    exact_a = sum(u.A for u in ups.values())
    noise = out[AGGREGATE].A - exact_a
    np.testing.assert_allclose(noise, np.swapaxes(noise, -1, -2))
    assert out[AGGREGATE].gram_noise == pytest.approx(priv.stds(0)["A"])  # once, not 4 times
    assert out[AGGREGATE].rhs_noise == pytest.approx(priv.stds(0)["b"])
    for t in range(4):
        assert priv.ledger.history(t) == [priv.plan[0]]
    # issue 29: never reproducible from the seed (a second run on it draws other noise)
    again = UserLevelPrivatizer(spec, bounds, 4, seed=3).aggregate(ups, 1)
    assert not np.array_equal(again[AGGREGATE].A, out[AGGREGATE].A)


def test_tenant_placement_noises_each_upload_so_the_sum_has_t_times_the_variance():
    cfg = D.DPALSConfig(rank=2)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=cfg.sweeps,
                         placement="tenant")
    priv = UserLevelPrivatizer(spec, D.user_bounds(cfg), 4, seed=3)
    ups = _uploads(cfg)
    noisy = {i: priv(u, i, 1) for i, u in ups.items()}
    assert priv.aggregate(noisy, 1) is noisy
    for i in ups:
        assert noisy[i].gram_noise == pytest.approx(priv.stds(0)["A"])
        assert not np.allclose(noisy[i].b, ups[i].b)
    # four independent noises: the sum carries sqrt(T) sigma
    assert sum_uploads(list(noisy.values()), priv.bounds).gram_noise == pytest.approx(
        2.0 * priv.stds(0)["A"])
    assert priv.report()["releases"][0]["tenants"] == 4


def test_budget_for_fewer_releases_than_planned_is_refused_before_the_run():
    cfg = D.DPALSConfig(rank=2)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=3)
    priv = UserLevelPrivatizer(spec, D.user_bounds(cfg), 2, seed=0)
    for k in (1, 2, 3):
        for t in (0, 1):
            priv.ledger.charge(t, priv.event(k - 1), k)
    # a fourth release is not affordable: the release of the sum (the one check, as the
    # service's) leaves the tenant out and records it as stopped; it then sends nothing
    up = _uploads(cfg, 2)[0]
    assert priv.aggregate({0: priv(up, 0, 4)}, 4) == {}
    assert priv.ledger.stopped() == {"0": 4}
    assert priv(up, 0, 5) is None
    with pytest.raises(BudgetExceeded, match="tenant 0 would spend epsilon"):
        UserLevelPrivatizer(spec, D.user_bounds(cfg), 2, seed=0, ledger=priv.ledger)


def test_sample_rate_must_match_the_algorithms_sampling():
    cfg = D.DPALSConfig(rank=2, user_sample_rate=0.5)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=3)
    with pytest.raises(ValueError, match="does not match the algorithm's user sampling"):
        UserLevelPrivatizer(spec, D.user_bounds(cfg), 2, seed=0)


def test_add_noise_keeps_existing_noise_in_quadrature():
    cfg = D.DPALSConfig(rank=2)
    up = _uploads(cfg, 1)[0].replace(gram_noise=3.0, rhs_noise=0.0, centre_noise=1.0)
    out = add_noise(up, D.user_bounds(cfg), {"A": 4.0, "b": 1.0, "m": 2.0},
                    np.random.default_rng(0))
    assert out.gram_noise == pytest.approx(5.0) and out.rhs_noise == pytest.approx(1.0)
    assert out.centre_noise == pytest.approx(math.sqrt(5.0))


def test_growing_schedule_meets_the_target_and_spends_more_on_later_releases():
    spec = UserLevelSpec(epsilon=8.0, delta=1e-6, n_users=6040, releases=4,
                         release_growth=2.5)
    weights = spec.weights()
    assert sum(weights) == pytest.approx(4) and weights[3] / weights[2] == pytest.approx(2.5)
    plan = spec.schedule()
    zs = [e.noise_multiplier for e in plan]
    assert zs == sorted(zs, reverse=True)
    np.testing.assert_allclose(zs, [spec.noise_multiplier() / math.sqrt(w) for w in weights])
    # dp-accounting on the same schedule: RDP meets the target, PLD is below it
    rdp = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    for z in zs:
        rdp.compose(dpa.GaussianDpEvent(z))
        pld.compose(dpa.GaussianDpEvent(z))
    assert rdp.get_epsilon(1e-6) == pytest.approx(8.0, rel=1e-5)
    assert pld.get_epsilon(1e-6) <= 8.0
    # for the Gaussian at q = 1 the shares add: the same total as 4 equal releases at z
    equal = UserLevelSpec(epsilon=8.0, delta=1e-6, n_users=6040, releases=4)
    assert spec.noise_multiplier() == pytest.approx(equal.noise_multiplier(), rel=1e-5)


def test_central_run_charges_each_release_its_own_scheduled_event():
    cfg = D.DPALSConfig(rank=2, sweeps=3)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=3,
                         release_growth=3.0)
    priv = UserLevelPrivatizer(spec, D.user_bounds(cfg), 2, seed=0)
    for k in (1, 2, 3):
        out = priv.aggregate({i: priv(u, i, k) for i, u in _uploads(cfg, 2, k).items()}, k)
        assert out[AGGREGATE].gram_noise == pytest.approx(priv.stds(k - 1)["A"])
    assert priv.ledger.history(0) == priv.plan
    assert priv.report()["epsilon_max"] == pytest.approx(4.0, rel=1e-5)
    assert [r["noise_multiplier"] for r in priv.report()["releases"]] == [
        e.noise_multiplier for e in priv.plan]


def test_growing_schedule_with_user_sampling_meets_the_target_by_dp_accounting():
    spec = UserLevelSpec(epsilon=2.0, delta=1e-6, n_users=6040, releases=3, sample_rate=0.3,
                         release_growth=2.0)
    rdp = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    for ev in spec.schedule():
        sampled = dpa.PoissonSampledDpEvent(0.3, dpa.GaussianDpEvent(ev.noise_multiplier))
        rdp.compose(sampled)
        pld.compose(sampled)
    assert rdp.get_epsilon(1e-6) == pytest.approx(2.0, rel=1e-5)
    assert pld.get_epsilon(1e-6) <= 2.0


def test_the_report_names_the_data_dependent_inputs_it_treats_as_public():
    """Every data-dependent figure a run uses without charging it is declared public in
    the report (the user count checks delta; the declared scale centres DPALS)."""
    cfg = D.DPALSConfig(rank=2, sweeps=2)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=2)
    priv = UserLevelPrivatizer(spec, D.user_bounds(cfg), 2, seed=0)
    report = priv.report()
    assert report["users"] == 1000
    assert set(report["public_inputs"]) == {"n_users", "rating_scale"}
    assert "delta < 1 / n_users" in report["public_inputs"]["n_users"]
    # the noise does not depend on the user count: only the check does
    other = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=5000, releases=2)
    assert other.noise_multiplier() == spec.noise_multiplier()


@pytest.mark.parametrize("seed,max_weight,power", [(0, 1.0, 0.0), (3, 10.0, 0.5)])
def test_honest_noisy_sums_lie_within_the_value_bound_and_a_scaled_rhs_does_not(
        seed, max_weight, power):
    """:func:`bound_problem` (norm bounding at the per-user bounds): bounded sums plus the
    declared noise pass, noise-free and at z = 1 over 100 draws, with the weights active;
    b scaled by 1e6 (an agent's poisoning) is named, and so is b alone at 1.01 x the
    noise-free bound of its gram's last diagonal entry."""
    rng = np.random.default_rng(seed)
    cfg = D.DPALSConfig(rank=3, max_ratings_per_user=4, user_factor_clip=0.7,
                        bias_coordinate=0.5, rating_clip=1.2, max_weight=max_weight,
                        rare_item_power=power, release_centre=False)
    block = _random_block(rng)
    v = rng.normal(0, 2.0, size=(cfg.d, block.n_items))
    keep = D.cap_per_user(block.rows, block.n_users, cfg.max_ratings_per_user, rng)
    u = D.solve_users(v, block, cfg)
    a, b = D.item_sums(u, keep, block, cfg, rng.uniform(0, 30, size=block.n_items))
    bounds, clean = D.user_bounds(cfg), D.Upload(A=a, b=b)
    zero = {name: 0.0 for name in bounds.arrays}
    assert bound_problem(clean, bounds, zero) is None
    stds = noise_stds(bounds, 1.0)
    for _ in range(100):
        assert bound_problem(add_noise(clean, bounds, stds, rng), bounds, stds) is None
    assert "b[" in bound_problem(clean.replace(b=b * 1e6), bounds, stds)
    edge = cfg.r_clip * cfg.x_norm * a[:, -1, -1] / cfg.bias_coordinate ** 2
    past = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-300) * (
        1.01 * edge[:, None])
    assert "b[" in bound_problem(clean.replace(b=past), bounds, zero)
