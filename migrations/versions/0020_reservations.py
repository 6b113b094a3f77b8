"""Training jobs reserve their planned privacy spend.

``training_jobs.reserved``: tenant id -> the events the job planned to charge it, as
[mechanism, noise multiplier, count] lists in order (its worst-case plan at creation). Job
creation checks a tenant's budget against what it has spent plus what every other
queued or running job still has reserved (planned minus already charged), so two jobs can
no longer both be accepted on a budget that holds one. A job that ends, fails or is
cancelled no longer reserves anything. Jobs stored before have no reservation (None).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("training_jobs",
                  sa.Column("reserved", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    # in place (SQLite >= 3.35), not a batch rebuild: dropping the old training_jobs table
    # would cascade to every job's rows with foreign keys on
    op.drop_column("training_jobs", "reserved")
