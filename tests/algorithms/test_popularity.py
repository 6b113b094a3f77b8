"""Popularity lists: exact counts, and the per-user bound and release of DP popularity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms import RatingBlock
from algorithms import popularity as P
from algorithms.data import Federation
from algorithms.ranking import ranking_report
from privacy.user_level import UserLevelPrivatizer, UserLevelSpec, clipped_sensitivity


def _federation(seed=0, sizes=(6, 9, 5), n_items=12):
    rng = np.random.default_rng(seed)
    blocks = []
    for m in sizes:
        mask = rng.random((m, n_items)) < rng.uniform(0.1, 0.9, size=(m, 1))
        mask[:, 0] = True
        rows, cols = np.nonzero(mask)
        blocks.append(RatingBlock(rows, cols, rng.integers(1, 6, rows.size).astype(float),
                                  m, n_items))
    return Federation(blocks, blocks, [np.arange(m) for m in sizes], np.arange(n_items),
                      (1.0, 5.0))


def test_exact_popularity_is_the_count_of_training_ratings_and_ranks_by_it():
    fed = _federation()
    result = P.fit(fed)
    counts = sum(np.bincount(b.cols, minlength=fed.n_items) for b in fed.train)
    np.testing.assert_array_equal(result.global_msg.counts, counts)
    a, b = P.ALGORITHM.factors(result.global_msg, result.local_states[0])
    np.testing.assert_array_equal((a @ b)[0], counts)
    assert result.history[0].uploads == 3 and P.user_bounds(P.PopularityConfig()) is None


@pytest.mark.parametrize("k", [1, 3, 20])
def test_removing_any_user_moves_dp_counts_by_at_most_sqrt_k(k):
    """Brute force over every user: the declared sensitivity sqrt(k) holds, and is met
    by a user with at least k items (not vacuous)."""
    block = _federation(k).train[1]
    full = P.item_counts(block, k)
    worst = 0.0
    for user in range(block.n_users):
        keep = block.rows != user
        rest = RatingBlock(block.rows[keep], block.cols[keep], block.vals[keep],
                           block.n_users, block.n_items)
        worst = max(worst, float(np.linalg.norm(full - P.item_counts(rest, k))))
    bounds = P.user_bounds(P.PopularityConfig(max_items_per_user=k))
    assert worst <= clipped_sensitivity(bounds) + 1e-12
    assert clipped_sensitivity(bounds) == pytest.approx(math.sqrt(k))
    assert worst >= math.sqrt(min(k, np.bincount(block.rows).max())) - 1e-12


def test_dp_popularity_is_one_charged_release_with_noise_of_the_planned_scale():
    fed = _federation()
    cfg = P.PopularityConfig(max_items_per_user=4)
    bounds = P.user_bounds(cfg)
    spec = UserLevelSpec(epsilon=2.0, delta=1e-3, n_users=20, releases=1)
    priv = UserLevelPrivatizer(spec, bounds, fed.n_clients, seed=5)
    result = P.fit(fed, cfg, privatizer=priv, aggregator=priv.aggregate)
    report = priv.report()
    assert len(report["releases"]) == 1 and report["releases"][0]["tenants"] == 3
    assert 1.99 < report["epsilon_max"] <= 2.0
    exact = sum(P.item_counts(b, 4) for b in fed.train)
    noise = result.global_msg.counts - exact
    assert np.all(noise != 0)
    assert report["noise_std"]["counts"] == pytest.approx(spec.noise_multiplier() * 2.0)
    rep = ranking_report(P.ALGORITHM, result.global_msg, result.local_states, fed.train,
                         fed.test, fed.scale)
    assert rep.users_ranked > 0


def test_dp_popularity_records_the_standard_deviation_of_its_count_noise():
    fed = _federation()
    cfg = P.PopularityConfig(max_items_per_user=4)
    spec = UserLevelSpec(epsilon=2.0, delta=1e-3, n_users=20, releases=1)
    priv = UserLevelPrivatizer(spec, P.user_bounds(cfg), fed.n_clients, seed=5)
    res = P.fit(fed, cfg, privatizer=priv, aggregator=priv.aggregate)
    assert res.global_msg.noise == pytest.approx(spec.noise_multiplier() * 2.0)
    assert P.fit(fed).global_msg.noise == 0.0  # the exact list


def test_the_default_k_of_dp_popularity_shrinks_with_epsilon_below_2():
    """k = min(100, 30 epsilon^2): at epsilon 1 each user's items weigh sqrt(30), so the
    count noise is sqrt(0.3) of what k = 100 gives at the same epsilon (the skewed sets'
    rarely rated items lifted into lists by noise, docs/benchmarks/ranking.md)."""
    assert [P.dp_items_per_user(e) for e in (0.01, 0.5, 1, 1.5, 2, 4, 8, 16)] == [
        1, 8, 30, 68, 100, 100, 100, 100]
    with pytest.raises(ValueError, match="epsilon"):
        P.dp_items_per_user(0.0)
    fed = _federation()
    stds = {}
    for k in (P.dp_items_per_user(1.0), P.DP_ITEMS_PER_USER):
        spec = UserLevelSpec(epsilon=1.0, delta=1e-3, n_users=20, releases=1)
        bounds = P.user_bounds(P.PopularityConfig(max_items_per_user=k))
        priv = UserLevelPrivatizer(spec, bounds, fed.n_clients, seed=5)
        res = P.fit(fed, P.PopularityConfig(max_items_per_user=k), privatizer=priv,
                    aggregator=priv.aggregate)
        stds[k] = res.global_msg.noise
    assert stds[30] == pytest.approx(stds[100] * math.sqrt(0.3))


def test_a_short_list_counts_its_empty_slots_as_misses():
    """Precision@k keeps k as its denominator when the support bar leaves fewer than k
    items: two relevant items listed of k = 10 slots is 0.2, not 1."""
    from algorithms.ranking import tenant_ranking

    train = RatingBlock(np.array([0]), np.array([5]), np.array([5.0]), 1, 6)
    test = RatingBlock(np.array([0, 0]), np.array([0, 1]), np.array([5.0, 5.0]), 1, 6)
    counts = np.array([9.0, 8.0, -np.inf, -np.inf, -np.inf, 7.0])
    sums = tenant_ranking(np.ones((1, 1)), counts[None, :], train, test, 3.5, 10)
    assert sums.precision == pytest.approx(0.2) and sums.ndcg == pytest.approx(1.0)
    assert sums.recommended.tolist() == [True, True, False, False, False, False]
