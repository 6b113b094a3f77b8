"""Tuning jobs: ``fedrec tune`` through the admin API, run by a worker.

A tuning job splits the tenants' stored ratings exactly as a training job with the same
``seed`` and ``test_fraction`` would (:func:`algorithms.data.federation_from_tenants` on
the same snapshot), drops the test part, and hands the training part to
:func:`algorithms.tuning.tune`, which carves its validation set out of each tenant's
*training* ratings: the test ratings a later training job reports on are never read.
The chosen config is stored in the form a training job's ``config`` takes.

Privacy: the search trains and scores without noise on the hosted tenants' raw training
ratings, and its answer (a config and validation errors) is a function of them. It is not
differentially private, so, like a noise-free training job, it needs every tenant's
``allow_non_private`` opt-in (else 409 ``not_private_refused``) and is charged to every
tenant's ledger as epsilon = infinity when it is created
(:func:`app.training.ledger.charge_tuning`, through the ledger's one charge path): every
later report of those tenants says "not private: tuning used raw ratings", and no later
differentially private job can include them. Agent tenants' ratings are not in this
database: they cannot be tuned on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
import threading
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from algorithms import registry
from algorithms.data import Federation, federation_from_tenants
from algorithms.tuning import Trial, metric_value, search_space, tune
from app import store
from app.models import Tenant, utcnow
from app.training.jobs import JobRefused, snapshot_blocks
from app.training.ledger import charge_tuning
from app.training.models import TuningJob

log = logging.getLogger("fedrec.training")


@dataclasses.dataclass(frozen=True)
class TuningSpec:
    algorithm: str
    tenant_ids: list[int]
    rounds: int | None
    per_round: int
    seed: int
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    test_fraction: float = 0.2
    trials: int = 9
    eta: int = 3
    budget_seconds: float = 600.0
    metric: str | None = None
    """rmse or ndcg (:data:`algorithms.tuning.METRICS`); None: ndcg for a ranking model,
    else rmse."""


def create_tuning_job(s: Session, spec: TuningSpec) -> TuningJob:
    """Validate the request and store a queued tuning job (committed); :class:`JobRefused`
    with the status to answer when it cannot run."""
    try:
        alg = registry.get(spec.algorithm)
    except KeyError as exc:
        raise JobRefused(422, str(exc.args[0])) from None
    try:
        search_space(alg)
    except ValueError as exc:
        raise JobRefused(422, f"not tunable: {exc}") from None
    try:
        cfg = alg.config(**spec.config)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise JobRefused(422, f"invalid config: {where + ': ' if where else ''}"
                              f"{first['msg'].removeprefix('Value error, ')}") from None
    if len(set(spec.tenant_ids)) != len(spec.tenant_ids) or not spec.tenant_ids:
        raise JobRefused(422, "tenant_ids must be a non-empty list without duplicates")
    tenants = [s.get(Tenant, t) for t in spec.tenant_ids]
    missing = [t for t, row in zip(spec.tenant_ids, tenants, strict=True) if row is None]
    if missing:
        raise JobRefused(404, f"unknown tenant id(s): {', '.join(map(str, missing))}")
    for t in tenants:
        if store.count_ratings(s, t.id) == 0:
            raise JobRefused(422, f"tenant {t.id} ({t.name}) has no ratings to tune on")
    rounds = spec.rounds or int(alg.run_defaults.get("rounds", 50))
    job = TuningJob(status="queued", algorithm=alg.name,
                    base_config=cfg.model_dump(mode="json", include=set(spec.config)),
                    tenant_ids=list(spec.tenant_ids), rounds=rounds, per_round=spec.per_round,
                    seed=spec.seed, test_fraction=spec.test_fraction, trials=spec.trials,
                    eta=spec.eta, budget_seconds=spec.budget_seconds, scored=[],
                    metric=spec.metric or ("ndcg" if registry.model_kind(alg.name) == "ranking"
                                           else "rmse"))
    s.add(job)
    s.flush()
    refused = charge_tuning(s, job.id, list(spec.tenant_ids))
    if refused:
        s.rollback()
        names = {t.id: t.name for t in tenants}
        who = ", ".join(f"{t} ({names[t]})" for t in sorted(refused))
        raise JobRefused(409, f"tenant(s) {who} did not opt in to non-private training "
                              "(allow_non_private is false): a tuning job trains and scores "
                              "on their ratings without noise")
    s.commit()  # the job and its charges together
    return job


def training_federation(s: Session, job: TuningJob) -> Federation:
    """The tenants' ratings split as a training job with the job's seed and test fraction
    splits them, with the test part removed (never read by the search)."""
    tenants = [s.get(Tenant, t) for t in job.tenant_ids]
    if any(t is None for t in tenants):
        raise ValueError("a tenant of the tuning job was deleted")
    blocks, keys, item_ids = snapshot_blocks(s, tenants)
    scale = (min(t.rating_min for t in tenants), max(t.rating_max for t in tenants))
    fed = federation_from_tenants(blocks, keys, item_ids, job.seed, job.test_fraction, scale)
    return Federation(fed.train, [], fed.user_ids, fed.item_ids, fed.scale)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _trial(t: Trial, metric: str = "rmse") -> dict[str, Any]:
    return {"params": t.params, "rounds": t.rounds,
            **_validation(metric, t.rmse)}


def _validation(metric: str, loss: float, prefix: str = "") -> dict[str, float | None]:
    """``{prefix}validation_rmse`` (and ``..._ndcg`` with metric ndcg) of a loss."""
    if metric == "rmse":
        return {f"{prefix}validation_rmse": _finite(loss)}
    return {f"{prefix}validation_rmse": None,
            f"{prefix}validation_ndcg": _finite(metric_value(metric, loss))}


class _Stopped(Exception):
    """The search was cancelled, or another run of the same tuning job took it over."""


def claim(sessions, tuning_id: int) -> int | None:
    """Take a queued or running tuning job for this run: its new ``attempt`` number (a run
    that started earlier and is still going notices at its next trial and stops), or None
    when the job is finished, cancelled or gone."""
    with sessions() as s:
        job = s.get(TuningJob, tuning_id, with_for_update=True)
        if job is None or job.status not in ("queued", "running"):
            return None
        job.status, job.scored, job.error = "running", [], None
        job.attempt, job.heartbeat_at = job.attempt + 1, utcnow()
        s.commit()
        return job.attempt


def _owned(s: Session, tuning_id: int, attempt: int) -> None:
    """Raise :class:`_Stopped` unless this run still owns a running job."""
    row = s.execute(sa.select(TuningJob.status, TuningJob.attempt)
                    .where(TuningJob.id == tuning_id)).one_or_none()
    if row is None or row.attempt != attempt or row.status != "running":
        raise _Stopped


@contextlib.contextmanager
def heartbeat(sessions, tuning_id: int, attempt: int, every: float) -> Iterator[None]:
    """While the block runs, stamp ``heartbeat_at`` every ``every`` seconds: the watchdog
    (:func:`stalled_tuning_jobs`) re-sends a running job whose stamp has gone stale, i.e.
    whose worker died, instead of waiting for the broker's visibility timeout."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            try:
                with sessions() as s:
                    s.execute(sa.update(TuningJob).where(TuningJob.id == tuning_id,
                                                         TuningJob.attempt == attempt)
                              .values(heartbeat_at=utcnow()))
                    s.commit()
            except Exception:  # noqa: BLE001 - a missed beat only makes the job look stale
                log.warning("tuning job %s: heartbeat failed", tuning_id, exc_info=True)

    thread = threading.Thread(target=beat, name=f"fedrec-tuning-beat-{tuning_id}",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


HEARTBEAT_SECONDS = 15.0


def run_tuning(sessions, tuning_id: int, heartbeat_seconds: float = HEARTBEAT_SECONDS
               ) -> None:
    """Run a queued (or interrupted) tuning job to the end and store its choice; a failure
    is stored on the job. A redelivered or resumed run repeats the whole search (it is
    deterministic given the job's seed, unless the time budget cut it). A cancelled job,
    or one another run has claimed since, stops at its next trial."""
    attempt = claim(sessions, tuning_id)
    if attempt is None:
        return
    with heartbeat(sessions, tuning_id, attempt, heartbeat_seconds), sessions() as s:
        try:
            _search(s, tuning_id, attempt)
        except _Stopped:
            log.info("tuning job %s: run %s stopped (cancelled or superseded)", tuning_id,
                     attempt)
            return
        except Exception as exc:  # noqa: BLE001 - stored on the job for GET
            log.exception("tuning job %s failed", tuning_id)
            s.rollback()
            _finish(s, tuning_id, attempt, status="failed",
                    error=f"{type(exc).__name__}: {exc}")


def _finish(s: Session, tuning_id: int, attempt: int, **values: Any) -> None:
    """Store the run's outcome, unless the job was cancelled or claimed by another run."""
    s.execute(sa.update(TuningJob).where(TuningJob.id == tuning_id,
                                         TuningJob.attempt == attempt,
                                         TuningJob.status == "running")
              .values(finished_at=utcnow(), **values))
    s.commit()


def _search(s: Session, tuning_id: int, attempt: int) -> None:
    job = s.get(TuningJob, tuning_id)
    alg = registry.get(job.algorithm)
    fed = training_federation(s, job)
    scored: list[dict[str, Any]] = []

    def record(t: Trial) -> None:  # progress visible to GET while it runs
        _owned(s, tuning_id, attempt)
        scored.append(_trial(t, job.metric))
        s.execute(sa.update(TuningJob).where(TuningJob.id == tuning_id)
                  .values(scored=list(scored)))
        s.commit()

    res = tune(alg, fed, rounds=job.rounds, per_round=job.per_round or fed.n_clients,
               seed=job.seed, trials=job.trials, eta=job.eta,
               budget_seconds=job.budget_seconds, base=dict(job.base_config),
               on_trial=record, metric=job.metric)
    result = {
        "config": res.config(alg).model_dump(mode="json"),
        "changed": res.best.params, "chosen_rounds": res.rounds,
        "metric": job.metric, **_validation(job.metric, res.rmse),
        **_validation(job.metric, dict(res.default.history).get(
            res.rounds, res.default.best[1]), "default_"),
        "budget_exhausted": res.budget_exhausted, "seconds": res.seconds,
        "trials": [{**_trial(t, job.metric),
                    "history": [[r, _finite(metric_value(job.metric, v))]
                                for r, v in t.history]}
                   for t in res.trials]}
    _finish(s, tuning_id, attempt, status="completed", result=result)


def cancel_tuning_job(s: Session, job: TuningJob) -> bool:
    """Stop a queued or running tuning job (a running search stops at its next trial);
    False when it has already finished."""
    if job.status not in ("queued", "running"):
        return False
    job.status, job.finished_at = "cancelled", utcnow()
    s.commit()
    return True


def reopen_tuning_job(s: Session, job: TuningJob) -> bool:
    """Queue a failed or cancelled tuning job again (the search starts over); also a
    running one, whose worker may be gone (a live run stops at its next trial). False for
    a completed job."""
    if job.status == "completed":
        return False
    # stamped as sent: the watchdog waits another period for a worker to claim it
    job.status, job.finished_at, job.heartbeat_at = "queued", None, utcnow()
    s.commit()
    return True


def stalled_tuning_jobs(s: Session, stalled_after: float) -> list[int]:
    """Queued or running tuning jobs with no heartbeat for ``stalled_after`` seconds."""
    cutoff = utcnow() - dt.timedelta(seconds=stalled_after)
    stamp = sa.func.coalesce(TuningJob.heartbeat_at, TuningJob.created_at)
    return list(s.scalars(sa.select(TuningJob.id).where(
        TuningJob.status.in_(("queued", "running")), stamp < cutoff)))
