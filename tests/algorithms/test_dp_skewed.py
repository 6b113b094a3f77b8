"""The user-level DP algorithms on sparse, skewed rating data (issue 17): an Amazon-like
set (most users rate once or twice, half the items are rated once, 70% of ratings are 5s)
where their defaults were worse than predicting the global mean."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms import RatingBlock, registry
from algorithms import _user_kernels as UK
from algorithms import dpals as D
from algorithms.data import build_federation
from algorithms.scale import with_public_scale
from algorithms.simulate import simulate
from algorithms.synthetic import describe, generate_skewed_ratings
from privacy.user_level import UserLevelPrivatizer, plan

DP = ["dpals", "dp-fedmavg", "dp-fedmc-admm"]
#: main's defaults before issue 17's fix: the scale's middle as the centre, the user bias
#: under the factor's ridge, a factor for every user (and the gradient methods' noise_reg 1)
BEFORE = {"release_centre": False, "lam_bias": None, "factor_min_ratings": 1}


@pytest.fixture(scope="module")
def skewed():
    r = generate_skewed_ratings(6000, 2400, 12_000, seed=1)
    shape = describe(r)
    assert shape["users_1_or_2"] > 0.9 and shape["items_rated_once"] > 0.4
    assert shape["fives"] == pytest.approx(0.7, abs=0.01)
    fed = build_federation(r, 20, 0)
    mean = np.concatenate([b.vals for b in fed.train]).mean()
    test = np.concatenate([b.vals for b in fed.test])
    return fed, float(np.sqrt(np.mean((test - mean) ** 2)))


def _run(name, fed, **overrides):
    """Test RMSE at the default epsilon (8, delta 1e-6, user unit, central placement), as
    ``fedrec simulate --privacy user`` runs it."""
    alg = registry.get(name)
    cfg = with_public_scale(alg.config(**overrides), overrides, fed.scale)
    releases = registry.user_releases(cfg, 0)
    bounds = registry.user_bounds(name, cfg)
    spec = plan({"epsilon": 8.0, "delta": 1e-6}, bounds, sum(b.n_users for b in fed.train),
                releases)
    priv = UserLevelPrivatizer(spec, bounds, fed.n_clients, 0)
    res = simulate(alg, cfg, fed, rounds=releases + 1, per_round=fed.n_clients, seed=0,
                   privatizer=priv, aggregator=priv.aggregate, evaluate_every=releases + 1)
    return res.final.test_rmse


@pytest.mark.parametrize("name", DP)
def test_dp_defaults_beat_the_global_mean_on_sparse_skewed_data(skewed, name):
    """At the default epsilon every DP algorithm beats the global mean (the noise is
    fresh on every run: dp-fedmc-admm, the closest, measured 0.964 to 0.986 of it over
    five noise draws); before the fix they were 1.25x, 1.23x, 1.26x of it."""
    fed, mean_rmse = skewed
    assert _run(name, fed) < mean_rmse
    before = {**BEFORE, **({} if name == "dpals" else {"noise_reg": 1.0})}
    assert _run(name, fed, **before) > 1.1 * mean_rmse


def _light_block():
    """Users with 1, 2, 3 and 5 ratings."""
    counts = [1, 2, 3, 5]
    rows = np.repeat(np.arange(4), counts)
    cols = np.concatenate([np.arange(c) + u for u, c in enumerate(counts)])
    vals = np.array([5.0, 4, 2, 1, 3, 5, 2, 4, 4, 5, 1])
    return RatingBlock(rows, cols, vals, 4, 10)


@pytest.mark.parametrize("numba", [True, False])
def test_users_with_too_few_ratings_get_their_bias_alone(numba, monkeypatch):
    """Below ``factor_min_ratings`` a user's factor is 0 and its bias the exact ridge
    mean of its offsets, ``sum(r - mu - c beta) / (n + lam_bias)``; others are untouched."""
    if numba and not UK.HAVE_NUMBA:
        pytest.skip("numba not installed")
    monkeypatch.setattr(UK, "HAVE_NUMBA", numba)
    block = _light_block()
    v = np.random.default_rng(0).normal(size=(3, 10))
    cfg = D.DPALSConfig(rank=2, factor_min_ratings=3, lam_bias=3.0, lam_u=0.5)
    u = D.solve_users(v, block, cfg)
    for user, n in ((0, 1), (1, 2)):
        sel = block.rows == user
        offsets = block.vals[sel] - cfg.mu - cfg.bias_coordinate * v[2, block.cols[sel]]
        np.testing.assert_array_equal(u[user, :2], 0.0)
        assert u[user, 2] == pytest.approx(offsets.sum() / (n + 3.0), rel=1e-12)
    full = D.solve_users(v, block, cfg.model_copy(update={"factor_min_ratings": 1}))
    np.testing.assert_allclose(u[2:], full[2:], rtol=1e-12)
    assert np.all(full[:2, :2] != 0)
