"""Authentication and authorisation of every route in the OpenAPI schema.

The walk enumerates ``app.openapi()``, so a new route is covered without editing this file
(an unknown path parameter fails the walk until it gets a value here). Each operation is
called with no credentials, malformed headers, a wrong key, another tenant's key, a revoked
key, a tenant key on admin routes and the admin token on tenant routes. The design
(app/deps.py): missing or invalid credentials get 401 with ``WWW-Authenticate: Bearer``;
a valid key of another tenant gets 404 ``Tenant not found`` (never 403, so a key cannot
learn whether a tenant exists). Never 2xx, never 5xx, and the body never echoes the
presented secret or a traceback. With the right credentials the same requests succeed
(positive control), so the walk cannot pass by testing nothing.
"""

from __future__ import annotations

import ast
import collections
import hmac
import inspect
import math
import secrets
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import app.deps
import app.routes.tenants
import app.security
from app.config import Settings
from app.db import migrate
from app.main import create_app
from app.models import ApiKey
from app.security import KEY_PREFIX, PREFIX_LENGTH, generate_key, hash_key
from tests.app.conftest import ADMIN_TOKEN
from tests.test_layers import parse
from tests.training_helpers import make_tenants, submit_job, wait_job

PUBLIC = {("get", "/health"), ("get", "/ready")}  # the only routes without credentials
METHODS = ("get", "post", "put", "patch", "delete")


def bodies(victim: int, other: int) -> dict:
    """Request bodies that succeed with the right credentials (positive control)."""
    job = {"algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 1,
           "tenant_ids": [victim, other], "dp": {"mechanism": "none"}}
    return {
        ("post", "/v1/admin/tenants"): {"json": {"name": "walk-new", "privacy_budget": 1}},
        ("post", "/v1/admin/tenants/{tenant_id}/api-keys"): {"json": {"name": "walk"}},
        ("put", "/v1/admin/items"): {"json": {"items": [{"key": "walk-item"}]}},
        ("patch", "/v1/admin/tenants/{tenant_id}"): {"json": {"privacy_budget": 2000.0,
                                                            "retrain_min_seconds": 3600}},
        ("post", "/v1/admin/jobs"): {"json": job},
        ("post", "/v1/admin/tuning-jobs"): {"json": {"tenant_ids": [victim, other],
                                                     "rounds": 2, "trials": 2}},
        ("post", "/v1/tenants/{tenant_id}/ratings"): {
            "content": b"u0,i0,3\n", "headers": {"Content-Type": "text/csv"}},
        ("post", "/v1/tenants/{tenant_id}/recommendations"): {"json": {"users": ["u0"], "k": 2}},
        ("post", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/rounds/{round_}/decline"): {
            "json": {"reason": "walk"}},
        ("post", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/rounds/{round_}/secagg/{phase}"): {
            "json": {"message": {"type": "AdvertiseKeys"}}},
    }

