"""`store.load_block` reads a tenant's ratings in batches into numpy columns; its block must
be the one an independent reading of the same rows gives (users in key order, items in
catalogue order), whatever the batch size, on SQLite and PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from app import store
from app.db import engine_for
from app.models import Item, Rating, User


@pytest.fixture
def tenant_rows(api):
    """A tenant with users whose keys sort differently as text and as numbers, and a
    second tenant whose rows must not be read."""
    keys = [f"i{j}" for j in range(12)]
    api.items(*keys)
    rng = np.random.default_rng(3)
    users = ["u10", "u9", "U1", "ä", "u-2", "zz", "a b"]
    rows = {(u, f"i{j}"): float(rng.integers(1, 6)) for u in users
            for j in rng.choice(12, size=int(rng.integers(1, 9)), replace=False)}
    tid, auth = api.tenant()
    text = "user,item,rating\n" + "".join(f"{u},{i},{v:g}\n" for (u, i), v in rows.items())
    assert api.upload_csv(tid, auth, text).status_code == 200
    other, other_auth = api.tenant()
    assert api.upload_csv(other, other_auth, "user,item,rating\nu9,i0,1\nnew,i3,2\n"
                          ).status_code == 200
    return tid, rows, keys


@pytest.mark.parametrize("chunk", [1, 5, 65_536])
def test_block_equals_an_independent_reading(api, database_url, tenant_rows, monkeypatch,
                                             chunk):
    tid, rows, _ = tenant_rows
    monkeypatch.setattr(store, "LOAD_CHUNK", chunk)
    with Session(engine_for(database_url)) as s:
        block, user_keys = store.load_block(s, tid)
        item_keys = s.scalars(sa.select(Item.key).order_by(Item.id)).all()
    expected_users = sorted({u for u, _ in rows})  # code-point order, as numpy sorts
    assert user_keys.tolist() == expected_users
    # columns span the whole catalogue (other tests' items too, on the shared database)
    assert (block.n_users, block.n_items, block.nnz) == (len(expected_users), len(item_keys),
                                                         len(rows))
    got = {(user_keys[r], item_keys[c]): v
           for r, c, v in zip(block.rows, block.cols, block.vals, strict=True)}
    assert got == rows


def test_a_user_forgotten_between_the_two_reads_is_left_out(api, database_url, tenant_rows,
                                                            monkeypatch):
    """Without snapshot isolation (SQLite) a user can be deleted after its ratings were
    read and before the keys are: its ratings are dropped, not a KeyError."""
    tid, rows, _ = tenant_rows
    engine = engine_for(database_url)
    gone = "u9"
    real_execute = Session.execute
    deleted = []

    def execute(self, statement, *a, **kw):
        sql = str(statement)
        if not deleted and "FROM users" in sql and "ratings" not in sql:  # the keys' query
            deleted.append(gone)  # before the nested statements, which come here too
            with Session(engine) as other:
                assert store.delete_user(other, tid, gone)
                other.commit()
        return real_execute(self, statement, *a, **kw)

    with Session(engine) as s:
        monkeypatch.setattr(Session, "execute", execute)
        block, user_keys = store.load_block(s, tid)
    monkeypatch.undo()
    assert gone not in user_keys.tolist()
    assert user_keys.tolist() == sorted({u for u, _ in rows} - {gone})
    assert block.nnz == sum(1 for u, _ in rows if u != gone)
    with Session(engine) as s:  # and the deletion itself happened
        assert not s.scalar(sa.select(sa.func.count()).select_from(Rating).join(
            User, User.id == Rating.user_id).where(User.tenant_id == tid, User.key == gone))


def test_the_registered_block_leaves_out_items_an_upload_created(api, database_url):
    """``registered_only`` (a DP job's read): the catalogue is the registered items, and
    ratings of items an upload created are dropped, with users left without any."""
    api.items("reg-a", "reg-b")
    tid, auth = api.tenant(auto_create_items=True)
    text = "user,item,rating\nx,reg-a,4\nx,made-up,5\ny,made-up,2\n"
    assert api.upload_csv(tid, auth, text).status_code == 200
    with Session(engine_for(database_url)) as s:
        block, user_keys = store.load_block(s, tid, registered_only=True)
        registered = s.scalars(sa.select(Item.key).where(Item.origin == "admin")
                               .order_by(Item.id)).all()
        full, _ = store.load_block(s, tid)
    assert "made-up" not in registered and block.n_items == len(registered)
    assert user_keys.tolist() == ["x"] and block.nnz == 1
    assert registered[int(block.cols[0])] == "reg-a" and full.nnz == 3
