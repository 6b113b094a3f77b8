"""fedrec.client against the real app: its models against the OpenAPI schema, every
method against a live server (SQLite and PostgreSQL), and ``fedrec admin`` end to end."""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
import sys
import types
import uuid
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import httpx
import pytest
from fastapi.testclient import TestClient

from app.cli import main
from app.config import Settings
from app.main import create_app
from fedrec import client as fc
from fedrec.client import ApiError, Client, TrainedModel
from tests.app.conftest import ADMIN_TOKEN
from tests.doc_pages import section
from tests.training_helpers import CONFIG

ROOT = Path(__file__).resolve().parents[2]


# -- the models against the schema --------------------------------------------------------

@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict:
    url = f"sqlite:///{tmp_path_factory.mktemp('schema')}/s.db"
    return create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN)).openapi()


def refused(ann, node: Any, where: str) -> list[str]:
    """Why the client's annotation ``ann`` cannot hold every value the schema ``node``
    allows (empty: it can)."""
    if node is True or node == {}:
        return [] if ann is Any else [f"{where}: any value, the client takes {ann}"]
    alternatives = node.get("anyOf") or node.get("oneOf")
    if alternatives:
        return [p for alt in alternatives for p in refused(ann, alt, where)]
    if ann is Any:
        return []
    if get_origin(ann) in (Union, types.UnionType):
        options = [refused(a, node, where) for a in get_args(ann)]
        return [] if any(not o for o in options) else \
            [f"{where}: no member of {ann} takes {node}"]
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        ok = isinstance(ann, type) and issubclass(ann, fc.Model) and ann.schema_name == name
        return [] if ok else [f"{where}: {name} expected, the client has {ann}"]
    if get_origin(ann) is Literal:
        values = node.get("enum", [node["const"]] if "const" in node else None)
        ok = values is not None and set(values) <= set(get_args(ann))
        return [] if ok else [f"{where}: {node} is not within {ann}"]
    kind = node.get("type")
    if kind == "array":
        if get_origin(ann) is not list:
            return [f"{where}: array, the client has {ann}"]
        return refused(get_args(ann)[0], node.get("items", {}), where + "[]")
    if kind == "object":
        if get_origin(ann) is not dict:
            return [f"{where}: object, the client has {ann}"]
        return refused(get_args(ann)[1], node.get("additionalProperties", True), where + "{}")
    takes = {"null": (type(None),), "integer": (int, float), "number": (float,),
             "boolean": (bool,), "string": (str, dt.datetime) if node.get("format") ==
             "date-time" else (str,)}.get(kind, ())
    return [] if ann in takes else [f"{where}: {kind} ({node}), the client has {ann}"]


def test_every_client_model_matches_its_schema_component(openapi):
    components = openapi["components"]["schemas"]
    assert len(fc.MODELS) >= 30
    problems = []
    for model in fc.MODELS:
        schema = components.get(model.schema_name)
        assert schema is not None, f"{model.__name__}: no component {model.schema_name}"
        props = schema["properties"]
        fields = model.model_fields
        problems += [f"{model.__name__}.{f}: not in {model.schema_name}"
                     for f in fields if f not in props]
        problems += [f"{model.__name__}: lacks required {model.schema_name}.{f}"
                     for f in schema.get("required", []) if f not in fields]
        for name, field in fields.items():
            if name in props:
                problems += refused(field.annotation, props[name], f"{model.__name__}.{name}")
    assert problems == []


def test_the_schema_check_finds_a_wrong_type(openapi):
    """The check above can fail: a model with an int where the schema has a number, a
    missing required field and an extra one."""
    class Wrong(fc.Model):
        schema_name = "TenantPrivacy"
        epsilon_max: int
        extra: str

    schema = openapi["components"]["schemas"]["TenantPrivacy"]
    assert refused(Wrong.model_fields["epsilon_max"].annotation,
                   schema["properties"]["epsilon_max"], "x")
    assert refused(float, schema["properties"]["epsilon_spent"], "x")  # "infinity"
    assert not refused(fc.Privacy.model_fields["epsilon_spent"].annotation,
                       schema["properties"]["epsilon_spent"], "x")


