"""Stored FedMC-ADMM job configs get ``item_bias_ridge`` with the value of their earlier
behaviour.

FedMC-ADMM gained ``item_bias_ridge``, a fixed ridge on the item-bias row of V (on by
default: the per-rating ridge alone leaves the bias of lightly-rated items unshrunk, and
they top the ranked lists). A job stored before it (queued, running, or the parent a
scheduled retraining copies) would otherwise load the new default and change its
regularisation mid-run; it gets 0, the earlier behaviour. A job that has the field already
is untouched. The pattern of 0012.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

#: per algorithm: each field added since 0012, with the value of the earlier behaviour
EARLIER = {
    "fedmc-admm": {"item_bias_ridge": 0.0},
}

jobs = sa.table("training_jobs", sa.column("id", sa.Integer),
                sa.column("algorithm", sa.String), sa.column("config", sa.JSON))


def _rewrite(change) -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.algorithm, jobs.c.config).where(
        jobs.c.algorithm.in_(list(EARLIER)))).all()
    for job_id, algorithm, config in rows:
        new = change(algorithm, dict(config or {}))
        if new != config:
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(config=new))


def upgrade() -> None:
    _rewrite(lambda algorithm, config: {**EARLIER[algorithm], **config})


def downgrade() -> None:
    # the earlier code does not know the field (its configs refuse unknown ones)
    _rewrite(lambda algorithm, config: {k: v for k, v in config.items()
                                        if k not in EARLIER[algorithm]})
