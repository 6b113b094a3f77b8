"""``fedrec doctor``: each failing check is named in plain words with a nonzero exit."""

from __future__ import annotations

import re
import time

import pytest

from app import cli
from app.commands import doctor
from app.config import Settings, get_settings
from app.db import migrate


def run_doctor(monkeypatch, capsys, **env) -> tuple[int, str]:
    for name in ("FEDREC_BROKER_URL", "REDIS_URL", "FEDREC_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        code = cli.main(["doctor", "--timeout", "1"])
    finally:
        get_settings.cache_clear()
    return code, capsys.readouterr().out


def test_a_migrated_database_without_broker_is_fine(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/ok.db"
    migrate(url)
    code, out = run_doctor(monkeypatch, capsys, FEDREC_DATABASE_URL=url)
    assert code == 0, out
    assert "ok   database:" in out and "everything looks fine" in out


def test_an_old_schema_and_an_unreachable_database_are_named(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/old.db"
    migrate(url, "0004")
    code, out = run_doctor(monkeypatch, capsys, FEDREC_DATABASE_URL=url)
    assert code == 1
    from alembic.script import ScriptDirectory

    from app.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head != "0004"
    assert f"is at migration 0004, the code needs {head}: run `fedrec migrate`" in out
    code, out = run_doctor(monkeypatch, capsys,
                           FEDREC_DATABASE_URL="postgresql://no_such_role@127.0.0.1:1/x")
    assert code == 1 and "FAIL database: cannot reach the database at" in out
    assert "1 problem(s) found" in out


@pytest.mark.integration
def test_workers_and_beat_are_checked_through_the_broker(monkeypatch, capsys,
                                                          redis_test_url):
    redis_url = redis_test_url  # CI fails, never skips, when Redis is down
    import redis

    settings = Settings(broker_url=redis_url, stalled_job_seconds=60)
    client = redis.Redis.from_url(redis_url)
    client.delete(doctor.BEAT_KEY)
    ok, message = doctor.check_beat(settings, 1)
    assert not ok and message.startswith("beat has never run the job watchdog")
    client.set(doctor.BEAT_KEY, time.time() - 1000)
    ok, message = doctor.check_beat(settings, 1)
    assert not ok and "last ran 1000 s ago (it should run every 60 s)" in message
    client.set(doctor.BEAT_KEY, time.time() - 5)
    assert doctor.check_beat(settings, 1)[0]
    client.delete(doctor.BEAT_KEY)


def test_json_dash_writes_the_checks_to_stdout_only(tmp_path, monkeypatch, capsys):
    import json

    url = f"sqlite:///{tmp_path}/old.db"
    migrate(url, "0004")
    for name in ("FEDREC_BROKER_URL", "REDIS_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FEDREC_DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        code = cli.main(["doctor", "--timeout", "1", "--json", "-"])
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr()
    report = json.loads(out.out)  # stdout is the JSON document alone
    assert code == 1 and report["ok"] is False and report["problems"] == 1
    database, broker = report["checks"]
    assert (database["name"], database["ok"]) == ("database", False)
    assert "is at migration 0004" in database["message"]
    assert (broker["name"], broker["ok"]) == ("broker", True)
    assert "FAIL database: " + database["message"] in out.err  # the lines went to stderr


@pytest.mark.integration
def test_beat_in_its_first_minute_is_starting_not_failing(monkeypatch, capsys, redis_test_url):
    """Before the watchdog's first run (one period after beat starts) doctor said "FAIL
    beat: never run"; beat now records its start and doctor says it is starting."""
    import types

    import redis

    from worker.celery_app import _beat_started, create_celery_app

    settings = Settings(broker_url=redis_test_url, stalled_job_seconds=60)
    client = redis.Redis.from_url(redis_test_url)
    client.delete(doctor.BEAT_KEY, doctor.BEAT_STARTED_KEY)
    _beat_started(sender=types.SimpleNamespace(app=create_celery_app(settings)))
    assert abs(float(client.get(doctor.BEAT_STARTED_KEY)) - time.time()) < 5
    ok, message = doctor.check_beat(settings, 1)
    assert ok and re.match(r"starting: beat started \d+ s ago", message), message
    client.set(doctor.BEAT_STARTED_KEY, time.time() - 1000)  # started, never ran: stuck
    ok, message = doctor.check_beat(settings, 1)
    assert not ok and message.startswith("beat has never run the job watchdog")
    client.set(doctor.BEAT_STARTED_KEY, time.time() - 5)  # restarted after an old run
    client.set(doctor.BEAT_KEY, time.time() - 1000)
    assert doctor.check_beat(settings, 1)[1].startswith("starting: ")
    client.set(doctor.BEAT_KEY, time.time())
    assert doctor.check_beat(settings, 1) == (True, "beat alive: the job watchdog ran 0 s ago")
    client.delete(doctor.BEAT_KEY, doctor.BEAT_STARTED_KEY)
