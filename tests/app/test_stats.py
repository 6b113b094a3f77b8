"""Rating-block statistics: the pure function, and the task run in-process by the API."""

from __future__ import annotations

import numpy as np

from algorithms.block import RatingBlock
from app.stats import block_statistics
from tests.app.conftest import refusal


def test_statistics_against_a_hand_count():
    # users 0 and 2 rate; user 1 has no rating; items 1 and 3 of 5 are rated.
    block = RatingBlock(np.array([0, 0, 2]), np.array([1, 3, 1]), np.array([4.0, 2.5, 4.0]),
                        n_users=3, n_items=5)
    stats = block_statistics(block)
    assert (stats.n_ratings, stats.n_users, stats.n_items) == (3, 2, 2)
    assert stats.mean == (4.0 + 2.5 + 4.0) / 3
    assert stats.histogram == {"2.5": 1, "4": 2}


def test_empty_block_has_no_mean():
    empty = np.zeros(0, dtype=int)
    stats = block_statistics(RatingBlock(empty, empty, empty.astype(float), 0, 4))
    assert (stats.n_ratings, stats.n_users, stats.n_items, stats.mean, stats.histogram) == (
        0, 0, 0, None, {})


def test_stats_task_runs_in_process_without_a_broker(api):
    api.items("m1", "m2", "m3")
    tenant_id, key = api.tenant()
    other_id, other_key = api.tenant()
    api.upload_csv(tenant_id, key, "a,m1,5\na,m2,3\nb,m1,3\n")
    api.upload_csv(other_id, other_key, "z,m3,1\n")
    missing = api.client.get(f"/v1/tenants/{tenant_id}/stats", headers=key)
    assert refusal(missing) == (404, "stats_not_computed",
                                "Statistics not computed yet; POST to this URL to compute them")
    queued = api.client.post(f"/v1/tenants/{tenant_id}/stats", headers=key)
    assert queued.status_code == 202 and queued.json()["status"] == "SUCCESS"
    stats = api.client.get(f"/v1/tenants/{tenant_id}/stats", headers=key).json()
    assert {k: stats[k] for k in ("tenant_id", "n_ratings", "n_users", "n_items", "mean",
                                  "histogram")} == {
        "tenant_id": tenant_id, "n_ratings": 3, "n_users": 2, "n_items": 2,
        "mean": 11 / 3, "histogram": {"3": 2, "5": 1}}


def test_beat_refresh_recomputes_every_tenant(sqlite_api):
    from app.queue import REFRESH_ALL_RATING_STATS, enqueue

    api = sqlite_api
    api.items("m1")
    tenants = [api.tenant() for _ in range(2)]
    for n, (tenant_id, key) in enumerate(tenants):
        api.upload_csv(tenant_id, key, "".join(f"u{i},m1,{n + 1}\n" for i in range(n + 1)))
    _, state = enqueue(api.client.app.state.celery, REFRESH_ALL_RATING_STATS, [])
    assert state == "SUCCESS"
    for n, (tenant_id, key) in enumerate(tenants):
        stats = api.client.get(f"/v1/tenants/{tenant_id}/stats", headers=key).json()
        assert (stats["n_ratings"], stats["histogram"]) == (n + 1, {str(n + 1): n + 1})


def test_forgetting_a_user_takes_them_out_of_the_statistics_at_once(api):
    api.items("m1", "m2")
    tenant_id, key = api.tenant()
    api.upload_csv(tenant_id, key, "a,m1,5\na,m2,3\nb,m1,1\n")
    assert api.client.post(f"/v1/tenants/{tenant_id}/stats", headers=key).status_code == 202
    before = api.client.get(f"/v1/tenants/{tenant_id}/stats", headers=key).json()
    assert (before["n_users"], before["n_ratings"]) == (2, 3)
    forgot = api.client.delete(f"/v1/tenants/{tenant_id}/users/b/ratings", headers=key)
    assert forgot.json() == {"user": "b", "deleted": 1}
    after = api.client.get(f"/v1/tenants/{tenant_id}/stats", headers=key).json()
    assert (after["n_users"], after["n_ratings"], after["histogram"]) == (1, 2,
                                                                         {"3": 1, "5": 1})