def test_every_answer_model_is_the_documented_answer_of_its_routes(openapi):
    """Each model names a component some operation answers with (2xx), so the client
    reads what the server documents, not a request body."""
    answered = set()
    for item in openapi["paths"].values():
        for op in item.values():
            for code, response in op.get("responses", {}).items():
                if code.startswith("2"):
                    answered |= set(re.findall(r"#/components/schemas/(\w+)",
                                               json.dumps(response)))
    nested = {"JobSpend", "TenantPrivacy", "TenantPublic", "TenantAuditPublic",
              "ApiKeyPublic", "ItemPublic", "TenantPlan", "RoundPublic",
              "TenantRoundPublic", "RankingPublic", "RatingPublic", "Recommendation",
              "RecommendationsPublic", "TuningTrial"}  # reached through another answer
    missing = {m.schema_name for m in fc.MODELS} - answered - nested
    assert missing == set()


CALLS = {  # every method that makes one call: its arguments
    "create_tenant": (("acme", 1.0), {}), "tenants": ((), {}), "tenant": ((1,), {}),
    "update_tenant": ((1,), {"name": "x"}), "tenant_audit": ((1,), {}),
    "delete_tenant": ((1,), {}),
    "create_api_key": ((1,), {}), "api_keys": ((1,), {}), "revoke_api_key": ((1, 2), {}),
    "put_items": (([{"key": "a"}],), {}), "items": ((), {}), "create_job": ((), {}),
    "plan_job": ((), {}), "jobs": ((), {}), "job": ((1,), {}), "cancel_job": ((1,), {}),
    "resume_job": ((1,), {}), "job_report": ((1,), {}),
    "create_tuning_job": ((), {}), "tuning_job": ((1,), {}), "tuning_jobs": ((), {}),
    "cancel_tuning_job": ((1,), {}), "resume_tuning_job": ((1,), {}), "model": ((1,), {}),
    "upload_ratings": ((1,), {"rows": [{"user": "u", "item": "a", "rating": 1}]}),
    "ratings": ((1,), {}), "count_ratings": ((1,), {}), "forget_user": ((1, "u/1"), {}),
    "recommendations": ((1, "u"), {}), "batch_recommendations": ((1, ["u"]), {}),
    "tenant_report": ((1,), {}), "privacy": ((1,), {}), "compute_stats": ((1,), {}),
    "stats": ((1,), {}),
}


def test_every_method_calls_a_documented_operation_answering_its_model(openapi):
    """Each method's request is an operation of the schema (path and method), and the
    operation's success answer is the component the method returns."""
    import typing

    sent = []

    class Sent(Exception):
        pass

    def record(request):
        sent.append(request)
        raise Sent

    client = Client("http://x", token="t", transport=httpx.MockTransport(record))
    public = {n for n in dir(Client) if not n.startswith("_")} - {
        "request", "close", "wait_job", "wait_tuning_job", "base_url"}
    assert public == set(CALLS)
    templates = {path: "^" + re.sub(r"\\\{[^}/]+\\\}", "[^/]+", re.escape(path)) + "$"
                 for path in openapi["paths"]}
    for name, (args, kwargs) in CALLS.items():
        with pytest.raises(Sent):
            getattr(client, name)(*args, **kwargs)
        request = sent.pop()
        path = request.url.raw_path.decode().split("?")[0]
        if name == "forget_user":  # a user key is one path segment, whatever it holds
            assert path == "/v1/tenants/1/users/u%2F1/ratings"
        matches = [p for p, rx in templates.items() if re.match(rx, path)
                   and request.method.lower() in openapi["paths"][p]]
        assert len(matches) == 1, (name, request.method, path)
        op = openapi["paths"][matches[0]][request.method.lower()]
        answers = {ref for code, response in op["responses"].items() if code.startswith("2")
                   for ref in re.findall(r"#/components/schemas/(\w+)", json.dumps(response))}
        returned = typing.get_type_hints(getattr(Client, name))["return"]
        if returned is TrainedModel:  # a NumPy file, not a JSON component
            assert "application/x-npz" in op["responses"]["200"]["content"], name
            continue
        assert returned.schema_name in answers, (name, answers)


