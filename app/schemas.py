"""Request and response bodies (``XCreate`` / ``XPublic`` / ``XsPublic(data, count)``).

Request bodies derive from :class:`app.inputs.Input` (no NUL characters, 422 naming the field)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from app.inputs import Input

Key = Field(min_length=1, max_length=255)


def _as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite returns naive datetimes; everything fedrec stores is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


UtcDatetime = Annotated[dt.datetime, AfterValidator(_as_utc)]


MAX_DB_INT = 2 ** 31 - 1
"""Largest id, offset, seed or count a request may carry: PostgreSQL's ``integer``."""
MAX_RATING_MAGNITUDE = 1e6
"""Bound on ``|rating_min|`` and ``|rating_max|``: squares and sums of ratings stay far
from float overflow however many tenants train together."""
MAX_RATING_SPAN = 1e6
"""Largest ``rating_max - rating_min``."""
MAX_PRIVACY_BUDGET = 1e6
#: the longest minimum retraining interval: 100 years (a larger one would overflow the
#: date arithmetic of every beat tick; "never" is scheduled_retraining off)
MAX_RETRAIN_SECONDS = 100 * 365.25 * 86400
"""Largest ``privacy_budget`` (epsilon); anything near it already means no privacy."""

DbInt = Annotated[int, Field(ge=0, le=MAX_DB_INT)]
"""A non-negative integer that fits the database's ``integer`` columns."""
DbId = Annotated[int, Field(ge=1, le=MAX_DB_INT)]
"""A row id: 1 to 2^31 - 1."""
PathId = Annotated[int, Path(ge=1, le=MAX_DB_INT)]
"""A row id in a URL path (422 naming it when out of range, never a database error)."""
Offset = Annotated[int, Query(ge=0, le=MAX_DB_INT)]
"""The ``offset`` of a list endpoint."""
Limit = Annotated[int, Query(ge=1, le=MAX_DB_INT,
                             description="Page size: at most FEDREC_MAX_PAGE_SIZE (default "
                                         "1000); 422 beyond.")]
RatingBound = Annotated[float, Field(ge=-MAX_RATING_MAGNITUDE, le=MAX_RATING_MAGNITUDE,
                                     allow_inf_nan=False)]


class TenantCreate(Input):
    """A new tenant. Besides the bounds of each field, ``rating_min`` must be smaller than
    ``rating_max`` and ``rating_max - rating_min`` at most 1e6 (JSON Schema cannot state
    a rule between two fields; the API answers 422 naming them)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "acme", "rating_min": 1.0, "rating_max": 5.0, "privacy_budget": 10.0},
        {"name": "movielens-lab", "rating_min": 0.5, "rating_max": 5.0,
         "privacy_budget": 8.0, "auto_create_items": True}]})

    name: str = Key
    rating_min: RatingBound = 1.0
    rating_max: RatingBound = 5.0
    privacy_budget: float = Field(gt=0, le=MAX_PRIVACY_BUDGET, allow_inf_nan=False,
                                  description="Total epsilon the tenant may spend.")
    auto_create_items: bool = Field(
        False, description="Add unknown items to the catalogue on upload instead of rejecting.")
    allow_non_private: bool = Field(
        False, description="Opt in to jobs that send this tenant's data without a DP "
                           "guarantee (dp mechanism 'none', or FedMGS). Each such "
                           "transmission is charged as epsilon = infinity, after which no "
                           "DP job can include the tenant. Off: such jobs get 409.")
    scheduled_retraining: bool = Field(
        False, description="Consent to scheduled retraining (beat), which charges this "
                           "tenant's budget. Off: beat never retrains a job including it.")
    retrain_min_seconds: float = Field(
        86400.0, ge=0, le=MAX_RETRAIN_SECONDS, allow_inf_nan=False,
        description="Least time between two scheduled retrainings including this tenant.")

    @model_validator(mode="after")
    def _scale(self) -> TenantCreate:
        if not self.rating_min < self.rating_max:
            raise ValueError("rating_min must be smaller than rating_max")
        if self.rating_max - self.rating_min > MAX_RATING_SPAN:
            raise ValueError(f"rating_max - rating_min must be at most {MAX_RATING_SPAN:g}")
        return self


class TenantPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    rating_min: float
    rating_max: float
    privacy_budget: float
    auto_create_items: bool
    allow_non_private: bool
    scheduled_retraining: bool
    retrain_min_seconds: float
    last_retrained_at: UtcDatetime | None
    created_at: UtcDatetime


class TenantUpdate(Input):
    """A change of a tenant's settings (PATCH): only the fields given change. The rating
    scale cannot change (stored ratings were checked against it)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"privacy_budget": 20.0}, {"name": "acme-eu", "scheduled_retraining": True}]})

    name: str = Field(None, min_length=1, max_length=255)
    privacy_budget: float = Field(
        None, gt=0, le=MAX_PRIVACY_BUDGET, allow_inf_nan=False, strict=True,
        description="The new total epsilon: a raise, or a cut no lower than what the "
                    "tenant has already spent (409 otherwise).")
    auto_create_items: bool = Field(None)
    allow_non_private: bool = Field(None)
    scheduled_retraining: bool = Field(None)
    retrain_min_seconds: float = Field(None, ge=0, le=MAX_RETRAIN_SECONDS,
                                       allow_inf_nan=False, strict=True)


