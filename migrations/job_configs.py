"""The one rule of the migrations that give stored job configs a newly added field: each
stored job of an algorithm gets, for each field added since it was written, the value that
keeps its earlier behaviour (a field it has already is left alone); downgrading removes the
fields again, since the earlier code refuses configs with unknown fields. Used by
0012 (FedMC-ADMM, FedMAvg), 0014 and 0016 (RFRec, RFRecF), 0015 and 0017 (the user-level DP
algorithms) and 0022 (ials and dp-ials: the popularity prior).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from alembic import op

Fields = Mapping[str, Mapping[str, Any]]
"""Per algorithm name: each added field and the value of the earlier behaviour."""

jobs = sa.table("training_jobs", sa.column("id", sa.Integer),
                sa.column("algorithm", sa.String), sa.column("config", sa.JSON))


def _rewrite(earlier: Fields, change: Callable[[str, dict], dict]) -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.algorithm, jobs.c.config).where(
        jobs.c.algorithm.in_(list(earlier)))).all()
    for job_id, algorithm, config in rows:
        new = change(algorithm, dict(config or {}))
        if new != config:
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(config=new))


def add_fields(earlier: Fields) -> None:
    """Upgrade: every stored config of these algorithms gets the fields it lacks."""
    _rewrite(earlier, lambda algorithm, config: {**earlier[algorithm], **config})


def remove_fields(earlier: Fields) -> None:
    """Downgrade: the fields are removed from every stored config of these algorithms."""
    _rewrite(earlier, lambda algorithm, config: {k: v for k, v in config.items()
                                                 if k not in earlier[algorithm]})
