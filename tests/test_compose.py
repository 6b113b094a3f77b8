"""docker-compose.yml: every service restarts and has a health check, Redis persists,
every setting of app/config.py reaches the fedrec services, Flower is optional, and the
file is valid Compose (the Compose Specification's JSON schema; Docker itself does not
run on fedrec's build machines)."""

from __future__ import annotations

import json
import os
import re
import secrets
import types
import typing
from pathlib import Path

import pytest
import yaml

from app.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
FEDREC = ("api", "worker", "beat")
#: the Compose Specification's schema (github.com/compose-spec/compose-spec, Apache-2.0,
#: schema/compose-spec.json at commit 170098b, 2026-06-23)
SPEC = ROOT / "tests" / "data" / "compose-spec.json"


def test_the_file_is_valid_compose():
    import jsonschema_rs

    validator = jsonschema_rs.validator_for(json.loads(SPEC.read_text()))
    assert [str(e) for e in validator.iter_errors(COMPOSE)] == []
    broken = {**COMPOSE, "services": {**COMPOSE["services"], "api": {
        **COMPOSE["services"]["api"], "healthcheck": {"tests": ["CMD", "true"]}}}}
    assert not validator.is_valid(broken)  # the schema does catch a misspelt key


def test_every_service_restarts_and_is_health_checked():
    services = COMPOSE["services"]
    assert set(services) >= {"postgres", "redis", *FEDREC, "flower"}
    for name, service in services.items():
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), name


def test_redis_persists_its_queue_on_a_volume():
    redis = COMPOSE["services"]["redis"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "redisdata" in COMPOSE["volumes"]


def env_names(name: str) -> list[str]:
    """The environment variables a Settings field is read from, in pydantic's order."""
    alias = Settings.model_fields[name].validation_alias
    if alias is None:
        return [f"FEDREC_{name.upper()}"]
    return [c for c in alias.choices if isinstance(c, str) and c.isupper()]


def sample(name: str) -> str:
    """A valid value of the field that differs from its default."""
    field = Settings.model_fields[name]
    kind, default = field.annotation, field.default
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is typing.Literal:
        return next(str(c) for c in typing.get_args(kind) if c != default)
    if name == "database_url":
        return "postgresql://dotenv:pw@elsewhere:5432/dotenv"
    if name in ("broker_url", "result_backend"):
        return "redis://dotenv-redis:6379/7"
    if name == "admin_token":
        return secrets.token_urlsafe(32)
    if kind is int:
        return str((default or 9000) + 1)
    if kind is float:
        return str((default or 0.0) + 1.5)
    return f"dotenv-{name}"


INTERPOLATION = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def resolve(service: dict, dotenv: dict[str, str]) -> dict[str, str]:
    """The container's environment as compose builds it: ``env_file`` (.env), overlaid by
    ``environment`` with ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` taken from
    the same .env (compose's interpolation file)."""
    def value(m: re.Match) -> str:
        name, op, arg = m.groups()
        if dotenv.get(name):
            return dotenv[name]
        assert op != "?", f"compose would refuse to start: {arg}"
        return arg if op == "-" else ""

    env = dict(dotenv) if {"path": ".env", "required": False} in service["env_file"] else {}
    for key, raw in service["environment"].items():
        env[key] = INTERPOLATION.sub(value, str(raw)).replace("$$", "$")
    return env


@pytest.mark.parametrize("name", FEDREC)
def test_every_setting_reaches_the_fedrec_services(name, monkeypatch):
    """An .env that sets every field of Settings: each field reaches the service's
    Settings, except the connection URLs compose builds itself (from POSTGRES_* and the
    redis service), which must win over .env."""
    dotenv = {env_names(f)[0]: sample(f) for f in Settings.model_fields}
    dotenv |= {"FEDREC_ENV": "production", "POSTGRES_PASSWORD": "pg-secret",
               "POSTGRES_USER": "dotuser", "POSTGRES_DB": "dotdb",
               # the unprefixed spellings lose to the ones compose sets
               "DATABASE_URL": "postgresql://loser@x/y", "REDIS_URL": "redis://loser:1/0"}
    service = COMPOSE["services"][name]
    known = {n for f in Settings.model_fields for n in env_names(f)}
    assert set(service["environment"]) <= known, "a variable no setting reads"
    env = resolve(service, dotenv)
    for key in list(os.environ):
        if key.startswith("FEDREC_") or key in ("DATABASE_URL", "REDIS_URL"):
            monkeypatch.delenv(key)
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    settings = Settings()
    built = {"database_url": "postgresql://dotuser:pg-secret@postgres:5432/dotdb",
             "broker_url": "redis://redis:6379/0"}
    for field in Settings.model_fields:
        got = getattr(settings, field)
        got = got.get_secret_value() if hasattr(got, "get_secret_value") else got
        want = built.get(field, dotenv[env_names(field)[0]])
        assert str(got) == str(type(got)(want)) if got is not None else want is None, (
            field, got, want)


def test_flower_is_optional_and_the_worker_exports_metrics():
    assert COMPOSE["services"]["flower"]["profiles"] == ["flower"]
    worker = COMPOSE["services"]["worker"]
    assert worker["environment"]["FEDREC_WORKER_METRICS_PORT"] == (
        "${FEDREC_WORKER_METRICS_PORT:-9808}")
    assert "ports" not in worker  # on the compose network only (no token on it)