def test_the_client_imports_no_server_module():
    code = ("import sys, fedrec.client; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('app', 'worker', 'fastapi', 'sqlalchemy', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


# -- every method against the app (SQLite and PostgreSQL) ---------------------------------

@pytest.fixture
def app(database_url):
    return create_app(Settings(database_url=database_url, admin_token=ADMIN_TOKEN,
                               broker_url=None))


def client_of(app, token: str | None) -> Client:
    """A fedrec Client talking to ``app`` in-process (a TestClient is an httpx.Client)."""
    return Client("http://testserver", token=token, http=TestClient(app))


def test_the_client_drives_the_admin_and_tenant_routes(app, tmp_path):
    admin = client_of(app, ADMIN_TOKEN)
    name = f"c-{uuid.uuid4().hex[:8]}"
    tenant = admin.create_tenant(name, 3.0, idempotency_key=f"k-{name}", rating_max=5.0)
    again = admin.create_tenant(name, 3.0, idempotency_key=f"k-{name}", rating_max=5.0)
    assert isinstance(tenant, fc.Tenant) and again.id == tenant.id
    with pytest.raises(ApiError) as err:
        admin.create_tenant(name, 3.0)
    assert (err.value.status, err.value.code) == (409, "tenant_name_taken")
    assert name in err.value.detail
    assert tenant.id in [t.id for t in admin.tenants().data]
    detail = admin.update_tenant(tenant.id, privacy_budget=7.5, actor="ops")
    assert detail.privacy_budget == 7.5 and detail.privacy.epsilon_remaining == 7.5
    assert admin.tenant(tenant.id).privacy.epsilon_spent == 0.0
    audit = admin.tenant_audit(tenant.id)
    assert audit.count == 1 and audit.data[0].changes["privacy_budget"] == {"old": 3.0,
                                                                            "new": 7.5}
    assert audit.data[0].actor.endswith("(ops)")

    key = admin.create_api_key(tenant.id, "client-test")
    spare = admin.create_api_key(tenant.id)
    assert key.key.startswith(f"fk_{key.prefix}_")
    revoked = admin.revoke_api_key(tenant.id, spare.id)
    assert revoked.revoked_at is not None
    keys = {k.id: k for k in admin.api_keys(tenant.id).data}
    assert keys[key.id].revoked_at is None and keys[spare.id].revoked_at is not None
    with pytest.raises(ApiError) as err:
        client_of(app, spare.key).count_ratings(tenant.id)
    assert err.value.status == 401

    assert admin.put_items([{"key": f"{name}-{i}", "title": f"T{i}"} for i in range(4)]) \
        .upserted == 4
    page = admin.items(limit=1000)
    assert {f"{name}-{i}" for i in range(4)} <= {i.key for i in page.data}

    mine = client_of(app, key.key)
    assert mine.upload_ratings(tenant.id, rows=[{"user": "a", "item": f"{name}-0",
                                                 "rating": 4}]).stored == 1
    assert mine.upload_ratings(tenant.id, csv=f"user,item,rating\nb,{name}-1,2\n").stored == 1
    tsv = tmp_path / "u.data"
    tsv.write_text(f"c\t{name}-2\t5\t881250949\nc\t{name}-3\t1\t881250950\n")
    assert mine.upload_ratings(tenant.id, path=tsv).stored == 2
    with pytest.raises(ApiError) as err:
        mine.upload_ratings(tenant.id, csv=f"user,item,rating\nd,{name}-0,9\nd,nope,3\n")
    assert (err.value.status, err.value.code) == (422, "upload_rejected")
    assert [(e["line"], e["field"]) for e in err.value.errors] == [(2, "rating"), (3, "item")]
    assert mine.count_ratings(tenant.id) == fc.RatingsCount(count=4, users=3)
    rows = mine.ratings(tenant.id, user="c").data
    assert [(r.item, r.rating) for r in rows] == [(f"{name}-2", 5.0), (f"{name}-3", 1.0)]
    assert rows[0].timestamp == dt.datetime.fromtimestamp(881250949, dt.UTC)
    assert mine.forget_user(tenant.id, "c") == fc.UserForgotten(user="c", deleted=2)
    assert mine.count_ratings(tenant.id).count == 2
    assert mine.privacy(tenant.id).epsilon_max == 7.5
    assert mine.compute_stats(tenant.id).status  # no broker: computed in-process
    stats = mine.stats(tenant.id)
    assert (stats.n_ratings, stats.n_users, stats.mean) == (2, 2, 3.0)
    recs = mine.recommendations(tenant.id, "a", k=2)
    # the tenant's rated items by popularity, less a's own (c's were forgotten)
    assert recs.source == "popularity" and [r.item for r in recs.data] == [f"{name}-1"]
    with pytest.raises(ApiError) as err:
        mine.tenant_report(tenant.id)
    assert (err.value.status, err.value.code) == (404, "no_training_job")
    with pytest.raises(ApiError) as err:
        mine.count_ratings(tenant.id + 1)  # another tenant's: 404, never its data
    assert err.value.code == "tenant_not_found"


def trained_tenant(admin: Client, seed: int) -> tuple[int, str]:
    """A tenant (unique name, opted in to noise-free jobs) with synthetic ratings over
    its own items, set up through the client; (id, API key)."""
    from algorithms.synthetic import generate_ratings

    tag = uuid.uuid4().hex[:8]
    r = generate_ratings(60, 30, 900, rank=3, seed=seed)
    admin.put_items([{"key": f"{tag}-{i}"} for i in range(30)])
    tenant = admin.create_tenant(f"job-{tag}", 1000.0, allow_non_private=True)
    key = admin.create_api_key(tenant.id).key
    rows = [{"user": f"u{u}", "item": f"{tag}-{i}", "rating": float(v)}
            for u, i, v in zip(r.users, r.items, r.values, strict=True)]
    with Client(admin.base_url, token=key, http=_sibling(admin)) as mine:
        assert mine.upload_ratings(tenant.id, rows=rows).stored == len(rows)
    return tenant.id, key


def _sibling(client: Client) -> httpx.Client | None:
    """A new httpx client to the same place (a TestClient's app, else None: by URL)."""
    app = getattr(client.http, "app", None)
    return TestClient(app) if app is not None else None


def test_the_client_trains_a_job_and_reads_its_report(app):
    with TestClient(app) as http:
        admin = Client("http://testserver", token=ADMIN_TOKEN, http=http)
        tid, key = trained_tenant(admin, seed=0)
        body = {"algorithm": "fedmc-admm", "config": CONFIG, "rounds": 3, "seed": 1,
                "tenant_ids": [tid], "dp": {"mechanism": "none"}, "lists": "model"}
        plan = admin.plan_job(**body)
        assert plan.tenants[str(tid)].epsilon_after == "infinity"
        job = admin.create_job(idempotency_key=f"j-{uuid.uuid4().hex}", **body)
        seen = []
        done = admin.wait_job(job.id, poll=0.05, timeout=120, on_poll=seen.append)
        assert done.status == "completed" and done.current_round == 3
        assert seen[-1] == done
        report = admin.job_report(job.id)
        assert [r.round for r in report.curve] == [1, 2, 3]
        assert report.curve[-1].test_rmse == done.latest_metrics["test_rmse"]
        assert admin.jobs().data[0].id == job.id
        with pytest.raises(ApiError) as err:
            admin.cancel_job(job.id)
        assert (err.value.status, err.value.code) == (409, "job_finished")
        with pytest.raises(ApiError) as err:
            admin.resume_job(job.id)
        assert (err.value.status, err.value.code) == (409, "job_not_resumable")
        mine = Client("http://testserver", token=key, http=TestClient(app))
        assert mine.tenant_report(tid).job_id == job.id
        user = mine.ratings(tid, limit=1).data[0].user
        one = mine.recommendations(tid, user, k=3)
        assert one.source == "model" and one.job_id == job.id and len(one.data) == 3
        batch = mine.batch_recommendations(tid, [user, "nobody"], k=3)
        assert batch.data == [one] and batch.not_found == ["nobody"]


def test_the_client_tunes_then_trains_with_the_chosen_config(app):
    """A tuning job through the client; its config, as it is, is a training job's config."""
    with TestClient(app) as http:
        admin = Client("http://testserver", token=ADMIN_TOKEN, http=http)
        tid, _ = trained_tenant(admin, seed=3)
        tuning = admin.create_tuning_job(algorithm="fedmc-admm", tenant_ids=[tid],
                                         rounds=4, trials=3, seed=2)
        assert tuning.status in ("queued", "running") and tuning.tenant_ids == [tid]
        done = admin.wait_tuning_job(tuning.id, poll=0.05, timeout=300)
        assert done.status == "completed", done.error
        assert done == admin.tuning_job(tuning.id)
        at_chosen = [t.validation_rmse for t in done.scored if t.rounds == done.chosen_rounds]
        assert done.validation_rmse == min(at_chosen) and done.config is not None
        assert 1 <= done.chosen_rounds <= 4
        job = admin.wait_job(admin.create_job(algorithm="fedmc-admm", tenant_ids=[tid],
                                              rounds=done.chosen_rounds, config=done.config,
                                              dp={"mechanism": "none"}).id,
                             poll=0.05, timeout=120)
        assert job.status == "completed" and job.config == done.config
        with pytest.raises(ApiError) as err:
            admin.tuning_job(10**9)
        assert (err.value.status, err.value.code) == (404, "tuning_job_not_found")


def test_an_answer_that_is_not_a_problem_still_raises_api_error():
    def handler(request):
        return httpx.Response(502, text="<html>Bad gateway</html>")

    client = Client("http://x", token="t", transport=httpx.MockTransport(handler))
    with pytest.raises(ApiError) as err:
        client.tenants()
    assert (err.value.status, err.value.code) == (502, "http_502")
    assert "Bad gateway" in err.value.detail


# -- fedrec admin against a live server ---------------------------------------------------

@pytest.fixture
def live(database_url, monkeypatch):
    """A uvicorn server (a thread) on the database; FEDREC_URL and the token set."""
    from app.commands.demo import _free_port, start_server

    port = _free_port()
    server, thread = start_server(Settings(database_url=database_url,
                                            admin_token=ADMIN_TOKEN, broker_url=None), port)
    monkeypatch.setenv("FEDREC_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("FEDREC_ADMIN_TOKEN", ADMIN_TOKEN)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def admin_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["admin", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_admin_cli_creates_shows_and_patches_a_tenant(live, capsys, tmp_path):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    code, out, _ = admin_cli(capsys, "tenants", "create", name, "--budget", "4",
                             "--allow-non-private", "--json", "-")
    assert code == 0
    created = json.loads(out)  # stdout holds the JSON only
    with Client(live, token=ADMIN_TOKEN) as admin:
        row = admin.tenant(created["id"])
    assert (row.name, row.privacy_budget, row.allow_non_private) == (name, 4.0, True)

    saved = tmp_path / "tenants.json"
    code, out, _ = admin_cli(capsys, "tenants", "list", "--json", str(saved))
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "NAME", "RATING_MIN"]
    listed = json.loads(saved.read_text())  # a file: the JSON there, the table here
    assert created in listed["data"] and listed["count"] == len(listed["data"])
    assert re.search(rf"^{created['id']}\s+{name}\s+1\s+5\s+4\s+True", out, re.M)

    code, out, _ = admin_cli(capsys, "tenants", "patch", str(created["id"]), "--budget", "9",
                             "--actor", "cli-test")
    assert code == 0 and re.search(r"^privacy_budget\s+9$", out, re.M)
    assert re.search(r"^epsilon_remaining\s+9$", out, re.M)
    code, out, _ = admin_cli(capsys, "tenants", "audit", str(created["id"]), "--json", "-")
    entry = json.loads(out)["data"][0]
    assert entry["changes"] == {"privacy_budget": {"old": 4.0, "new": 9.0}}
    assert entry["actor"].endswith("(cli-test)")


