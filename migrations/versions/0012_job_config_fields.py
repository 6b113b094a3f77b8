"""Stored job configs get the fields added since they were written, with the values that
keep their old behaviour.

FedMC-ADMM gained ``lam_rating`` and ``gamma_rating`` (per-rating ridge weights, now 0.085
by default) and FedMAvg ``bias``, ``aggregate`` and ``curvature`` (now on by default, and
``bias`` changes the shape of a tenant's factors). A job stored before them (queued,
running, or the parent a scheduled retraining copies) would otherwise load the new
defaults: a resumed FedMAvg job would not fit its own stored factors, and a FedMC-ADMM job
would change its regularisation mid-run. The fields get the values of the earlier
behaviour; a job that has them already is untouched.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

#: per algorithm: each field added since, with the value of the earlier behaviour
EARLIER = {
    "fedmc-admm": {"lam_rating": 0.0, "gamma_rating": 0.0},
    "fedmavg": {"bias": False, "aggregate": "mean", "curvature": "global"},
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
    # the earlier code knows none of these fields (its configs refuse unknown ones)
    _rewrite(lambda algorithm, config: {k: v for k, v in config.items()
                                        if k not in EARLIER[algorithm]})
