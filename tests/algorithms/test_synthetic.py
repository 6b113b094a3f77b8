import numpy as np
import pytest

from algorithms.synthetic import MOVIELENS_HISTOGRAM, generate_ratings


def test_synthetic_ratings_shape_histogram_and_uniqueness():
    r = generate_ratings(300, 200, 9000, rank=4, seed=3)
    assert len(r) == 9000
    keys = r.users * 200 + r.items
    assert np.unique(keys).size == 9000  # distinct pairs
    assert r.users.max() < 300 and r.items.max() < 200
    counts = np.bincount(r.values.astype(int), minlength=6)[1:] / 9000
    np.testing.assert_allclose(counts, MOVIELENS_HISTOGRAM / MOVIELENS_HISTOGRAM.sum(),
                               atol=0.01)
    assert np.bincount(r.users, minlength=300).min() >= 5


def test_synthetic_popularity_is_skewed_and_seeded():
    r = generate_ratings(500, 400, 20000, seed=1)
    pop = np.sort(np.bincount(r.items, minlength=400))[::-1]
    assert pop[:40].sum() > 0.3 * pop.sum()  # top 10% of items hold > 30% of ratings
    again = generate_ratings(500, 400, 20000, seed=1)
    np.testing.assert_array_equal(r.values, again.values)
    assert not np.array_equal(r.values, generate_ratings(500, 400, 20000, seed=2).values)


def test_synthetic_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="exceeds"):
        generate_ratings(3, 3, 10)
