"""Rating files as users have them (issue 17: "rating data you have not seen"): other
separators, quoted and string ids, byte-order marks, decimal commas, duplicate pairs, and
clear errors naming the line of what cannot be read."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from algorithms.data import (
    Ratings,
    build_federation,
    check_rating_values,
    default_clients,
    load_ratings,
)


def _load(tmp_path, text: str | bytes, name: str = "r.csv") -> Ratings:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return load_ratings(path)


def test_book_crossing_style_semicolons_quotes_and_string_ids(tmp_path):
    r = _load(tmp_path, '"User-ID";"ISBN";"Book-Rating"\n"276725";"034545104X";"0"\n'
                        '"276726";"0155061224";"5"\n')
    np.testing.assert_array_equal(r.users, [276725, 276726])
    assert r.users.dtype == np.int64
    np.testing.assert_array_equal(r.items, ["034545104X", "0155061224"])
    np.testing.assert_array_equal(r.values, [0.0, 5.0])


def test_string_ids_bom_crlf_blank_lines_and_extra_columns(tmp_path):
    text = b"\xef\xbb\xbfA3SGX,B0001,4.5,1300000000\r\nA3SGX,B0002,3,1\r\n\r\nZ9,B0001,2,7\r\n"
    r = _load(tmp_path, text)
    np.testing.assert_array_equal(r.users, ["A3SGX", "A3SGX", "Z9"])
    np.testing.assert_array_equal(r.items, ["B0001", "B0002", "B0001"])
    np.testing.assert_array_equal(r.values, [4.5, 3.0, 2.0])
    fed = build_federation(r, 2, seed=0, test_fraction=0.0)
    assert sorted(fed.item_ids.tolist()) == ["B0001", "B0002"]
    assert sum(b.nnz for b in fed.train) == 3


@pytest.mark.parametrize("text", [
    "userId;movieId;rating\n1;2;3,5\n1;3;4\n",   # a European spreadsheet: decimal commas
    "1 2 3.5\n1   3 4\n",                          # whitespace separated
    "1\t2\t3.5\t99\n1\t3\t4\t98\n",                 # tab
    "1::2::3.5\n1::3::4\n",                         # ML-1M
])
def test_separators(tmp_path, text):
    r = _load(tmp_path, gzip.compress(text.encode()), "r.gz")
    np.testing.assert_array_equal(r.users, [1, 1])
    np.testing.assert_array_equal(r.items, [2, 3])
    np.testing.assert_array_equal(r.values, [3.5, 4.0])


def test_a_hash_is_part_of_an_id_not_a_comment(tmp_path):
    r = _load(tmp_path, "u#1,i#2,4\nu2,i3,5\n")
    np.testing.assert_array_equal(r.users, ["u#1", "u2"])


def test_a_pair_rated_twice_keeps_its_last_rating(tmp_path):
    """Dirty exports repeat pairs; two entries of one pair would be summed in a tenant's
    sparse block (a 2 and a 5 becoming a 7 on a 1-5 scale) or leak a test rating."""
    r = _load(tmp_path, "1,10,2\n2,10,3\n1,10,5\n1,11,1\n")
    assert r.duplicates == 1
    got = sorted(zip(r.users.tolist(), r.items.tolist(), r.values.tolist(), strict=True))
    assert got == [(1, 10, 5.0), (1, 11, 1.0), (2, 10, 3.0)]


@pytest.mark.parametrize("text, message", [
    ("userId,movieId,rating,timestamp\n1,2,4.0,9\n1,3,abc,9\n",
     "line 3: rating 'abc' is not a finite number"),
    ("1,2,4\n\n1,3,nan\n", "line 3: rating 'nan' is not a finite number"),
    ("1,2,4\n1,3,inf\n", "line 2: rating 'inf' is not a finite number"),
    ("1,2,4\n1,3\n", "line 2: expected 3 or more fields, got 2"),
    ("1,2\n1,3\n", "line 1: expected 3 or more fields, got 2"),
    ("", "no ratings"),
    ("user,item,rating\n", "no ratings"),
])
def test_unreadable_files_are_clear_errors_naming_the_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, text)


def test_default_clients_is_one_tenant_per_user_on_small_data():
    r = Ratings(np.repeat(np.arange(50), 3), np.tile(np.arange(3), 50), np.ones(150))
    assert default_clients(100, r) == 50
    assert default_clients(10, r) == 10


def test_constant_ratings_are_refused_naming_the_binary_algorithms():
    r = Ratings(np.arange(5), np.arange(5), np.ones(5))
    with pytest.raises(ValueError, match="all 5 ratings are 1.*felb"):
        check_rating_values(r)
    check_rating_values(Ratings(np.arange(2), np.arange(2), np.array([1.0, 2.0])))
