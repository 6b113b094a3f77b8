"""Logs: one JSON object a line with the request id (X-Request-ID in and out), tenant id
and job id; the same format setting for the API, the worker and beat."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest

from app.logs import ContextFilter, JsonFormatter, TextFormatter, configure_logging
from tests.training_helpers import make_tenants, submit_job, wait_job


@pytest.fixture
def lines():
    """The JSON lines logged during the test (through the API's own formatter)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def test_request_ids_are_echoed_or_made_and_every_line_carries_them(env, lines):
    app, client = env
    (tid, key), _ = make_tenants(client)
    auth = {"Authorization": f"Bearer {key}"}
    given = client.get(f"/v1/tenants/{tid}/ratings/count",
                       headers={**auth, "X-Request-ID": "req-42.a"})
    assert given.headers["x-request-id"] == "req-42.a"
    made = client.get(f"/v1/tenants/{tid}/ratings/count", headers=auth)
    bad = client.get(f"/v1/tenants/{tid}/ratings/count",
                     headers={**auth, "X-Request-ID": "no spaces allowed"})
    assert len(made.headers["x-request-id"]) == 32
    assert bad.headers["x-request-id"] not in ("no spaces allowed",)
    job = wait_job(client, submit_job(client, rounds=1).json()["id"])
    client.get(f"/v1/admin/jobs/{job['id']}", headers={"X-Request-ID": "job-read"})
    access = [line for line in lines() if line["logger"] == "fedrec.access"]
    mine = next(line for line in access if line["request_id"] == "req-42.a")
    assert mine["tenant_id"] == tid and mine["level"] == "INFO"
    assert mine["message"].startswith("GET /v1/tenants/{tenant_id}/ratings/count 200 ")
    assert any(line["request_id"] == made.headers["x-request-id"] for line in access)
    read = next(line for line in access if line["request_id"] == "job-read")
    assert read["job_id"] == job["id"] and "tenant_id" not in read
    created = [line for line in lines() if line["message"].startswith(f"job {job['id']} "
                                                                      "created")]
    assert created and created[0]["job_id"] == job["id"] and created[0]["request_id"]


def test_text_and_json_formats_carry_the_same_context():
    record = logging.LogRecord("fedrec", logging.WARNING, __file__, 1, "hello %s", ("x",),
                               None)
    record.request_id, record.tenant_id = "r1", 7
    record.job_id = record.task_id = None
    assert json.loads(JsonFormatter().format(record)) | {"ts": None} == {
        "ts": None, "level": "WARNING", "logger": "fedrec", "message": "hello x",
        "request_id": "r1", "tenant_id": 7}
    assert TextFormatter().format(record).endswith("WARNING fedrec: hello x "
                                                   "[request_id=r1 tenant_id=7]")
    with pytest.raises(ValueError, match="log format must be one of text, json"):
        configure_logging("xml")


def test_the_cli_takes_the_format(monkeypatch):
    from app import cli
    from app.config import get_settings

    # setenv, not delenv: delenv of an absent variable records nothing, so the value the
    # CLI sets below would survive the test (and turn every later app's logs into JSON)
    monkeypatch.setenv("FEDREC_LOG_FORMAT", "text")
    seen = []
    args = cli.parse(["migrate"])
    args.func = lambda _: seen.append(get_settings().log_format) or 0
    monkeypatch.setattr(cli, "parse", lambda argv: setattr(args, "log_format", "json") or args)
    assert cli.main(["--log-format", "json", "migrate"]) == 0
    assert seen == ["json"] and os.environ["FEDREC_LOG_FORMAT"] == "json"
    get_settings.cache_clear()
    wrong = subprocess.run([sys.executable, "-m", "app.cli", "--log-format", "xml", "migrate"],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "invalid choice: 'xml'" in wrong.stderr


def test_worker_and_beat_log_in_the_configured_format(monkeypatch):
    """Celery's setup_logging signal hands the worker's and beat's logging to fedrec."""
    from celery import signals

    from app.config import get_settings

    monkeypatch.setenv("FEDREC_LOG_FORMAT", "json")
    get_settings.cache_clear()
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        import worker.celery_app  # noqa: F401 - connects the handlers

        signals.setup_logging.send(sender=None, loglevel="INFO", logfile=None, format="",
                                   colorize=False)
        ours = [h for h in root.handlers if isinstance(h.formatter, JsonFormatter)]
        assert len(ours) == 1 and len(root.handlers) == 1
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        get_settings.cache_clear()


@pytest.mark.parametrize("access_log", [True, False])
def test_every_worker_of_fedrec_serve_logs_its_requests(tmp_path, access_log):
    """``fedrec serve --workers 2`` starts each worker as a new interpreter: the log set-up
    must reach them (it once did not, and the workers dropped every INFO line, access lines
    included, in the text format); ``--no-access-log`` must reach them too."""
    import os
    import secrets

    import httpx

    from bench._server import serve, stop
    from tests.integration.conftest import free_port

    port, log = free_port(), tmp_path / "serve.log"
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("REDIS_URL", "FEDREC_BROKER_URL", "DATABASE_URL")},
           "FEDREC_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite", "FEDREC_BROKER_URL": "",
           "FEDREC_ADMIN_TOKEN": secrets.token_urlsafe(32), "FEDREC_LOG_FORMAT": "text"}
    server = serve(env, port, log, access_log)
    try:
        ids = [f"probe-{i}" for i in range(8)]
        for request_id in ids:  # new connections: the kernel spreads them over the workers
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                assert client.get("/health", headers={"X-Request-ID": request_id}
                                  ).status_code == 200
    finally:
        stop(server)
    text = log.read_text()
    assert text.count("INFO uvicorn.error: Started server process") == 2, text
    logged = [i for i in ids if "INFO fedrec.access: GET /health 200 " in text
              and f"[request_id={i}]" in text]
    assert logged == (ids if access_log else []), text
