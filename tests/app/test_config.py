"""Settings: environment variables, production refusal of weak admin tokens."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import Settings, resolve_admin_token
from app.db import normalise_url

STRONG = "k3y-" + "abcdefghijklmnopqrstuvwxyz0123456789"


def test_defaults_are_embedded_sqlite_and_no_broker(monkeypatch):
    for name in ("DATABASE_URL", "FEDREC_DATABASE_URL", "REDIS_URL", "FEDREC_BROKER_URL",
                 "FEDREC_ENV", "FEDREC_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert (settings.env, settings.database_url, settings.broker_url) == (
        "development", "sqlite:///./fedrec.db", None)
    assert settings.max_upload_bytes == 64 * 1024 * 1024


def test_unprefixed_database_and_redis_urls_are_accepted(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/x")
    monkeypatch.setenv("REDIS_URL", "redis://r:6379/0")
    monkeypatch.setenv("FEDREC_MAX_UPLOAD_BYTES", "123")
    settings = Settings()
    assert (settings.database_url, settings.broker_url, settings.max_upload_bytes) == (
        "postgresql://db/x", "redis://r:6379/0", 123)


def test_development_generates_a_token_when_none_is_set():
    token, generated = resolve_admin_token(Settings(env="development", admin_token=None))
    assert generated and len(token) >= 32
    assert resolve_admin_token(Settings(admin_token=STRONG)) == (STRONG, False)


@pytest.mark.parametrize(("token", "problem"), [
    (None, "FEDREC_ADMIN_TOKEN must be set"),
    ("short", "FEDREC_ADMIN_TOKEN must be at least 32 characters"),
    ("a" * 40, "FEDREC_ADMIN_TOKEN is too weak"),
    ("abcdefgh" * 4, "FEDREC_ADMIN_TOKEN is too weak \\(about 24 bits"),
    ("0123456789abcdef" * 3, "FEDREC_ADMIN_TOKEN is too weak \\(about 64 bits"),
    ("0123456789abcdef" * 2 + "0", "FEDREC_ADMIN_TOKEN is too weak \\(about 64 bits"),
])
def test_production_refuses_missing_or_weak_tokens(token, problem):
    with pytest.raises(ValidationError, match=f"FEDREC_ENV=production: {problem}"):
        Settings(env="production", admin_token=token)


def test_production_accepts_a_strong_token_and_never_generates_one():
    assert resolve_admin_token(Settings(env="production", admin_token=STRONG)) == (
        STRONG, False)


def test_postgres_urls_use_psycopg3():
    assert normalise_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalise_url("postgresql://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalise_url("sqlite:///x.db") == "sqlite:///x.db"


def test_the_refusal_never_echoes_the_token():
    with pytest.raises(ValidationError) as info:
        Settings(env="production", admin_token="hunter2-secret")
    assert "hunter2-secret" not in str(info.value)
