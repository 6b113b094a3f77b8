"""One ratings reader (algorithms/ratings_io.py) for simulate, the upload API, the Python
client and the agent (issue 31): ML-1M's ``::`` and gzip, ``Content-Encoding: gzip``,
decimal commas, Parquet, a gzip bomb, and errors naming the line, the field and the
format the data looks like. Each of these uploads was refused before the reader was
shared (422 "not valid UTF-8", "expected 3 or 4 fields", "not a number", 415)."""

from __future__ import annotations

import gzip
import io
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.data import read_file
from algorithms.data import load_ratings
from app.config import Settings
from app.main import create_app
from tests.app.conftest import ADMIN_TOKEN, make_api

ML1M = "ml-1m/ratings_no_timestamps.dat.gz"


def upload(api, tenant_id, headers, body: bytes, content_type: str = "text/csv", **extra):
    return api.client.post(f"/v1/tenants/{tenant_id}/ratings", content=body,
                           headers={**headers, "Content-Type": content_type, **extra})


@pytest.fixture
def tenant(sqlite_api):
    tenant_id, headers = sqlite_api.tenant(auto_create_items=True, rating_max=5.0)
    return sqlite_api, tenant_id, headers


def parquet_bytes(table: dict) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table(table), out)
    return out.getvalue()


def test_movielens_1m_rows_with_double_colons_are_read(tenant):
    api, tid, h = tenant
    answer = upload(api, tid, h, b"1::1193::5\n1::661::3\n2::1193::4\n")
    assert answer.status_code == 200, answer.text
    assert sorted(api.ratings(tid, h)) == [("1", "1193", 5.0), ("1", "661", 3.0),
                                           ("2", "1193", 4.0)]


def test_a_gzip_body_is_recognised_by_its_magic_bytes(tenant):
    api, tid, h = tenant
    answer = upload(api, tid, h, gzip.compress(b"u1\ti1\t4\nu2\ti1\t2\n"))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"stored": 2}


def test_content_encoding_gzip_is_honoured_and_checked(tenant):
    api, tid, h = tenant
    body = gzip.compress(b'{"ratings": [{"user": "a", "item": "x", "rating": 3}]}')
    answer = upload(api, tid, h, body, "application/json", **{"Content-Encoding": "gzip"})
    assert answer.status_code == 200, answer.text
    answer = upload(api, tid, h, b"a,x,3\n", **{"Content-Encoding": "gzip"})
    assert answer.status_code == 422
    assert "Content-Encoding is gzip but the body is not gzip data" in answer.text
    answer = upload(api, tid, h, b"a,x,3\n", **{"Content-Encoding": "br"})
    assert answer.status_code == 415 and "'br'" in answer.json()["detail"]


def test_decimal_commas_with_semicolons(tenant):
    api, tid, h = tenant
    answer = upload(api, tid, h, b"user;item;rating\nx;a;3,5\ny;a;4\n")
    assert answer.status_code == 200, answer.text
    assert sorted(api.ratings(tid, h)) == [("x", "a", 3.5), ("y", "a", 4.0)]


def test_parquet_by_media_type_and_by_magic_bytes(tenant):
    api, tid, h = tenant
    body = parquet_bytes({"user": ["p1", "p2"], "item": ["a", "b"], "rating": [2.0, 4.5]})
    answer = upload(api, tid, h, body, "application/vnd.apache.parquet")
    assert answer.status_code == 200, answer.text
    positional = parquet_bytes({"u": [7], "i": [8], "r": [1]})  # 3 columns, any names
    assert upload(api, tid, h, positional, "text/csv").json() == {"stored": 1}
    assert ("7", "8", 1.0) in api.ratings(tid, h)
    bad = parquet_bytes({"user": ["p3"], "item": ["a"], "rating": [9.0]})
    answer = upload(api, tid, h, bad, "application/vnd.apache.parquet")
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["line"] == 1
    assert answer.json()["errors"][0]["field"] == "rating"


def test_parquet_without_pyarrow_is_415_naming_the_extra(tenant, monkeypatch):
    import sys

    api, tid, h = tenant
    body = parquet_bytes({"user": ["p1"], "item": ["a"], "rating": [2.0]})
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails
    answer = upload(api, tid, h, body, "application/vnd.apache.parquet")
    assert answer.status_code == 415
    assert "pip install 'fedrec[parquet]'" in answer.json()["detail"]