def test_admin_cli_says_the_problem_code_and_exits_1(live, capsys):
    code, out, err = admin_cli(capsys, "tenants", "show", "999999")
    assert (code, out) == (1, "")
    assert err.strip() == "fedrec: error 404 tenant_not_found: Tenant not found"
    code, _, err = admin_cli(capsys, "tenants", "create", "x", "--budget", "1",
                             "--rating-min", "5", "--rating-max", "1")
    assert code == 1 and "error 422 validation_error" in err
    assert "rating_min must be smaller than rating_max" in err
    code, _, err = admin_cli(capsys, "tenants", "list", "--token", "wrong" * 8)
    assert (code, err) == (1, "fedrec: error 401 invalid_admin_token: Invalid admin token\n")


def test_admin_cli_without_a_server_or_token(monkeypatch, capsys):
    monkeypatch.delenv("FEDREC_ADMIN_TOKEN", raising=False)
    assert main(["admin", "tenants", "list"]) == 2
    assert "no admin token: give --token or set FEDREC_ADMIN_TOKEN" in capsys.readouterr().err
    from app.commands.demo import _free_port

    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["admin", "tenants", "list", "--url", url, "--token", "t" * 32]) == 1
    assert f"cannot reach the service at {url}" in capsys.readouterr().err


def test_admin_cli_keys_items_and_a_watched_job(live, capsys, tmp_path, monkeypatch):
    with Client(live, token=ADMIN_TOKEN) as admin:
        tid, _ = trained_tenant(admin, seed=3)
    code, out, _ = admin_cli(capsys, "keys", "create", str(tid), "--name", "cli",
                             "--json", "-")
    key = json.loads(out)
    assert code == 0 and key["key"].startswith(f"fk_{key['prefix']}_")
    code, out, _ = admin_cli(capsys, "keys", "revoke", str(tid), str(key["id"]))
    assert code == 0 and re.search(r"^revoked_at\s+\d{4}-", out, re.M)
    code, out, _ = admin_cli(capsys, "keys", "list", str(tid), "--json", "-")
    listed = {k["id"]: k for k in json.loads(out)["data"]}
    assert listed[key["id"]]["revoked_at"] is not None

    catalogue = tmp_path / "items.csv"
    catalogue.write_text("key,title\ncli-1,One\ncli-2,\"Two, with a comma\"\n")
    code, out, _ = admin_cli(capsys, "items", "put", str(catalogue))
    assert (code, out) == (0, "2 item(s) added or updated\n")
    code, out, _ = admin_cli(capsys, "items", "list", "--limit", "1000", "--json", "-")
    titles = {i["key"]: i["title"] for i in json.loads(out)["data"]}
    assert titles["cli-1"] == "One" and titles["cli-2"] == "Two, with a comma"

    body = tmp_path / "job.json"
    body.write_text(json.dumps({"algorithm": "fedmc-admm", "config": CONFIG, "seed": 2}))
    code, out, _ = admin_cli(capsys, "jobs", "create", "--body", str(body), "--tenants",
                             str(tid), "--rounds", "3", "--no-noise", "--json", "-")
    job = json.loads(out)
    assert code == 0 and job["dp"]["mechanism"] == "none" and job["rounds"] == 3
    code = main(["jobs", "watch", str(job["id"]), "--interval", "0.1"])
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith(f"job {job['id']} completed")
    with Client(live, token=ADMIN_TOKEN) as admin:
        report = admin.job_report(job["id"])
    last = report.curve[-1]
    assert f"round 3/3 RMSE {last.test_rmse:.4f}" in out
    code, out, _ = admin_cli(capsys, "jobs", "report", str(job["id"]))
    assert code == 0 and re.search(rf"^3\s+\S+\s+{last.test_rmse:g}\s", out, re.M)
    code, _, err = admin_cli(capsys, "jobs", "cancel", str(job["id"]))
    assert code == 1 and f"error 409 job_finished: Job {job['id']} is already completed" in err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # on a terminal: the bar
    monkeypatch.delenv("FEDREC_NO_PROGRESS", raising=False)
    assert main(["admin", "jobs", "watch", str(job["id"])]) == 0
    out = capsys.readouterr()
    assert out.out == f"job {job['id']} completed\n"  # no per-round lines: the bar has them
    assert f"RMSE {last.test_rmse:.4f}" in out.err and "3/3" in out.err


