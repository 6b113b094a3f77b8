"""Ranking and rating models in one job pair, model selection on validation, and the
serving decision (issue 30).

* ``training_jobs.pair_job_id``: the job created together with this one (the default job
  is a ranking model that serves lists and a rating model that predicts ratings);
* ``training_jobs.validation_fraction``: the share of each tenant's training ratings
  carved out to choose the run length (0: none, the configured rounds run);
* ``training_jobs.selection``: what the carve-out chose (metric, best round, stop);
* ``training_jobs.serving``: whether the job's model or popularity serves the lists, and
  why (their precision and NDCG on the same held-out split);
* ``tuning_jobs.metric``: what a search chooses by, validation RMSE or NDCG@10.

Revision ID: 0018_h6
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_h6"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_jobs") as batch:
        batch.add_column(sa.Column("pair_job_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("validation_fraction", sa.Float(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("selection", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("serving", sa.JSON(), nullable=True))
        batch.create_foreign_key("fk_training_jobs_pair_job_id", "training_jobs",
                                 ["pair_job_id"], ["id"], ondelete="SET NULL")
    with op.batch_alter_table("tuning_jobs") as batch:
        batch.add_column(sa.Column("metric", sa.String(8), nullable=False,
                                   server_default="rmse"))


def downgrade() -> None:
    with op.batch_alter_table("tuning_jobs") as batch:
        batch.drop_column("metric")
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_constraint("fk_training_jobs_pair_job_id", type_="foreignkey")
        batch.drop_column("serving")
        batch.drop_column("selection")
        batch.drop_column("validation_fraction")
        batch.drop_column("pair_job_id")
