"""Schemathesis against the service's own OpenAPI schema, in-process on a migrated SQLite.

Every operation gets a bounded number of generated requests (``EXAMPLES``) with valid
credentials: the admin token on ``/admin/*``, the victim tenant's key on ``/tenants/*``,
whose ``{tenant_id}`` (and ``{job_id}``, ``{key_id}``) are pinned to existing rows so the
requests reach the handlers instead of stopping at 404. Checks: no 5xx, every status code
is documented, every response body conforms to its documented schema and content type.

The operations are listed at collection time from the app's OpenAPI document and each one
runs Hypothesis over ``APIOperation.as_strategy`` (``MODES``). This uses only
schemathesis' public schema API, not its pytest plugin, whose ``from_fixture`` reaches into
pytest internals that pytest 9.2 removed.
"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.config import Settings
from app.db import migrate
from app.main import create_app
from tests.app.conftest import ADMIN_TOKEN
from tests.training_helpers import make_tenants, submit_job, wait_job

EXAMPLES = 12
#: positive cases (valid by the schema); out-of-range and malformed input is walked by
#: the hardening tests, which name the field expected in each 422
MODES = [GenerationMode.POSITIVE]
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance,
          content_type_conformance]


class Env:
    """The app, two tenants with ratings, a finished job and a spare key to revoke."""

    def __init__(self, tmp):
        url = f"sqlite:///{tmp}/fuzz.db"
        migrate(url)
        # small job bounds: a generated job that passes validation trains for seconds; the
        # fuzzer's wrong tokens must not lock its valid requests out
        self.app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN,
                                       max_job_rounds=2, max_top_k=50,
                                       max_failed_sign_ins=10**6))
        self.client = TestClient(self.app)
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        self.client.headers.update(self.admin)
        (self.victim, key), _ = make_tenants(self.client)
        self.tenant = {"Authorization": f"Bearer {key}"}
        self.job = wait_job(self.client, submit_job(self.client, rounds=1).json()["id"])["id"]
        spare = self.client.post(f"/v1/admin/tenants/{self.victim}/api-keys").json()
        self.spare_key_id = spare["id"]

    def pin(self, case) -> dict[str, str]:
        """Pin the path to existing rows; the credentials of the operation."""
        params = case.path_parameters or {}
        fixed = {"tenant_id": self.victim, "job_id": self.job, "key_id": self.spare_key_id}
        if (case.method.upper(), case.operation.path) == ("DELETE",
                                                          "/v1/admin/tenants/{tenant_id}"):
            # deleting pins a throwaway tenant: the others' rows must outlive the case
            fixed["tenant_id"] = self.client.post("/v1/admin/tenants", json={
                "name": f"throwaway-{uuid.uuid4().hex[:8]}", "privacy_budget": 1}).json()["id"]
        for name, value in fixed.items():
            if name in params:
                params[name] = value
        return self.admin if case.operation.path.startswith("/v1/admin/") else self.tenant

    def wait_jobs(self) -> None:
        for job in self.client.get("/v1/admin/jobs", headers=self.admin).json()["data"]:
            wait_job(self.client, job["id"])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = Env(tmp_path_factory.mktemp("fuzz"))
    yield env
    env.wait_jobs()  # no training thread outlives the database


@pytest.fixture(scope="module")
def api_schema(env):
    return schemathesis.openapi.from_asgi("/openapi.json", env.app)


def _operation_labels() -> list[str]:
    """``"METHOD /path"`` of every operation in the app's OpenAPI document."""
    spec = create_app(Settings(database_url="sqlite://", admin_token=ADMIN_TOKEN)).openapi()
    return [f"{method.upper()} {path}" for path, item in spec["paths"].items()
            for method in item if method in ("get", "post", "put", "patch", "delete")]


LABELS = _operation_labels()


def test_every_operation_is_fuzzed():
    # the list above is the app's own: a route added later is fuzzed without editing this file
    assert "POST /v1/tenants/{tenant_id}/ratings" in LABELS and len(LABELS) >= 20


@pytest.mark.parametrize("label", LABELS)
def test_no_server_error_and_responses_match_the_schema(label, env, api_schema):
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in the served schema"
    cases = st.one_of([operation.as_strategy(generation_mode=mode) for mode in MODES])

    @given(case=cases)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        case.headers = {**(case.headers or {}), **env.pin(case)}
        case.call_and_validate(checks=CHECKS)

    run()
