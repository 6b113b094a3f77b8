"""Attack primitives of the audit on hand-made examples."""

import itertools

import numpy as np
import pytest

from algorithms.block import RatingBlock
from algorithms.fedmgs import item_statistics
from privacy.audit import (
    auc,
    fedmgs_single_rater,
    fix_offset,
    item_features,
    item_membership_scores,
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
