"""Bad values that used to be accepted or to end in a 500: non-finite or unbounded tenant
settings, a tenant whose data poisons a joint job, non-finite factors reaching serving,
timestamps that can be stored but not read back, numbers with underscores, rounded echoes
of a rejected rating, and a broker outage when statistics are requested."""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np
import pytest
import sqlalchemy as sa

from algorithms.ingest import RowError, check_rows, parse_body
from app.models import Tenant
from app.training import pipeline
from app.training.models import FactorSnapshot
from tests.app.conftest import make_api, refusal
from tests.training_helpers import make_tenants, submit_job, wait_job

SCALE = (1.0, 5.0)


def tenant_count(api) -> int:
    with api.client.app.state.sessions() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Tenant))


@pytest.mark.parametrize("fields, loc, kind", [
    ('"rating_min": -Infinity, "rating_max": Infinity', "rating_min", "finite_number"),
    ('"rating_max": Infinity', "rating_max", "finite_number"),
    ('"rating_min": NaN', "rating_min", "finite_number"),
    ('"rating_min": -1e300', "rating_min", "greater_than_equal"),
    ('"rating_max": 1000001', "rating_max", "less_than_equal"),
    ('"privacy_budget": 1e999', "privacy_budget", "finite_number"),
    ('"privacy_budget": NaN', "privacy_budget", "finite_number"),
    ('"privacy_budget": 1e7', "privacy_budget", "less_than_equal"),
], ids=["infinite-scale", "infinite-max", "nan-min", "huge-min", "max-over-bound",
        "infinite-budget", "nan-budget", "huge-budget"])