def test_admin_cli_tunes_and_shows_the_choice(live, capsys):
    with Client(live, token=ADMIN_TOKEN) as admin:
        tid, _ = trained_tenant(admin, seed=4)
    code, out, _ = admin_cli(capsys, "tuning", "create", "--tenants", str(tid), "--rounds",
                             "3", "--trials", "2", "--wait", "--json", "-")
    tuning = json.loads(out)
    assert code == 0 and tuning["status"] == "completed" and tuning["tenant_ids"] == [tid]
    assert tuning["config"] is not None and len(tuning["scored"]) >= 2
    code, out, _ = admin_cli(capsys, "tuning", "show", str(tuning["id"]))
    assert code == 0 and re.search(r"^status\s+completed$", out, re.M)
    assert re.search(rf"^validation_rmse\s+{tuning['validation_rmse']:g}$", out, re.M)
    code, _, err = admin_cli(capsys, "tuning", "show", "999999")
    assert code == 1 and "error 404 tuning_job_not_found" in err


# -- the documentation's client examples, as written, against a fresh server -------------

def readme_blocks() -> tuple[str, list[str]]:
    """The Python and the bash block of the documentation's client section (the hosted
    service tutorial)."""
    text = section("Python client and admin CLI")
    python = text.split("```python\n", 1)[1].split("```", 1)[0]
    bash = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return python, [line for line in bash.splitlines() if line.strip()]


