"""A client generated from the live OpenAPI schema works (issue 31): openapi-python-client
builds it from ``/openapi.json`` of a running server on the real PostgreSQL, and tenant
creation, a ratings upload, a training job and recommendations go through it.

Operation ids are the routes' function names (``create_tenant``, not FastAPI's default
``create_tenant_v1_admin_tenants_post``) and every JSON answer has a named schema (the
agent routes' answers were untyped ``dict``s, generated as ``ReadManifestV1Tenants...``
models)."""

from __future__ import annotations

import gzip
import importlib
import subprocess
import sys
import time
import uuid
from collections import Counter

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.app.conftest import ADMIN_TOKEN


def _operations(schema: dict) -> list[tuple[str, str, dict]]:
    return [(path, method, op) for path, ops in schema["paths"].items()
            for method, op in ops.items()]


def test_operation_ids_are_the_function_names_and_unique():
    schema = create_app(Settings(database_url="sqlite:///:memory:",
                                 admin_token=ADMIN_TOKEN)).openapi()
    ids = [op["operationId"] for _, _, op in _operations(schema)]
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    assert "create_tenant" in ids and "create_ratings" in ids and "read_manifest" in ids
    assert not [i for i in ids if "_v1_" in i or i.endswith(("_get", "_post", "_put"))]


def test_every_json_answer_has_a_named_schema():
    schema = create_app(Settings(database_url="sqlite:///:memory:",
                                 admin_token=ADMIN_TOKEN)).openapi()
    untyped = []
    for path, method, op in _operations(schema):
        for code, answer in op["responses"].items():
            if not code.startswith("2"):
                continue
            for media, body in answer.get("content", {}).items():
                shape = body.get("schema", {})
                named = "$ref" in shape or all("$ref" in s for s in shape.get("anyOf", [{}]))
                if media == "application/json" and not named:
                    untyped.append(f"{method.upper()} {path}")
                elif media != "application/json" and not shape.get("type"):
                    untyped.append(f"{method.upper()} {path} ({media})")
    assert untyped == []


@pytest.fixture
def live_pg(make_postgres_db):
    """A uvicorn server (a thread) on a database of its own on the real PostgreSQL (its
    items stay out of the other tests' catalogue), jobs run in-process."""
    from app.commands.demo import _free_port, start_server
    from app.db import migrate

    url = make_postgres_db()
    migrate(url)
    port = _free_port()
    server, thread = start_server(Settings(database_url=url, admin_token=ADMIN_TOKEN,
                                            broker_url=None), port)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _generate(base_url: str, tmp_path, monkeypatch):
    """The client package openapi-python-client generates from the live schema."""
    schema = tmp_path / "openapi.json"
    schema.write_bytes(httpx.get(f"{base_url}/openapi.json", timeout=30).content)
    out = tmp_path / "fedrec_generated"
    run = subprocess.run([sys.executable, "-m", "openapi_python_client", "generate",
                          "--path", str(schema), "--meta", "none", "--output-path", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return importlib.import_module("fedrec_generated")


def _module(package, name: str):
    return importlib.import_module(f"{package.__name__}.{name}")


def _ratings_file(tenant: int) -> bytes:
    """ML-1M-style ``::`` rows, gzip-compressed, for 30 users of one tenant."""
    rows = [f"t{tenant}u{u}::i{(u * 7 + j) % 40}::{1 + (u + j) % 5}"
            for u in range(30) for j in range(12)]
    return gzip.compress(("\n".join(rows) + "\n").encode())


@pytest.mark.integration
def test_a_generated_client_drives_the_live_server(live_pg, tmp_path, monkeypatch):
    gen = _generate(live_pg, tmp_path, monkeypatch)
    models = _module(gen, "models")
    tenants_api = "api.admin_tenants"
    create_tenant = _module(gen, f"{tenants_api}.create_tenant")
    create_api_key = _module(gen, f"{tenants_api}.create_api_key")
    create_ratings = _module(gen, "api.tenant_ratings.create_ratings")
    create_job = _module(gen, "api.admin_training.create_training_job")
    read_job = _module(gen, "api.admin_training.read_job")
    recommend = _module(gen, "api.tenant_recommendations.read_recommendations")
    from_types = _module(gen, "types")

    admin = gen.AuthenticatedClient(base_url=live_pg, token=ADMIN_TOKEN, timeout=60)
    # a DP job trains on the registered catalogue only: the admin registers the items
    upsert_items = _module(gen, "api.admin_items.upsert_items")
    upserted = upsert_items.sync(client=admin, body=models.ItemsUpsert.from_dict(
        {"items": [{"key": f"i{j}"} for j in range(40)]}))
    assert isinstance(upserted, models.ItemsUpserted), upserted
    ids, keys = [], []
    for n in range(2):
        tenant = create_tenant.sync(client=admin, body=models.TenantCreate(
            name=f"gen-{uuid.uuid4().hex[:8]}", privacy_budget=50.0, auto_create_items=True))
        assert isinstance(tenant, models.TenantPublic), tenant
        key = create_api_key.sync(tenant.id, client=admin,
                                  body=models.ApiKeyCreate(name="generated"))
        assert isinstance(key, models.ApiKeyCreated), key
        mine = gen.AuthenticatedClient(base_url=live_pg, token=key.key, timeout=60)
        upload = models.CreateRatingsFilesBody(file=from_types.File(
            payload=_ratings_file(n), file_name="ratings.dat.gz"))
        stored = create_ratings.sync(tenant.id, client=mine, body=upload)
        assert isinstance(stored, models.UploadResult), stored
        assert stored.stored == 360
        ids.append(tenant.id)
        keys.append(mine)

    body = models.JobCreate.from_dict({
        "algorithm": "dpals", "tenant_ids": ids, "config": {"rank": 3, "sweeps": 2},
        "rounds": 3, "privacy": {"unit": "user", "target_epsilon": 4.0, "delta": 1e-3}})
    job = create_job.sync(client=admin, body=body)
    assert isinstance(job, models.JobPublic), job
    deadline = time.monotonic() + 240
    while job.status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
        job = read_job.sync(job.id, client=admin)
    assert job.status == "completed", job

    answer = recommend.sync(ids[0], "t0u1", client=keys[0], k=5)
    assert isinstance(answer, models.RecommendationsPublic), answer
    assert answer.job_id == job.id and len(answer.data) == 5
    refused = recommend.sync(ids[1], "t0u1", client=keys[0], k=5)  # another tenant's path
    assert isinstance(refused, models.Problem) and refused.status == 404
