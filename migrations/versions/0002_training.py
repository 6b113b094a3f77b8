"""Training: jobs, per-tenant job state, staged uploads, rounds, privacy ledger, snapshots.

Also adds to tenants the delta of their (epsilon, delta) budget and a ratings version that
every upload or deletion bumps (scheduled retraining starts only when it changed).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def _job_fk(primary_key: bool = True) -> sa.Column:
    return sa.Column("job_id", sa.Integer(),
                     sa.ForeignKey("training_jobs.id", ondelete="CASCADE"),
                     primary_key=primary_key, nullable=False)


def _tenant_fk(primary_key: bool = False) -> sa.Column:
    return sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                     primary_key=primary_key, nullable=False)


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("privacy_delta", sa.Float(), nullable=False,
                                   server_default="1e-05"))
        batch.add_column(sa.Column("ratings_version", sa.Integer(), nullable=False,
                                   server_default="0"))
        batch.create_check_constraint("ck_tenants_delta",
                                      "privacy_delta > 0 AND privacy_delta < 1")
    op.create_table(
        "training_jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("dp", sa.JSON(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("per_round", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("test_fraction", sa.Float(), nullable=False),
        sa.Column("tenant_ids", sa.JSON(), nullable=False),
        sa.Column("item_ids", sa.LargeBinary(), nullable=False),
        sa.Column("current_round", sa.Integer(), nullable=False),
        sa.Column("global_msg", sa.LargeBinary(), nullable=True),
        sa.Column("server_state", sa.LargeBinary(), nullable=True),
        sa.Column("latest_metrics", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("stopped_tenants", sa.JSON(), nullable=True),
        sa.Column("parent_job_id", sa.Integer(), sa.ForeignKey("training_jobs.id"),
                  nullable=True),
        sa.Column("ratings_version", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_table(
        "job_clients",
        _job_fk(),
        sa.Column("client_index", sa.Integer(), primary_key=True),
        _tenant_fk(),
        sa.Column("user_keys", sa.JSON(), nullable=False),
        sa.Column("train_block", sa.LargeBinary(), nullable=False),
        sa.Column("test_block", sa.LargeBinary(), nullable=False),
        sa.Column("local_state", sa.LargeBinary(), nullable=False),
        sa.Column("transmissions", sa.Integer(), nullable=False),
    )
    op.create_index("ix_job_clients_tenant_id", "job_clients", ["tenant_id"])
    op.create_table(
        "round_uploads",
        _job_fk(),
        sa.Column("round", sa.Integer(), primary_key=True),
        sa.Column("client_index", sa.Integer(), primary_key=True),
        sa.Column("local_state", sa.LargeBinary(), nullable=False),
        sa.Column("upload", sa.LargeBinary(), nullable=True),
        sa.Column("refused", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "job_rounds",
        _job_fk(),
        sa.Column("round", sa.Integer(), primary_key=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("test_rmse", sa.Float(), nullable=True),
        sa.Column("test_mae", sa.Float(), nullable=True),
        sa.Column("per_tenant", sa.JSON(), nullable=False),
        sa.Column("participants", sa.JSON(), nullable=False),
        sa.Column("uploads", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "privacy_ledger",
        sa.Column("id", sa.Integer(), primary_key=True),
        _tenant_fk(),
        _job_fk(primary_key=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("event", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("tenant_id", "job_id", "round", name="uq_privacy_ledger_charge"),
    )
    op.create_index("ix_privacy_ledger_tenant_id", "privacy_ledger", ["tenant_id"])
    op.create_table(
        "factor_snapshots",
        _tenant_fk(primary_key=True),
        _job_fk(),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("user_keys", sa.JSON(), nullable=False),
        sa.Column("factors", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("factor_snapshots", "privacy_ledger", "job_rounds", "round_uploads",
                  "job_clients", "training_jobs"):
        op.drop_table(table)
    with op.batch_alter_table("tenants") as batch:
        batch.drop_constraint("ck_tenants_delta", type_="check")
        batch.drop_column("ratings_version")
        batch.drop_column("privacy_delta")
