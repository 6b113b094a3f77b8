"""The per-process rated-items cache keeps, across a ratings change, exactly the users
whose ratings did not change (and re-reads the others)."""

from __future__ import annotations

import secrets

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import migrate
from app.main import create_app
from app.models import Item, Rating, User
from app.training.serving import RatingsCache
from tests.training_helpers import csv_body


@pytest.fixture
def api(tmp_path):
    url = f"sqlite:///{tmp_path}/cache.db"
    migrate(url)
    token = secrets.token_urlsafe(32)
    app = create_app(Settings(database_url=url, admin_token=token, broker_url=None))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        client.put("/v1/admin/items", json={"items": [{"key": f"i{j}"} for j in range(6)]}
                   ).raise_for_status()
        tid = client.post("/v1/admin/tenants", json={"name": "t", "privacy_budget": 1.0}
                          ).json()["id"]
        key = client.post(f"/v1/admin/tenants/{tid}/api-keys", json={}).json()["key"]

        def upload(rows):
            r = client.post(f"/v1/tenants/{tid}/ratings", content=csv_body(rows),
                            headers={"Content-Type": "text/csv",
                                     "Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text

        def delete(user):
            r = client.delete(f"/v1/tenants/{tid}/users/{user}/ratings",
                              headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text

        yield app, tid, upload, delete


def _truth(s, tid, user) -> set[str]:
    """The user's rated item keys, straight from the tables."""
    return set(s.scalars(sa.select(Item.key).join(Rating, Rating.item_id == Item.id)
                         .join(User, User.id == Rating.user_id)
                         .where(User.tenant_id == tid, User.key == user)))


def _keys(s, ids) -> set[str]:
    return set(s.scalars(sa.select(Item.key).where(Item.id.in_(ids.tolist()))))


def test_only_changed_users_are_reread_and_every_answer_is_exact(api):
    app, tid, upload, delete = api
    upload([("a", "i0", 4), ("a", "i1", 3), ("b", "i2", 5), ("c", "i3", 1)])
    cache = RatingsCache(ttl=0.0)  # re-check the version on every call
    with app.state.sessions() as s:
        for user in "abc":
            assert _keys(s, cache.rated(s, tid, user)) == _truth(s, tid, user)
        kept_b = cache.rated(s, tid, "b")
    upload([("a", "i4", 2), ("c", "i3", 5)])  # a gains an item; c only changes a value
    delete("b")
    upload([("b", "i5", 3)])  # b re-created with one rating, as many as before
    with app.state.sessions() as s:
        for user in "abc":
            assert _keys(s, cache.rated(s, tid, user)) == _truth(s, tid, user)
        assert _truth(s, tid, "a") == {"i0", "i1", "i4"} and _truth(s, tid, "b") == {"i5"}
        assert cache.rated(s, tid, "b") is not kept_b  # a new user id: re-read


def test_unchanged_users_are_served_from_memory_after_an_upload(api):
    app, tid, upload, _ = api
    upload([("a", "i0", 4), ("b", "i2", 5)])
    cache = RatingsCache(ttl=3600.0)
    with app.state.sessions() as s:
        a, b = cache.rated(s, tid, "a"), cache.rated(s, tid, "b")
    upload([("b", "i3", 1)])
    with app.state.sessions() as s:
        cache.refresh(s, tid, max_age=0.0)  # re-check the version now
    assert cache.peek_rated(tid, "a")[0] is a  # kept: a's ratings did not change
    assert cache.peek_rated(tid, "b")[0] is None  # dropped: b rated another item
    with app.state.sessions() as s:
        assert np.array_equal(np.sort(cache.rated(s, tid, "b")),
                              np.sort(np.r_[b, s.scalar(sa.select(Item.id)
                                                          .where(Item.key == "i3"))]))
