"""Job creation reserves each tenant's planned spend (SQLite and PostgreSQL): a second job
that fits a tenant's budget alone but not next to an accepted one is refused (two
epsilon-4 jobs on an epsilon-5 tenant both used to get 202), cancelling the first
releases its reservation, and two creations racing for the same budget admit one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.app.conftest import make_api, refusal


def _setup(api):
    api.items("i0", "i1", "i2", "i3")
    tenants = [api.tenant(privacy_budget=100.0)[0] for _ in range(2)]
    body = {"algorithm": "fedmc-admm", "config": {"rank": 2}, "rounds": 3, "per_round": 0,
            "seed": 1, "dp": {"mechanism": "gaussian", "noise_multiplier": 1.0},
            "tenant_ids": tenants, "agents": tenants}
    plan = api.client.post("/v1/admin/jobs", params={"dry_run": True}, json=body,
                           headers=api.admin)
    assert plan.status_code == 200, plan.text
    one = plan.json()["tenants"][str(tenants[0])]["epsilon_after"]
    for t in tenants:  # one job fits, two do not
        res = api.client.patch(f"/v1/admin/tenants/{t}", json={"privacy_budget": 1.5 * one},
                               headers=api.admin)
        assert res.status_code == 200, res.text
    return tenants, body


def _create(api, body):
    return api.client.post("/v1/admin/jobs", json=body, headers=api.admin)


def test_a_second_job_past_the_reserved_budget_is_refused_until_the_first_ends(api):
    tenants, body = _setup(api)
    first = _create(api, body)
    assert first.status_code == 202, first.text
    second = _create(api, body)
    status, code, detail = refusal(second)
    assert (status, code) == (409, "budget_exceeded"), detail
    plan = api.client.post("/v1/admin/jobs", params={"dry_run": True}, json=body,
                           headers=api.admin)
    assert plan.status_code == 409  # the plan sees the reservation too
    cancel = api.client.post(f"/v1/admin/jobs/{first.json()['id']}/cancel",
                             headers=api.admin)
    assert cancel.status_code == 200, cancel.text
    again = _create(api, body)
    assert again.status_code == 202, again.text


def test_two_creations_racing_for_one_budget_admit_one(api):
    tenants, body = _setup(api)
    with ThreadPoolExecutor(2) as ex:
        answers = list(ex.map(lambda _: _create(api, body), range(2)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [202, 409], [r.text for r in answers]
    jobs = api.client.get("/v1/admin/jobs", headers=api.admin).json()["data"]
    assert len([j for j in jobs if j["tenant_ids"] == tenants]) == 1  # none left behind


def _open_upload(api, tenant, headers, job_id):
    """Wait for round 1 to ask this agent for its upload; a small upload of the job's
    schema (well within the clip)."""
    import time

    import numpy as np

    from algorithms.messages import _message_class

    path = f"/v1/tenants/{tenant}/agent/jobs/{job_id}"
    end = time.monotonic() + 30
    while api.client.get(f"{path}/round", headers=headers).json()["phase"] != "upload":
        assert time.monotonic() < end, "round 1 did not open"
        time.sleep(0.05)
    schema = api.client.get(path, headers=headers).json()["upload"]
    arrays = {k: np.full(v["shape"], 1e-3) for k, v in schema["arrays"].items()}
    return _message_class(schema["type"])(**arrays).to_bytes()


@pytest.mark.integration
def test_concurrent_agent_uploads_of_two_jobs_cannot_overspend(migrated_postgres_url):
    """Two accepted agent jobs, then the tenant's budget cut to one release: the two
    uploads racing into both jobs are checked and charged under the tenant's lock, so one
    is accepted and the other is 409 budget_exceeded (both used to be charged, leaving
    the ledger past the budget). PostgreSQL: SQLite has no row locks."""
    api = make_api(migrated_postgres_url)
    tenants, body = _setup(api)
    for t in tenants:
        api.client.patch(f"/v1/admin/tenants/{t}", json={"privacy_budget": 100.0},
                         headers=api.admin).raise_for_status()
    one = {**body, "rounds": 1}
    plan = api.client.post("/v1/admin/jobs", params={"dry_run": True}, json=one,
                           headers=api.admin).json()
    single = plan["tenants"][str(tenants[0])]["epsilon_after"]  # one release
    jobs = [_create(api, one) for _ in range(2)]
    assert [j.status_code for j in jobs] == [202, 202], [j.text for j in jobs]
    api.client.patch(f"/v1/admin/tenants/{tenants[0]}", json={"privacy_budget": 1.2 * single},
                     headers=api.admin).raise_for_status()
    key = api.client.post(f"/v1/admin/tenants/{tenants[0]}/api-keys", headers=api.admin)
    headers = {"Authorization": f"Bearer {key.json()['key']}"}
    ids = [j.json()["id"] for j in jobs]
    bodies = {j: _open_upload(api, tenants[0], headers, j) for j in ids}

    def put(job_id):
        return api.client.put(
            f"/v1/tenants/{tenants[0]}/agent/jobs/{job_id}/rounds/1/upload",
            content=bodies[job_id], headers={**headers,
                                             "Content-Type": "application/octet-stream"})

    with ThreadPoolExecutor(2) as ex:
        answers = list(ex.map(put, ids))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 409], [r.text for r in answers]
    refused = next(r for r in answers if r.status_code == 409)
    assert refusal(refused)[1] == "budget_exceeded"
    spend = api.client.get(f"/v1/tenants/{tenants[0]}/privacy", headers=headers)
    assert spend.status_code == 200, spend.text
    assert spend.json()["epsilon_spent"] <= 1.2 * single
