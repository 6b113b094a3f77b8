"""docker-compose.yml: every service restarts and has a health check, Redis persists,
every setting reaches the fedrec services, Flower is optional."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml")
                         .read_text())
FEDREC = ("api", "worker", "beat")


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


def test_every_setting_reaches_the_fedrec_services_and_flower_is_optional():
    for name in FEDREC:
        service = COMPOSE["services"][name]
        assert service["env_file"] == [{"path": ".env", "required": False}], name
        env = service["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "FEDREC_ADMIN_TOKEN", "FEDREC_LOG_FORMAT"} <= set(env)
    assert COMPOSE["services"]["flower"]["profiles"] == ["flower"]
