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


def test_dp_popularity_records_its_count_noise_and_the_support_bar_drops_lifted_items():
    """The release keeps the standard deviation of the noise in its counts; with
    ``support_z`` z an item whose released count is below 5 + z s is never listed (a
    list shorter than k, its empty slots misses), without it every item is."""
    fed = _federation()
    bounds = P.user_bounds(P.PopularityConfig(max_items_per_user=4))
    spec = UserLevelSpec(epsilon=2.0, delta=1e-3, n_users=20, releases=1)
    assert P.PopularityConfig().support_z is None  # off by default
    off = P.fit(fed, P.PopularityConfig(max_items_per_user=4),
                privatizer=(p := UserLevelPrivatizer(spec, bounds, fed.n_clients, seed=5)),
                aggregator=p.aggregate)
    s = off.global_msg.noise
    assert s == pytest.approx(spec.noise_multiplier() * 2.0)
    assert off.global_msg.served is None
    # a noise-lifted item: counts far below the bar except by noise, and one clear item
    counts = np.array([500.0, 4.0 + 2.5 * s, 3.0, -20.0])
    glob = P.Counts(counts, True, s, P.supported(counts, s, 3.0))
    np.testing.assert_array_equal(glob.served, [True, False, False, False])
    a, b = P.ALGORITHM.factors(glob, P.Users(2))
    top = np.argsort(-(a @ b)[0], kind="stable")
    assert top[0] == 0 and np.all(np.isneginf((a @ b)[0, 1:]))
    # without the bar the lifted item is second in every list
    a, b = P.ALGORITHM.factors(glob.replace(served=None), P.Users(2))
    assert np.argsort(-(a @ b)[0], kind="stable")[1] == 1
    # exact counts (no noise): nothing is dropped whatever z
    assert P.supported(counts, 0.0, 3.0) is None and P.supported(counts, s, None) is None
    with pytest.raises(ValueError, match="support_z"):
        P.PopularityConfig(support_z=-1.0)


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
