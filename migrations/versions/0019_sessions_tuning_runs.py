"""Dashboard sessions ended by signing out (``revoked_sessions``); tuning jobs' run
ownership and heartbeat (``attempt``, ``heartbeat_at``) for their watchdog.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revoked_sessions",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_revoked_sessions_expires_at", "revoked_sessions", ["expires_at"])
    # plain ALTER TABLE (no batch): a batch rebuild of tuning_jobs on SQLite drops the old
    # table, and with foreign keys on that cascades to the ledger rows that name it
    op.add_column("tuning_jobs", sa.Column("attempt", sa.Integer(), nullable=False,
                                           server_default="0"))
    op.add_column("tuning_jobs", sa.Column("heartbeat_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("tuning_jobs", "heartbeat_at")  # SQLite >= 3.35 drops it in place
    op.drop_column("tuning_jobs", "attempt")
    op.drop_index("ix_revoked_sessions_expires_at", table_name="revoked_sessions")
    op.drop_table("revoked_sessions")