NOT_2XX_WHEN_AUTHORISED = {  # the walk's fixture state explains these (a finished job)
    ("post", "/v1/admin/jobs/{job_id}/cancel"): 409,
    ("post", "/v1/admin/jobs/{job_id}/resume"): 409,
    ("get", "/v1/tenants/{tenant_id}/stats"): 404,  # the GETs run before POST /stats
    ("get", "/v1/admin/tuning-jobs/{job_id}"): 404,  # ... and before POST /tuning-jobs
    # the walk's job is hosted: the victim is not an agent of it
    ("get", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}"): 404,
    ("get", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/round"): 404,
    ("get", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/global"): 404,
    ("put", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/rounds/{round_}/upload"): 404,
    ("post", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/rounds/{round_}/decline"): 404,
    ("get", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/rounds/{round_}/secagg"): 404,
    ("post", "/v1/tenants/{tenant_id}/agent/jobs/{job_id}/rounds/{round_}/secagg/{phase}"): 404,
}
TENANT_CASES = ("none", "basic", "empty_bearer", "no_scheme", "wrong_key", "garbage",
                "revoked", "admin_token", "other_tenant")
ADMIN_CASES = ("none", "basic", "empty_bearer", "no_scheme", "wrong_token", "tenant_key",
               "other_tenant_key", "revoked")
TRACEBACK_MARKERS = ("Traceback", 'File "', "sqlalchemy", "Error:", "site-packages")


class Walk:
    """The app, a victim tenant (with data, a job and a revoked key) and another tenant."""

    def __init__(self, tmp: Path):
        url = f"sqlite:///{tmp}/walk.db"
        migrate(url)
        self.db_path = tmp / "walk.db"
        self.app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN,
                                       max_failed_sign_ins=10**6))  # walks every refusal
        self.client = TestClient(self.app)
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        self.client.headers.update(self.admin)  # make_tenants and submit_job act as admin
        (self.victim, self.key), (self.other, self.other_key) = make_tenants(self.client)
        self.job = wait_job(self.client, submit_job(self.client, rounds=1).json()["id"])["id"]
        self.wait_jobs()
        self.revoked = self._revoked_key()
        self.key_id = self._new_key()["id"]  # a spare key of the victim: {key_id} of the walk

    def wait_jobs(self) -> None:
        """Wait for every job (no training thread outlives the database); then no default
        credentials are left on the client."""
        self.client.headers.update(self.admin)
        for job in self.client.get("/v1/admin/jobs").json()["data"]:
            wait_job(self.client, job["id"])
        for _ in range(1200):  # and the tuning job the walk may have created
            if self.client.get("/v1/admin/tuning-jobs/1").json().get("status") not in (
                    "queued", "running"):
                break
            time.sleep(0.05)
        del self.client.headers["Authorization"]

    def _new_key(self) -> dict:
        return self.client.post(f"/v1/admin/tenants/{self.victim}/api-keys",
                                headers=self.admin).json()

    def _revoked_key(self) -> str:
        created = self._new_key()
        used = self.client.get(f"/v1/tenants/{self.victim}/ratings/count",
                               headers={"Authorization": f"Bearer {created['key']}"})
        assert used.status_code == 200  # cached as valid before the revocation
        gone = self.client.delete(f"/v1/admin/tenants/{self.victim}/api-keys/{created['id']}",
                                  headers=self.admin)
        assert gone.status_code == 200
        return created["key"]

    def params(self) -> dict[str, str]:
        return {"tenant_id": str(self.victim), "job_id": str(self.job),
                "key_id": str(self.key_id), "user": "u0", "user_key": "u0", "round_": "1",
                "phase": "keys"}

    def credentials(self, case: str) -> tuple[dict[str, str], str | None]:
        """(headers, the secret presented) of one credential case."""
        fake_key = f"{KEY_PREFIX}_{secrets.token_hex(PREFIX_LENGTH // 2)}_" \
                   f"{secrets.token_urlsafe(32)}"
        secret = {"none": None, "basic": self.key, "empty_bearer": None,
                  "no_scheme": self.key, "wrong_key": fake_key,
                  "garbage": "x" * 20 + secrets.token_urlsafe(16),
                  "wrong_token": secrets.token_urlsafe(32), "revoked": self.revoked,
                  "admin_token": ADMIN_TOKEN, "other_tenant": self.other_key,
                  "other_tenant_key": self.other_key, "tenant_key": self.key}[case]
        header = {"none": None, "basic": f"Basic {secret}", "empty_bearer": "Bearer ",
                  "no_scheme": secret}.get(case, f"Bearer {secret}")
        return ({} if header is None else {"Authorization": header}), secret

    def call(self, method: str, template: str, headers: dict[str, str]):
        params = self.params()
        if (method, template) == ("delete", "/v1/admin/tenants/{tenant_id}"):
            # deleting a tenant names a throwaway one: the walk's tenants must outlive it
            params["tenant_id"] = self.client.post(
                "/v1/admin/tenants", json={"name": f"throwaway-{uuid.uuid4().hex[:8]}",
                                           "privacy_budget": 1},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["id"]
        path = template.format(**params)
        extra = bodies(self.victim, self.other).get((method, template), {})
        return self.client.request(method.upper(), path, headers={
            **extra.get("headers", {}), **headers},
            **{k: v for k, v in extra.items() if k != "headers"})


def operations(schema: dict) -> list[tuple[str, str, dict]]:
    return [(method, path, op) for path, item in schema["paths"].items()
            for method, op in item.items() if method in METHODS]


def kind_of(path: str, op: dict) -> str:
    schemes = {name for req in op.get("security", []) for name in req}
    return "admin" if "AdminToken" in schemes else "tenant" if "TenantApiKey" in schemes \
        else "public"


def expected(kind: str, case: str) -> tuple[int, str]:
    if kind == "tenant":
        if case == "other_tenant":
            return 404, "Tenant not found"
        missing = case in ("none", "basic", "empty_bearer", "no_scheme")
        return 401, "API key required" if missing else "Invalid API key"
    missing = case in ("none", "basic", "empty_bearer", "no_scheme")
    return 401, "Admin token required" if missing else "Invalid admin token"


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Walk:
    return Walk(tmp_path_factory.mktemp("walk"))


@pytest.fixture(scope="module")
def results(walk) -> list[tuple]:
    """(kind, method, path, case, response, secret) of every refused call of the walk."""
    before = walk.client.get(f"/v1/tenants/{walk.victim}/ratings/count",
                             headers={"Authorization": f"Bearer {walk.key}"}).json()
    out = []
    for method, path, op in operations(walk.app.openapi()):
        kind = kind_of(path, op)
        for case in {"admin": ADMIN_CASES, "tenant": TENANT_CASES}.get(kind, ()):
            headers, secret = walk.credentials(case)
            out.append((kind, method, path, case, walk.call(method, path, headers), secret))
    after = walk.client.get(f"/v1/tenants/{walk.victim}/ratings/count",
                            headers={"Authorization": f"Bearer {walk.key}"}).json()
    assert after == before  # no refused call wrote anything
    return out


def test_every_route_is_classified_and_only_health_is_public(walk):
    for method, path, op in operations(walk.app.openapi()):
        kind = kind_of(path, op)
        if path.startswith("/v1/admin/") or path == "/metrics":  # metrics: admin-only
            assert kind == "admin", (method, path)
        elif path.startswith("/v1/tenants/"):
            assert kind == "tenant", (method, path)
        else:
            assert (method, path) in PUBLIC and kind == "public", (method, path)
        for param in op.get("parameters", []):
            if param["in"] == "path":
                assert param["name"] in walk.params(), f"no value for {param['name']} " \
                                                       f"in {method} {path}: add one"


def test_the_walk_covered_every_operation_with_every_case(walk, results):
    ops = operations(walk.app.openapi())
    guarded = [(m, p) for m, p, op in ops if kind_of(p, op) != "public"]
    assert len(guarded) == len(ops) - len(PUBLIC) >= 25
    per_op = collections.Counter((m, p) for _, m, p, _, _, _ in results)
    assert set(per_op) == set(guarded)
    for kind, cases in (("admin", ADMIN_CASES), ("tenant", TENANT_CASES)):
        mine = {(m, p) for k, m, p, _, _, _ in results if k == kind}
        assert mine and all(per_op[op] == len(cases) for op in mine)
    assert len(results) == sum(len(ADMIN_CASES if kind_of(p, op) == "admin" else TENANT_CASES)
                               for m, p, op in ops if kind_of(p, op) != "public")


def test_every_refusal_has_the_designed_status_and_detail(results):
    wrong = []
    for kind, method, path, case, response, _ in results:
        want = expected(kind, case)
        got = (response.status_code, response.json().get("detail"))
        if got != want:
            wrong.append((method, path, case, got, want))
        elif response.status_code == 401:
            assert response.headers["www-authenticate"] == "Bearer"
    assert wrong == []


def test_refusals_never_echo_the_secret_or_a_traceback(results):
    for _, method, path, case, response, secret in results:
        assert not 200 <= response.status_code < 300 and response.status_code < 500
        if secret:
            assert secret not in response.text, (method, path, case)
            assert secret[-20:] not in response.text, (method, path, case)
        assert not any(m in response.text for m in TRACEBACK_MARKERS), (method, path, case)


def test_with_the_right_credentials_every_operation_is_served(walk, results):
    """Positive control: the same requests succeed (or fail for a reason other than
    authentication) with the right credentials; destructive calls go last."""
    order = {"get": 0, "put": 1, "post": 1, "patch": 1, "delete": 2}
    ops = sorted(operations(walk.app.openapi()), key=lambda o: order[o[0]])
    statuses = {}
    for method, path, op in ops:
        kind = kind_of(path, op)
        headers = walk.admin if kind == "admin" else \
            {"Authorization": f"Bearer {walk.key}"} if kind == "tenant" else {}
        response = walk.call(method, path, headers)
        statuses[(method, path)] = response.status_code
        assert response.status_code < 500 and response.status_code != 401, (method, path)
        assert response.json().get("code") != "tenant_not_found" if response.headers[
            "content-type"].startswith(("application/json", "application/problem+json")) \
            else True
    refused = {op: s for op, s in statuses.items() if not 200 <= s < 300}
    assert refused == NOT_2XX_WHEN_AUTHORISED
    walk.wait_jobs()


def test_keys_are_random_distinct_and_long():
    keys = [generate_key() for _ in range(300)]
    full = [k for k, _, _ in keys]
    assert len(set(full)) == len({p for _, p, _ in keys}) == len({h for _, _, h in keys}) == 300
    secrets_part = [k.split("_", 2)[2] for k in full]
    assert all(len(s) == 43 for s in secrets_part)  # 32 random bytes, URL-safe base64
    assert all(k.startswith(f"{KEY_PREFIX}_{p}_") and len(p) == PREFIX_LENGTH
               for k, p, _ in keys)
    counts = collections.Counter("".join(secrets_part))
    n = sum(counts.values())
    entropy = -sum(c / n * math.log2(c / n) for c in counts.values())
    assert entropy > 5.9  # bits per character; a uniform 64-letter alphabet gives 6
    assert all(h == hash_key(k) and len(h) == 64 for k, _, h in keys)


def test_issued_keys_are_distinct_and_only_their_hashes_are_stored(walk):
    issued = [walk.client.post(f"/v1/admin/tenants/{walk.other}/api-keys",
                               headers=walk.admin).json()["key"] for _ in range(5)]
    issued += [walk.key, walk.other_key, walk.revoked]
    assert len(set(issued)) == len(issued)
    with walk.app.state.sessions() as s:
        stored = s.execute(sa.select(ApiKey.prefix, ApiKey.key_hash)).all()
    assert {h for _, h in stored} >= {hash_key(k) for k in issued}
    raw = b"".join(p.read_bytes() for p in walk.db_path.parent.glob("walk.db*"))
    assert hash_key(walk.key).encode() in raw  # the scan does see the stored columns
    for key in issued:
        assert key.encode() not in raw and key.split("_", 2)[2].encode() not in raw
    with sqlite3.connect(walk.db_path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                             "WHERE type = 'table'")]
        dump = repr([conn.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables])
    assert not any(k.split("_", 2)[2] in dump for k in issued)


def _compared_names(source: str) -> list[str]:
    """The names (``x`` or ``obj.x``) compared with ``==`` or ``!=`` anywhere in ``source``."""
    names = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq)
                                                 for op in node.ops):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Name):
                    names.append(operand.id)
                elif isinstance(operand, ast.Attribute):
                    names.append(operand.attr)
    return names


