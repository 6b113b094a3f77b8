"""Tables of training jobs, their per-tenant state, rounds, ledger and factor snapshots.

Durability rules (the architecture's invariants 2-4):

* A client step stores its new local state (a new version in :class:`JobLocalState`),
  its (privatised) upload and the privacy charge of that upload in one transaction
  (:class:`RoundUpload` + :class:`LedgerEntry`); re-running it for the same (job, round,
  client) never stores or charges twice (unique keys).
* A round completes in one transaction: the server state (the shared part on the job,
  each tenant's part in :class:`JobServerPart`, only the parts that changed written), the
  global message, the staged local states (committed by pointing ``JobClient.state_round``
  at their version: no bytes are copied), the round's metrics and ``current_round`` move
  together, so a crash loses at most the round in flight.
* Every stored state and block carries a digest of its bytes, so a worker's in-memory
  copy is checked against the database without fetching the blob
  (:mod:`app.training.states`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.models import Base, utcnow

JOB_STATUSES = ("queued", "running", "completed", "failed", "cancelled")


class TrainingJob(Base):
    """A federated training run over a fixed snapshot of some tenants' ratings."""

    __tablename__ = "training_jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(sa.String(16), default="queued")
    algorithm: Mapped[str] = mapped_column(sa.String(32))
    config: Mapped[dict[str, Any]]
    dp: Mapped[dict[str, Any]]
    rounds: Mapped[int]
    per_round: Mapped[int]
    seed: Mapped[int]
    test_fraction: Mapped[float]
    tenant_ids: Mapped[list[int]] = mapped_column(sa.JSON)
    item_ids: Mapped[bytes] = mapped_column(sa.LargeBinary, deferred=True)
    """int64 ids of the items (columns of V), as raw bytes."""
    current_round: Mapped[int] = mapped_column(default=0)
    """Number of completed rounds."""
    # The blobs are deferred (loaded on first access, or up front with ``undefer``):
    # status polls, reports and client steps must not drag the server state around.
    global_msg: Mapped[bytes | None] = mapped_column(sa.LargeBinary, deferred=True)
    global_digest: Mapped[str | None] = mapped_column(sa.String(32))
    """Digest of ``global_msg`` (migration 0010): a worker that holds it skips the fetch."""
    server_state: Mapped[bytes | None] = mapped_column(sa.LargeBinary, deferred=True)
    """The server state without its per-client parts (those are :class:`JobServerPart`
    rows): :func:`app.training.states.load_server` joins them."""
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    error: Mapped[str | None] = mapped_column(sa.Text)
    stopped_tenants: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    """tenant id -> why it stopped transmitting (budget exhausted mid-run)."""
    parent_job_id: Mapped[int | None] = mapped_column(sa.ForeignKey("training_jobs.id"))
    ratings_version: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    """tenant id -> the tenant's ratings_version when the snapshot was taken."""
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(255))
    """The ``Idempotency-Key`` the job was created with (migration 0003)."""
    request_hash: Mapped[str | None] = mapped_column(sa.String(64))
    """SHA-256 of the creating request's body: a replay must match it."""
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")
    """Failed steps since the last committed round; at ``max_attempts`` the job fails."""
    max_attempts: Mapped[int] = mapped_column(default=3, server_default="3")
    agents: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    """Agent tenants (migration 0005): ``{"tenants": [ids], "round_seconds": deadline of a
    round, "wire": "float64"|"float32", "upload": schema of an upload}``; None: all hosted.
    An agent tenant's ratings are not in this database: its client step runs in
    ``fedrec agent`` on the tenant's machine (:mod:`app.training.agents`)."""
    reserved: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    """tenant id -> the events the job planned to charge it (migration 0018_h8), counted
    against the tenant's budget while the job is queued or running
    (:mod:`app.training.reservations`); None: stored before reservations."""

    pair_job_id: Mapped[int | None]
    """The job created together with this one (migration 0018_h6): the default job is a
    ranking model, which serves lists, paired with a rating model, which predicts
    ratings and feeds the RMSE report. No foreign key (see the migration); a deleted
    pair is simply not found."""
    validation_fraction: Mapped[float] = mapped_column(default=0.0, server_default="0")
    """Share of each hosted tenant's training ratings carved out to choose the run length
    (:mod:`app.training.selection`); 0: the configured rounds run."""
    selection: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    """What the validation carve-out chose: metric, best round and value, why it stopped
    (or why the job does not select, e.g. a DP job)."""
    serving: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))
    """Whether the model or popularity serves the lists, why, and both on held-out data."""

    __table_args__ = (sa.UniqueConstraint("idempotency_key",
                                          name="uq_training_jobs_idempotency_key"),)

    @property
    def model_kind(self) -> str:
        """"ranking" (serves top-k lists) or "rating" (predicts ratings)."""
        from algorithms.registry import model_kind

        return model_kind(self.algorithm)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[dt.datetime | None]


