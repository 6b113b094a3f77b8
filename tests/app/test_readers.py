"""The streaming readers (algorithms/readers.py) read the same rows whatever the chunk size: a
line ending, a multi-byte character, a JSON number or string cut by a chunk boundary is
reassembled, and errors name the same line or byte."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import ratings_io, readers
from algorithms.ingest import RowError, UploadRejected


def rows_of(body: bytes, media: str, chunk: int, monkeypatch) -> list:
    monkeypatch.setattr(ratings_io, "CHUNK_BYTES", chunk)
    try:
        return list(readers.read_rows(io.BytesIO(body), media))
    except UploadRejected as exc:
        return [("rejected", str(exc), exc.errors)]


values = st.one_of(st.integers(-10 ** 6, 10 ** 20), st.floats(allow_nan=False),
                   st.text(max_size=6), st.none())
json_row = st.fixed_dictionaries({"user": values, "item": values, "rating": values},
                                 optional={"timestamp": values, "x": values})
csv_field = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(json_row, max_size=8), chunk=st.integers(1, 9),
       pad=st.sampled_from(["", " ", "\n  "]), extra=st.booleans())
def test_json_rows_do_not_depend_on_the_chunk_size(rows, chunk, pad, extra):
    doc = {"meta": {"a": [1, 2.5, "é"]}, "ratings": rows} if extra else {"ratings": rows}
    body = json.dumps(doc, ensure_ascii=False, indent=1 if pad else None).encode()
    with pytest.MonkeyPatch.context() as mp:
        small = rows_of(body, "application/json", chunk, mp)
        whole = rows_of(body, "application/json", 1 << 20, mp)
    assert small == whole
    plain = [r for r in rows if set(r) <= {"user", "item", "rating", "timestamp"}]
    assert [r for r in whole if not isinstance(r, RowError)] == [
        (i, r["user"], r["item"], r["rating"], r.get("timestamp"))
        for i, r in enumerate(rows, start=1) if r in plain]


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.lists(csv_field, min_size=2, max_size=5), max_size=8),
       chunk=st.integers(1, 9), ending=st.sampled_from(["\n", "\r\n", "\r"]))
def test_csv_rows_do_not_depend_on_the_chunk_size(rows, chunk, ending):
    out = io.StringIO()
    csv.writer(out, lineterminator=ending).writerows(rows)
    body = out.getvalue().encode()
    with pytest.MonkeyPatch.context() as mp:
        assert rows_of(body, "text/csv", chunk, mp) == rows_of(body, "text/csv", 1 << 20, mp)


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 20])
def test_invalid_utf8_names_its_byte_whatever_the_chunk(chunk, monkeypatch):
    body = "u,é,1\nv,ü,2\n".encode() + b"w,\xff,3\n"
    assert rows_of(body, "text/csv", chunk, monkeypatch) == [
        ("rejected", "CSV body is not valid UTF-8 (byte 16); it looks like Latin-1 or "
                     "Windows-1252 text, perhaps: save it as UTF-8", [])]


@pytest.mark.parametrize("body, message", [
    (b'{"ratings": [], "ratings": []}', 'JSON body has "ratings" twice'),
    (b'{"other": 1}', 'JSON body must be an object {"ratings": [...]}'),
    (b'"ratings"', 'JSON body must be an object {"ratings": [...]}'),
    (b'{"ratings": []} x', "body is not valid JSON: Extra data (char 16)"),
    (b'{"ratings": [1 2]}', "body is not valid JSON: Expecting ',' (char 15)"),
    (b'{"ratings": [{"user": "u"', "body is not valid JSON: Expecting ',' delimiter "
                                  "(char 13)"),
    (b"", "body is not valid JSON: Expecting value (char 0)"),
])
def test_malformed_json_is_rejected_with_a_position(body, message, monkeypatch):
    got = rows_of(body, "application/json", 4, monkeypatch)
    assert got[-1][:2] == ("rejected", message)


@pytest.mark.parametrize("chunk", range(1, 12))
def test_a_number_cut_after_its_dot_or_exponent_is_reassembled(chunk, monkeypatch):
    body = b'{"ratings": [1.5e3, -Infinity, {"user": 1, "item": 2, "rating": 4.25e0}]}'
    assert rows_of(body, "application/json", chunk, monkeypatch) == [
        RowError(1, "row", "must be an object"), RowError(2, "row", "must be an object"),
        (3, 1, 2, 4.25, None)]
