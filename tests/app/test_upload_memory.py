"""Uploads in bounded memory, and at most FEDREC_MAX_CONCURRENT_UPLOADS per tenant at once.

A rejected upload used to hold every row as Python objects several times over (the body,
its decoded text, the raw columns, one RowError per offending row): 2M rows raised an API
worker by about 550 MB, and three at once by 1.6 GB (bench/upload_memory.py). The memory
test traces the Python allocations of whole requests through the API.
"""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from app import uploads
from tests.app.conftest import make_api, refusal

ROWS = 200_000


def unknown_items_csv(n: int) -> bytes:
    """``n`` distinct ratings whose items are not in the catalogue: every row offends."""
    return "".join(f"u{k // 40},x{k % 4000},{1 + k % 5}\n" for k in range(n)).encode()


def traced_peak(call) -> tuple[object, float]:
    """(result, peak MB of Python allocations made during ``call``)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1] / 2 ** 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("media", ["text/csv", "application/json"])
def test_a_rejected_large_upload_stays_in_bounded_memory(sqlite_url, media):
    api = make_api(sqlite_url, max_upload_rows=ROWS)
    api.items("m1")
    tenant_id, key = api.tenant()
    body = unknown_items_csv(ROWS)
    if media == "application/json":
        rows = (line.split(",") for line in body.decode().splitlines())
        body = ('{"ratings": [' + ",".join(f'{{"user": "{u}", "item": "{i}", "rating": {r}}}'
                                           for u, i, r in rows) + "]}").encode()
    response, peak = traced_peak(lambda: api.client.post(
        f"/v1/tenants/{tenant_id}/ratings", content=body,
        headers={**key, "Content-Type": media}))
    assert refusal(response) == (422, "upload_rejected",
                                 f"{ROWS} invalid row(s); nothing was stored")
    body = response.json()
    assert len(body["errors"]) == 100 and body["omitted"] == ROWS - 100
    assert body["errors"][0] == {"line": 1, "field": "item",
                                 "message": "item 'x0' is not in the catalogue"}
    # 200k rows: the compact columns take 28 bytes a row (5.6 MB), sorting them for
    # duplicates about as much again, plus one 1 MB chunk of the body in flight.
    assert peak < 30, f"peak {peak:.0f} MB"


def blocking_item_lookup(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make uploads naming item "slow" wait (after parsing) until ``release`` is set;
    ``entered`` is set each time one starts waiting."""
    real, entered, release = uploads.store.item_ids, threading.Semaphore(0), threading.Event()

    def item_ids(session, keys):
        keys = list(keys)
        if "slow" in keys:
            entered.release()
            assert release.wait(30)
        return real(session, keys)

    monkeypatch.setattr(uploads.store, "item_ids", item_ids)
    return entered, release


def test_concurrent_uploads_of_one_tenant_are_capped_with_429(sqlite_url, monkeypatch):
    api = make_api(sqlite_url, max_concurrent_uploads=2)
    api.items("slow", "fast")
    tenant_id, key = api.tenant()
    other_id, other_key = api.tenant()
    entered, release = blocking_item_lookup(monkeypatch)
    results = {}

    def upload(name, user):
        results[name] = api.upload_csv(tenant_id, key, f"{user},slow,4\n")

    threads = [threading.Thread(target=upload, args=(f"t{i}", f"u{i}")) for i in range(2)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert entered.acquire(timeout=30)  # both uploads are in progress
    refused = api.upload_csv(tenant_id, key, "u9,fast,4\n")
    other = api.upload_csv(other_id, other_key, "u9,fast,4\n")  # another tenant: own slots
    release.set()
    for thread in threads:
        thread.join(30)
    assert refusal(refused) == (429, "too_many_uploads",
                                "2 uploads of this tenant are already in progress "
                                "(FEDREC_MAX_CONCURRENT_UPLOADS); retry when one has finished")
    assert refused.headers["retry-after"] == "5"
    assert other.json() == {"stored": 1}
    assert [results[t].json() for t in ("t0", "t1")] == [{"stored": 1}] * 2
    assert sorted(api.ratings(tenant_id, key)) == [("u0", "slow", 4.0), ("u1", "slow", 4.0)]


def test_finished_and_failed_uploads_give_their_slot_back(sqlite_url):
    api = make_api(sqlite_url, max_concurrent_uploads=1)
    api.items("m1")
    tenant_id, key = api.tenant()
    for _ in range(3):
        assert api.upload_csv(tenant_id, key, "u1,nope,4\n").status_code == 422
        assert api.upload_csv(tenant_id, key, "u1,m1,9\n" * 2).status_code == 422
        big = api.client.post(f"/v1/tenants/{tenant_id}/ratings", content=b"u,m1,3\n" * 10,
                              headers={**key, "Content-Type": "text/plain"})
        assert big.status_code == 415
        assert api.upload_csv(tenant_id, key, "u1,m1,4\n").json() == {"stored": 1}
