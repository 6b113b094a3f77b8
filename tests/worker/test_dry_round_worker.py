"""A job's dry round runs in a worker when there is a broker (the API process runs no
round), on the real PostgreSQL, Redis and a Celery worker process (integration)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from app.training import dry_round
from app.training.models import TrainingJob
from tests.app.conftest import make_api, refusal
from tests.training_helpers import make_tenants
from tests.worker.conftest import celery_worker

BODY = {"algorithm": "fedmc-admm", "rounds": 1, "seed": 1,
        "dp": {"mechanism": "gaussian", "noise_multiplier": 2.0}}


@pytest.fixture(scope="module")
def worker_db(make_postgres_db, redis_test_url, tmp_path_factory):
    """A fresh database with two tenants' ratings, and a worker running the test app."""
    from app.db import migrate

    url = make_postgres_db()
    migrate(url)
    log = tmp_path_factory.mktemp("dry-round") / "worker.log"
    with celery_worker(url, redis_test_url, log,
                       celery_app="tests.worker.dry_round_app") as (queue, proc):
        api = make_api(url, broker_url=redis_test_url, task_queue=queue)
        api.client.headers.update(api.admin)
        tenants = [t for t, _ in make_tenants(api.client)]
        yield url, redis_test_url, queue, tenants, log


def _api(worker_db, **settings):
    url, broker, queue, _, _ = worker_db
    api = make_api(url, broker_url=broker, **{"task_queue": queue, **settings})
    api.client.headers.update(api.admin)
    return api


def _jobs(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return c.scalar(sa.select(sa.func.count()).select_from(TrainingJob))
    finally:
        engine.dispose()


@pytest.mark.integration
def test_the_dry_round_runs_in_the_worker_and_its_answers_reach_the_api(worker_db,
                                                                        monkeypatch):
    url, _, _, tenants, log = worker_db

    def in_the_api(*_args, **_kwargs):
        raise AssertionError("the API process ran a dry round")

    monkeypatch.setattr(dry_round, "round_one", in_the_api)
    api = _api(worker_db)
    body = {**BODY, "tenant_ids": tenants}
    plan = api.client.post("/v1/admin/jobs", params={"dry_run": True},
                           json={**body, "config": {"rank": 3}})
    assert plan.status_code == 200, plan.text + log.read_text()[-3000:]
    # a step failing in the worker is the config's 422, with the worker's message
    failing = api.client.post("/v1/admin/jobs", json={**body, "config": {"rank": 5}})
    assert refusal(failing) == (
        422, "invalid_config", "invalid config: round 1 fails with these settings "
                               "(ValueError: rank 5 cannot aggregate (test worker))")
    # a round the worker started but did not finish within the bound (counted from its
    # start): 422 naming it
    quick = _api(worker_db, dry_round_seconds=3.0)
    slow = quick.client.post("/v1/admin/jobs", json={**body, "config": {"rank": 7}})
    status, code, detail = refusal(slow)
    assert (status, code) == (422, "invalid_config") and (
        "longer than the dry-run bound of 3 s (FEDREC_DRY_ROUND_SECONDS)" in detail), detail
    assert _jobs(url) == 0
    created = api.client.post("/v1/admin/jobs", json={**body, "config": {"rank": 3}})
    assert created.status_code == 202, created.text
    assert _jobs(url) == 1


@pytest.mark.integration
def test_a_dry_round_no_worker_takes_is_503_and_creates_nothing(worker_db):
    url, _, _, tenants, _ = worker_db
    before = _jobs(url)
    idle = _api(worker_db, task_queue="fedrec-test-nobody-listens", dry_round_seconds=1.0)
    res = idle.client.post("/v1/admin/jobs",
                           json={**BODY, "tenant_ids": tenants, "config": {"rank": 3}})
    status, code, detail = refusal(res)
    assert (status, code) == (503, "dry_round_unavailable"), detail
    assert detail.startswith("no worker started the dry round within 1 s"), detail
    assert res.headers["retry-after"] == "5"
    assert _jobs(url) == before
    import redis

    broker = redis.Redis.from_url(worker_db[1])  # the unread (expired) request
    leftovers = list(broker.scan_iter("*fedrec-test-nobody-listens*"))
    if leftovers:
        broker.delete(*leftovers)


def test_a_dry_round_is_taken_before_queued_training_tasks(redis_test_url):
    """Training tasks go to the queue's priority-6 list and a dry round to its first list,
    which a worker (kombu's Redis transport: BRPOP over the lists in priority order) takes
    first: a backlog of client steps does not hold up job creation."""
    import uuid

    import redis

    from app.config import Settings
    from app.queue import TRAINING_PRIORITY, ask, create_celery_app
    from app.training.runner import CeleryDispatcher

    queue = f"fedrec-test-priority-{uuid.uuid4().hex[:8]}"
    celery = create_celery_app(Settings(database_url="sqlite:///unused.db",
                                        broker_url=redis_test_url, task_queue=queue))
    broker = redis.Redis.from_url(redis_test_url)
    try:
        for client in range(3):  # a round's client steps, queued with no worker free
            CeleryDispatcher(celery).send("fedrec.training.client_step", 1, 1, client)
        assert ask(celery, dry_round.TASK, [{}], 0.3) == ("waiting", None)  # unanswered
        sep = "\x06\x16"
        lists = [queue] + [f"{queue}{sep}{p}" for p in (3, 6, 9)]
        assert [broker.llen(k) for k in lists] == [1, 0, 3, 0]
        assert TRAINING_PRIORITY == 6
        key, message = broker.brpop(lists, timeout=1)  # what a worker takes next
        assert key.decode() == queue and dry_round.TASK.encode() in message
    finally:
        leftovers = list(broker.scan_iter(f"*{queue}*"))
        if leftovers:
            broker.delete(*leftovers)
