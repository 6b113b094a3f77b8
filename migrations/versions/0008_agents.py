"""Tenant agents: a job's agent tenants, round deadline and upload schema.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("training_jobs", sa.Column("agents", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column("training_jobs", "agents")
