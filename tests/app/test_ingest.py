"""Parsing and validation of uploads, without HTTP or a database."""

from __future__ import annotations

import datetime as dt
import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.ingest import (
    RawRows,
    RowError,
    UploadRejected,
    _validate_rows,
    check_rows,
    collect,
    parse_body,
    parse_csv,
    parse_json,
    validate,
)

SCALE = (1.0, 5.0)


def errors_of(call) -> list[RowError]:
    with pytest.raises(UploadRejected) as info:
        call()
    return info.value.errors


def test_csv_with_header_and_optional_timestamp():
    batch = validate(parse_csv(b"user,item,rating,timestamp\nu1,10,4.5,0\nu2,11,1\n"), SCALE)
    assert (batch.users, batch.items, batch.values) == (["u1", "u2"], ["10", "11"], [4.5, 1.0])
    assert batch.timestamps == [dt.datetime(1970, 1, 1, tzinfo=dt.UTC), None]
    assert batch.lines == [2, 3]


def test_csv_without_header_numbers_lines_from_one():
    batch = validate(parse_csv(b"u1,10,4\r\nu1,11,5\r\n"), SCALE)
    assert batch.lines == [1, 2] and batch.values == [4.0, 5.0]


def test_first_line_that_is_not_the_header_is_validated_as_data():
    assert errors_of(lambda: validate(parse_csv(b"usr,itm,score\nu,1,3\n"), SCALE)) == [
        RowError(1, "rating", "rating 'score' is not a number")]


def test_headers_naming_their_rating_column_and_semicolon_bodies():
    """MovieLens' own CSV header and Book-Crossing's quoted, semicolon-separated export are
    read as they come (both were rejected: the header as data, ';' as one field)."""
    batch = validate(parse_csv(b"userId,movieId,rating,timestamp\n1,2,4.0,0\n1,3,3.5,0\n"),
                     SCALE)
    assert (batch.users, batch.items, batch.values, batch.lines) == (
        ["1", "1"], ["2", "3"], [4.0, 3.5], [2, 3])
    body = b'"User-ID";"ISBN";"Book-Rating"\n"276725";"034545104X";"5"\n"2";"0155";"7"\n'
    batch = validate(parse_csv(body), (0.0, 10.0))
    assert (batch.users, batch.items, batch.values) == (["276725", "2"], ["034545104X",
                                                                          "0155"], [5.0, 7.0])
    assert validate(parse_csv(b"u;1;4\nv;2;5\n"), SCALE).values == [4.0, 5.0]


def test_every_offending_row_is_reported_with_line_field_and_reason():
    body = b"u1,1,9\nu2,2,nan\n,3,4\nu4,4,inf\nu5,5,3,yesterday\nu6,6\n"
    assert errors_of(lambda: parse_csv(body)) == [
        RowError(6, "row", "expected 3 or 4 fields, got 2 (user, item, rating[, timestamp], "
                           "','-separated as the first line)")]
    assert errors_of(lambda: validate(parse_csv(body[:-6]), SCALE)) == [
        RowError(1, "rating", "rating 9 is outside the tenant's scale [1, 5]"),
        RowError(2, "rating", "rating must be a finite number (NaN and infinity are rejected)"),
        RowError(3, "user", "user must not be empty"),
        RowError(4, "rating", "rating must be a finite number (NaN and infinity are rejected)"),
        RowError(5, "timestamp", "timestamp 'yesterday' is not Unix seconds or ISO 8601"),
    ]


def test_duplicates_with_the_same_value_are_kept_once_conflicts_are_errors():
    batch = validate(parse_csv(b"u,1,4\nu,1,4,100\nv,1,2\n"), SCALE)
    assert batch.users == ["u", "v"] and batch.values == [4.0, 2.0]
    assert batch.timestamps[0] == dt.datetime.fromtimestamp(100, dt.UTC)
    assert errors_of(lambda: validate(parse_csv(b"u,1,4\nv,1,2\nu,1,3\n"), SCALE)) == [
        RowError(3, "rating", "conflicts with line 1 for the same user and item (4 vs 3)")]


def test_json_rows_accept_numbers_as_keys_and_iso_timestamps():
    body = json.dumps({"ratings": [
        {"user": 7, "item": "a", "rating": 2, "timestamp": "2020-01-02T03:04:05+01:00"}]})
    batch = validate(parse_json(body.encode()), SCALE)
    assert batch.users == ["7"] and batch.values == [2.0]
    assert batch.timestamps == [dt.datetime(2020, 1, 2, 2, 4, 5, tzinfo=dt.UTC)]


def test_json_errors_use_one_based_positions():
    body = b'{"ratings": [{"user": "u", "item": "i", "rating": NaN},' \
           b' {"user": true, "item": "i", "rating": "x"}, {"user": "u", "item": "j"}]}'
    assert errors_of(lambda: validate(parse_json(body), SCALE)) == [
        RowError(1, "rating", "rating must be a finite number (NaN and infinity are rejected)"),
        RowError(2, "user", "user must be a string or an integer"),
        RowError(2, "rating", "rating 'x' is not a number"),
        RowError(3, "rating", "rating is missing"),
    ]


@pytest.mark.parametrize(("body", "message"), [
    (b"[1, 2]", 'JSON body must be an object {"ratings": [...]}'),
    (b'{"ratings": {}}', 'JSON body must be an object {"ratings": [...]}'),
])
def test_json_of_the_wrong_shape(body, message):
    with pytest.raises(UploadRejected, match=f"^{re.escape(message)}$"):
        parse_json(body)


def test_unknown_json_fields_and_invalid_utf8_are_rejected():
    assert errors_of(lambda: parse_json(b'{"ratings": [{"user": 1, "score": 2}]}')) == [
        RowError(1, "row", "unknown field(s): score")]
    with pytest.raises(UploadRejected,
                       match=r"^CSV body is not valid UTF-8 \(byte 2\); it looks like Latin-1"):
        parse_csv(b"u,\xff,1\n")


def test_unknown_items_are_reported_per_row():
    collected = collect(io.BytesIO(b"u,1,4\nu,2,4\nv,2,4\n"), "text/csv", SCALE)
    assert collected.with_unknown_items({"1"}) == ([
        RowError(2, "item", "item '2' is not in the catalogue"),
        RowError(3, "item", "item '2' is not in the catalogue")], 2)


def test_media_type_selects_the_parser():
    assert parse_body(b"u,1,3\n", "text/csv; charset=utf-8").users == ["u"]
    assert parse_body(b'{"ratings": []}', "application/json").users == []
    with pytest.raises(Exception, match="unsupported Content-Type 'text/plain'"):
        parse_body(b"", "text/plain")


keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")),
               min_size=1, max_size=5).filter(lambda s: s.strip() and s.isprintable())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(keys, keys, st.sampled_from(["1", "2.5", "5", 3, 4.0])), max_size=12))
def test_fast_path_agrees_with_the_row_by_row_path(rows):
    raw = RawRows(list(range(1, len(rows) + 1)), [r[0] for r in rows], [r[1] for r in rows],
                  [r[2] for r in rows], [None] * len(rows))
    fast, fast_errors = check_rows(raw, SCALE)
    slow, slow_errors = _validate_rows(raw, SCALE)
    assert (fast, fast_errors) == (slow, slow_errors)
