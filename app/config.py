"""Service settings: one pydantic-settings class, read from the environment.

Every variable has the prefix ``FEDREC_``; ``DATABASE_URL`` and ``REDIS_URL`` are also
accepted unprefixed because container platforms set them. Nothing is read at import time:
call :func:`get_settings` (cached) or build ``Settings(...)`` explicitly in tests.
"""

from __future__ import annotations

import collections
import math
import secrets
from functools import lru_cache
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_ADMIN_TOKEN_LENGTH = 32
MIN_ADMIN_TOKEN_BITS = 128
TOKEN_RECIPE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
WEAK_TOKENS = {"changeme", "change-me", "admin", "secret", "password", "token", "test"}


class Settings(BaseSettings):
    """Configuration of the API, the worker and the CLI."""

    model_config = SettingsConfigDict(env_prefix="FEDREC_", extra="ignore", frozen=True,
                                      hide_input_in_errors=True)  # never echo secrets

    env: Literal["development", "production"] = "development"
    """``production`` refuses to start without a strong explicit admin token."""
    database_url: str = Field(
        "sqlite:///./fedrec.db",
        validation_alias=AliasChoices("FEDREC_DATABASE_URL", "DATABASE_URL", "database_url"))
    """SQLAlchemy URL; ``postgresql://`` is served by psycopg 3. Default: SQLite file in cwd."""
    broker_url: str | None = Field(
        None, validation_alias=AliasChoices("FEDREC_BROKER_URL", "REDIS_URL", "broker_url"))
    """Celery broker (Redis). Unset: tasks run in-process inside the API."""
    result_backend: str | None = None
    """Celery result backend; defaults to the broker URL."""
    task_queue: str = "fedrec"
    """Celery queue the API sends to and the worker consumes."""
    admin_token: SecretStr | None = None
    """Bearer token of the admin endpoints. Development: generated at start-up if unset."""
    max_upload_bytes: int = Field(64 * 1024 * 1024, gt=0)
    """Largest accepted upload body (bytes); larger bodies get 413."""
    max_decompressed_bytes: int = Field(256 * 1024 * 1024, gt=0)
    """Largest decompressed size of a gzip upload (or uncompressed size of a Parquet one);
    larger get 413, however small the body (a gzip bomb stops here)."""
    max_upload_rows: int = Field(2_000_000, gt=0)
    """Most rating rows in one upload (CSV data lines or JSON ``ratings`` entries); more
    get 413. The default fits MovieLens 1M (1,000,209 ratings) in one upload."""
    max_concurrent_uploads: int = Field(2, gt=0)
    """Most rating uploads of one tenant in progress at once in one API process; more get
    429 with ``Retry-After`` (each upload may hold up to about 200 MB while it is checked)."""
    max_agent_polls: int = Field(8, gt=0)
    """Most round and secure-aggregation status requests (long-polls) of one tenant's agents
    in progress at once in one API process; more get 429 with ``Retry-After``."""
    database_pool_timeout: float = Field(10.0, gt=0)
    """Seconds a request waits for a PostgreSQL connection from the pool before it is
    answered 503 with ``Retry-After`` (the pool is busy, not broken)."""
    max_job_tenants: int = Field(1000, gt=0)
    """Most tenants in one training job (explicit ``tenant_ids`` or, when omitted, all
    tenants); more get 422."""
    max_job_rounds: int = Field(10_000, gt=0)
    """Largest ``rounds`` of a training job; larger get 422."""
    max_top_k: int = Field(1000, gt=0)
    """Largest ``k`` of the recommendation endpoints (single and batch); larger get 422."""
    max_reported_errors: int = Field(100, gt=0)
    """At most this many offending rows are listed in a 422; the rest are counted."""
    max_page_size: int = Field(1000, gt=0)
    """Largest ``limit`` accepted by list endpoints."""
    max_failed_sign_ins: int = Field(10, gt=0)
    """Wrong admin tokens or dashboard sign-ins one client may send per minute to one API
    process; after that every attempt from it gets 429 with ``Retry-After`` until a
    minute has passed since the oldest of them."""
    stats_refresh_seconds: float = Field(3600.0, gt=0)
    """Beat period of the refresh of every tenant's rating statistics."""
    serving_cache_seconds: float = Field(1.0, ge=0)
    """How stale a process may serve: verified API keys, the latest-snapshot check and each
    tenant's ratings version are re-read at most this often (0: every request)."""
    retrain_seconds: float = Field(86400.0, ge=0)
    """Beat period of the retraining check (a new job when ratings changed); 0 disables."""
    stalled_job_seconds: float = Field(600.0, gt=0)
    """A running job with no progress for this long is resumed by beat's watchdog."""
    log_format: Literal["text", "json"] = "text"
    """Log lines of the API, worker and beat: ``text`` or ``json`` (one object a line, with
    request_id, tenant_id, job_id); ``fedrec --log-format`` sets it too."""
    worker_metrics_port: int | None = Field(None, ge=1, le=65535)
    """A Celery worker serves its Prometheus task metrics on this port (``/metrics``, every
    pool process summed); unset: none. One port per worker command: scrape each worker."""
    dry_round_seconds: float = Field(30.0, gt=0)
    """Wall-clock bound of the dry round run before creating or planning a job (round 1 of
    the first tenant, checking the config; in a worker when there is a broker, else in the
    API process): longer gets 422 naming this bound, a dry round no worker started within
    it 503, and nothing is created. The default leaves room for a first round that
    compiles its numba kernels and for the recommended configs on MovieLens 1M in one
    tenant, and stops a round that would take minutes (the binary baseline's there)."""
    job_max_attempts: int = Field(3, ge=1)
    """A job whose steps raise this many times without a round committing in between is
    marked ``failed`` with the error (the watchdog then leaves it alone)."""

    @model_validator(mode="after")
    def _refuse_weak_admin_token(self) -> Settings:
        if self.env == "production":
            problem = admin_token_problem(self.admin_token)
            if problem:
                raise ValueError(f"FEDREC_ENV=production: FEDREC_ADMIN_TOKEN {problem}; "
                                 f"generate one with: {TOKEN_RECIPE}")
        return self


