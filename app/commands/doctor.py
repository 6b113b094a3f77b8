"""``fedrec doctor``: check a deployment and say in plain words what is wrong.

Checks, in order: the database answers; its schema is at the latest migration; the broker
answers; at least one Celery worker answers a ping; beat has run its watchdog recently
(the worker records each run in the broker's Redis, :data:`app.queue.BEAT_KEY`), or beat started
less than a watchdog period ago (``wait beat: ...``, not a failure: beat records its start,
:data:`app.queue.BEAT_STARTED_KEY`). Exit status 1 when any check fails, 0 otherwise.
"""

from __future__ import annotations

import argparse
import time

from app.config import Settings, get_settings
from app.queue import BEAT_KEY, BEAT_STARTED_KEY, create_celery_app

STARTING = "starting: "


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check the database, migrations, broker, workers and beat",
        description="Check that the deployment configured by the environment works: "
                    "database reachable and migrated, broker reachable, a worker and beat "
                    "alive. Prints each problem in plain words; exit status 1 if any.")
    parser.add_argument("--timeout", type=float, default=3.0,
                        help="seconds to wait for each service (default 3)")
    parser.add_argument("--json", metavar="FILE", default=None, nargs="?", const="-",
                        help="also write the checks as JSON ({\"ok\", \"problems\", "
                             "\"checks\": [{\"name\", \"ok\", \"message\"}]}) to FILE; "
                             "alone or '-': to stdout, the lines going to stderr")
    parser.set_defaults(func=run)


def check_database(settings: Settings) -> tuple[bool, str]:
    import sqlalchemy as sa
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from app.commands.migrate import redacted_url
    from app.db import alembic_config, make_engine

    where = redacted_url(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
            current = MigrationContext.configure(connection).get_current_revision()
    except Exception as exc:  # noqa: BLE001 - any failure is reported in words
        return False, (f"cannot reach the database at {where}: {_first_line(exc)}. Check "
                       "FEDREC_DATABASE_URL / DATABASE_URL, that the server runs, and that "
                       "the role and database exist (docs/how-to/deployment.md).")
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(alembic_config(settings.database_url)).get_current_head()
    if current != head:
        return False, (f"the database at {where} is at migration {current or 'none'}, the "
                       f"code needs {head}: run `fedrec migrate` (or `fedrec serve`, which "
                       "migrates first).")
    return True, f"database at {where} reachable, schema at migration {head}"


def check_broker(settings: Settings, timeout: float) -> tuple[bool, str]:
    from kombu import Connection

    from app.commands.migrate import redacted_url

    if not settings.broker_url:
        return True, "no broker configured: tasks run inside the API process"
    try:
        with Connection(settings.broker_url, connect_timeout=timeout) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    except Exception as exc:  # noqa: BLE001
        return False, (f"cannot reach the broker at {redacted_url(settings.broker_url)}: "
                       f"{_first_line(exc)}. Check FEDREC_BROKER_URL / REDIS_URL and that "
                       "Redis runs.")
    return True, f"broker at {redacted_url(settings.broker_url)} reachable"


def check_workers(settings: Settings, timeout: float) -> tuple[bool, str]:
    replies = create_celery_app(settings).control.ping(timeout=timeout) or []
    if not replies:
        return False, (f"no Celery worker answered a ping within {timeout:g} s: training "
                       "rounds and statistics will wait in the queue. Start one: `celery -A "
                       "worker.celery_app worker` (same environment as the API).")
    names = sorted(name for reply in replies for name in reply)
    return True, f"{len(names)} worker(s) answered: {', '.join(names)}"


def check_beat(settings: Settings, timeout: float, now: float | None = None
               ) -> tuple[bool, str]:
    import redis

    period = min(60.0, settings.stalled_job_seconds)
    client = redis.Redis.from_url(settings.broker_url, socket_timeout=timeout)
    try:
        last, started = client.get(BEAT_KEY), client.get(BEAT_STARTED_KEY)
    finally:
        client.close()
    now = time.time() if now is None else now
    if started is not None and (last is None or float(last) < float(started)):
        since = now - float(started)
        if since <= period + 30:
            return True, (f"{STARTING}beat started {since:.0f} s ago; its job watchdog "
                          f"first runs {period:g} s after the start")
    if last is None:
        return False, ("beat has never run the job watchdog: scheduled retraining, the "
                       "statistics refresh and the resumption of stalled jobs are not "
                       "happening. Start it: `celery -A worker.celery_app beat` (one "
                       "instance only).")
    age = now - float(last)
    if age > 3 * period + 30:
        return False, (f"beat's job watchdog last ran {age:.0f} s ago (it should run every "
                       f"{period:g} s): beat, or every worker, has stopped.")
    return True, f"beat alive: the job watchdog ran {age:.0f} s ago"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def run(args: argparse.Namespace) -> int:
    from app.commands.output import json_output

    with json_output(getattr(args, "json", None)) as write_json:
        results: list[dict] = []
        code = _run(args, results)
        write_json({"ok": code == 0, "problems": sum(not r["ok"] for r in results),
                    "checks": results})
    return code


def _run(args: argparse.Namespace, results: list[dict]) -> int:
    settings = get_settings()
    failed = 0
    checks = [("database", lambda: check_database(settings)),
              ("broker", lambda: check_broker(settings, args.timeout))]
    for name, check in checks:
        ok, message = check()
        failed += not ok
        results.append({"name": name, "ok": ok, "message": message})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {message}")
    if settings.broker_url:
        if failed and not check_broker(settings, args.timeout)[0]:
            print("skip workers, beat: the broker is unreachable")
        else:
            for name, check in (("workers", lambda: check_workers(settings, args.timeout)),
                                ("beat", lambda: check_beat(settings, args.timeout))):
                ok, message = check()
                failed += not ok
                results.append({"name": name, "ok": ok, "message": message})
                label = "wait" if message.startswith(STARTING) else "ok  " if ok else "FAIL"
                print(f"{label} {name}: {message.removeprefix(STARTING)}")
    print(f"{failed} problem(s) found" if failed else "everything looks fine")
    return 1 if failed else 0
