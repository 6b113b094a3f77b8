"""Forgetting: one tombstone per (tenant, user key) that every later job step honours.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forgotten_users",
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  primary_key=True, nullable=False),
        sa.Column("user_key", sa.String(255), primary_key=True, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_forgotten_users_tenant_version", "forgotten_users",
                    ["tenant_id", "version"])


def downgrade() -> None:
    op.drop_index("ix_forgotten_users_tenant_version", table_name="forgotten_users")
    op.drop_table("forgotten_users")
