"""Right to be forgotten, for what training derived from a user's ratings.

Deleting a user removes their ratings (``app.store.delete_user``); in the same transaction
:func:`forget_user` removes the user's row from every factor snapshot of the tenant (so no
recommendation is ever served from it) and the user's ratings from every stored job block
(train and held-out), replacing the user's key there by an empty string. What is left is
the user's row of U_i inside past jobs' stored local state: factors, not ratings, and no
longer linked to the user's key.
"""

from __future__ import annotations

import io

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from algorithms import RatingBlock
from app.training.models import FactorSnapshot, JobClient

FORGOTTEN = ""


def _drop_row(blob: bytes, row: int) -> bytes:
    block = RatingBlock.from_bytes(blob)
    return block.subset(block.rows != row).to_bytes()


def _scrub_snapshot(snap: FactorSnapshot, user_key: str) -> None:
    row = snap.user_keys.index(user_key)
    with np.load(io.BytesIO(snap.factors), allow_pickle=False) as z:
        a, b, items = np.delete(z["A"], row, axis=0), z["B"], z["item_ids"]
    buf = io.BytesIO()
    np.savez(buf, A=a, B=b, item_ids=items)
    snap.factors = buf.getvalue()
    snap.user_keys = [k for k in snap.user_keys if k != user_key]


def forget_user(s: Session, tenant_id: int, user_key: str) -> dict[str, int]:
    """Scrub the user from the tenant's snapshots and job blocks (caller commits)."""
    snaps = [r for r in s.scalars(sa.select(FactorSnapshot).where(
        FactorSnapshot.tenant_id == tenant_id)) if user_key in r.user_keys]
    for snap in snaps:
        _scrub_snapshot(snap, user_key)
    clients = [c for c in s.scalars(sa.select(JobClient).where(
        JobClient.tenant_id == tenant_id)) if user_key in c.user_keys]
    for jc in clients:
        row = jc.user_keys.index(user_key)
        jc.train_block = _drop_row(jc.train_block, row)
        jc.test_block = _drop_row(jc.test_block, row)
        jc.user_keys = [FORGOTTEN if k == user_key else k for k in jc.user_keys]
    return {"snapshots": len(snaps), "job_blocks": len(clients)}
