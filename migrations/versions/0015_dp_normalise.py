"""Stored DPALS, DP-FedMAvg and DP-FedMC-ADMM job configs get ``normalise = false``.

These algorithms now divide ratings by their public scale's unit ((scale_max - scale_min)
/ 4) inside the tenant by default, as every other algorithm does, so their clips and
ridges mean the same on a 0-10 or -10..10 scale as on 1-5 stars. A job stored before
(queued, running, or the parent a scheduled retraining copies) keeps raw ratings, its
earlier behaviour; on a 1-5 scale the two are the same. A job that has the field already
is untouched.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24
"""

from __future__ import annotations

from migrations.job_configs import add_fields, remove_fields

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

#: per algorithm: each field added since, with the value of the earlier behaviour
EARLIER = {name: {"normalise": False} for name in ("dpals", "dp-fedmavg", "dp-fedmc-admm")}


def upgrade() -> None:
    add_fields(EARLIER)


def downgrade() -> None:
    remove_fields(EARLIER)
