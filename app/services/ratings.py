"""A tenant's users: forget one (the right to erasure).

The tenant API (:mod:`app.routes.ratings`) calls this; the rules of what is deleted are
:mod:`app.training.forget`'s.
"""

from __future__ import annotations

from celery import Celery
from fastapi import status
from sqlalchemy.orm import Session

from app.problems import ApiError
from app.queue import RECOMPUTE_RATING_STATS, enqueue
from app.training.forget import forget_agent_user, forget_user, forgets_on_agent


def forget(session: Session, celery: Celery, tenant_id: int, user: str) -> tuple[int, bool]:
    """Forget ``user``: their ratings, and their rows in trained snapshots, job data and
    rating statistics (recomputed in the background; repeatable: 0 deleted when the user
    was forgotten before). For an agent tenant (the coordinator holds none of its ratings)
    the request is recorded for its agent instead; so is the request of a tenant that
    holds no ratings here yet, as an agent tenant before its first job (its agent leaves
    the user out from the first job it joins). Returns how many ratings were deleted
    and whether the agent was asked; 404 ``user_not_found`` for a user never seen."""
    deleted = forget_user(session, tenant_id, user)
    agent = not deleted and forgets_on_agent(session, tenant_id, deleted is not None)
    if agent:
        forget_agent_user(session, tenant_id, user)
    elif deleted is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "user_not_found", "User not found")
    session.commit()
    if deleted:
        enqueue(celery, RECOMPUTE_RATING_STATS, [tenant_id])
    return deleted or 0, agent
