"""Bodies of the training, recommendation and report endpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import MAX_DB_INT, DbId, UtcDatetime


class DPSettings(BaseModel):
    """Differential privacy of every upload (see the README's privacy section)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mechanism: Literal["none", "laplace", "gaussian"] = "gaussian"
    norm: Literal["l2", "l1", "value"] | None = None
    clip: float = Field(1.0, gt=0)
    noise_multiplier: float | None = Field(None, gt=0)
    noise_scale: float | None = Field(None, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)


class PrivacySettings(BaseModel):
    """User-level differential privacy (see the README's privacy section): the service
    solves the noise for ``target_epsilon`` at ``delta`` over the job's releases."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    unit: Literal["user"] = Field(
        "user", description="Protected unit: one user (all of one person's ratings). The "
                            "tenant unit is the 'dp' field.")
    placement: Literal["central", "tenant"] = Field(
        "central", description="central: the aggregation step noises the sum of the tenants' "
                               "bounded contributions once; tenant: each tenant noises its own "
                               "(protects against the coordinator too, at T times the noise "
                               "variance).")
    target_epsilon: float = Field(gt=0, le=100, description="Epsilon of the whole job per user.")
    delta: float = Field(1e-6, gt=0, lt=1,
                         description="Delta of the guarantee; must be below 1 / number of users.")


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    algorithm: str = Field("dpals", description="dpals, dp-fedmavg or dp-fedmc-admm "
                                                "(user-level DP), fedmc-admm, fedmavg, "
                                                "rfrec, rfrecf, or fedmgs (not private)")
    config: dict[str, Any] = Field(default_factory=dict,
                                   description="Algorithm options (e.g. rank); defaults are "
                                               "the algorithm's recommended settings.")
    tenant_ids: list[DbId] | None = Field(
        None, min_length=1,
        description="Participants; omitted or null: all tenants (an empty list is refused). "
                    "At most FEDREC_MAX_JOB_TENANTS (default 1000).")
    rounds: int = Field(50, ge=1, description="At most FEDREC_MAX_JOB_ROUNDS (default 10000).")
    per_round: int = Field(0, ge=0, le=MAX_DB_INT,
                           description="Tenants sampled per round; 0 = all.")
    seed: int = Field(0, ge=0, le=MAX_DB_INT)
    dp: DPSettings | None = Field(
        None, description="Tenant-unit DP of every upload (a tenant's whole block protected). "
                          "Give either this or 'privacy'.")
    privacy: PrivacySettings | None = Field(
        None, description="User-level DP (algorithms dpals, dp-fedmavg, dp-fedmc-admm). "
                          "With neither 'dp' nor "
                          "'privacy': user level (target_epsilon 8, delta 1e-6) for an "
                          "algorithm that can bound a user, else dp Gaussian with noise "
                          "multiplier 1.")
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    allow_not_private: bool = False


class TenantPlan(BaseModel):
    epsilon_spent: float | Literal["infinity"]
    epsilon_after: float | Literal["infinity"] = Field(
        description="Epsilon spent once the job has run (at the budget's delta).")
    epsilon_max: float
    delta: float


class JobPlanPublic(BaseModel):
    """A dry run's answer: nothing was created or charged."""

    dry_run: Literal[True] = True
    algorithm: str
    privacy: dict[str, Any] = Field(description="The job's privacy settings, with the noise "
                                                "solved for the target.")
    tenants: dict[str, TenantPlan]


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    status: str
    algorithm: str
    config: dict[str, Any]
    dp: dict[str, Any]
    rounds: int
    per_round: int
    seed: int
    tenant_ids: list[int]
    current_round: int
    progress: float
    latest_metrics: dict[str, Any] | None
    stopped_tenants: dict[str, Any] | None
    error: str | None
    parent_job_id: int | None
    created_at: UtcDatetime
    finished_at: UtcDatetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class RoundPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    round: int
    objective: float | None
    test_rmse: float | None
    test_mae: float | None
    uploads: int
    seconds: float


class TenantRoundPublic(BaseModel):
    round: int
    test_rmse: float | None
    test_mae: float | None
    n_test: int


class JobReport(BaseModel):
    job: JobPublic
    curve: list[RoundPublic]
    per_tenant: dict[str, list[TenantRoundPublic]]
    privacy: dict[str, Any]


class Recommendation(BaseModel):
    item: str
    title: str | None
    score: float


class RecommendationsPublic(BaseModel):
    user: str
    source: Literal["model", "popularity"] = Field(
        description="'model': the tenant's learned factors; 'popularity': cold-start "
                    "fallback (user unknown to the model), the damped mean rating.")
    job_id: int | None
    data: list[Recommendation]
    k: int
    offset: int


class BatchRecommendationsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: list[str] = Field(min_length=1, max_length=1000)
    k: int = Field(10, ge=1, description="At most FEDREC_MAX_TOP_K (default 1000).")
    include_rated: bool = False


class BatchRecommendationsPublic(BaseModel):
    data: list[RecommendationsPublic]
    not_found: list[str]


class TenantReport(BaseModel):
    tenant_id: int
    job_id: int | None
    curve: list[TenantRoundPublic]
    privacy: dict[str, Any]
