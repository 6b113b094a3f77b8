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
``allow_non_private`` opt-in (else 409 ``not_private_refused``); it is not entered in the
privacy ledger (whose rows are training jobs' charges), so a tenant's reported spend does
not include it. Agent tenants' ratings are not in this database: they cannot be tuned on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from algorithms import registry
from algorithms.data import Federation, federation_from_tenants
from algorithms.tuning import Trial, metric_value, search_space, tune
from app import store
from app.models import Tenant, utcnow
from app.training.jobs import JobRefused, _snapshot_blocks
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
    refused = [t for t in tenants if not t.allow_non_private]
    if refused:
        who = ", ".join(f"{t.id} ({t.name})" for t in refused)
        raise JobRefused(409, f"tenant(s) {who} did not opt in to non-private training "
                              "(allow_non_private is false): a tuning job trains and scores "
                              "on their ratings without noise")
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
    s.commit()
    return job


def training_federation(s: Session, job: TuningJob) -> Federation:
    """The tenants' ratings split as a training job with the job's seed and test fraction
    splits them, with the test part removed (never read by the search)."""
    tenants = [s.get(Tenant, t) for t in job.tenant_ids]
    if any(t is None for t in tenants):
        raise ValueError("a tenant of the tuning job was deleted")
    blocks, keys, item_ids = _snapshot_blocks(s, tenants)
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


def run_tuning(sessions, tuning_id: int) -> None:
    """Run a queued (or interrupted) tuning job to the end and store its choice; a failure
    is stored on the job. A redelivered task repeats the whole search (it is
    deterministic given the job's seed, unless the time budget cut it)."""
    with sessions() as s:
        job = s.get(TuningJob, tuning_id)
        if job is None or job.status not in ("queued", "running"):
            return
        job.status, job.scored = "running", []
        s.commit()
        try:
            alg = registry.get(job.algorithm)
            fed = training_federation(s, job)
            scored: list[dict[str, Any]] = []

            def record(t: Trial) -> None:  # progress visible to GET while it runs
                scored.append(_trial(t, job.metric))
                s.execute(sa.update(TuningJob).where(TuningJob.id == tuning_id)
                          .values(scored=list(scored)))
                s.commit()

            res = tune(alg, fed, rounds=job.rounds,
                       per_round=job.per_round or fed.n_clients, seed=job.seed,
                       trials=job.trials, eta=job.eta, budget_seconds=job.budget_seconds,
                       base=dict(job.base_config), on_trial=record, metric=job.metric)
            job = s.get(TuningJob, tuning_id, populate_existing=True)
            job.result = {
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
            job.status = "completed"
        except Exception as exc:  # noqa: BLE001 - stored on the job for GET
            log.exception("tuning job %s failed", tuning_id)
            s.rollback()
            job = s.get(TuningJob, tuning_id, populate_existing=True)
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
        job.finished_at = utcnow()
        s.commit()
