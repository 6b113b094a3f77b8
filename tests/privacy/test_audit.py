"""Attack primitives of the audit on hand-made examples."""

import itertools

import numpy as np
import pytest
from scipy.stats import beta

from algorithms.block import RatingBlock
from algorithms.fedmgs import item_statistics
from privacy.audit import (
    auc,
    clopper_pearson,
    epsilon_lower_bound,
    fedmgs_single_rater,
    fix_offset,
    item_features,
    item_membership_scores,
    max_measurable_epsilon,
    resolve_sign,
    ridge_fit,
    ridge_predict,
)


def test_auc_counts_ordered_pairs_with_half_ties():
    pos, neg = np.array([3.0, 1.0, 2.0]), np.array([2.0, 0.0])
    pairs = [1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg)]
    assert auc(pos, neg) == pytest.approx(np.mean(pairs))
    assert auc(np.array([5.0]), np.array([1.0, 2.0])) == 1.0
    assert np.isnan(auc(np.array([]), np.array([1.0])))


def test_membership_score_is_the_departure_from_the_broadcast():
    v = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    w = v + np.array([[0.0, 3.0, 0.0], [0.0, 4.0, 0.0]])
    y = np.zeros((2, 3))
    np.testing.assert_allclose(item_membership_scores({"W": w, "Y": y}, v, 3), [0.0, 5.0, 0.0])


def test_item_features_stack_the_upload_and_broadcast_columns():
    v = np.arange(6.0).reshape(2, 3)
    feats = item_features({"W": v + 1.0}, v, 3)
    np.testing.assert_allclose(feats, np.column_stack([np.ones((3, 2)), v.T]))


def test_single_rater_reconstruction_is_exact_on_fedmgs_statistics():
    rng = np.random.default_rng(0)
    block = RatingBlock(np.zeros(4, int), np.array([0, 2, 3, 5]), np.array([5.0, 1.0, 3.0, 4.0]),
                        1, 6)
    u = rng.normal(size=(1, 3))
    gram, cross = item_statistics(u, block, offset=3.25)
    items, vals = fedmgs_single_rater(gram, cross)
    np.testing.assert_array_equal(items, [0, 2, 3, 5])
    sign = np.sign(vals[0] / (block.vals[0] - 3.25))     # u is known only up to its sign
    np.testing.assert_allclose(sign * vals, block.vals - 3.25, atol=1e-10)
    np.testing.assert_allclose(fix_offset(sign * vals, (1.0, 5.0)), block.vals, atol=1e-9)


def test_fix_offset_uses_the_prior_when_several_shifts_fit():
    centred = np.array([0.25, -0.75, 1.25])         # ratings 3, 2, 4 minus 2.75
    np.testing.assert_allclose(fix_offset(centred, (1.0, 5.0), prior_mean=3.0), [3, 2, 4])
    np.testing.assert_allclose(fix_offset(centred, (1.0, 5.0), prior_mean=4.2), [4, 3, 5])


def test_single_rater_reconstruction_sees_through_a_folded_ridge():
    block = RatingBlock(np.zeros(3, int), np.array([0, 1, 4]), np.array([2.0, 5.0, 3.0]), 1, 5)
    u = np.array([[0.3, -1.2, 0.7]])
    gram, cross = item_statistics(u, block, offset=3.0, gamma_cols=np.full(5, 0.4))
    items, vals = fedmgs_single_rater(gram, cross)
    np.testing.assert_array_equal(items, [0, 1, 4])
    np.testing.assert_allclose(np.abs(vals), np.abs(block.vals - 3.0), atol=1e-10)


def test_items_with_two_raters_are_not_taken_as_single():
    block = RatingBlock(np.array([0, 1]), np.array([1, 1]), np.array([4.0, 2.0]), 2, 3)
    u = np.array([[1.0, 0.0], [0.0, 1.0]])
    items, _ = fedmgs_single_rater(*item_statistics(u, block))
    assert items.size == 0


