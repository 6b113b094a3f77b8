"""bench/sparse_sets.py: the large sparse catalogues' generator (issue 17)."""

from __future__ import annotations

import numpy as np

from algorithms.data import load_ratings
from bench import sparse_sets as S


def test_amazon_shape_is_drawn_with_every_user_and_item_and_distinct_pairs(tmp_path):
    r = S.generate("amazon", seed=3, n_users=900, n_items=400, n_ratings=1800)
    d = S.describe(r)
    assert (d["users"], d["items"], d["ratings"]) == (900, 400, 1800)
    assert np.unique(r.users * 400 + r.items).size == 1800  # no pair twice
    assert d["users_with_1_or_2"] > 0.75  # most users rate once or twice
    assert abs(d["histogram"]["5"] - 0.70) < 0.01 and set(d["histogram"]) == set("12345")
    path = tmp_path / "amazon.csv"
    S.write_csv(r, str(path), string_ids=True)
    first = path.read_text().split("\n", 1)[0].split(",")
    assert first[0].startswith("A") and first[1].startswith("B00") and len(first) == 4
    back = load_ratings(path)  # string ids, a timestamp, no header: fedrec reads it
    assert len(back) == 1800 and np.unique(back.users).size == 900
    assert sorted(back.values.tolist()) == sorted(r.values.tolist())


def test_big_shape_at_a_small_size_and_the_same_set_for_a_seed():
    a = S.generate("big", seed=1, n_users=2000, n_items=300, n_ratings=10_000)
    b = S.generate("big", seed=1, n_users=2000, n_items=300, n_ratings=10_000)
    assert np.array_equal(a.users, b.users) and np.array_equal(a.values, b.values)
    d = S.describe(a)
    assert (d["users"], d["items"], d["ratings"]) == (2000, 300, 10_000)
    assert d["max_per_user"] <= 30  # at most a tenth of the catalogue each