class JobClient(Base):
    """Tenant ``tenant_id`` as client ``client_index`` of a job, with its private state."""

    __tablename__ = "job_clients"

    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    client_index: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                                           index=True)
    user_keys: Mapped[list[str]] = mapped_column(sa.JSON)
    train_block: Mapped[bytes] = mapped_column(sa.LargeBinary, deferred=True)
    test_block: Mapped[bytes] = mapped_column(sa.LargeBinary, deferred=True)
    train_digest: Mapped[str] = mapped_column(sa.String(32))
    """blake2b-128 of ``train_block`` (:func:`app.training.states.digest`), kept with it."""
    test_digest: Mapped[str] = mapped_column(sa.String(32))
    state_round: Mapped[int | None]
    """The round of the committed local state (its :class:`JobLocalState` version); None
    for an agent tenant, whose state stays on its machine."""
    state_digest: Mapped[str | None] = mapped_column(sa.String(32))
    """The digest of that version (a worker holding it in memory reads nothing more)."""
    transmissions: Mapped[int] = mapped_column(default=0)


class JobLocalState(Base):
    """A version of a tenant's private state in a job: the one written at round ``round``
    (0: initial). ``JobClient.state_round`` names the committed one; a later version is
    staged by the round in flight. The aggregate step deletes versions it supersedes."""

    __tablename__ = "job_local_states"

    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    client_index: Mapped[int] = mapped_column(primary_key=True)
    round: Mapped[int] = mapped_column(primary_key=True)
    state: Mapped[bytes] = mapped_column(sa.LargeBinary, deferred=True)
    digest: Mapped[str] = mapped_column(sa.String(32))


class JobServerPart(Base):
    """Client ``client_index``'s part of the job's server state (the rows of the state's
    ``client_parts`` arrays that belong to it, e.g. FedMC-ADMM's contribution C_i),
    rewritten only when the server step changed it."""

    __tablename__ = "job_server_parts"

    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    client_index: Mapped[int] = mapped_column(primary_key=True)
    part: Mapped[bytes] = mapped_column(sa.LargeBinary, deferred=True)
    digest: Mapped[str] = mapped_column(sa.String(32))


