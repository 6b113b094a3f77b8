"""A typed client of the fedrec API (``/v1``), on httpx.

    from fedrec.client import Client

    with Client("http://127.0.0.1:8000", token=ADMIN_TOKEN) as admin:
        tenant = admin.create_tenant("acme", privacy_budget=10.0)
        key = admin.create_api_key(tenant.id, name="uploads").key
    with Client("http://127.0.0.1:8000", token=key) as acme:
        acme.upload_ratings(tenant.id, path="u.data")
        print(acme.recommendations(tenant.id, "196", k=5).data)

One :class:`Client` per credential: the admin token reaches ``/v1/admin/*``, a tenant's
API key its own ``/v1/tenants/{id}/*``. Answers are pydantic models named after the
OpenAPI components they mirror (``schema_name``; tests/app/test_client.py checks every
field against the server's schema); fields the server adds later are ignored. An error
answer raises :class:`ApiError` with the problem document's ``status``, ``code``,
``detail`` and ``errors``; a network failure raises httpx's ``TransportError``.

This module imports no server module (``app``, ``worker``), so the tenant agent and
any operator's machine can use it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import mimetypes
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
from pydantic import BaseModel, ConfigDict

API_PREFIX = "/v1"
Epsilon = float | Literal["infinity"]
"""An epsilon as the API spells it: a number, or "infinity" after a noise-free job."""


class ApiError(Exception):
    """An error answer (4xx/5xx), from its RFC 9457 problem document.

    ``code`` is the API's stable code (``tenant_not_found``, ``budget_exceeded``...),
    ``errors`` the fields or upload rows at fault (``[{"field", "message", ...}]``).
    An answer that is not a problem document (a proxy's page) gets ``http_<status>``."""

    def __init__(self, status: int, code: str, detail: str,
                 errors: list[dict[str, Any]] | None = None,
                 problem: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail = status, code, detail
        self.errors = errors or []
        self.problem = problem or {}

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "code" not in body:
            text = response.text.strip()[:500] or response.reason_phrase
            return cls(response.status_code, f"http_{response.status_code}", text)
        detail = body.get("detail")
        return cls(response.status_code, str(body["code"]),
                   detail if isinstance(detail, str) else json.dumps(detail),
                   body.get("errors"), body)


# -- answers: one model per OpenAPI component (schema_name) --------------------------------

class Model(BaseModel):
    """An answer of the API; ``schema_name`` is its component in ``/openapi.json``."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    schema_name: ClassVar[str]


class Tenant(Model):
    schema_name = "TenantPublic"
    id: int
    name: str
    rating_min: float
    rating_max: float
    privacy_budget: float
    auto_create_items: bool
    allow_non_private: bool
    scheduled_retraining: bool
    retrain_min_seconds: float
    last_retrained_at: dt.datetime | None
    created_at: dt.datetime


class JobSpend(Model):
    """A job's spend: what it asked for (``requested_epsilon`` at ``requested_delta``), its
    epsilon at that delta, and ``epsilon``, its charge at the budget's delta."""

    schema_name = "JobSpend"
    job_id: int
    requested_epsilon: float | None = None
    requested_delta: float | None = None
    epsilon_at_requested_delta: Epsilon | None = None
    epsilon: Epsilon
    budget_delta: float | None = None
    transmissions: int


class Privacy(Model):
    schema_name = "TenantPrivacy"
    tenant_id: int
    note: str = ""
    epsilon_spent: Epsilon
    epsilon_max: float
    epsilon_remaining: float
    delta: float
    private: bool
    transmissions: int
    jobs: list[JobSpend]


class TenantDetail(Tenant):
    schema_name = "TenantDetail"
    privacy: Privacy


class Tenants(Model):
    schema_name = "TenantsPublic"
    data: list[Tenant]
    count: int


class AuditEntry(Model):
    schema_name = "TenantAuditPublic"
    id: int
    tenant_id: int
    actor: str
    at: dt.datetime
    changes: dict[str, dict[str, Any]]


class AuditLog(Model):
    schema_name = "TenantAuditLog"
    data: list[AuditEntry]
    count: int


class ApiKey(Model):
    schema_name = "ApiKeyPublic"
    id: int
    tenant_id: int
    prefix: str
    name: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


class ApiKeyCreated(ApiKey):
    schema_name = "ApiKeyCreated"
    key: str


class ApiKeys(Model):
    schema_name = "ApiKeysPublic"
    data: list[ApiKey]
    count: int


class Item(Model):
    schema_name = "ItemPublic"
    id: int
    key: str
    title: str | None


class Items(Model):
    schema_name = "ItemsPublic"
    data: list[Item]
    count: int


class ItemsUpserted(Model):
    schema_name = "ItemsUpserted"
    upserted: int


class Job(Model):
    schema_name = "JobPublic"
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
    created_at: dt.datetime
    finished_at: dt.datetime | None
    model_kind: Literal["ranking", "rating"] = "rating"
    pair_job_id: int | None = None
    validation_fraction: float = 0.0
    selection: dict[str, Any] | None = None
    serving: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status not in RUNNING


RUNNING = ("queued", "running")
"""Job statuses before the end; any other (completed, failed, cancelled) is final."""


class Jobs(Model):
    schema_name = "JobsPublic"
    data: list[Job]
    count: int


class TuningTrial(Model):
    schema_name = "TuningTrial"
    params: dict[str, Any]
    rounds: int
    validation_rmse: float | None
    validation_ndcg: float | None = None


class TuningJob(Model):
    schema_name = "TuningJobPublic"
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
    scored: list[TuningTrial]
    config: dict[str, Any] | None = None
    changed: dict[str, Any] | None = None
    chosen_rounds: int | None = None
    validation_rmse: float | None = None
    default_validation_rmse: float | None = None
    metric: Literal["rmse", "ndcg"] = "rmse"
    validation_ndcg: float | None = None
    default_validation_ndcg: float | None = None
    budget_exhausted: bool | None = None
    seconds: float | None = None
    error: str | None = None
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status not in RUNNING


class TuningJobs(Model):
    schema_name = "TuningJobsPublic"
    data: list[TuningJob]
    count: int


class TenantPlan(Model):
    schema_name = "TenantPlan"
    epsilon_spent: Epsilon
    epsilon_after: Epsilon
    epsilon_max: float
    delta: float


class JobPlan(Model):
    schema_name = "JobPlanPublic"
    dry_run: bool = True
    algorithm: str
    privacy: dict[str, Any]
    tenants: dict[str, TenantPlan]


class Round(Model):
    schema_name = "RoundPublic"
    round: int
    objective: float | None
    test_rmse: float | None
    test_mae: float | None
    uploads: int
    seconds: float


class TenantRound(Model):
    schema_name = "TenantRoundPublic"
    round: int
    test_rmse: float | None
    test_mae: float | None
    n_test: int


class Ranking(Model):
    schema_name = "RankingPublic"
    k: int
    threshold: float | None = None
    precision_at_k: float | None
    recall_at_k: float | None
    ndcg_at_k: float | None
    coverage: float
    users_ranked: int


class JobReport(Model):
    schema_name = "JobReport"
    job: Job
    curve: list[Round]
    per_tenant: dict[str, list[TenantRound]]
    privacy: dict[str, Any]
    ranking: Ranking | None = None
    ranking_per_tenant: dict[str, Ranking] = {}
    popularity: Ranking | None = None
    models: dict[str, Any] = {}


class TenantReport(Model):
    schema_name = "TenantReport"
    tenant_id: int
    job_id: int | None
    curve: list[TenantRound]
    privacy: dict[str, Any]
    ranking: Ranking | None = None
    popularity: Ranking | None = None
    models: dict[str, Any] = {}


class Rating(Model):
    schema_name = "RatingPublic"
    user: str
    item: str
    rating: float
    timestamp: dt.datetime | None


class Ratings(Model):
    schema_name = "RatingsPublic"
    data: list[Rating]
    count: int


class RatingsCount(Model):
    schema_name = "RatingsCount"
    count: int
    users: int


class UploadResult(Model):
    schema_name = "UploadResult"
    stored: int


class TenantDeleted(Model):
    schema_name = "TenantDeleted"
    id: int
    name: str
    ratings: int
    users: int


class UserForgotten(Model):
    schema_name = "UserRatingsDeleted"
    user: str
    deleted: int


class Recommendation(Model):
    schema_name = "Recommendation"
    item: str
    title: str | None
    score: float


class Recommendations(Model):
    schema_name = "RecommendationsPublic"
    user: str
    source: Literal["model", "fold_in", "popularity", "none"]
    job_id: int | None
    data: list[Recommendation]
    k: int
    offset: int
    private: bool = False
    privacy: str = ""
    model: str | None = None
    model_kind: Literal["ranking", "rating", "popularity"] | None = None
    reason: str | None = None


class BatchRecommendations(Model):
    schema_name = "BatchRecommendationsPublic"
    data: list[Recommendations]
    not_found: list[str]


class TaskEnqueued(Model):
    schema_name = "TaskEnqueued"
    task_id: str
    status: str


class RatingStats(Model):
    schema_name = "RatingStatsPublic"
    tenant_id: int
    n_ratings: int
    n_users: int
    n_items: int
    mean: float | None
    histogram: dict[str, int]
    computed_at: dt.datetime


MODELS: tuple[type[Model], ...] = tuple(
    m for m in list(globals().values())
    if isinstance(m, type) and issubclass(m, Model) and m is not Model)
"""Every answer model (tests check each against the OpenAPI schema)."""


# -- uploads ------------------------------------------------------------------------------

MEDIA_TYPES = {".csv": "text/csv", ".tsv": "text/tab-separated-values",
               ".data": "text/tab-separated-values", ".dat": "text/csv",
               ".json": "application/json", ".parquet": "application/vnd.apache.parquet"}
"""The upload's Content-Type by file extension, a ``.gz`` suffix dropped (MovieLens
``u.data`` is TSV; ``.dat``, as ML-1M's ``ratings.dat``, is delimited text whose delimiter
the server finds). The file is sent as it is: the server recognises gzip and Parquet by
their magic bytes and reads every format with one reader."""
CHUNK = 1 << 16


def _media_type(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    suffix = name[name.rfind("."):] if "." in name else ""
    return MEDIA_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "text/csv"


def _chunks(path: Path, on_bytes: Callable[[int], None] | None) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            if on_bytes is not None:
                on_bytes(len(chunk))
            yield chunk


def progress_enabled() -> bool:
    """Progress bars only when stderr is a terminal and FEDREC_NO_PROGRESS is unset: logs,
    pipes, CI and ``--json -`` output never hold one."""
    return sys.stderr.isatty() and not os.environ.get("FEDREC_NO_PROGRESS")


def _progress_bar(total: int, label: str):
    """A rich progress bar of bytes on stderr, or None when :func:`progress_enabled` is
    false."""
    if not progress_enabled():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    progress = Progress(TextColumn(label), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), console=Console(stderr=True), transient=True)
    progress.add_task(label, total=total)
    return progress


# -- the client ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class TrainedModel:
    """A tenant's exported model (``GET /tenants/{id}/model``, a NumPy ``.npz``): a user's
    scores for ``item_keys`` are ``user_factors[u] @ item_factors`` (through
    ``offset + spread * sigmoid(.)`` when ``link`` is set)."""

    user_keys: list[str]
    item_keys: list[str]
    user_factors: Any
    item_factors: Any
    meta: dict[str, Any]
    link: tuple[float, float] | None = None

    @classmethod
    def from_npz(cls, data: bytes) -> TrainedModel:
        import io

        import numpy as np

        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            link = tuple(float(x) for x in z["link"]) if "link" in z.files else None
            return cls([str(k) for k in z["user_keys"]], [str(k) for k in z["item_keys"]],
                       z["user_factors"], z["item_factors"], json.loads(str(z["meta"])),
                       link)

    def scores(self, user: str) -> Any:
        """The user's score for every item of ``item_keys``."""
        import numpy as np

        raw = self.user_factors[self.user_keys.index(user)] @ self.item_factors
        if self.link is None:
            return raw
        offset, spread = self.link
        return offset + spread / (1.0 + np.exp(-raw))


class Client:
    """The fedrec API with one credential (the admin token or a tenant's API key).

    ``transport`` is passed to httpx (e.g. ``httpx.ASGITransport`` or a TestClient's, to
    talk to an app in-process); ``http`` replaces the httpx client altogether."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None,
                 http: httpx.Client | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout,
                                         transport=transport)
        self.http.headers.update(headers)
        self.base_url = str(self.http.base_url)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call under ``/v1``; an error answer raises :class:`ApiError`."""
        response = self.http.request(method, API_PREFIX + path, **kwargs)
        if response.status_code >= 400:
            raise ApiError.from_response(response)
        return response

    def _get(self, model: type[Model], path: str, **params: Any):
        query = {k: v for k, v in params.items() if v is not None}
        return model.model_validate(self.request("GET", path, params=query).json())

    def _send(self, model: type[Model], method: str, path: str, body: Any = None,
              headers: Mapping[str, str] | None = None, **params: Any):
        response = self.request(method, path, json=body, headers=headers, params=params)
        return model.model_validate(response.json())

    # ---- admin: tenants ------------------------------------------------------------------
    def create_tenant(self, name: str, privacy_budget: float, *,
                      idempotency_key: str | None = None, **fields: Any) -> Tenant:
        """``POST /admin/tenants`` (fields: rating_min, rating_max, auto_create_items,
        allow_non_private, scheduled_retraining, retrain_min_seconds)."""
        return self._send(Tenant, "POST", "/admin/tenants",
                          {"name": name, "privacy_budget": privacy_budget, **fields},
                          _key(idempotency_key))

    def tenants(self) -> Tenants:
        return self._get(Tenants, "/admin/tenants")

    def tenant(self, tenant_id: int) -> TenantDetail:
        return self._get(TenantDetail, f"/admin/tenants/{tenant_id}")

    def delete_tenant(self, tenant_id: int) -> TenantDeleted:
        """``DELETE``: the tenant with its keys, users, ratings, job data, snapshots and
        ledger (409 while an unfinished job includes it)."""
        return self._send(TenantDeleted, "DELETE", f"/admin/tenants/{tenant_id}")

    def update_tenant(self, tenant_id: int, *, actor: str | None = None,
                      **changes: Any) -> TenantDetail:
        """``PATCH``: only the fields given change; ``actor`` goes to the audit log."""
        return self._send(TenantDetail, "PATCH", f"/admin/tenants/{tenant_id}", changes,
                          {"X-Actor": actor} if actor else None)

    def tenant_audit(self, tenant_id: int) -> AuditLog:
        return self._get(AuditLog, f"/admin/tenants/{tenant_id}/audit")

    # ---- admin: API keys -----------------------------------------------------------------
    def create_api_key(self, tenant_id: int, name: str | None = None) -> ApiKeyCreated:
        """A new key; its secret (``.key``) is in this answer only."""
        return self._send(ApiKeyCreated, "POST", f"/admin/tenants/{tenant_id}/api-keys",
                          {"name": name} if name is not None else {})

    def api_keys(self, tenant_id: int) -> ApiKeys:
        return self._get(ApiKeys, f"/admin/tenants/{tenant_id}/api-keys")

    def revoke_api_key(self, tenant_id: int, key_id: int) -> ApiKey:
        return self._send(ApiKey, "DELETE", f"/admin/tenants/{tenant_id}/api-keys/{key_id}")

    # ---- admin: items --------------------------------------------------------------------
    def put_items(self, items: Iterable[Mapping[str, Any]]) -> ItemsUpserted:
        """Add or retitle catalogue items: ``[{"key": "1193", "title": "..."}, ...]``."""
        body = [{"key": str(i["key"]), "title": i.get("title")} for i in items]
        return self._send(ItemsUpserted, "PUT", "/admin/items", {"items": body})

    def items(self, limit: int = 100, offset: int = 0) -> Items:
        return self._get(Items, "/admin/items", limit=limit, offset=offset)

    # ---- admin: jobs ---------------------------------------------------------------------
    def create_job(self, *, idempotency_key: str | None = None, **body: Any) -> Job:
        """``POST /admin/jobs`` with the body's fields (algorithm, tenant_ids, rounds,
        privacy or dp, config...); with ``idempotency_key`` a retry returns the same job."""
        return self._send(Job, "POST", "/admin/jobs", body, _key(idempotency_key))

    def plan_job(self, **body: Any) -> JobPlan:
        """The dry run: each tenant's epsilon before and after, nothing created."""
        return self._send(JobPlan, "POST", "/admin/jobs", body, dry_run="true")

    def jobs(self, limit: int = 100, offset: int = 0) -> Jobs:
        return self._get(Jobs, "/admin/jobs", limit=limit, offset=offset)

    def job(self, job_id: int) -> Job:
        return self._get(Job, f"/admin/jobs/{job_id}")

    def cancel_job(self, job_id: int) -> Job:
        return self._send(Job, "POST", f"/admin/jobs/{job_id}/cancel")

    def resume_job(self, job_id: int) -> Job:
        return self._send(Job, "POST", f"/admin/jobs/{job_id}/resume")

    def job_report(self, job_id: int) -> JobReport:
        return self._get(JobReport, f"/admin/jobs/{job_id}/report")

    def wait_job(self, job_id: int, *, poll: float = 0.5, timeout: float | None = None,
                 on_poll: Callable[[Job], None] | None = None) -> Job:
        """Poll the job until it ends (``on_poll`` sees every answer); TimeoutError after
        ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_poll is not None:
                on_poll(job)
            if job.finished:
                return job
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"job {job_id} still {job.status} after {timeout:g} s")
            time.sleep(poll)

    # ---- admin: tuning jobs --------------------------------------------------------------
    def create_tuning_job(self, **body: Any) -> TuningJob:
        """``POST /admin/tuning-jobs`` (algorithm, tenant_ids, rounds, per_round, seed,
        config, test_fraction, trials, eta, budget_seconds); once completed, its ``config``
        goes as it is into :meth:`create_job`."""
        return self._send(TuningJob, "POST", "/admin/tuning-jobs", body)

    def tuning_job(self, job_id: int) -> TuningJob:
        return self._get(TuningJob, f"/admin/tuning-jobs/{job_id}")

    def tuning_jobs(self, *, limit: int | None = None, offset: int | None = None
                    ) -> TuningJobs:
        """Tuning jobs, newest first."""
        return self._get(TuningJobs, "/admin/tuning-jobs", limit=limit, offset=offset)

    def cancel_tuning_job(self, job_id: int) -> TuningJob:
        """Stop a queued or running search (a running one after its current trial)."""
        return self._send(TuningJob, "POST", f"/admin/tuning-jobs/{job_id}/cancel")

    def resume_tuning_job(self, job_id: int) -> TuningJob:
        """Start a failed, cancelled or stuck search again, from its first trial."""
        return self._send(TuningJob, "POST", f"/admin/tuning-jobs/{job_id}/resume")

    def wait_tuning_job(self, job_id: int, *, poll: float = 0.5,
                        timeout: float | None = None) -> TuningJob:
        """Poll the tuning job until it ends; TimeoutError after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while not (job := self.tuning_job(job_id)).finished:
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"tuning job {job_id} still {job.status} after "
                                   f"{timeout:g} s")
            time.sleep(poll)
        return job

    # ---- tenant: ratings -----------------------------------------------------------------
    def upload_ratings(self, tenant_id: int, *, rows: Iterable[Mapping[str, Any]] | None
                       = None, csv: str | bytes | None = None, path: str | Path | None = None,
                       media_type: str | None = None, idempotency_key: str | None = None,
                       progress: bool = True) -> UploadResult:
        """Upload ratings: ``rows`` (``{"user", "item", "rating"[, "timestamp"]}``) as
        JSON, ``csv`` text, or a file at ``path`` (delimited text such as MovieLens
        ``u.data`` or ML-1M's ``::``, JSON or Parquet, gzip-compressed or not; by extension
        unless ``media_type`` says) sent unchanged, streamed in chunks, with a
        progress bar on a terminal. All rows are stored or none (422 lists the rows)."""
        if sum(x is not None for x in (rows, csv, path)) != 1:
            raise ValueError("give exactly one of rows, csv or path")
        headers = _key(idempotency_key) or {}
        url = f"/tenants/{tenant_id}/ratings"
        if rows is not None:
            return self._send(UploadResult, "POST", url, {"ratings": [dict(r) for r in rows]},
                              headers)
        if csv is not None:
            content = csv.encode() if isinstance(csv, str) else csv
            headers["Content-Type"] = media_type or "text/csv"
            return UploadResult.model_validate(
                self.request("POST", url, content=content, headers=headers).json())
        path = Path(path)
        headers["Content-Type"] = media_type or _media_type(path)
        size = path.stat().st_size
        headers["Content-Length"] = str(size)
        bar = _progress_bar(size, f"upload {path.name}") if progress else None
        if bar is None:
            return UploadResult.model_validate(self.request(
                "POST", url, content=_chunks(path, None), headers=headers).json())
        with bar:
            task = bar.task_ids[0]
            return UploadResult.model_validate(self.request(
                "POST", url, headers=headers,
                content=_chunks(path, lambda n: bar.advance(task, n))).json())

    def ratings(self, tenant_id: int, *, user: str | None = None, limit: int = 100,
                offset: int = 0) -> Ratings:
        return self._get(Ratings, f"/tenants/{tenant_id}/ratings", user=user, limit=limit,
                         offset=offset)

    def count_ratings(self, tenant_id: int) -> RatingsCount:
        return self._get(RatingsCount, f"/tenants/{tenant_id}/ratings/count")

    def forget_user(self, tenant_id: int, user: str) -> UserForgotten:
        """Delete a user's ratings and their rows in trained snapshots."""
        return self._send(UserForgotten, "DELETE",
                          f"/tenants/{tenant_id}/users/{_path(user)}/ratings")

    # ---- tenant: recommendations, report, privacy, statistics ----------------------------
    def recommendations(self, tenant_id: int, user: str, *, k: int = 10, offset: int = 0,
                        include_rated: bool = False) -> Recommendations:
        return self._get(Recommendations,
                         f"/tenants/{tenant_id}/users/{_path(user)}/recommendations", k=k,
                         offset=offset, include_rated=str(include_rated).lower())

    def batch_recommendations(self, tenant_id: int, users: list[str], *, k: int = 10,
                              include_rated: bool = False) -> BatchRecommendations:
        return self._send(BatchRecommendations, "POST", f"/tenants/{tenant_id}/recommendations",
                          {"users": users, "k": k, "include_rated": include_rated})

    def tenant_report(self, tenant_id: int) -> TenantReport:
        return self._get(TenantReport, f"/tenants/{tenant_id}/report")

    def model(self, tenant_id: int, path: str | Path | None = None) -> TrainedModel:
        """``GET /tenants/{id}/model``: the tenant's latest trained model; with ``path``,
        the ``.npz`` file is also written there."""
        data = self.request("GET", f"/tenants/{tenant_id}/model").content
        if path is not None:
            Path(path).write_bytes(data)
        return TrainedModel.from_npz(data)

    def privacy(self, tenant_id: int) -> Privacy:
        return self._get(Privacy, f"/tenants/{tenant_id}/privacy")

    def compute_stats(self, tenant_id: int) -> TaskEnqueued:
        return self._send(TaskEnqueued, "POST", f"/tenants/{tenant_id}/stats")

    def stats(self, tenant_id: int) -> RatingStats:
        return self._get(RatingStats, f"/tenants/{tenant_id}/stats")


def _key(idempotency_key: str | None) -> dict[str, str] | None:
    return {"Idempotency-Key": idempotency_key} if idempotency_key else None


def _path(segment: str) -> str:
    """A user key as one path segment (a key may hold ``/`` or ``?``)."""
    from urllib.parse import quote

    return quote(str(segment), safe="")
