"""Use cases of the service, as plain functions: what the HTTP routes (:mod:`app.routes`),
the dashboard (:mod:`app.dashboard`) and the command line share.

Each takes a database session (and the settings, or the application whose state holds the
Celery app, where it needs them) and returns domain objects or raises
:class:`app.problems.ApiError`, a refusal with a status and a stable code that the HTTP
layer answers as a problem document and the dashboard shows on its page. No handler calls
another handler: both call these (the split of the FastAPI full-stack template's
``crud.py`` and ``api/routes/``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session


def newest_first(session: Session, model: type, limit: int, offset: int) -> tuple[list, int]:
    """A page of ``model`` rows, newest (highest id) first, and how many there are."""
    rows = session.scalars(sa.select(model).order_by(model.id.desc())
                           .limit(limit).offset(offset)).all()
    return list(rows), session.scalar(sa.select(sa.func.count()).select_from(model))
