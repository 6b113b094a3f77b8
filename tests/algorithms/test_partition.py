"""Non-IID partitions: every user in exactly one tenant, none empty, seeded, skew present."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.data import Ratings, build_federation
from algorithms.partition import assign_users, gini, parse_partition, skew
from algorithms.synthetic import generate_ratings

SCHEMES = ["random", "by-activity", "by-item-cluster", "dirichlet:0.1", "dirichlet:100",
           "sizes:0.3"]


@pytest.fixture(scope="module")
def ratings():
    """400 users with 5 tastes: user u rates 24 items of block u % 5 (of 5 blocks of 60
    items) and 6 others, its activity varying with u."""
    rng = np.random.default_rng(5)
    users, items = [], []
    for u in range(400):
        own = rng.choice(60, size=24 + 2 * (u % 17), replace=False) + 60 * (u % 5)
        other = rng.choice(np.setdiff1d(np.arange(300), own), size=6, replace=False)
        users += [u] * (own.size + 6)
        items += own.tolist() + other.tolist()
    vals = rng.integers(1, 6, size=len(users)).astype(float)
    return Ratings(np.array(users) + 1000, np.array(items) + 7, vals)


def _test_set(fed):
    return sorted((int(fed.user_ids[t][r]), int(fed.item_ids[c]), float(v))
                  for t, b in enumerate(fed.test)
                  for r, c, v in zip(b.rows, b.cols, b.vals, strict=True))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_user_in_exactly_one_tenant(ratings, scheme):
    fed = build_federation(ratings, 20, seed=1, partition=scheme)
    ids = np.concatenate(fed.user_ids)
    assert sorted(ids.tolist()) == sorted(set(ratings.users.tolist()))  # once each
    assert all(b.n_users > 0 for b in fed.train)
    assert sum(b.nnz for b in fed.train) + sum(b.nnz for b in fed.test) == len(ratings)
    again = build_federation(ratings, 20, seed=1, partition=scheme)
    assert all(np.array_equal(a, b) for a, b in zip(fed.user_ids, again.user_ids, strict=True))


def test_the_test_ratings_do_not_depend_on_the_partition(ratings):
    base = _test_set(build_federation(ratings, 20, seed=1))
    for scheme in SCHEMES[1:]:
        assert _test_set(build_federation(ratings, 20, seed=1, partition=scheme)) == base


def test_random_partition_is_the_default_one(ratings):
    a = build_federation(ratings, 20, seed=1)
    b = build_federation(ratings, 20, seed=1, partition="random")
    assert all(np.array_equal(x, y) for x, y in zip(a.user_ids, b.user_ids, strict=True))


def test_skew_is_measurably_present(ratings):
    def stats(scheme):
        return skew(build_federation(ratings, 20, seed=1, partition=scheme).train)
    rnd, dir01, dir100 = stats("random"), stats("dirichlet:0.1"), stats("dirichlet:100")
    cluster, sizes = stats("by-item-cluster"), stats("sizes:0.3")
    assert rnd["size_gini"] < 0.01 and cluster["size_gini"] < 0.01
    # what tenants rate: item-cluster label distributions far from the federation's
    assert dir01["label_tv"] > 2 * rnd["label_tv"], (dir01, rnd)
    assert cluster["label_tv"] > 2 * rnd["label_tv"], (cluster, rnd)
    assert dir100["label_tv"] < dir01["label_tv"]
    # tenant sizes
    assert sizes["size_gini"] > 0.3 and dir01["size_gini"] > 0.3
    # activity: the last tenant's users rate more than the first's
    fed = build_federation(ratings, 20, seed=1, partition="by-activity")
    per_user = [(b.nnz + t.nnz) / b.n_users for b, t in zip(fed.train, fed.test, strict=True)]
    assert per_user == sorted(per_user) and per_user[-1] > 1.8 * per_user[0]


def test_gini_against_a_hand_computation():
    assert gini([1, 1, 1, 1]) == 0.0
    # mean absolute difference over all pairs / (2 mean): values 0, 0, 0, 4 -> 0.75
    assert gini([0, 0, 0, 4]) == pytest.approx(0.75)


@pytest.mark.parametrize("text", ["dirichlet", "dirichlet:0", "dirichlet:x", "clusters",
                                  "sizes:-1", "random:2"])
def test_bad_partitions_are_refused_by_name(text):
    with pytest.raises(ValueError, match="partition"):
        parse_partition(text)


def test_more_tenants_than_labels_leaves_none_empty():
    r = generate_ratings(60, 40, 900, rank=2, seed=2)
    users = np.unique(r.users, return_inverse=True)[1]
    items = np.unique(r.items, return_inverse=True)[1]
    t = assign_users(users, items, 60, int(items.max()) + 1, 50, "dirichlet:0.05",
                     np.random.default_rng(0))
    assert np.bincount(t, minlength=50).min() >= 1 and t.shape == (60,)
