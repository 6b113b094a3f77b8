"""Scheduled retraining and the stalled-job watchdog (run by Celery beat).

``retrain_if_changed`` starts a new job from the settings of the latest completed job when
any of its tenants' ratings changed since (``ratings_version``, bumped only by an upload or
deletion that changes a rating), never while another job runs, only when every tenant it
would charge consented (``scheduled_retraining``) and its own minimum interval since its
last scheduled retraining has passed (``retrain_min_seconds``), and never past a budget:
the new job goes through the same budget and opt-in checks as any other and is simply not
created when it fails one. ``resume_stalled`` re-sends the next round of running jobs that
made no progress for a while (a crashed worker whose task was lost); every pipeline step is
idempotent, so a false alarm costs nothing.
"""

from __future__ import annotations

import datetime as dt
import logging

import sqlalchemy as sa

from app.models import Tenant, utcnow
from app.training import pipeline, tuning
from app.training.jobs import JobRefused, JobSpec, create_job, discard_job
from app.training.models import TrainingJob, TuningJob

log = logging.getLogger("fedrec.training")


def _changed(s, job: TrainingJob) -> list[int]:
    versions = dict(s.execute(sa.select(Tenant.id, Tenant.ratings_version)
                              .where(Tenant.id.in_(job.tenant_ids))).all())
    return [t for t in job.tenant_ids
            if t in versions and versions[t] != job.ratings_version.get(str(t))]


def _not_consenting(s, tenant_ids: list[int]) -> str | None:
    """Why a scheduled retraining may not charge these tenants, or None: each must have
    consented, and its minimum interval since its last scheduled retraining must be over."""
    now = utcnow()
    tenants = s.scalars(sa.select(Tenant).where(Tenant.id.in_(tenant_ids))
                        .order_by(Tenant.id)).all()
    no = [f"{t.id} ({t.name})" for t in tenants if not t.scheduled_retraining]
    if no:
        return f"tenant(s) {', '.join(no)} did not consent to scheduled retraining"
    due = {t.id: _due(t.last_retrained_at, t.retrain_min_seconds)
           for t in tenants if t.last_retrained_at is not None}
    early = [f"{t.id} ({t.name}) until {due[t.id].isoformat()}" for t in tenants
             if t.id in due and due[t.id] > now]
    if early:
        return f"tenant(s) {', '.join(early)} within their minimum retraining interval"
    return None


def _due(last: dt.datetime, seconds: float) -> dt.datetime:
    """When the interval after ``last`` ends; a stored interval beyond the calendar (rows
    written before the API bounded it) never ends, instead of failing every beat tick."""
    try:
        return _aware(last) + dt.timedelta(seconds=seconds)
    except OverflowError:
        return dt.datetime.max.replace(tzinfo=dt.UTC)


def _aware(at: dt.datetime) -> dt.datetime:
    """SQLite returns naive datetimes; everything fedrec stores is UTC."""
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def retrain_if_changed(sessions, dispatch: pipeline.Dispatcher) -> int | None:
    """Start a retraining job if due; returns its id, or None (with the reason logged)."""
    with sessions() as s:
        if s.scalar(sa.select(sa.func.count()).select_from(TrainingJob)
                    .where(TrainingJob.status.in_(("queued", "running")))):
            log.info("retraining skipped: a job is running")
            return None
        last = s.scalar(sa.select(TrainingJob).where(TrainingJob.status == "completed")
                        .order_by(TrainingJob.id.desc()).limit(1))
        if last is None:
            return None
        changed = _changed(s, last)
        if not changed:
            return None
        alive = [t for t in last.tenant_ids if s.get(Tenant, t) is not None]
        refused = _not_consenting(s, alive)
        if refused:
            log.info("retraining after job %s skipped: %s", last.id, refused)
            return None
        spec = JobSpec(last.algorithm, alive, last.rounds, last.per_round, last.seed,
                       last.config, last.dp, last.test_fraction, allow_not_private=True,
                       parent_job_id=last.id, max_attempts=last.max_attempts,
                       agents=[t for t in (last.agents or {}).get("tenants", [])
                               if t in alive],
                       round_seconds=(last.agents or {}).get("round_seconds", 300.0),
                       wire=(last.agents or {}).get("wire", "float64"),
                       rounds_given=False,  # a job of older code may have spare rounds
                       validation_fraction=last.validation_fraction,
                       lists=(last.serving or {}).get("policy", "auto"))
        try:
            job = create_job(s, spec)
        except JobRefused as exc:
            log.warning("retraining after job %s refused: %s", last.id, exc.detail)
            return None
        now = utcnow()
        s.execute(sa.update(Tenant).where(Tenant.id.in_(alive)).values(last_retrained_at=now))
        s.commit()
        log.info("retraining job %s started (ratings changed for tenants %s)", job.id, changed)
    try:
        dispatch.send(pipeline.TASK_START, job.id, 1)
    except BaseException:  # broker down: leave no job for the watchdog to run later
        with sessions() as s:
            discard_job(s, job.id)
        raise
    return job.id


def resume_stalled(sessions, dispatch: pipeline.Dispatcher, stalled_after: float) -> list[int]:
    """Resume running jobs not updated for ``stalled_after`` seconds; returns their ids."""
    cutoff = utcnow() - dt.timedelta(seconds=stalled_after)
    with sessions() as s:
        ids = list(s.scalars(sa.select(TrainingJob.id).where(
            TrainingJob.status.in_(("queued", "running")), TrainingJob.updated_at < cutoff)))
    return [j for j in ids if pipeline.resume(sessions, dispatch, j)]


def resume_stalled_tuning(sessions, dispatch: pipeline.Dispatcher, stalled_after: float
                          ) -> list[int]:
    """Re-send tuning jobs whose search has not beaten for ``stalled_after`` seconds (its
    worker died, or its message was lost with the broker); returns their ids."""
    from app.queue import TUNING_RUN

    with sessions() as s:
        ids = tuning.stalled_tuning_jobs(s, stalled_after)
        for tuning_id in ids:
            tuning.reopen_tuning_job(s, s.get(TuningJob, tuning_id))
    for tuning_id in ids:
        log.warning("tuning job %s stalled: sent again", tuning_id)
        dispatch.send(TUNING_RUN, tuning_id)
    return ids
