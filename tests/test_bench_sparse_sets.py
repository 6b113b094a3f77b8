"""bench/sparse_sets.py: its sets come from algorithms.synthetic, and the Amazon-like one is
written the way Amazon review dumps come (string ids, a timestamp, no header)."""

from __future__ import annotations

import numpy as np

from algorithms.data import load_ratings
from algorithms.synthetic import generate_skewed_ratings, generate_sparse_ratings
from bench import sparse_sets as S


def test_amazon_csv_has_string_ids_and_a_timestamp_and_fedrec_reads_it(tmp_path):
    r = generate_skewed_ratings(900, 400, 1800, seed=3)
    path = tmp_path / "amazon.csv"
    S.write_csv(r, str(path), string_ids=S.SETS["amazon"][1])
    first = path.read_text().split("\n", 1)[0].split(",")
    assert first[0].startswith("A") and first[1].startswith("B00") and len(first) == 4
    back = load_ratings(path)
    assert len(back) == 1800 and np.unique(back.users).size == 900
    assert sorted(back.values.tolist()) == sorted(r.values.tolist())


def test_the_named_sets_are_the_synthetic_generators():
    assert S.SETS["amazon"][0] is generate_skewed_ratings
    assert S.SETS["big"][0] is generate_sparse_ratings
