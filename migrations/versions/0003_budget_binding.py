"""Budget binding: tenant opt-ins, idempotent job creation, bounded job attempts.

Tenants get the admin's opt-ins (all off by default): ``allow_non_private`` (jobs may send
their data without a DP guarantee, charged as epsilon = infinity), ``scheduled_retraining``
(beat may retrain jobs that include them) with ``retrain_min_seconds`` between two such
retrainings, and ``last_retrained_at``. Training jobs get the ``Idempotency-Key`` they were
created with (unique) and the hash of that request, and the count of failed steps since
their last committed round with its bound (``attempts``, ``max_attempts``).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("allow_non_private", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("scheduled_retraining", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("retrain_min_seconds", sa.Float(), nullable=False,
                                   server_default="86400"))
        batch.add_column(sa.Column("last_retrained_at", sa.DateTime(timezone=True),
                                   nullable=True))
        batch.create_check_constraint("ck_tenants_retrain_min", "retrain_min_seconds >= 0")
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("max_attempts", sa.Integer(), nullable=False,
                                   server_default="3"))
        batch.create_unique_constraint("uq_training_jobs_idempotency_key", ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_constraint("uq_training_jobs_idempotency_key", type_="unique")
        for column in ("max_attempts", "attempts", "request_hash", "idempotency_key"):
            batch.drop_column(column)
    with op.batch_alter_table("tenants") as batch:
        batch.drop_constraint("ck_tenants_retrain_min", type_="check")
        for column in ("last_retrained_at", "retrain_min_seconds", "scheduled_retraining",
                       "allow_non_private"):
            batch.drop_column(column)