Epsilon = float | Literal["infinity"]


class JobSpend(BaseModel):
    """One job's spend, side by side: what it asked for, its epsilon at the delta it asked
    for, and its charge to the budget (the same noise at the budget's delta)."""

    job_id: int
    requested_epsilon: float | None = Field(
        None, description="The job's target epsilon (user-level jobs; null for the tenant "
                          "unit, whose noise is given, not solved for a target).")
    requested_delta: float | None = Field(
        None, description="The delta the job's guarantee is stated at (null: no noise).")
    epsilon_at_requested_delta: Epsilon | None = Field(
        None, description="Epsilon this job spent, at requested_delta.")
    epsilon: Epsilon = Field(description="Epsilon this job spent at the budget's delta: "
                                         "what the budget is charged.")
    budget_delta: float | None = Field(None, description="The budget's delta.")
    transmissions: int


class TenantPrivacy(BaseModel):
    """A tenant's privacy spend: lifetime against its budget, and per job."""

    tenant_id: int
    note: str = Field("", description="Why a job's requested epsilon and its charge to the "
                                      "budget differ.")
    epsilon_spent: Epsilon = Field(description="Lifetime epsilon spent; \"infinity\" after "
                                               "a job that sent its data without noise.")
    epsilon_max: float = Field(description="The budget (total epsilon).")
    epsilon_remaining: float
    delta: float
    private: bool = Field(description="Whether the lifetime spend is still a DP guarantee.")
    transmissions: int = Field(description="Charged transmissions over all jobs.")
    jobs: list[JobSpend]


class TenantDetail(TenantPublic):
    """One tenant, with its privacy spend."""

    privacy: TenantPrivacy


class TenantAuditPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    tenant_id: int
    actor: str
    at: UtcDatetime
    changes: dict[str, dict[str, Any]] = Field(
        description="{field: {old, new}} of every field the change set.")


class TenantAuditLog(BaseModel):
    data: list[TenantAuditPublic]
    count: int


class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int


class ApiKeyCreate(Input):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=255)


class ApiKeyPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    tenant_id: int
    prefix: str
    name: str | None
    created_at: UtcDatetime
    revoked_at: UtcDatetime | None


class ApiKeyCreated(ApiKeyPublic):
    key: str = Field(description="The secret key. Shown once; only its hash is stored.")


class ApiKeysPublic(BaseModel):
    data: list[ApiKeyPublic]
    count: int


class ItemIn(Input):
    model_config = ConfigDict(extra="forbid")

    key: str = Key
    title: str | None = None


class ItemsUpsert(Input):
    model_config = ConfigDict(extra="forbid")

    items: list[ItemIn] = Field(min_length=1)


class ItemPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    key: str
    title: str | None


class ItemsPublic(BaseModel):
    data: list[ItemPublic]
    count: int


class ItemsUpserted(BaseModel):
    upserted: int


class RatingIn(Input):
    """One rating of an upload (documentation of the JSON body)."""

    user: str
    item: str
    rating: float
    timestamp: float | str | None = Field(None, description="Unix seconds or ISO 8601.")


class RatingsUpload(Input):
    ratings: list[RatingIn]


class RatingPublic(BaseModel):
    user: str
    item: str
    rating: float
    timestamp: UtcDatetime | None


class RatingsPublic(BaseModel):
    data: list[RatingPublic]
    count: int


class RatingsCount(BaseModel):
    count: int
    users: int


class UploadResult(BaseModel):
    stored: int = Field(description="Rows inserted or updated (exact duplicates counted once).")


class TenantDeleted(BaseModel):
    id: int
    name: str
    ratings: int = Field(description="Ratings deleted with the tenant.")
    users: int = Field(description="Users deleted with the tenant.")


class UserRatingsDeleted(BaseModel):
    user: str
    deleted: int
    agent: bool | None = None
    """True (status 202; absent otherwise): the tenant is an agent tenant; its ``fedrec
    agent`` forgets the user on the tenant's machine when it next polls (the coordinator
    holds no ratings of it)."""


class TaskEnqueued(BaseModel):
    task_id: str
    status: str


class RatingStatsPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    tenant_id: int
    n_ratings: int
    n_users: int
    n_items: int
    mean: float | None
    histogram: dict[str, int]
    computed_at: UtcDatetime


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    database: str
    broker: str
