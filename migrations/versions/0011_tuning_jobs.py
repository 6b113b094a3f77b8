"""Tuning jobs: a hyper-parameter search on the tenants' training ratings, run by a worker.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuning_jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column("base_config", sa.JSON(), nullable=False),
        sa.Column("tenant_ids", sa.JSON(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("per_round", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("test_fraction", sa.Float(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("eta", sa.Integer(), nullable=False),
        sa.Column("budget_seconds", sa.Float(), nullable=False),
        sa.Column("scored", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("tuning_jobs")
