"""Ranking and rating models in one job pair, model selection on validation, and the
serving decision (issue 30).

* ``training_jobs.pair_job_id``: the job created together with this one (the default job
  is a ranking model that serves lists and a rating model that predicts ratings); a plain
  integer, no foreign key: adding one makes SQLite rebuild ``training_jobs``, and the
  rebuild's DROP would cascade to every job's rows;
* ``training_jobs.validation_fraction``: the share of each tenant's training ratings
  carved out to choose the run length (0: none, the configured rounds run);
* ``training_jobs.selection``: what the carve-out chose (metric, best round, stop);
* ``training_jobs.serving``: whether the job's model or popularity serves the lists, and
  why (their precision and NDCG on the same held-out split);
* ``tuning_jobs.metric``: what a search chooses by, validation RMSE or NDCG@10.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ALTER TABLE (no batch): a batch rebuild of training_jobs on SQLite drops the
    # old table, and with foreign keys on that cascades to every job's rows
    op.add_column("training_jobs", sa.Column("pair_job_id", sa.Integer(), nullable=True))
    op.add_column("training_jobs", sa.Column("validation_fraction", sa.Float(),
                                             nullable=False, server_default="0"))
    op.add_column("training_jobs", sa.Column("selection", sa.JSON(), nullable=True))
    op.add_column("training_jobs", sa.Column("serving", sa.JSON(), nullable=True))
    op.add_column("tuning_jobs", sa.Column("metric", sa.String(8), nullable=False,
                                           server_default="rmse"))


def downgrade() -> None:
    op.drop_column("tuning_jobs", "metric")  # SQLite >= 3.35 drops a column in place
    for column in ("serving", "selection", "validation_fraction", "pair_job_id"):
        op.drop_column("training_jobs", column)
