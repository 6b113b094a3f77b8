"""An upload's arrays that its tenant's staged local state already holds are stored once.

``round_uploads.from_state`` (JSON, upload field -> local state field) names the arrays of
a staged upload that are kept only in the same client's ``job_local_states`` version of
that round; ``round_uploads.upload`` holds them empty. A noise-free FedMC-ADMM upload is
W_i and Y_i of the new local state: 650 KB per tenant on MovieLens 1M, written and read
back once instead of twice.

Upgrade: uploads staged before keep every array in ``upload`` (``from_state`` NULL), which
the code reads as before, so a round in flight completes as it started. Downgrade: every
referencing upload gets its arrays back from the local state version it names.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("round_uploads") as batch:
        batch.add_column(sa.Column("from_state", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    from algorithms import Message

    bind = op.get_bind()
    rows = bind.execute(sa.text(
        "SELECT u.job_id, u.round, u.client_index, u.upload, u.from_state, s.state "
        "FROM round_uploads u JOIN job_local_states s ON s.job_id = u.job_id "
        "AND s.client_index = u.client_index AND s.round = u.round "
        "WHERE u.from_state IS NOT NULL")).all()
    for job_id, round_, client, upload, refs, state in rows:
        refs = json.loads(refs) if isinstance(refs, str) else refs
        local = Message.from_bytes(bytes(state))
        full = Message.from_bytes(bytes(upload)).replace(
            **{n: getattr(local, m) for n, m in refs.items()})
        bind.execute(sa.text("UPDATE round_uploads SET upload = :u WHERE job_id = :j "
                             "AND round = :r AND client_index = :c"),
                     {"u": full.to_bytes(), "j": job_id, "r": round_, "c": client})
    with op.batch_alter_table("round_uploads") as batch:
        batch.drop_column("from_state")
