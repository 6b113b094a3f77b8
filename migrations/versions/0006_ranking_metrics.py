"""Ranking metrics of a job's final round (precision/recall/NDCG@k, coverage).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_rounds") as batch:
        batch.add_column(sa.Column("ranking", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_rounds") as batch:
        batch.drop_column("ranking")