def test_errors_name_the_line_and_the_format_the_line_looks_like(tenant):
    api, tid, h = tenant
    answer = upload(api, tid, h, b"u1,i1,4\nu2;i2;5\n")
    assert answer.status_code == 422
    (error,) = answer.json()["errors"]
    assert error["line"] == 2 and error["field"] == "row"
    assert "got 1" in error["message"] and "this line looks ';'-separated" in error["message"]
    answer = upload(api, tid, h, b"PK\x03\x04\xff\xfe rest of a zip")
    assert answer.status_code == 422 and "looks like a ZIP archive" in answer.json()["detail"]


def test_a_gzip_bomb_is_refused_in_bounded_memory(sqlite_url):
    """Decompression is a stream of 1 MB chunks, capped in total (413) and per line (422):
    a 64 kB body of 64 MB of zeros costs a few MB, not 64."""
    import tracemalloc

    api = make_api(sqlite_url, max_decompressed_bytes=4 << 20)
    tid, h = api.tenant(auto_create_items=True)
    rows = gzip.compress(b"u,i,3\n" * (2 << 20))  # 12 MB of rows in a 30 kB body
    answer = upload(api, tid, h, rows)
    assert answer.status_code == 413 and answer.json()["code"] == "decompressed_too_large"
    zeros = gzip.compress(b"0" * (64 << 20))  # one line of 64 MB in a 64 kB body
    tracemalloc.start()
    try:
        answer = upload(api, tid, h, zeros)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert answer.status_code == 422, answer.text
    assert "longer than 1048576 characters" in answer.json()["errors"][0]["message"]
    assert peak < 32 << 20, peak
    assert api.ratings(tid, h) == []


def test_multipart_dat_gz_file_is_read_by_its_name(tenant):
    api, tid, h = tenant
    files = {"file": ("ratings.dat.gz", gzip.compress(b"5::6::2\n"), "application/gzip")}
    answer = api.client.post(f"/v1/tenants/{tid}/ratings", files=files, headers=h)
    assert answer.status_code == 200, answer.text
    assert api.ratings(tid, h) == [("5", "6", 2.0)]


def test_simulate_and_the_agent_read_the_same_files(tmp_path):
    text = b"userId;movieId;rating\n1;2;3,5\n1;3;4\n"
    for name, data in (("r.csv.gz", gzip.compress(text)), ("r.dat", b"1::2::3.5\n1::3::4\n"),
                       ("r.parquet", parquet_bytes({"user": [1, 1], "item": [2, 3],
                                                    "rating": [3.5, 4.0]}))):
        path = tmp_path / name
        path.write_bytes(data)
        simulated = load_ratings(path)
        np.testing.assert_array_equal(simulated.values, [3.5, 4.0])
        agent = read_file(path, (1.0, 5.0))
        assert sorted(agent.values.tolist()) == [3.5, 4.0], name


def _data_dir() -> Path:
    env = os.environ.get("FEDREC_DATA_DIR")
    assert env and (Path(env) / ML1M).is_file(), f"set FEDREC_DATA_DIR to a folder with {ML1M}"
    return Path(env)


@pytest.mark.integration
def test_ml_1m_uploads_unchanged_through_the_client(make_postgres_db):
    """ML-1M's ratings_no_timestamps.dat.gz, as distributed, through Client.upload_ratings
    against the real PostgreSQL (before: 422 "CSV body is not valid UTF-8"); a database of
    its own, so its 3,706 items stay out of the other tests' catalogue."""
    from fastapi.testclient import TestClient

    from app.db import migrate
    from fedrec.client import Client

    path = _data_dir() / ML1M
    url = make_postgres_db()
    migrate(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN, broker_url=None))
    with TestClient(app) as http:
        admin = Client("http://testserver", token=ADMIN_TOKEN, http=http)
        tenant = admin.create_tenant(f"ml1m-{uuid.uuid4().hex[:8]}", 1.0,
                                     auto_create_items=True)
        key = admin.create_api_key(tenant.id).key
        mine = Client("http://testserver", token=key, http=http)
        assert mine.upload_ratings(tenant.id, path=path, progress=False).stored == 1_000_209
        count = mine.count_ratings(tenant.id)
        assert (count.count, count.users) == (1_000_209, 6040)
