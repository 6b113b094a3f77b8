"""algorithms.synthetic's Amazon-like and large sparse generators: their shapes, and the
same sets for the same seed as when they lived in the lab (bench/), so the figures measured
on them still describe them."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from algorithms.synthetic import describe, generate_skewed_ratings, generate_sparse_ratings


def digest(r) -> str:
    h = hashlib.sha256()
    for column in (r.users, r.items, r.values):
        h.update(np.ascontiguousarray(column).tobytes())
    return h.hexdigest()[:16]


def test_skewed_set_is_amazon_like():
    r = generate_skewed_ratings(900, 400, 1800, seed=3)
    d = describe(r)
    assert (d["users"], d["ratings"]) == (900, 1800)
    assert np.unique(r.users * 400 + r.items).size == 1800  # no pair twice
    assert d["users_1_or_2"] > 0.75  # most users rate once or twice
    assert d["fives"] == pytest.approx(0.70, abs=0.01) and set(d["histogram"]) == set("12345")


def test_sparse_set_covers_every_user_and_item_within_the_cap():
    r = generate_sparse_ratings(2000, 300, 10_000, seed=1)
    d = describe(r)
    assert (d["users"], d["items"], d["ratings"]) == (2000, 300, 10_000)
    assert np.unique(r.users * 300 + r.items).size == 10_000
    assert d["max_per_user"] <= 30  # at most a tenth of the catalogue each
    with pytest.raises(ValueError, match="at least max"):
        generate_sparse_ratings(100, 50, 60)


@pytest.mark.parametrize(("draw", "expected"), [
    # digests of bench.skewed_ratings / bench.sparse_sets' sets before the move
    (lambda: generate_skewed_ratings(), "df3e2fe9ce516e0e"),
    (lambda: generate_skewed_ratings(6000, 2400, 12_000, seed=1), "cb4a17802facc479"),
    (lambda: generate_sparse_ratings(2000, 300, 10_000, seed=1), "0cccde764ba0708f"),
])
def test_the_same_seed_draws_the_same_set_as_before_the_move(draw, expected):
    assert digest(draw()) == expected
    assert digest(draw()) == expected  # and again: nothing but the seed decides it


def test_another_seed_draws_another_set():
    assert digest(generate_skewed_ratings(900, 400, 1800, seed=3)) != digest(
        generate_skewed_ratings(900, 400, 1800, seed=4))