class RoundUpload(Base):
    """What a client step produced in a round, staged until the round is aggregated."""

    __tablename__ = "round_uploads"

    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    round: Mapped[int] = mapped_column(primary_key=True)
    client_index: Mapped[int] = mapped_column(primary_key=True)
    upload: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    """The privatised upload; None when nothing was sent (or the budget refused it)."""
    from_state: Mapped[dict[str, str] | None] = mapped_column(sa.JSON(none_as_null=True))
    """Upload field -> field of the client's local state version of this round that holds
    its array (migration 0013): stored once, there, and empty in ``upload``
    (:func:`app.training.states.stage_upload`); None: every array is in ``upload``."""
    refused: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class SecAggMessage(Base):
    """One agent's secure-aggregation message of one phase of a round (keys, shares, masked,
    unmask: :mod:`app.training.secure`), staged as uploads are; never an unmasked upload."""

    __tablename__ = "secagg_messages"

    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    round: Mapped[int] = mapped_column(primary_key=True)
    client_index: Mapped[int] = mapped_column(primary_key=True)
    phase: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    body: Mapped[str] = mapped_column(sa.Text)
    """The message as JSON (:func:`privacy.secagg.to_wire`)."""
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class JobRound(Base):
    """Metrics of one completed round (the training curve)."""

    __tablename__ = "job_rounds"

    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    round: Mapped[int] = mapped_column(primary_key=True)
    objective: Mapped[float | None]
    test_rmse: Mapped[float | None]
    test_mae: Mapped[float | None]
    per_tenant: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    """tenant id -> {"test_rmse", "test_mae", "n_test"}."""
    ranking: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
    """Final round only: {"overall": {...}, "per_tenant": {...}} of
    :func:`app.training.evaluation.job_ranking`."""
    participants: Mapped[list[int]] = mapped_column(sa.JSON)
    uploads: Mapped[int]
    seconds: Mapped[float]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class LedgerEntry(Base):
    """One privacy charge: a noisy transmission of a tenant in a round of a job."""

    __tablename__ = "privacy_ledger"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                                           index=True)
    job_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"))
    #: a tuning job's charge (epsilon = infinity) instead of a training job's (0018_h3)
    tuning_job_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("tuning_jobs.id", ondelete="CASCADE",
                      name="fk_privacy_ledger_tuning_job"))
    round: Mapped[int]
    event: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (sa.UniqueConstraint("tenant_id", "job_id", "round",
                                          name="uq_privacy_ledger_charge"),
                      sa.UniqueConstraint("tenant_id", "tuning_job_id",
                                          name="uq_privacy_ledger_tuning_charge"),
                      sa.CheckConstraint("(job_id IS NULL) <> (tuning_job_id IS NULL)",
                                         name="ck_privacy_ledger_one_job"))


class FactorSnapshot(Base):
    """The latest serving factors of a tenant from a job: scores = A[user] @ B."""

    __tablename__ = "factor_snapshots"

    tenant_id: Mapped[int] = mapped_column(
        sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(
        sa.ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    round: Mapped[int]
    user_keys: Mapped[list[str]] = mapped_column(sa.JSON)
    factors: Mapped[bytes] = mapped_column(sa.LargeBinary)
    """npz with A (users x r'), B (r' x items) and item_ids."""
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class TuningJob(Base):
    """A hyper-parameter search on a validation carve-out of some tenants' training
    ratings (``POST /v1/admin/tuning-jobs``, :mod:`app.training.tuning`; migration 0010)."""

    __tablename__ = "tuning_jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(sa.String(16), default="queued")
    algorithm: Mapped[str] = mapped_column(sa.String(32))
    base_config: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    """The request's fields of the base config; a trial replaces those it draws."""
    tenant_ids: Mapped[list[int]] = mapped_column(sa.JSON)
    rounds: Mapped[int]
    per_round: Mapped[int]
    seed: Mapped[int]
    test_fraction: Mapped[float]
    trials: Mapped[int]
    eta: Mapped[int]
    budget_seconds: Mapped[float]
    metric: Mapped[str] = mapped_column(sa.String(8), default="rmse", server_default="rmse")
    """What the search chooses by: "rmse" or "ndcg" (migration 0018_h6)."""
    scored: Mapped[list[dict[str, Any]] | None] = mapped_column(sa.JSON)
    """Every trial evaluation so far (params, rounds, validation RMSE), in order."""
    result: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    """Once completed: the chosen config and the search's figures."""
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]
    attempt: Mapped[int] = mapped_column(default=0, server_default="0")
    """How many runs have claimed the job; only the latest may store progress or a result."""
    heartbeat_at: Mapped[dt.datetime | None]
    """Stamped by the running search every few seconds; stale means its worker died."""
