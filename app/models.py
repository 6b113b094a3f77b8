"""SQLAlchemy 2 ORM models. The schema itself is created by the Alembic migrations.

Later issues add training jobs, rounds, factor snapshots and the privacy ledger as new
classes on the same :class:`Base` plus a new migration.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

KEY_LENGTH = 255


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    # Float (double precision on PostgreSQL), as the migrations declare it.
    type_annotation_map = {dt.datetime: sa.DateTime(timezone=True), dict[str, Any]: sa.JSON,
                           float: sa.Float()}


class Tenant(Base):
    """An organisation holding a private block of ratings."""

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(KEY_LENGTH), unique=True)
    rating_min: Mapped[float]
    rating_max: Mapped[float]
    privacy_budget: Mapped[float]
    auto_create_items: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    privacy_delta: Mapped[float] = mapped_column(default=1e-5, server_default="1e-05")
    """The delta of the tenant's (epsilon, delta) budget (migration 0002)."""
    ratings_version: Mapped[int] = mapped_column(default=0, server_default="0")
    """Bumped by every upload or deletion that changes a rating; retraining starts only
    when it changed."""
    # Opt-ins set by the admin at creation (migration 0003); all off by default.
    allow_non_private: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    """The tenant accepts jobs that send its data without a DP guarantee (charged to its
    ledger as epsilon = infinity, which ends every later DP job for it)."""
    scheduled_retraining: Mapped[bool] = mapped_column(default=False,
                                                       server_default=sa.false())
    """Beat may retrain jobs that include the tenant (and charge its budget)."""
    retrain_min_seconds: Mapped[float] = mapped_column(default=86400.0,
                                                       server_default="86400")
    """At least this long between two scheduled retrainings that include the tenant."""
    last_retrained_at: Mapped[dt.datetime | None]
    """When the latest scheduled retraining including the tenant was started."""
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(KEY_LENGTH))
    """The ``Idempotency-Key`` the tenant was created with (migration 0007)."""
    request_hash: Mapped[str | None] = mapped_column(sa.String(64))
    """SHA-256 of the creating request's body: a replay of the key must match it."""

    __table_args__ = (
        sa.CheckConstraint("rating_min < rating_max", name="ck_tenants_scale"),
        sa.CheckConstraint("privacy_budget > 0", name="ck_tenants_budget"),
        sa.CheckConstraint("retrain_min_seconds >= 0", name="ck_tenants_retrain_min"),
        sa.UniqueConstraint("idempotency_key", name="uq_tenants_idempotency_key"),
    )


class TenantAudit(Base):
    """One change of a tenant's settings by an admin (PATCH): who, when, old and new."""

    __tablename__ = "tenant_audit"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(
        sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    actor: Mapped[str] = mapped_column(sa.String(KEY_LENGTH))
    """``admin:<fingerprint of the admin token>``, plus the ``X-Actor`` header if given."""
    at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    changes: Mapped[dict[str, Any]]
    """``{field: {"old": value, "new": value}}`` of every field the request changed."""


class ApiKey(Base):
    """A tenant API key: only a SHA-256 of the full key is stored; ``prefix`` finds it."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(
        sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(sa.String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(sa.String(64))
    name: Mapped[str | None] = mapped_column(sa.String(KEY_LENGTH))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[dt.datetime | None]


REGISTERED = "admin"
"""``Item.origin`` of an item an admin created (the pre-registered, public catalogue)."""
UPLOADED = "upload"
"""``Item.origin`` of an item an upload created (``auto_create_items``)."""


class Item(Base):
    """The shared item catalogue; ``key`` is the external id tenants use."""

    __tablename__ = "items"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(KEY_LENGTH), unique=True)
    title: Mapped[str | None] = mapped_column(sa.Text)
    #: ``admin`` (registered: public, what differentially private jobs train on and
    #: serve) or ``upload`` (created by an upload with ``auto_create_items``; migration
    #: 0018_h3)
    origin: Mapped[str] = mapped_column(sa.String(16), default=REGISTERED,
                                        server_default=REGISTERED)


class User(Base):
    """A tenant's end user, known by the tenant's external key; never shared across tenants.

    Ratings point at this integer id, which keeps the rating index small and fast to
    build; deleting the user (right to be forgotten) cascades to the ratings.
    """

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(sa.String(KEY_LENGTH))

    __table_args__ = (sa.UniqueConstraint("tenant_id", "key", name="uq_users_tenant_key"),)


class Rating(Base):
    """One rating; re-uploading the same (user, item) updates value and timestamp.

    The composite primary key is the uniqueness rule and the index for per-user queries.
    Neither column has a foreign key, on purpose: the per-row check costs more than the
    insert itself in a bulk upload (measured on PostgreSQL: 5.5 of the 7 CPU-seconds of a
    1M-row COPY went to the ``users`` check; migration 0007). Items are never deleted and
    uploads resolve item ids from the catalogue in the same transaction; uploads lock each
    existing user they write to (``FOR KEY SHARE``) and :func:`app.store.delete_user`
    locks the user before deleting its ratings and then the user, so no rating outlives
    its user.
    """

    __tablename__ = "ratings"

    user_id: Mapped[int] = mapped_column(primary_key=True)
    item_id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[float] = mapped_column(sa.Float)
    rated_at: Mapped[dt.datetime | None]


class IdempotencyRecord(Base):
    """The stored response of a request made with an ``Idempotency-Key`` header."""

    __tablename__ = "idempotency_records"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(sa.String(KEY_LENGTH))
    request_hash: Mapped[str] = mapped_column(sa.String(64))
    status_code: Mapped[int]
    response: Mapped[dict[str, Any]]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (sa.UniqueConstraint("tenant_id", "key", name="uq_idempotency_tenant_key"),)


class RatingStats(Base):
    """Statistics of a tenant's rating block, computed by the Celery task."""

    __tablename__ = "rating_stats"

    tenant_id: Mapped[int] = mapped_column(
        sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    n_ratings: Mapped[int]
    n_users: Mapped[int]
    n_items: Mapped[int]
    mean: Mapped[float | None]
    histogram: Mapped[dict[str, Any]]
    computed_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ForgottenUser(Base):
    """A tombstone: the tenant deleted this user (right to be forgotten).

    ``version`` is the tenant's ``ratings_version`` right after the deletion. A training
    job recorded the version its snapshot of the tenant's ratings was taken at, so the
    tombstone applies exactly to the jobs whose data predates the deletion (version below
    it): every step of those jobs leaves the user's ratings and factor row out, even when
    the job's rows were committed after the deletion. Ratings uploaded later for the same
    key are a new consent: jobs snapshotted after the deletion train on them.
    """

    __tablename__ = "forgotten_users"

    tenant_id: Mapped[int] = mapped_column(
        sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    user_key: Mapped[str] = mapped_column(sa.String(KEY_LENGTH), primary_key=True)
    version: Mapped[int]
    forgotten_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (sa.Index("ix_forgotten_users_tenant_version", "tenant_id", "version"),)


class RevokedSession(Base):
    """A dashboard session ended by signing out: its cookie (by SHA-256) is refused by every
    API process until it would have expired anyway (then the row may be pruned)."""

    __tablename__ = "revoked_sessions"

    digest: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    expires_at: Mapped[dt.datetime] = mapped_column(index=True)
