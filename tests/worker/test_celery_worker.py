"""The statistics task executed by a real Celery worker process, through the real Redis,
on the real PostgreSQL (integration)."""

from __future__ import annotations

import pytest

from app.config import Settings
from tests.worker.conftest import celery_worker
from worker.celery_app import create_celery_app


def test_without_a_broker_the_app_is_eager():
    celery = create_celery_app(Settings(database_url="sqlite:///x.db", broker_url=None))
    assert celery.conf.task_always_eager and celery.conf.broker_url == "memory://"


def test_with_a_broker_tasks_go_to_the_configured_queue():
    celery = create_celery_app(Settings(database_url="sqlite:///x.db",
                                        broker_url="redis://h:6379/3", task_queue="q1"))
    assert not celery.conf.task_always_eager
    assert (celery.conf.broker_url, celery.conf.result_backend, celery.conf.task_default_queue
            ) == ("redis://h:6379/3", "redis://h:6379/3", "q1")


@pytest.fixture
def worker_env(migrated_postgres_url, redis_test_url, tmp_path):
    """Settings shared by the test's API and a worker process on a private queue."""
    log = tmp_path / "worker.log"
    with celery_worker(migrated_postgres_url, redis_test_url, log) as (queue, proc):
        yield Settings(database_url=migrated_postgres_url, broker_url=redis_test_url,
                       task_queue=queue), proc, log


@pytest.mark.integration
def test_worker_process_computes_and_stores_statistics(worker_env):
    from tests.app.conftest import Api, make_api

    settings, proc, log = worker_env
    api: Api = make_api(settings.database_url, broker_url=settings.broker_url,
                        task_queue=settings.task_queue)
    assert api.client.get("/ready").json()["broker"] == "ok"
    api.items("w1", "w2")
    tenant_id, key = api.tenant()
    api.upload_csv(tenant_id, key, "a,w1,2\nb,w1,4\nb,w2,4\n")
    queued = api.client.post(f"/v1/tenants/{tenant_id}/stats", headers=key)
    assert queued.status_code == 202 and queued.json()["status"] == "PENDING"
    result = api.client.app.state.celery.AsyncResult(queued.json()["task_id"])
    try:
        outcome = result.get(timeout=60)
    except Exception as exc:
        raise AssertionError(f"worker did not finish the task ({exc!r}); its log:\n"
                             + log.read_text()[-3000:]) from None
    result.forget()
    assert outcome["status"] == "stored" and outcome["n_ratings"] == 3
    stats = api.client.get(f"/v1/tenants/{tenant_id}/stats", headers=key).json()
    assert (stats["n_ratings"], stats["n_users"], stats["n_items"], stats["histogram"]) == (
        3, 2, 2, {"2": 1, "4": 2})
    assert abs(stats["mean"] - 10 / 3) < 1e-12
    assert proc.poll() is None  # the worker is still serving