def test_non_finite_or_unbounded_tenant_settings_are_422_naming_the_field(
        sqlite_api, fields, loc, kind):
    body = '{"name": "poison", "privacy_budget": 1, ' + fields + "}"
    before = tenant_count(sqlite_api)
    response = sqlite_api.client.post("/v1/admin/tenants", content=body, headers={
        **sqlite_api.admin, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert ("body", loc) in [tuple(e["loc"]) for e in errors]
    assert kind in [e["type"] for e in errors if tuple(e["loc"]) == ("body", loc)]
    assert tenant_count(sqlite_api) == before


def test_the_rating_span_is_bounded(sqlite_api):
    response = sqlite_api.client.post("/v1/admin/tenants", headers=sqlite_api.admin, json={
        "name": "wide", "privacy_budget": 1, "rating_min": -600000, "rating_max": 600000})
    assert response.status_code == 422
    assert response.json()["errors"][0]["message"] == \
        "Value error, rating_max - rating_min must be at most 1e+06"
    widest = sqlite_api.client.post("/v1/admin/tenants", headers=sqlite_api.admin, json={
        "name": "widest", "privacy_budget": 1e6, "rating_min": -500000, "rating_max": 500000})
    assert widest.status_code == 201, widest.text


def _recommend(client, tid, key, user):
    return client.get(f"/v1/tenants/{tid}/users/{user}/recommendations",
                      headers={"Authorization": f"Bearer {key}"}, params={"k": 5})


def test_a_tenant_with_extreme_ratings_cannot_break_the_others(sqlite_url):
    api = make_api(sqlite_url)
    client = api.client
    client.headers.update(api.admin)
    (good, good_key), = make_tenants(client, n=1)
    poison = client.post("/v1/admin/tenants", json={
        "name": "poison", "privacy_budget": 1000, "rating_min": -1e300, "rating_max": 1e300})
    assert poison.status_code == 422  # accepted before: +-1e300 then made the job NaN
    bad = client.post("/v1/admin/tenants", json={  # the most extreme scale still accepted
        "name": "extreme", "privacy_budget": 1000, "rating_min": -5e5, "rating_max": 5e5,
        "allow_non_private": True})  # the job below is noise-free
    assert bad.status_code == 201, bad.text
    bad_id = bad.json()["id"]
    bad_key = client.post(f"/v1/admin/tenants/{bad_id}/api-keys").json()["key"]
    rows = "".join(f"x{u},i{i},{(-1) ** (u + i) * 5e5:g}\n" for u in range(30)
                   for i in range(0, 40, 3))
    upload = client.post(f"/v1/tenants/{bad_id}/ratings", content=rows.encode(), headers={
        "Content-Type": "text/csv", "Authorization": f"Bearer {bad_key}"})
    assert upload.status_code == 200, upload.text
    job = wait_job(client, submit_job(client, rounds=3, tenant_ids=[good, bad_id]).json()["id"])
    assert job["status"] == "completed", job
    served = _recommend(client, good, good_key, "u0")
    assert served.status_code == 200 and served.json()["source"] == "model"
    scores = [r["score"] for r in served.json()["data"]]
    assert len(scores) == 5 and np.all(np.isfinite(scores))


def test_non_finite_factors_are_never_published(sqlite_url, monkeypatch):
    api = make_api(sqlite_url)
    client = api.client
    client.headers.update(api.admin)
    (tid, key), _ = make_tenants(client)
    first = wait_job(client, submit_job(client, rounds=2).json()["id"])
    assert first["status"] == "completed"
    before = _recommend(client, tid, key, "u0").json()
    real = pipeline.algorithm_of

    def diverging(job):
        alg, cfg = real(job)

        def nan_factors(glob, state):
            a, b = alg.factors(glob, state)
            return a * np.nan, b

        return dataclasses.replace(alg, factors=nan_factors), cfg

    monkeypatch.setattr(pipeline, "algorithm_of", diverging)
    second = wait_job(client, submit_job(client, rounds=2).json()["id"])
    assert second["status"] == "failed"
    assert second["error"].startswith("training diverged: the factors of tenant(s) ")
    assert "nothing was published" in second["error"]
    with client.app.state.sessions() as s:
        jobs = set(s.scalars(sa.select(FactorSnapshot.job_id)))
    assert jobs == {first["id"]}
    api.client.app.state.factor_cache.__init__(0)  # forget what this process served
    after = _recommend(client, tid, key, "u0").json()
    assert after == before and after["job_id"] == first["id"] and after["data"]


def errors(body: bytes, media: str = "text/csv") -> list[RowError]:
    return check_rows(parse_body(body, media), SCALE)[1]


def test_a_rejected_rating_is_echoed_as_given():
    assert errors(b"u,m,5.0000001\n") == [
        RowError(1, "rating", "rating 5.0000001 is outside the tenant's scale [1, 5]")]
    assert errors(b'{"ratings": [{"user": "u", "item": "m", "rating": 0.99999999}]}',
                  "application/json") == [
        RowError(1, "rating", "rating 0.99999999 is outside the tenant's scale [1, 5]")]


@pytest.mark.parametrize("body, field, reason", [
    (b"u,m,0_4\n", "rating", "rating '0_4' is not a number"),
    (b"u,m,4,1_600_000_000\n", "timestamp", "timestamp '1_600_000_000' is not Unix seconds "
                                            "or ISO 8601"),
])
def test_underscores_in_numbers_are_rejected(body, field, reason):
    assert errors(body) == [RowError(1, field, reason)]


RANGE = "(1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z)"


@pytest.mark.parametrize("stamp", [
    "0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00", "1969-12-31T23:59:59Z", "-1",
    "253402300800"])
def test_timestamps_outside_1970_to_9999_utc_are_row_errors(stamp):
    assert errors(f"u,m,4,{stamp}\n".encode()) == [
        RowError(1, "timestamp", f"timestamp {stamp} is out of range {RANGE}")]


def test_timestamps_are_stored_in_utc():
    batch, errs = check_rows(parse_body(b"u,m,4,9999-12-31T23:00:00+05:00\n", "text/csv"),
                             SCALE)
    assert errs == []
    assert batch.timestamps == [dt.datetime(9999, 12, 31, 18, tzinfo=dt.UTC)]
    assert batch.timestamps[0].utcoffset() == dt.timedelta(0)


def test_an_extreme_offset_is_refused_and_every_page_stays_readable(api):
    api.items("m1", "m2")
    tenant_id, key = api.tenant()
    refused = api.upload_csv(tenant_id, key, "u1,m1,4,0001-01-01T00:00:00+05:00\n"
                                             "u1,m2,3,9999-12-31T23:00:00-05:00\n")
    assert refused.status_code == 422
    assert refusal(refused)[:2] == (422, "upload_rejected")
    assert refused.json()["errors"] == [
        {"line": 1, "field": "timestamp",
         "message": f"timestamp 0001-01-01T00:00:00+05:00 is out of range {RANGE}"},
        {"line": 2, "field": "timestamp",
         "message": f"timestamp 9999-12-31T23:00:00-05:00 is out of range {RANGE}"}]
    edge = api.upload_csv(tenant_id, key, "u1,m1,4,9999-12-31T23:59:59Z\n"
                                          "u1,m2,3,1970-01-01T00:00:00+00:00\n")
    assert edge.status_code == 200, edge.text
    page = api.client.get(f"/v1/tenants/{tenant_id}/ratings", headers=key)
    assert page.status_code == 200
    assert [r["timestamp"] for r in page.json()["data"]] == [
        "9999-12-31T23:59:59Z", "1970-01-01T00:00:00Z"]


def test_statistics_during_a_broker_outage_are_503(sqlite_url):
    api = make_api(sqlite_url, broker_url="redis://127.0.0.1:1/0")
    conf = api.client.app.state.celery.conf  # fail fast instead of ~20 s of retries
    conf.result_backend_transport_options = {"retry_policy": {"max_retries": 1,
                                                              "interval_start": 0}}
    conf.broker_transport_options = {"max_retries": 1}
    tenant_id, key = api.tenant()
    response = api.client.post(f"/v1/tenants/{tenant_id}/stats", headers=key)
    assert refusal(response) == (
        503, "broker_unavailable", "The broker is unavailable; retry the request later")
    assert response.headers["retry-after"] == "5"
