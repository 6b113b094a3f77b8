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


def test_tenant_ratings_latent_model_predicts_the_drawn_pairs_and_stars():
    """LatentModel (kept by generate_tenant_ratings) gives P(rated) and P(star >= 4 | rated)
    of every pair: summed over all pairs they match the counts drawn, and the pairs it
    rates likely are drawn far more often than the rest (calibration by deciles)."""
    from algorithms.synthetic import generate_tenant_ratings

    tr = generate_tenant_ratings(900, 400, 30_000, 3, rank=4, seed=2)
    model = tr.model
    n_rated = n_top = 0.0
    probs, hits = [], []
    for t, block in enumerate(tr.blocks):
        users, items = np.arange(block.n_users), np.arange(block.n_items)
        rated = model.observed(t, users, items, model.draws(t))
        top = rated * model.star_at_least(4, t, users, items)
        n_rated += rated.sum()
        n_top += top.sum()
        dense = np.zeros(top.shape, bool)
        keep = block.vals >= 4
        dense[block.rows[keep], block.cols[keep]] = True
        probs.append(top.ravel())
        hits.append(dense.ravel())
        pairs = model.observed(t, block.rows, block.cols, model.draws(t), pairs=True)
        np.testing.assert_allclose(pairs, rated[block.rows, block.cols])
    assert abs(n_rated - tr.n_ratings) < 0.01 * tr.n_ratings  # draws() solves for this
    ones = sum(int((b.vals >= 4).sum()) for b in tr.blocks)
    assert abs(n_top - ones) < 0.05 * ones, (n_top, ones)
    p, a = np.concatenate(probs), np.concatenate(hits)
    for lo, hi in [(0.0, 0.05), (0.2, 0.4), (0.6, 1.0)]:
        sel = (p >= lo) & (p < hi)
        assert sel.sum() > 500
        assert abs(a[sel].mean() - p[sel].mean()) < 0.05, (lo, a[sel].mean(), p[sel].mean())


def test_star_at_least_runs_from_certain_to_the_top_star():
    """P(star >= 1) is 1, the probabilities fall with the star, and a star outside the
    scale is refused (star 1 once read the top cut and gave P(star = 5))."""
    from algorithms.synthetic import generate_tenant_ratings

    model = generate_tenant_ratings(60, 40, 600, 2, rank=3, seed=1).model
    users, items = np.arange(5), np.arange(7)
    probs = [model.star_at_least(s, 0, users, items) for s in range(1, 6)]
    np.testing.assert_array_equal(probs[0], np.ones((5, 7)))
    assert all(np.all(a >= b) for a, b in zip(probs, probs[1:], strict=False))
    assert np.all(probs[4] < 1.0)
    assert model.star_at_least(1, 0, users, users, pairs=True).shape == (5,)
    for bad in (0, 6):
        with pytest.raises(ValueError, match="star must be from 1 to 5"):
            model.star_at_least(bad, 0, users, items)