def test_ridge_recovers_a_linear_map():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 3.0
    w = ridge_fit(x, y, lam=1e-10)
    np.testing.assert_allclose(ridge_predict(w, x), y, atol=1e-6)


def test_resolve_sign_picks_the_reflection_the_histogram_prefers():
    ratings = np.array([4.0, 5.0, 4.0, 3.0, 1.0, 4.0])
    centred = ratings - ratings.mean()
    hist = np.array([5, 10, 30, 40, 15])                    # counts of 1..5, skewed high
    for s in (1.0, -1.0):
        np.testing.assert_allclose(resolve_sign(s * centred, (1.0, 5.0), hist, 3.5), ratings)


def test_clopper_pearson_ends_have_closed_forms():
    # k = 0: upper end solves (1 - p)^n = alpha/2; k = n: lower end solves p^n = alpha/2
    lo, hi = clopper_pearson(0, 20, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 20))
    lo, hi = clopper_pearson(20, 20, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 20))
    lo, hi = clopper_pearson(np.array([3]), 10, 0.1)
    assert lo[0] == pytest.approx(beta.ppf(0.05, 3, 8))
    assert hi[0] == pytest.approx(beta.ppf(0.95, 4, 7))
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(11, 10)


def test_epsilon_lower_bound_of_a_perfect_attack_is_set_by_the_run_count():
    delta = 1e-5
    got = epsilon_lower_bound(np.arange(10.0, 20.0), np.arange(10.0), delta)
    h = 1 - 0.025 ** (1 / 10)                    # CP upper bound of 0 errors in 10 runs
    assert got["epsilon_lower_bound"] == pytest.approx(np.log((1 - delta - h) / h))
    assert got["threshold"] == 10.0 and got["fpr"] == 0.0 and got["fnr"] == 0.0
    assert got["max_measurable"] == pytest.approx(got["epsilon_lower_bound"])
    assert max_measurable_epsilon(200, 200, delta) == pytest.approx(
        np.log((1 - delta - (1 - 0.025 ** (1 / 200))) / (1 - 0.025 ** (1 / 200))))


def test_epsilon_lower_bound_takes_the_best_threshold_and_both_forms():
    delta, alpha = 1e-3, 0.05
    pos = np.array([5.0, 6.0, 7.0, 8.0, 2.0, 9.0, 10.0, 11.0])   # 8 runs with the canary
    neg = np.array([0.0, 1.0, 3.0, 4.0, 4.5, 1.5])               # 6 runs without

    def by_hand(t):
        fp, fn = int(np.sum(neg >= t)), int(np.sum(pos < t))
        fpr = 1.0 if fp == 6 else beta.ppf(1 - alpha / 2, fp + 1, 6 - fp)
        fnr = 1.0 if fn == 8 else beta.ppf(1 - alpha / 2, fn + 1, 8 - fn)
        forms = [np.log(max(1 - delta - fnr, 1e-300) / fpr) if 1 - delta > fnr else 0.0,
                 np.log(max(1 - delta - fpr, 1e-300) / fnr) if 1 - delta > fpr else 0.0]
        return max(forms + [0.0])

    got = epsilon_lower_bound(pos, neg, delta, alpha)
    want = max(by_hand(t) for t in np.concatenate([pos, neg]))
    assert got["epsilon_lower_bound"] == pytest.approx(want)
    assert got["threshold"] == 5.0                # only the run at 2.0 is missed
    assert got["fnr"] == pytest.approx(1 / 8) and got["fpr"] == 0.0
    # chance: identical score distributions give no evidence at all
    same = epsilon_lower_bound(np.zeros(50), np.zeros(50), delta)
    assert same["epsilon_lower_bound"] == 0.0
    with pytest.raises(ValueError, match="at least one run"):
        epsilon_lower_bound(np.array([]), neg, delta)
