"""Tenant administration: the Idempotency-Key a tenant was created with, and the audit
log of changes made to tenants (PATCH /admin/tenants/{id}).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        batch.create_unique_constraint("uq_tenants_idempotency_key", ["idempotency_key"])
    op.create_table(
        "tenant_audit",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changes", sa.JSON(), nullable=False),
    )
    op.create_index("ix_tenant_audit_tenant_id", "tenant_audit", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_tenant_audit_tenant_id", table_name="tenant_audit")
    op.drop_table("tenant_audit")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_constraint("uq_tenants_idempotency_key", type_="unique")
        batch.drop_column("request_hash")
        batch.drop_column("idempotency_key")