@pytest.fixture
def fresh_live(sqlite_url, monkeypatch):
    """A live server on a fresh SQLite database (the documented ids start at 1)."""
    from app.commands.demo import _free_port, start_server

    port = _free_port()
    server, thread = start_server(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN,
                                            broker_url=None), port)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_the_readme_client_and_admin_examples_run(fresh_live, tmp_path, monkeypatch,
                                                  capsys):
    from algorithms.synthetic import generate_ratings

    python, bash = readme_blocks()
    r = generate_ratings(120, 200, 3000, rank=3, seed=5)
    (tmp_path / "u.data").write_text("".join(
        f"{u}\t{i + 1}\t{v:g}\t881250949\n" for u, i, v in zip(r.users, r.items, r.values,
                                                             strict=True)))
    monkeypatch.chdir(tmp_path)
    exec(python.replace("http://127.0.0.1:8000", fresh_live)  # as documented
         .replace("ADMIN-TOKEN", ADMIN_TOKEN), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["3000", "count=3000 users=120", "404 user_not_found"]

    assert bash[0].startswith("export FEDREC_URL=http://127.0.0.1:8000 FEDREC_ADMIN_TOKEN=")
    monkeypatch.setenv("FEDREC_URL", fresh_live)
    monkeypatch.setenv("FEDREC_ADMIN_TOKEN", ADMIN_TOKEN)
    outputs = {}
    for line in bash[1:]:
        command, _, comment = line.partition("#")
        argv = shlex.split(command)
        assert argv[0] == "fedrec", line
        code = main(argv[1:])
        out = capsys.readouterr()
        outputs[command.strip()] = out.out
        if "error" in comment:  # the docs show the error line it prints
            assert code == 1 and out.err.strip() == comment.strip(), (line, out.err)
        else:
            assert code == 0, (line, out.err)
    # listed before the patch (budget 10), shown after it (20)
    assert re.search(r"^1\s+acme\s+1\s+5\s+10\s+False\s", outputs["fedrec admin tenants list"],
                     re.M)
    assert "privacy_budget: 10.0 -> 20.0" in outputs["fedrec admin tenants audit 1"]
    assert outputs["fedrec jobs watch 1"].rstrip().endswith("job 1 completed")
    shown = json.loads(outputs["fedrec admin --json tenants show 1"])
    assert shown["privacy_budget"] == 20.0 and shown["privacy"]["jobs"][0]["job_id"] == 1
    assert 0 < shown["privacy"]["epsilon_spent"] <= 8.0 + 1e-9


def test_the_help_lists_the_admin_and_jobs_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert re.search(r"^\s+admin\s+manage tenants, API keys, items and jobs", text, re.M)
    assert re.search(r"^\s+jobs\s+training jobs", text, re.M)
    for resource, actions in {"tenants": "list create show patch audit",
                              "keys": "create list revoke", "items": "put list",
                              "jobs": "create list show cancel resume report watch"}.items():
        with pytest.raises(SystemExit):
            main(["admin", resource, "--help"])
        listed = re.findall(r"^    (\w+)\s", capsys.readouterr().out, re.M)
        assert listed == actions.split(), resource


def test_an_upload_draws_a_progress_bar_only_on_a_terminal(sqlite_url, tmp_path, capsys,
                                                          monkeypatch):
    app = create_app(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN,
                              broker_url=None))
    admin = client_of(app, ADMIN_TOKEN)
    tenant = admin.create_tenant("bar", 1.0, auto_create_items=True)
    mine = client_of(app, admin.create_api_key(tenant.id).key)
    data = tmp_path / "u.data"
    data.write_text("".join(f"u{n % 50}\ti{n % 300}\t{1 + n % 5}\n" for n in range(20000)))
    monkeypatch.delenv("FEDREC_NO_PROGRESS", raising=False)
    # rows repeat every 300 lines (same user, item and rating): 300 distinct ratings
    assert mine.upload_ratings(tenant.id, path=data).stored == 300
    assert capsys.readouterr().err == ""  # captured stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    mine.upload_ratings(tenant.id, path=data)
    assert "upload u.data" in capsys.readouterr().err
    assert mine.count_ratings(tenant.id) == fc.RatingsCount(count=300, users=50)
