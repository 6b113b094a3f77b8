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


def _held_out_hits(r, n_items: int) -> tuple[float, float]:
    """Hit rate@10 on one held-out item per user with 3+ ratings: (item-item EASE on the
    rest, lambda 100; the popularity list of the rest)."""
    rng = np.random.default_rng(0)
    n_users = int(r.users.max()) + 1
    many = np.flatnonzero(np.bincount(r.users, minlength=n_users) >= 3)
    first = {}
    for i in rng.permutation(r.users.size):
        first.setdefault(int(r.users[i]), int(i))
    held = np.array([first[int(u)] for u in many])
    keep = np.ones(r.users.size, dtype=bool)
    keep[held] = False
    x = np.zeros((n_users, n_items))
    x[r.users[keep], r.items[keep]] = 1.0
    p = np.linalg.inv(x.T @ x + 100.0 * np.eye(n_items))
    b = -p / np.diag(p)
    np.fill_diagonal(b, 0.0)
    out = []
    for scores in (x[many] @ b, np.tile(x.sum(axis=0), (many.size, 1))):
        scores[x[many] > 0] = -np.inf
        top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        out.append(float((top == r.items[held][:, None]).any(axis=1).mean()))
    return out[0], out[1]


def test_taste_zero_is_todays_set_and_taste_makes_choices_follow_the_user():
    """``taste = 0`` draws the set bit for bit as without it (the ranking bench's control,
    where a user's items come from popularity alone); ``taste > 0`` keeps the shape
    (ratings, distinct pairs, star histogram, mostly one- or two-item users) but a user's
    items follow the user's factors: an item-item model (EASE) predicts a held-out item
    far better than the popularity list, while on the control it does not."""
    assert digest(generate_skewed_ratings(taste=0.0)) == "df3e2fe9ce516e0e"
    assert digest(generate_skewed_ratings(900, 400, 1800, seed=3, taste=0.0)) == digest(
        generate_skewed_ratings(900, 400, 1800, seed=3))
    control = generate_skewed_ratings(3000, 300, 15_000, seed=2)
    tasty = generate_skewed_ratings(3000, 300, 15_000, seed=2, taste=2.0)
    d = describe(tasty)
    assert (d["users"], d["ratings"]) == (3000, 15_000)
    assert np.unique(tasty.users * 300 + tasty.items).size == 15_000
    assert d["fives"] == pytest.approx(0.70, abs=0.01)
    assert d["users_1_or_2"] > 0.6
    assert digest(tasty) != digest(control)
    model, popular = _held_out_hits(control, 300)
    assert model < popular  # by construction: popularity is the best list
    model, popular = _held_out_hits(tasty, 300)
    assert model > 1.3 * popular
