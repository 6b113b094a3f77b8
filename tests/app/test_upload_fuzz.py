"""Property-based tests of the upload parser (algorithms/ingest.py) and of upload atomicity.

Whatever the bytes, parsing raises only its domain errors (:class:`UploadRejected`,
:class:`TooManyRows`, :class:`UnsupportedMediaType`) and validation raises nothing; through
the API, an upload that is refused leaves the tenant's rows (and users, and idempotency
records) exactly as they were, and one offending row anywhere refuses the whole upload.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.ingest import (
    MAX_KEY_LENGTH,
    TooManyRows,
    UnsupportedMediaType,
    UploadRejected,
    check_rows,
    parse_body,
)
from app.models import IdempotencyRecord, Rating, User
from tests.app.conftest import make_api

DOMAIN = (UploadRejected, TooManyRows, UnsupportedMediaType)
SCALE = (1.0, 5.0)
ITEMS = ("m0", "m1", "m2", "m3")
MEDIA = st.sampled_from(["text/csv", "application/json", "", "application/csv",
                         "text/csv; charset=utf-8", "text/plain", "application/xml"])
FAST = settings(max_examples=300, deadline=None)
API = settings(max_examples=40, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])

bad_scalar = st.one_of(
    st.none(), st.booleans(), st.just(""), st.just("   "), st.just("\x00"),
    st.text(max_size=3).map(lambda t: "\x07" + t), st.text(min_size=MAX_KEY_LENGTH + 1,
                                                           max_size=MAX_KEY_LENGTH + 3),
    st.integers(min_value=10 ** 300, max_value=10 ** 400), st.floats(),  # nan, inf, huge
    st.sampled_from(["nan", "inf", "-inf", "1e999", "abc", "9" * 5000, "2024-13-45",
                     "-1e308", "１", "0x10"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                         max_size=1))
good_key = st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=1,
                   max_size=8)
good_rating = st.sampled_from([1, 2, 3, 4, 5, 1.5, "3", " 4.5 "])
good_stamp = st.one_of(st.none(), st.integers(0, 2 ** 31), st.just("2024-01-02T03:04:05"))


@st.composite
def json_rows(draw, min_bad=0):
    """Rows of a JSON upload: mostly valid, some fields replaced by bad values."""
    rows = []
    for _ in range(draw(st.integers(min_value=min_bad, max_value=6))):
        row = {"user": draw(good_key), "item": draw(st.sampled_from(ITEMS)),
               "rating": draw(good_rating), "timestamp": draw(good_stamp)}
        if draw(st.booleans()):
            row[draw(st.sampled_from(["user", "item", "rating", "timestamp"]))] = \
                draw(bad_scalar)
        if draw(st.integers(0, 9)) == 0:
            row[draw(st.sampled_from(["extra", "Rating", ""]))] = 1
        if draw(st.integers(0, 9)) == 0:
            del row[draw(st.sampled_from(sorted(row)))]
        rows.append(row)
    return rows


def to_json(rows) -> bytes:
    return json.dumps({"ratings": rows}, default=str).encode()


def to_csv(rows) -> bytes:
    """Rows as CSV lines (None becomes an empty field; non-strings via ``str``)."""
    out = io.StringIO()
    writer = csv.writer(out)
    for row in rows:
        writer.writerow(["" if v is None else str(v) for v in row.values()])
    return out.getvalue().encode("utf-8", errors="surrogatepass")


def parse_and_check(body: bytes, media: str) -> None:
    """The property: only domain errors, and a parsed body validates without raising."""
    try:
        raw = parse_body(body, media, max_rows=50)
    except DOMAIN:
        return
    assert len({len(raw.lines), len(raw.users), len(raw.items), len(raw.ratings),
                len(raw.timestamps)}) == 1
    batch, errors = check_rows(raw, SCALE)
    for user, item, value in zip(batch.users, batch.items, batch.values, strict=True):
        assert 0 < len(user) <= MAX_KEY_LENGTH and 0 < len(item) <= MAX_KEY_LENGTH
        assert SCALE[0] <= value <= SCALE[1]
    assert all(e.line in raw.lines and e.field in ("user", "item", "rating", "timestamp")
               for e in errors)


@FAST
@given(st.binary(max_size=400), MEDIA)
def test_arbitrary_bytes_raise_only_domain_errors(body, media):
    parse_and_check(body, media)


@FAST
@given(json_rows())
def test_near_valid_json_raises_only_domain_errors(rows):
    parse_and_check(to_json(rows), "application/json")


@FAST
@given(json_rows(), st.booleans())
def test_near_valid_csv_raises_only_domain_errors(rows, header):
    body = (b"user,item,rating,timestamp\n" if header else b"") + to_csv(rows)
    parse_and_check(body, "text/csv")


@pytest.mark.parametrize("body, media, expected", [
    (b"[" * 100_000, "application/json", "body is not valid JSON: nested too deeply"),
    (b'{"ratings": [' + b"9" * 5000 + b"]}", "application/json",
     "body is not valid JSON: Exceeds the limit (4300 digits)"),
    (b"u,m0," + b"1" * 200_000 + b"\n", "text/csv", "1 invalid row(s)"),
    (b"\xff\xfe", "text/csv", "CSV body is not valid UTF-8 (byte 0)"),
], ids=["deep-json", "long-integer", "long-csv-field", "not-utf8"])
def test_inputs_that_used_to_escape_the_domain_errors(body, media, expected):
    with pytest.raises(UploadRejected) as caught:
        parse_body(body, media)
    assert str(caught.value).startswith(expected)


@pytest.mark.parametrize("field, value, reason", [
    ("rating", 10 ** 400, "rating is too large"),
    ("timestamp", 10 ** 400, "timestamp is out of range"),
])
def test_huge_integers_are_row_errors(field, value, reason):
    row = {"user": "u", "item": "m0", "rating": 3, field: value}
    batch, errors = check_rows(parse_body(to_json([row]), "application/json"), SCALE)
    assert [(e.line, e.field, e.reason) for e in errors] == [(1, field, reason)]


@pytest.fixture(scope="module")
def upload_api(tmp_path_factory):
    from app.db import migrate

    url = f"sqlite:///{tmp_path_factory.mktemp('upfuzz')}/fedrec.db"
    migrate(url)
    api = make_api(url, max_upload_rows=50)
    api.items(*ITEMS)
    tenant_id, key = api.tenant()
    first = api.upload_csv(tenant_id, key, "seed,m0,3\nseed,m1,4\n")
    assert first.status_code == 200
    return api, tenant_id, key


def snapshot(api) -> tuple:
    """Every rating, user and idempotency record in the database."""
    with api.client.app.state.sessions() as s:
        ratings = s.execute(sa.select(Rating.user_id, Rating.item_id, Rating.value,
                                      Rating.rated_at).order_by(Rating.user_id,
                                                                 Rating.item_id)).all()
        users = s.execute(sa.select(User.id, User.key).order_by(User.id)).all()
        records = s.scalar(sa.select(sa.func.count()).select_from(IdempotencyRecord))
    return ratings, users, records


def post(api, tenant_id, key, body: bytes, media: str, idempotency: str | None = None):
    headers = {**key, "Content-Type": media}
    if idempotency:
        headers["Idempotency-Key"] = idempotency
    return api.client.post(f"/v1/tenants/{tenant_id}/ratings", content=body, headers=headers)


@API
@given(body=st.binary(max_size=300), media=MEDIA, keyed=st.booleans())
def test_refused_arbitrary_bytes_change_nothing(upload_api, body, media, keyed):
    api, tenant_id, key = upload_api
    before = snapshot(api)
    response = post(api, tenant_id, key, body, media, "k-" + body.hex()[:40] if keyed else None)
    assert response.status_code in (200, 413, 415, 422), response.text
    if response.status_code != 200:
        assert snapshot(api) == before


@API
@given(good=json_rows(), bad=json_rows(min_bad=1), position=st.integers(0, 6),
       as_csv=st.booleans())
def test_one_offending_row_refuses_the_whole_upload(upload_api, good, bad, position,
                                                   as_csv):
    api, tenant_id, key = upload_api
    offending = {"user": "x", "item": "not-in-catalogue", "rating": 3}
    rows = good[:position] + [offending] + good[position:] + bad
    body = to_csv(rows) if as_csv else to_json(rows)
    before = snapshot(api)
    response = post(api, tenant_id, key, body, "text/csv" if as_csv else "application/json")
    assert response.status_code == 422, response.text
    assert snapshot(api) == before
