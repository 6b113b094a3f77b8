import numpy as np
import pytest

from algorithms.recommend import fold_in, popularity_scores, top_k


def _reference(scores, k, exclude=(), offset=0):
    ranked = sorted((i for i in range(len(scores)) if i not in set(exclude)),
                    key=lambda i: (-scores[i], i))
    return ranked[offset:offset + k]


@pytest.mark.parametrize("seed", range(5))
def test_top_k_matches_a_full_sort(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, 50).astype(float)  # many ties
    exclude = rng.choice(50, 7, replace=False)
    for k, offset in [(10, 0), (10, 10), (3, 45), (60, 0)]:
        items, vals = top_k(scores, k, exclude, offset)
        assert items.tolist() == _reference(scores, k, exclude.tolist(), offset)
        np.testing.assert_array_equal(vals, scores[items])


def test_top_k_edge_cases():
    assert top_k(np.array([1.0, 2.0]), 0)[0].size == 0
    assert top_k(np.array([1.0, 2.0]), 5, np.array([0, 1]))[0].size == 0
    with pytest.raises(ValueError, match="non-negative"):
        top_k(np.zeros(3), -1)


def test_popularity_damps_rare_items():
    counts = np.array([1.0, 500.0, 1000.0, 0.0])
    sums = np.array([5.0, 2300.0, 3000.0, 0.0])  # one 5-star vs 500 at 4.6; mean ~3.53
    s = popularity_scores(counts, sums)
    mean = 5305.0 / 1501.0
    assert s[0] == pytest.approx((5 + 10 * mean) / 11)
    assert s[1] > s[0] and s[3] == pytest.approx(mean)


def test_fold_in_recovers_a_users_factor_from_its_ratings():
    """Ratings that are exactly a @ B_S give back a (up to the ridge), and the ridge
    solution is the one of the normal equations."""
    rng = np.random.default_rng(0)
    b = rng.normal(size=(4, 30))
    a = rng.normal(size=4)
    np.testing.assert_allclose(fold_in(b, a @ b, lam=1e-9), a, atol=1e-8)
    got = fold_in(b[:, :3], (a @ b)[:3], lam=2.0)  # fewer ratings than factors: solvable
    want = np.linalg.solve(b[:, :3] @ b[:, :3].T + 2.0 * np.eye(4), b[:, :3] @ (a @ b)[:3])
    np.testing.assert_allclose(got, want)
