"""``fedrec serve``: migrate the database, then run the API with uvicorn."""

from __future__ import annotations

import argparse
import logging.config

from app.config import get_settings, resolve_admin_token
from app.db import migrate
from app.logs import logging_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the HTTP API (migrates the database first)",
        description="Run the API on FEDREC_DATABASE_URL/DATABASE_URL (default: SQLite file "
                    "./fedrec.db); tasks go to FEDREC_BROKER_URL/REDIS_URL, or run in-process.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes (needs FEDREC_ADMIN_TOKEN when > 1)")
    parser.add_argument("--no-access-log", action="store_true",
                        help="do not log every request (the fedrec.access line)")
    parser.add_argument("--no-migrate", action="store_true",
                        help="do not run the Alembic migrations before starting")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    settings = get_settings()
    # the log set-up of this process and, through uvicorn (log_config), of every worker
    # process it starts: fedrec logs one access line per request itself (with its request
    # id), so uvicorn's own access log is off
    log_config = logging_config(settings.log_format, access_log=not args.no_access_log)
    logging.config.dictConfig(log_config)
    if args.workers > 1 and resolve_admin_token(settings)[1]:
        raise ValueError("--workers > 1 needs FEDREC_ADMIN_TOKEN (each worker would "
                         "generate its own development token)")
    if not args.no_migrate:
        migrate(settings.database_url)
    uvicorn.run("app.main:create_served_app", factory=True, host=args.host, port=args.port,
                workers=args.workers, access_log=False, log_config=log_config)
    return 0
