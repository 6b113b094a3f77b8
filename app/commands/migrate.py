"""``fedrec migrate``: apply the Alembic migrations (same as ``alembic upgrade head``)."""

from __future__ import annotations

import argparse

from app.config import get_settings
from app.db import migrate


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "migrate", help="create or upgrade the database schema",
        description="Upgrade the database (FEDREC_DATABASE_URL/DATABASE_URL, default "
                    "sqlite:///./fedrec.db) to the latest schema.")
    parser.add_argument("--url", help="database URL (default: from the environment)")
    parser.add_argument("--revision", default="head")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    url = args.url or get_settings().database_url
    migrate(url, args.revision)
    print(f"database at {redacted_url(url)} is at revision {args.revision}")
    return 0


def redacted_url(url: str) -> str:
    """The URL without its password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
