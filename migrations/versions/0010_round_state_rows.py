"""Rounds without blob churn: per-client server-state parts, versioned local states,
digests beside the blobs.

``job_server_parts`` holds each client's rows of a server state's ``client_parts`` arrays
(the job row keeps the rest); ``job_local_states`` holds versions of each tenant's local
state (``job_clients.state_round`` names the committed one; the client step stages the
next instead of ``round_uploads.local_state``); ``job_clients`` gets the digests of its
blocks. Existing jobs are converted in place, both ways. On PostgreSQL the state columns
are stored uncompressed (``STORAGE EXTERNAL``): float arrays do not compress, and trying
costs CPU on every write.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_EXTERNAL = [("job_local_states", "state"), ("job_server_parts", "part"),
             ("training_jobs", "server_state"), ("training_jobs", "global_msg"),
             ("round_uploads", "upload")]


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _part(state, i: int) -> bytes:
    buf = io.BytesIO()
    for name in state.client_parts:
        np.save(buf, np.ascontiguousarray(getattr(state, name)[i]), allow_pickle=False)
    return buf.getvalue()


def upgrade() -> None:
    from algorithms import Message

    op.create_table(
        "job_local_states",
        sa.Column("job_id", sa.Integer(),
                  sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("client_index", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "client_index", "round"),
    )
    op.create_table(
        "job_server_parts",
        sa.Column("job_id", sa.Integer(),
                  sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("client_index", sa.Integer(), nullable=False),
        sa.Column("part", sa.LargeBinary(), nullable=False),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "client_index"),
    )
    with op.batch_alter_table("job_clients") as batch:
        batch.add_column(sa.Column("train_digest", sa.String(32), nullable=True))
        batch.add_column(sa.Column("test_digest", sa.String(32), nullable=True))
        batch.add_column(sa.Column("state_round", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("state_digest", sa.String(32), nullable=True))
    with op.batch_alter_table("training_jobs", recreate="never") as batch:  # parent of cascades
        batch.add_column(sa.Column("global_digest", sa.String(32), nullable=True))
    bind = op.get_bind()
    locals_ = sa.table("job_local_states", sa.column("job_id"), sa.column("client_index"),
                       sa.column("round"), sa.column("state"), sa.column("digest"))
    parts = sa.table("job_server_parts", sa.column("job_id"), sa.column("client_index"),
                     sa.column("part"), sa.column("digest"))
    for job_id, current in bind.execute(sa.text("SELECT id, current_round FROM training_jobs")
                                        ).all():
        for index, train, test, state in bind.execute(sa.text(
                "SELECT client_index, train_block, test_block, local_state FROM job_clients "
                "WHERE job_id = :j"), {"j": job_id}).all():
            kept = bool(state)  # b"": an agent's (its state stays on its machine)
            bind.execute(sa.text(
                "UPDATE job_clients SET train_digest = :a, test_digest = :b, state_round = :r, "
                "state_digest = :d WHERE job_id = :j AND client_index = :i"),
                {"a": _digest(bytes(train)), "b": _digest(bytes(test)),
                 "r": current if kept else None, "d": _digest(bytes(state)) if kept else None,
                 "j": job_id, "i": index})
            if kept:
                bind.execute(sa.insert(locals_), {"job_id": job_id, "client_index": index,
                                                  "round": current, "state": bytes(state),
                                                  "digest": _digest(bytes(state))})
        for round_, index, state in bind.execute(sa.text(
                "SELECT round, client_index, local_state FROM round_uploads "
                "WHERE job_id = :j AND round > :c"), {"j": job_id, "c": current}).all():
            if state:
                bind.execute(sa.insert(locals_), {"job_id": job_id, "client_index": index,
                                                  "round": round_, "state": bytes(state),
                                                  "digest": _digest(bytes(state))})
        glob = bind.scalar(sa.text("SELECT global_msg FROM training_jobs WHERE id = :j"),
                           {"j": job_id})
        if glob is not None:
            bind.execute(sa.text("UPDATE training_jobs SET global_digest = :d WHERE id = :j"),
                         {"d": _digest(bytes(glob)), "j": job_id})
        blob = bind.scalar(sa.text("SELECT server_state FROM training_jobs WHERE id = :j"),
                           {"j": job_id})
        if blob:
            state = Message.from_bytes(bytes(blob))
            if state.client_parts:
                n = getattr(state, state.client_parts[0]).shape[0]
                for i in range(n):
                    part = _part(state, i)
                    bind.execute(sa.insert(parts), {"job_id": job_id, "client_index": i,
                                                    "part": part, "digest": _digest(part)})
                shared = state.replace(**{m: getattr(state, m)[:0]
                                          for m in state.client_parts}).to_bytes()
                bind.execute(sa.text("UPDATE training_jobs SET server_state = :s "
                                     "WHERE id = :j"), {"s": shared, "j": job_id})
    with op.batch_alter_table("job_clients") as batch:
        batch.alter_column("train_digest", existing_type=sa.String(32), nullable=False)
        batch.alter_column("test_digest", existing_type=sa.String(32), nullable=False)
        batch.drop_column("local_state")
    with op.batch_alter_table("round_uploads") as batch:
        batch.drop_column("local_state")
    if bind.dialect.name == "postgresql":
        for table, column in _EXTERNAL:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTERNAL")


def downgrade() -> None:
    from algorithms import Message

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for table, column in _EXTERNAL[2:]:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTENDED")
    with op.batch_alter_table("job_clients") as batch:
        batch.add_column(sa.Column("local_state", sa.LargeBinary(), nullable=True))
    with op.batch_alter_table("round_uploads") as batch:
        batch.add_column(sa.Column("local_state", sa.LargeBinary(), nullable=True))
    bind.execute(sa.text(
        "UPDATE job_clients SET local_state = (SELECT s.state FROM job_local_states s "
        "WHERE s.job_id = job_clients.job_id AND s.client_index = job_clients.client_index "
        "AND s.round = job_clients.state_round)"))
    bind.execute(sa.text(
        "UPDATE round_uploads SET local_state = (SELECT s.state FROM job_local_states s "
        "WHERE s.job_id = round_uploads.job_id AND s.client_index = round_uploads.client_index"
        " AND s.round = round_uploads.round)"))
    bind.execute(sa.text("UPDATE job_clients SET local_state = :e WHERE local_state IS NULL"),
                 {"e": b""})
    bind.execute(sa.text("UPDATE round_uploads SET local_state = :e WHERE local_state IS NULL"),
                 {"e": b""})
    for job_id, blob in bind.execute(sa.text(
            "SELECT id, server_state FROM training_jobs WHERE server_state IS NOT NULL")).all():
        state = Message.from_bytes(bytes(blob))
        if not state.client_parts:
            continue
        rows = bind.execute(sa.text("SELECT part FROM job_server_parts WHERE job_id = :j "
                                    "ORDER BY client_index"), {"j": job_id}).scalars().all()
        decoded = []
        for part in rows:
            buf = io.BytesIO(bytes(part))
            decoded.append([np.load(buf, allow_pickle=False) for _ in state.client_parts])
        full = state.replace(**{m: np.stack([d[k] for d in decoded])
                                for k, m in enumerate(state.client_parts)})
        bind.execute(sa.text("UPDATE training_jobs SET server_state = :s WHERE id = :j"),
                     {"s": full.to_bytes(), "j": job_id})
    with op.batch_alter_table("job_clients") as batch:
        batch.alter_column("local_state", existing_type=sa.LargeBinary(), nullable=False)
        batch.drop_column("state_digest")
        batch.drop_column("state_round")
        batch.drop_column("test_digest")
        batch.drop_column("train_digest")
    with op.batch_alter_table("round_uploads") as batch:
        batch.alter_column("local_state", existing_type=sa.LargeBinary(), nullable=False)
    with op.batch_alter_table("training_jobs", recreate="never") as batch:  # parent of cascades
        batch.drop_column("global_digest")
    op.drop_table("job_server_parts")
    op.drop_table("job_local_states")