def admin_token_problem(token: SecretStr | None) -> str | None:
    """Why ``token`` is unacceptable in production, or None when it is strong enough."""
    if token is None or not token.get_secret_value():
        return "must be set"
    value = token.get_secret_value()
    if len(value) < MIN_ADMIN_TOKEN_LENGTH:
        return f"must be at least {MIN_ADMIN_TOKEN_LENGTH} characters"
    if value.lower() in WEAK_TOKENS or len(set(value)) < 8:
        return "is too weak (too few distinct characters or a well-known word)"
    bits = estimated_bits(value)
    if bits < MIN_ADMIN_TOKEN_BITS:
        return (f"is too weak (about {bits:.0f} bits by its character frequencies; at least "
                f"{MIN_ADMIN_TOKEN_BITS} needed)")
    return None


def estimated_bits(value: str) -> float:
    """An upper estimate of a secret's entropy: the length of its shortest repeating unit
    times the empirical Shannon entropy of that unit's characters. A repeated pattern
    (``"abcdefgh" * 4``: 24 bits) or a small alphabet scores low; 32 random bytes in
    URL-safe base64 score about 215."""
    value = value[:_period(value)]
    n = len(value)
    counts = collections.Counter(value).values()
    return -n * sum(c / n * math.log2(c / n) for c in counts)


def _period(value: str) -> int:
    """The length of the shortest unit whose repetition spells ``value``."""
    n = len(value)
    return next(p for p in range(1, n + 1) if value == (value[:p] * (n // p + 1))[:n])


def resolve_admin_token(settings: Settings) -> tuple[str, bool]:
    """The admin token to enforce and whether it was generated (development only)."""
    if settings.admin_token is not None and settings.admin_token.get_secret_value():
        return settings.admin_token.get_secret_value(), False
    if settings.env == "production":  # unreachable: the validator refused already
        raise ValueError("FEDREC_ENV=production: FEDREC_ADMIN_TOKEN must be set")
    return secrets.token_urlsafe(32), True


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
