"""Job creation reserves each tenant's planned spend (SQLite and PostgreSQL): a second job
that fits a tenant's budget alone but not next to an accepted one is refused (two
epsilon-4 jobs on an epsilon-5 tenant both used to get 202), cancelling the first
releases its reservation, and two creations racing for the same budget admit one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.app.conftest import refusal


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
