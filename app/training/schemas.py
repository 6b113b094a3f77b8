"""Bodies of the training, recommendation and report endpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.inputs import Input
from app.schemas import MAX_DB_INT, DbId, UtcDatetime


class DPSettings(Input):
    """Differential privacy of every upload (docs/explanation/privacy.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mechanism: Literal["none", "laplace", "gaussian"] = "gaussian"
    norm: Literal["l2", "l1", "value"] | None = None
    # bounds keep the accountant's arithmetic finite (a noise multiplier of 5e-324
    # overflowed it: a 500); anything near them already spends an enormous epsilon
    clip: float = Field(1.0, gt=0, le=1e6)
    noise_multiplier: float | None = Field(None, ge=1e-6, le=1e6)
    noise_scale: float | None = Field(None, ge=1e-6, le=1e12)
    delta: float = Field(1e-5, ge=1e-12, lt=1)


class PrivacySettings(Input):
    """User-level differential privacy (docs/explanation/privacy.md): the service
    solves the noise for ``target_epsilon`` at ``delta`` over the job's releases."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    unit: Literal["user"] = Field(
        "user", description="Protected unit: one user account of one tenant (all of its "
                            "ratings; a person with accounts in k tenants is k units). The "
                            "tenant unit is the 'dp' field.")
    placement: Literal["central", "tenant"] = Field(
        "central", description="central: the aggregation step noises the sum of the tenants' "
                               "bounded contributions once; tenant: each tenant noises its own "
                               "(protects against the coordinator too, at T times the noise "
                               "variance).")
    target_epsilon: float = Field(ge=0.01, le=100, description=(
        "Epsilon of the whole job per user; at least 0.01 (a smaller target needs more "
        "noise than the accountant can solve for)."))
    delta: float = Field(1e-6, ge=1e-12, lt=1,
                         description="Delta of the guarantee; must be below 1 / number of "
                                     "users, and at least 1e-12.")
    secure_aggregation: bool = Field(
        False, description="Placement tenant only, every tenant an agent: the agents add "
                           "distributed discrete Gaussian noise and mask their uploads "
                           "(Bonawitz et al.); the coordinator unmasks only the round's sum, "
                           "which carries the noise of central placement.")
    dropout_tolerance: float = Field(
        0.1, ge=0, lt=0.5, description="Secure aggregation: largest fraction of a round's "
                                       "agents that may drop out after sending their shares.")


class JobCreate(Input):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    algorithm: str | None = Field(
        None, description="Omitted or null: the default job, a ranking model (dp-ials) that "
                          "serves the lists and a rating model (dpals) that predicts ratings "
                          "and feeds the RMSE report, created together (each at half the "
                          "privacy target). Or one model: dp-ials, dpals, dp-fedmavg or "
                          "dp-fedmc-admm (user-level DP), ials, fedmc-admm, fedmavg, rfrec, "
                          "rfrecf, or fedmgs (not private).")
    config: dict[str, Any] = Field(default_factory=dict,
                                   description="Algorithm options (e.g. rank); defaults are "
                                               "the algorithm's recommended settings.")
    tenant_ids: list[DbId] | None = Field(
        None, min_length=1,
        description="Participants; omitted or null: all tenants (an empty list is refused). "
                    "At most FEDREC_MAX_JOB_TENANTS (default 1000).")
    rounds: int = Field(50, ge=1, description=(
        "At most FEDREC_MAX_JOB_ROUNDS (default 10000). An algorithm that stops uploading "
        "after a set number of releases (dpals: config.sweeps; dp-fedmavg, dp-fedmc-admm: "
        "config.releases) uses those rounds plus one that re-solves the users: omitted, "
        "rounds is that number; a larger number is refused with 422 (its extra rounds would "
        "send nothing)."))
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
    agents: list[DbId] = Field(
        default_factory=list,
        description="Tenants (among tenant_ids) that run their client step in their own "
                    "'fedrec agent': their ratings never reach this service. User-level "
                    "privacy with agents needs placement 'tenant'.")
    round_seconds: float = Field(300.0, gt=0, le=86400.0,
                                 description="How long a round waits for agents' uploads.")
    wire: Literal["float64", "float32"] = Field(
        "float64", description="dtype of agents' uploads: float64 (exact) or float32 "
                               "(half the bytes).")
    lists: Literal["auto", "model"] = Field(
        "auto", description="Who serves the tenants' lists once the job completes: auto, the "
                            "better of its model and a most-popular list by NDCG@10 on the "
                            "held-out split (a model that loses does not serve lists); "
                            "model, its model whatever the comparison.")
    validation_fraction: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="Share of each tenant's training ratings carved out to choose the run "
                    "length (NDCG@10 for a ranking model, RMSE for a rating model; the job "
                    "stops once 3 rounds in a row fail to beat its best). Omitted: 0.1 for "
                    "a job without DP guarantee or agents, else 0 (a DP job runs its "
                    "configured rounds: choosing them on private data is not charged).")


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
    agents: dict[str, Any] | None = None
    model_kind: Literal["ranking", "rating"] = Field(
        "rating", description="ranking: serves top-k lists; rating: predicts ratings "
                              "(RMSE).")
    pair_job_id: int | None = Field(
        None, description="The job created together with this one (the default job's "
                          "ranking and rating models).")
    validation_fraction: float = 0.0
    selection: dict[str, Any] | None = Field(
        None, description="Run-length selection on the validation carve-out: metric, best "
                          "round, why it stopped; or why the job does not select.")
    serving: dict[str, Any] | None = Field(
        None, description="Who serves this job's lists (lists: model or popularity), why, "
                          "and both on the held-out split.")
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


class RankingPublic(BaseModel):
    """Ranking metrics of the final model on held-out ratings (training items excluded)."""

    k: int
    threshold: float | None = Field(
        description="held-out ratings >= threshold are relevant (62.5% up the tenant's "
                    "scale; null overall, where each tenant uses its own)")
    precision_at_k: float | None
    recall_at_k: float | None
    ndcg_at_k: float | None
    coverage: float = Field(description="share of the catalogue in some scored user's top k")
    users_ranked: int = Field(description="users with at least one relevant held-out item")


class JobReport(BaseModel):
    job: JobPublic
    curve: list[RoundPublic]
    per_tenant: dict[str, list[TenantRoundPublic]]
    privacy: dict[str, Any]
    ranking: RankingPublic | None = Field(
        None, description="final round, all tenants (null until the job completes)")
    ranking_per_tenant: dict[str, RankingPublic] = Field(default_factory=dict)
    popularity: RankingPublic | None = Field(
        None, description="a most-popular list (each tenant's training counts) on the same "
                          "held-out split, all tenants (null until the job completes)")
    models: dict[str, Any] = Field(
        default_factory=dict,
        description="Which model produced what: 'lists' (the job and algorithm whose lists "
                    "are served, or popularity, with the reason) and 'ratings' (the rating "
                    "model whose predictions feed the RMSE curve).")


class Recommendation(BaseModel):
    item: str
    title: str | None
    score: float


class RecommendationsPublic(BaseModel):
    user: str
    source: Literal["model", "fold_in", "popularity", "none"] = Field(
        description="'model': the tenant's learned factors; for a user unknown to the "
                    "model (cold start): 'fold_in', the user's own ratings folded into a "
                    "differentially private model's released item factors; 'popularity', "
                    "the damped mean rating of the tenant's raw ratings (not private: only "
                    "without a differentially private model); 'none', an empty list where "
                    "a differentially private model cannot fold the user in.")
    job_id: int | None
    data: list[Recommendation]
    k: int
    offset: int
    private: bool = Field(False, description="Whether the list is differentially private "
                                             "for the tenant's other users (see privacy).")
    privacy: str = Field("", description="Which model and which privacy status produced "
                                         "the list, in words.")
    model: str | None = Field(
        None, description="Which model produced the list: the algorithm of the job's model "
                          "(a ranking model such as dp-ials, or a rating model), or "
                          "'popularity'.")
    model_kind: Literal["ranking", "rating", "popularity"] | None = Field(
        None, description="ranking: a model of which items users choose; rating: a model "
                          "of rating values; popularity: the most-popular list.")
    reason: str | None = Field(
        None, description="Why popularity serves a user the model knows: the job's model "
                          "lost to popularity on held-out data.")


class BatchRecommendationsRequest(Input):
    model_config = ConfigDict(extra="forbid")

    users: list[str] = Field(min_length=1, max_length=1000)
    k: int = Field(10, ge=1, description="At most FEDREC_MAX_TOP_K (default 1000).")
    include_rated: bool = Field(False, strict=True)


class BatchRecommendationsPublic(BaseModel):
    data: list[RecommendationsPublic]
    not_found: list[str]


class TenantReport(BaseModel):
    tenant_id: int
    job_id: int | None
    curve: list[TenantRoundPublic]
    privacy: dict[str, Any]
    ranking: RankingPublic | None = Field(
        None, description="this tenant's ranking metrics at the job's final round")
    popularity: RankingPublic | None = Field(
        None, description="a most-popular list's (this tenant's training counts) on the "
                          "same held-out split")
    models: dict[str, Any] = Field(
        default_factory=dict, description="Which model produced this tenant's lists and "
                                          "which its RMSE curve (as a job report's).")


class TuningJobCreate(Input):
    """A hyper-parameter search on a validation carve-out of the tenants' training ratings
    (``fedrec tune`` on the stored ratings)."""

    # strict: a JSON true is no number of trials (nor a test fraction of 1.0)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    algorithm: str = Field("fedmc-admm", description="An algorithm with a search space: "
                                                      "fedmc-admm, fedmavg, rfrec, rfrecf.")
    config: dict[str, Any] = Field(default_factory=dict,
                                   description="The base config (the default trial's); each "
                                               "trial replaces the fields of the algorithm's "
                                               "search space it draws.")
    tenant_ids: list[DbId] | None = Field(
        None, min_length=1, description="Tenants whose training ratings are tuned on; "
                                        "omitted: all. Each must allow non-private training.")
    rounds: int | None = Field(None, ge=1, description="Rounds of the search's last rung "
                                                       "(default: the algorithm's).")
    per_round: int = Field(0, ge=0, le=MAX_DB_INT, description="Tenants per round; 0 = all.")
    seed: int = Field(0, ge=0, le=MAX_DB_INT, description="Seed of the split (as a training "
                                                          "job's), the carve-out and search.")
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0,
                                 description="Held out as a training job with this seed "
                                             "holds it out; never read by the search.")
    trials: int = Field(9, ge=1, le=200, description="Configs drawn, the default included.")
    eta: int = Field(3, ge=2, le=10, description="Successive halving: keep 1/eta per rung.")
    budget_seconds: float = Field(600.0, gt=0, le=86400.0,
                                  description="Stop starting new trials after this long.")
    metric: Literal["rmse", "ndcg"] | None = Field(
        None, description="What configs and run lengths are chosen by: rmse (validation "
                          "RMSE, rating models) or ndcg (validation NDCG@10, ranking models). "
                          "Omitted: ndcg for a ranking model, else rmse.")


class TuningTrial(BaseModel):
    params: dict[str, Any]
    rounds: int
    validation_rmse: float | None
    validation_ndcg: float | None = None


class TuningJobPublic(BaseModel):
    id: int
    status: Literal["queued", "running", "completed", "failed", "cancelled"]
    algorithm: str
    tenant_ids: list[int]
    rounds: int
    per_round: int
    seed: int
    test_fraction: float
    trials: int
    eta: int
    budget_seconds: float
    base_config: dict[str, Any]
    scored: list[TuningTrial] = Field(description="Every trial evaluation so far, in order.")
    config: dict[str, Any] | None = Field(
        None, description="Once completed: the chosen config, as a training job's config.")
    changed: dict[str, Any] | None = Field(None, description="The fields the search changed "
                                                             "from the default.")
    chosen_rounds: int | None = Field(None, description="Once completed: the run length "
                                                        "chosen, as a training job's rounds.")
    validation_rmse: float | None = Field(None, description="The choice's validation RMSE "
                                                            "at chosen_rounds.")
    default_validation_rmse: float | None = Field(None, description="The default config's "
                                                                    "at chosen_rounds.")
    metric: Literal["rmse", "ndcg"] = "rmse"
    validation_ndcg: float | None = Field(None, description="metric ndcg: the choice's "
                                                            "validation NDCG@10.")
    default_validation_ndcg: float | None = Field(None, description="metric ndcg: the "
                                                                    "default config's.")
    budget_exhausted: bool | None = None
    seconds: float | None = None
    error: str | None = None
    created_at: UtcDatetime
    finished_at: UtcDatetime | None = None
    heartbeat_at: UtcDatetime | None = Field(None, description="Last sign of life of the "
                                             "running search (stale: its worker died; the "
                                             "watchdog sends it again).")


class TuningJobsPublic(BaseModel):
    data: list[TuningJobPublic]
    count: int
