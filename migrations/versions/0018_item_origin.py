"""How each catalogue item came to exist, and tuning jobs charged to the privacy ledger.

``items.origin``: ``admin`` (registered through ``PUT /v1/admin/items``, public by
construction) or ``upload`` (created as a side effect of an upload of a tenant with
``auto_create_items``: its existence is a function of a user's rating). Differentially
private jobs train on and serve registered items only. Items that exist before this
migration cannot be told apart and are taken as registered (``admin``).

``privacy_ledger.tuning_job_id``: a tuning job trains and scores on raw ratings, so it is
charged epsilon = infinity to every tenant it reads, in the same ledger as training jobs;
such a row has ``job_id`` NULL and ``tuning_job_id`` set (exactly one of the two is set).
Downgrade drops the tuning charges with the column.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("items") as batch:
        batch.add_column(sa.Column("origin", sa.String(16), nullable=False,
                                   server_default="admin"))
    with op.batch_alter_table("privacy_ledger") as batch:
        batch.alter_column("job_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column("tuning_job_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_privacy_ledger_tuning_job", "tuning_jobs",
                                 ["tuning_job_id"], ["id"], ondelete="CASCADE")
        batch.create_unique_constraint("uq_privacy_ledger_tuning_charge",
                                       ["tenant_id", "tuning_job_id"])
        batch.create_check_constraint("ck_privacy_ledger_one_job",
                                      "(job_id IS NULL) <> (tuning_job_id IS NULL)")


def downgrade() -> None:
    op.execute("DELETE FROM privacy_ledger WHERE job_id IS NULL")
    with op.batch_alter_table("privacy_ledger") as batch:
        batch.drop_constraint("ck_privacy_ledger_one_job", type_="check")
        batch.drop_constraint("uq_privacy_ledger_tuning_charge", type_="unique")
        batch.drop_constraint("fk_privacy_ledger_tuning_job", type_="foreignkey")
        batch.drop_column("tuning_job_id")
        batch.alter_column("job_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("items") as batch:
        batch.drop_column("origin")
