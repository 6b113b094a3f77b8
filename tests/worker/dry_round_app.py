"""The worker app of the dry-round tests (``celery -A tests.worker.dry_round_app``): the
real one, with a dry round that raises for rank 5 and runs 10 s for rank 7, so the API's
handling of a worker's failures and overruns is checked on a real worker. Every other
config runs the real round."""

from __future__ import annotations

import time

from app.training import dry_round
from worker.celery_app import get_celery_app

_real = dry_round.round_one


def _round_one(alg, cfg, *args):
    if getattr(cfg, "rank", None) == 5:
        raise ValueError("rank 5 cannot aggregate (test worker)")
    if getattr(cfg, "rank", None) == 7:
        time.sleep(10.0)
    return _real(alg, cfg, *args)


dry_round.round_one = _round_one
app = get_celery_app()