def test_secrets_are_compared_in_constant_time_only():
    same = inspect.getsource(app.security.same_secret)
    assert "hmac.compare_digest" in same and not _compared_names(same)
    suspicious = {"credentials", "key_hash", "admin_token", "presented", "given", "candidate",
                  "digest", "key", "token", "expected_hash_or_token"}
    compared = [n for m in (app.deps, app.security, app.routes.tenants)
                for n in _compared_names(inspect.getsource(m))]
    assert "id" in compared  # the scan does find comparisons (tenant.id != tenant_id)
    assert suspicious.isdisjoint(compared)


def test_admin_token_and_keys_go_through_compare_digest(walk, monkeypatch):
    seen, original = [], hmac.compare_digest

    def recording(a, b):
        seen.append((a, b))
        return original(a, b)

    monkeypatch.setattr(app.security.hmac, "compare_digest", recording)
    assert walk.client.get("/v1/admin/tenants", headers=walk.admin).status_code == 200
    assert (ADMIN_TOKEN.encode(), ADMIN_TOKEN.encode()) in seen
    walk.app.state.key_cache.forget()  # force a database verification of the key
    ok = walk.client.get(f"/v1/tenants/{walk.victim}/ratings/count",
                         headers={"Authorization": f"Bearer {walk.key}"})
    assert ok.status_code == 200
    assert (hash_key(walk.key).encode(), hash_key(walk.key).encode()) in seen
