"""The round pipeline of a training job.

``start_round(k)`` samples S_k from the job seed and sends one ``client_step(k, i)`` per
sampled tenant; each client step stages its new local state and its privatised upload,
charging the ledger in the same transaction; the client step that completes the round
sends ``aggregate(k)``, which runs the server step on the uploads, evaluates, and commits
the round (states, metrics, ``current_round``) in one transaction before sending
``start_round(k + 1)``. Every task takes ids only and is idempotent: running it twice, or
after a crash, changes nothing that was committed. Every non-private draw derives from
(job seed, round, client), so a resumed job without privacy ends bit-identical to an
uninterrupted one; privacy noise and per-user sampling come from secret, fresh randomness
(:mod:`privacy.randomness`), and exactly-once comes from persisting each noisy release
with its charge before it is used: a retried step whose release was committed reuses it,
one that crashed before draws afresh and is charged once.

Tasks are sent through a :class:`Dispatcher`: Celery (``worker.tasks``) when a broker is
configured, or :class:`InlineDispatcher`, which runs them in this process.
"""

from __future__ import annotations

import collections
import functools
import io
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import sqlalchemy as sa
from kombu.exceptions import OperationalError as BrokerDown
from sqlalchemy import orm
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from algorithms import Message, RatingBlock, registry
from algorithms.base import Algorithm
from algorithms.simulate import (
    RoundState,
    Staged,
    client_round,
    combine_errors,
    select_clients,
    server_round,
    step,
    tenant_errors,
)
from app import queue
from app.db import DATABASE_DOWN
from app.models import Tenant, utcnow
from app.training import states
from app.training.forget import (
    forgotten_since,
    newer_tombstone,
    newest_tombstone,
    scrub_job_clients,
    without_forgotten,
)
from app.training.ledger import load_ledger, record_charges
from app.training.models import JobClient, JobRound, LedgerEntry, RoundUpload, TrainingJob
from privacy import release as privacy_release
from privacy import user_level
from privacy.ledger import Ledger
from privacy.randomness import fresh_noise_generator, process_key, with_user_draws
from privacy.release import Release, UploadRelease, release_of

TASK_START = queue.TRAINING_START_ROUND
TASK_CLIENT = queue.TRAINING_CLIENT_STEP
TASK_AGGREGATE = queue.TRAINING_AGGREGATE
TASK_RETRAIN = queue.TRAINING_RETRAIN
TASK_WATCHDOG = queue.TRAINING_RESUME_STALLED

Sessions = sessionmaker
log = logging.getLogger("fedrec.training")
#: outages, not the job's fault: the worker retries (database) or the watchdog resumes
#: (broker); they are never counted against a job's attempts
OUTAGES = (*DATABASE_DOWN, BrokerDown)


class Dispatcher(Protocol):
    """Sends a task by name with integer arguments."""

    def send(self, task: str, *args: int) -> None: ...


class InlineDispatcher:
    """Runs the pipeline's tasks in this process, in order (no broker configured).

    A queue, not recursion: a 1,000-round job does not grow the stack.
    """

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self._queue: collections.deque[tuple[str, tuple[int, ...]]] = collections.deque()

    def send(self, task: str, *args: int) -> None:
        self._queue.append((task, args))

    def drain(self) -> None:
        while self._queue:
            task, args = self._queue.popleft()
            TASKS[task](self.sessions, self, *args)

    def send_later(self, task: str, delay: float, *args: int) -> None:
        """Run ``task`` in a fresh in-process queue after ``delay`` seconds (a round's
        deadline: it closes even if no agent ever polls again)."""
        def run() -> None:
            later = InlineDispatcher(self.sessions)
            later.send(task, *args)
            try:
                later.drain()
            except Exception:  # noqa: BLE001 - counted on the job by _bounded
                log.exception("delayed %s%s failed", task, args)

        timer = threading.Timer(delay, run)
        timer.daemon = True
        timer.start()


def agent_clients(job: TrainingJob) -> set[int]:
    """Client indices of the job's agent tenants (their client step runs in their agent)."""
    agents = set((job.agents or {}).get("tenants", []))
    return {i for i, t in enumerate(job.tenant_ids) if t in agents}


def round_deadline(job: TrainingJob, round_: int) -> float | None:
    """When round ``round_`` stops waiting for agents (Unix seconds), once it has started."""
    opened = (job.latest_metrics or {}).get("round_open") or {}
    return opened.get("deadline") if opened.get("round") == round_ else None


def algorithm_of(job: TrainingJob) -> tuple[Algorithm, Any]:
    alg = registry.get(job.algorithm)
    return alg, alg.config(**job.config)


_BLOCKS: collections.OrderedDict[tuple[int, int, str], RatingBlock] = collections.OrderedDict()
_BLOCK_CACHE_SIZE = 4096


def _block(jc: JobClient, which: str) -> RatingBlock:
    """A job's blocks change only when a forgotten user is scrubbed: decompress each once
    per process (LRU keyed by the digest stored with the block, so neither a round nor a
    cache hit fetches the blob, and a cache never confuses two databases' jobs)."""
    key = (jc.job_id, jc.client_index, jc.train_digest if which == "train" else jc.test_digest)
    block = _BLOCKS.get(key)
    if block is None:  # loads the deferred column now
        block = RatingBlock.from_bytes(jc.train_block if which == "train" else jc.test_block)
        _BLOCKS[key] = block
        if len(_BLOCKS) > _BLOCK_CACHE_SIZE:
            _BLOCKS.popitem(last=False)
    else:
        _BLOCKS.move_to_end(key)
    return block


def _fit_and_valid(job: TrainingJob, jc: JobClient) -> tuple[RatingBlock, RatingBlock | None]:
    """(the ratings the job fits on, its validation carve-out or None): the stored training
    block split by :func:`app.training.selection.carve` (cached like the blocks)."""
    from app.training.selection import carve

    fraction = job.validation_fraction or 0.0
    if fraction <= 0:
        return _block(jc, "train"), None
    key = (jc.job_id, jc.client_index, f"{jc.train_digest}:fit")
    fit, valid = _BLOCKS.get(key, (None, None))
    if fit is None:
        fit, valid = carve(_block(jc, "train"), job.seed, jc.client_index, fraction)
        _BLOCKS[key] = (fit, valid)
        if len(_BLOCKS) > _BLOCK_CACHE_SIZE:
            _BLOCKS.popitem(last=False)
    return fit, valid


def _active_job(s: Session, job_id: int, round_: int, lock: bool = False
                ) -> TrainingJob | None:
    """The job if round ``round_`` is the next one to run, else None (stale task).

    Loads the shared part of the server state with it when ``lock`` (the aggregate step
    is the only one that reads it); the global message is read through
    :func:`app.training.states.load_global` (from memory when its digest is there).
    """
    q = sa.select(TrainingJob).where(TrainingJob.id == job_id)
    if lock:
        q = q.options(orm.undefer(TrainingJob.server_state))
    job = s.execute(q.with_for_update() if lock else q).scalar_one_or_none()
    if job is None or job.status not in ("queued", "running") or round_ > job.rounds:
        return None
    return job if job.current_round == round_ - 1 else None


def _client_of(s: Session, job_id: int, round_: int, client: int
               ) -> tuple[TrainingJob, JobClient, bool, int | None] | None:
    """What a client step reads first, in one statement: the job if round ``round_`` is
    the next one to run (else None, a stale task), the client's row, whether its result
    for the round is staged already, and the version of its tenant's newest tombstone."""
    row = s.execute(_CLIENT_OF, {"job_id": job_id, "round": round_, "client": client}
                    ).one_or_none()
    if row is None:
        return None
    job, jc, done, tombstone = row
    if (job.status not in ("queued", "running") or job.current_round != round_ - 1
            or round_ > job.rounds):
        return None
    return job, jc, bool(done), tombstone


_CLIENT_OF = (
    sa.select(TrainingJob, JobClient,
              sa.exists().where(RoundUpload.job_id == sa.bindparam("job_id"),
                                RoundUpload.round == sa.bindparam("round"),
                                RoundUpload.client_index == sa.bindparam("client")
                                ).label("staged"),
              newest_tombstone(JobClient.tenant_id))
    .join(JobClient, sa.and_(JobClient.job_id == TrainingJob.id,
                             JobClient.client_index == sa.bindparam("client")))
    .where(TrainingJob.id == sa.bindparam("job_id")))


def _selected(job: TrainingJob, alg: Algorithm, round_: int) -> list[int]:
    glob = states.load_global(job)
    return [int(i) for i in select_clients(alg, glob, len(job.tenant_ids), job.per_round,
                                           job.seed, round_)]


def start_round(sessions: Sessions, dispatch: Dispatcher, job_id: int, round_: int) -> None:
    """Mark the round started and send one client step per sampled tenant."""
    with sessions() as s:
        job = _active_job(s, job_id, round_)
        if job is None:
            return
        alg, _ = algorithm_of(job)
        selected = _selected(job, alg, round_)
        remote = agent_clients(job)
        job.status = "running"
        now, wait = time.time(), None
        metrics = {**(job.latest_metrics or {}), "round_started": now}
        if remote and round_deadline(job, round_) is None:  # a re-sent start keeps it
            metrics["round_open"] = {"round": round_,
                                     "deadline": now + job.agents["round_seconds"]}
            wait = job.agents["round_seconds"]
        job.latest_metrics = metrics
        s.commit()
    for i in selected:
        if i not in remote:  # an agent fetches its round itself (app.training.agents)
            dispatch.send(TASK_CLIENT, job_id, round_, i)
    if not selected:
        dispatch.send(TASK_AGGREGATE, job_id, round_)
    elif wait is not None and any(i in remote for i in selected):
        send_later = getattr(dispatch, "send_later", None)
        if send_later is not None:  # close the round at its deadline whoever is missing
            send_later(TASK_AGGREGATE, wait + 0.5, job_id, round_)


def _release(s: Session, job: TrainingJob, alg: Algorithm, cfg: Any, tenant_id: int
             ) -> UploadRelease:
    """A hosted tenant's release of its upload (:class:`privacy.release.UploadRelease`,
    whatever the unit) on its ledger in the database, loaded when there is an upload to
    release with the tenant row locked (:func:`load_ledger`), so two jobs cannot both
    spend the last of its budget."""
    def books() -> tuple[Ledger, int]:
        ledger = load_ledger(s, [tenant_id], lock=True)
        index = _job_releases(s, job.id, tenant_id) if release_of(job.dp).user_level else 0
        return ledger, index

    return UploadRelease(job.dp, job.algorithm, cfg, tenant_id, books, alg.privacy_preserving,
                         fresh_noise_generator)


def _job_releases(s: Session, job_id: int, tenant_id: int | None = None) -> int:
    """User-level releases this job has charged so far: of one tenant's users (placement
    tenant), or rounds in which any was charged (placement central)."""
    q = sa.select(sa.func.count(sa.distinct(LedgerEntry.round))).where(
        LedgerEntry.job_id == job_id)
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
    return int(s.scalar(q) or 0)


def _release_central(s: Session, job: TrainingJob, cfg: Any, round_: int,
                     uploads: dict[int, Message]) -> tuple[dict[int, Message], dict[str, str]]:
    """What the server step receives (:func:`privacy.release.release_round`: for central
    user-level DP, every contributing tenant charged, then the sum of their bounded
    uploads noised once), the charges persisted in the round's transaction. Returns
    (received, refusals by tenant id)."""
    if not uploads or not privacy_release.central(job.dp):
        return uploads, {}
    tenant_of = {i: job.tenant_ids[i] for i in uploads}
    ledger = load_ledger(s, tenant_of.values(), lock=True)
    received, charged, refused = privacy_release.release_round(
        job.dp, job.algorithm, cfg, {tenant_of[i]: up for i, up in uploads.items()},
        ledger, _job_releases(s, job.id), fresh_noise_generator(), round_)
    record_charges(s, charged, round_, job_id=job.id, dp=job.dp)  # committed with the round
    return received, {str(t): why for t, why in refused.items()}


def private_block(job: TrainingJob, jc: JobClient, block: RatingBlock) -> RatingBlock:
    """A hosted tenant's training block carrying its secret per-user draws when the job
    protects users (their cap and Poisson sample, :mod:`privacy.randomness`), under this
    process's key for the job (held in memory only)."""
    if not user_level.is_user_level(job.dp):
        return block
    return with_user_draws(block, process_key(("training-job", job.id)), jc.tenant_id,
                           jc.user_keys)


def client_step(sessions: Sessions, dispatch: Dispatcher, job_id: int, round_: int,
                client: int) -> float | None:
    """Run tenant ``client``'s step of the round and stage its result (idempotent).

    Returns the seconds spent computing and staging it, or None when there was nothing to
    compute (a stale or duplicate delivery, an agent's client)."""
    computed = None
    with sessions() as s:
        found = _client_of(s, job_id, round_, client)
        if found is None:
            return None
        job, jc, staged, tombstone = found
        if client in agent_clients(job):
            return None
        alg, cfg = algorithm_of(job)
        if not staged:
            started = time.perf_counter()
            gone = (forgotten_since(s, job, [jc.tenant_id]).get(jc.tenant_id, set())
                    if newer_tombstone(job, jc.tenant_id, tombstone) else set())
            train = private_block(job, jc, without_forgotten(_fit_and_valid(job, jc)[0],
                                                             jc.user_keys, gone))
            release = _release(s, job, alg, cfg, jc.tenant_id)
            local, upload = client_round(
                alg, cfg, round_, job.seed, client, states.load_global(job),
                states.load_locals(s, job_id, [jc])[client], train, release)
            try:
                states.stage_local(s, job_id, client, round_, local)
                states.stage_upload(s, job_id, client, round_, local, upload,
                                    release.refused)
                if release.event is not None:  # charged in the transaction storing it
                    record_charges(s, {jc.tenant_id: release.event}, round_, job_id=job_id,
                                   dp=job.dp)
                s.commit()
                computed = time.perf_counter() - started
            except IntegrityError:  # a duplicate delivery of this task got there first
                s.rollback()
        complete = round_complete(s, job, alg, round_)
    if complete:
        dispatch.send(TASK_AGGREGATE, job_id, round_)
    return computed


def round_complete(s: Session, job: TrainingJob, alg: Algorithm, round_: int) -> bool:
    """Every tenant selected in the round has staged its result (hosted or agent)."""
    staged = s.scalar(_STAGED_COUNT, {"job_id": job.id, "round": round_})
    return staged >= len(_selected(job, alg, round_))


#: the statement every client step runs, built once (building one costs more than
#: executing it): the count of a round's staged results
_STAGED_COUNT = sa.select(sa.func.count()).select_from(RoundUpload).where(
    RoundUpload.job_id == sa.bindparam("job_id"), RoundUpload.round == sa.bindparam("round"))


def _evaluate(s: Session, job: TrainingJob, alg: Algorithm, cfg: Any, glob: Message,
              clients: list[JobClient], locals_: dict[int, Message]) -> dict[str, Any]:
    """Training objective and test RMSE/MAE, overall and per tenant (same arithmetic as
    :func:`algorithms.simulate.evaluate`, so a job matches a simulation number for number).

    This reads each tenant's local state and held-out block: it is the tenants' own
    evaluation reported to the job, not part of the server step, which sees uploads only.
    """
    scales = {t: (lo, hi) for t, lo, hi in s.execute(
        sa.select(Tenant.id, Tenant.rating_min, Tenant.rating_max)
        .where(Tenant.id.in_(job.tenant_ids)))}
    parts, per_tenant, objective = [], {}, 0.0
    remote = agent_clients(job)
    for jc in clients:
        if jc.client_index in remote:  # an agent evaluates on its own machine
            continue
        state = locals_[jc.client_index]
        part = tenant_errors(alg, glob, state, _block(jc, "test"), scales[jc.tenant_id])
        objective += float(alg.objective(glob, state, _fit_and_valid(job, jc)[0], cfg))
        parts.append(part)
        rmse, mae = combine_errors([part])
        per_tenant[str(jc.tenant_id)] = {"test_rmse": _num(rmse), "test_mae": _num(mae),
                                         "n_test": part[2]}
    rmse, mae = combine_errors(parts)
    return {"objective": _num(objective), "test_rmse": _num(rmse), "test_mae": _num(mae),
            "per_tenant": per_tenant}


def _final_ranking(s: Session, job: TrainingJob, alg: Algorithm, glob: Message,
                   clients: list[JobClient], locals_: dict[int, Message]) -> dict[str, Any]:
    """Ranking metrics of the final model on the hosted tenants (an agent's U_i stays
    with it) (:mod:`app.training.evaluation`), and of a most-popular list on the same
    split (``popularity``: :func:`app.training.selection.popularity_ranking`)."""
    from app.training.evaluation import job_ranking
    from app.training.selection import popularity_ranking

    scales = _scales(s, job)
    hosted = [jc for jc in clients if jc.client_index not in agent_clients(job)]
    ranking = job_ranking(alg, glob, hosted, {jc.client_index: locals_[jc.client_index]
                                              for jc in hosted}, scales, _block)
    return {**ranking, "model": job.algorithm,
            "model_kind": registry.model_kind(job.algorithm),
            "popularity": popularity_ranking(hosted, _block, scales)}


def _scales(s: Session, job: TrainingJob) -> dict[int, tuple[float, float]]:
    return {t: (lo, hi) for t, lo, hi in s.execute(
        sa.select(Tenant.id, Tenant.rating_min, Tenant.rating_max)
        .where(Tenant.id.in_(job.tenant_ids)))}


def _select(s: Session, job: TrainingJob, alg: Algorithm, glob: Message,
            clients: list[JobClient], locals_: dict[int, Message], round_: int) -> bool:
    """Score the round on the validation carve-out of a job that selects its run length
    (:mod:`app.training.selection`) and record it; True when the job stops here."""
    from app.training import selection

    if not (job.selection or {}).get("metric"):
        return False
    value = selection.validation_score(alg, glob, _validation_parts(s, job, clients, locals_),
                                       job.selection["metric"])
    job.selection, stop = selection.update(job.selection, round_, value)
    return stop


def _validation_parts(s: Session, job: TrainingJob, clients: list[JobClient],
                      locals_: dict[int, Message]
                      ) -> list[tuple[Message, RatingBlock, RatingBlock | None,
                                      tuple[float, float]]]:
    """(local state, fit block, validation carve-out, scale) of each hosted tenant: what
    :mod:`app.training.selection` scores a model on."""
    scales = _scales(s, job)
    return [(locals_[jc.client_index], *_fit_and_valid(job, jc), scales[jc.tenant_id])
            for jc in clients if jc.client_index in locals_]


def _choose_prior(s: Session, job: TrainingJob, alg: Algorithm, glob: Message,
                  clients: list[JobClient], locals_: dict[int, Message]) -> Message:
    """The final model with its popularity prior chosen on the validation carve-out, for a
    job that selects (:func:`app.training.selection.choose_prior`), recorded in its
    selection; the model unchanged otherwise."""
    from app.training import selection

    if not (job.selection or {}).get("metric"):
        return glob
    glob, record = selection.choose_prior(alg, glob,
                                          _validation_parts(s, job, clients, locals_))
    if record is not None:
        job.selection = {**job.selection, "popularity_prior": record}
    return glob


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def aggregate(sessions: Sessions, dispatch: Dispatcher, job_id: int, round_: int
              ) -> float | None:
    """Server step on the staged uploads; commit the whole round in one transaction.

    Returns the round's duration (its start to this commit, as stored on the round), or
    None when no round was committed (stale, or still waiting for uploads)."""
    with sessions() as s:
        job = _active_job(s, job_id, round_, lock=True)
        if job is None:
            return None
        alg, cfg = algorithm_of(job)
        selected = _selected(job, alg, round_)
        staged = {r.client_index: r for r in s.scalars(sa.select(RoundUpload).where(
            RoundUpload.job_id == job_id, RoundUpload.round == round_))}
        missing = [i for i in selected if i not in staged]
        deadline = round_deadline(job, round_)
        if missing and not (set(missing) <= agent_clients(job) and deadline is not None
                            and time.time() >= deadline):
            return None  # not complete yet: a later client step sends aggregate again
        # past the deadline, agents that sent nothing sit the round out (state unchanged)
        uploads = states.load_uploads(s, job_id, round_,
                                      [staged[i] for i in selected if i in staged])
        released_refusals: dict[str, str] = {}
        n_uploads = len(uploads)

        def release(ups: dict[int, Message], k: int) -> dict[int, Message]:
            """The round's release as the job's settings decide it, charged in this
            transaction: a secure sum (the server step gets the unmasked sum only) or
            central noise on the sum (:func:`_release_central`), else the uploads."""
            nonlocal n_uploads
            if release_of(job.dp) is Release.USER_SECURE:
                from app.training import secure

                received, survivors = secure.secure_sum(s, job, k, selected)
                n_uploads = len(survivors)
                return received
            received, refusals = _release_central(s, job, cfg, k, ups)
            released_refusals.update(refusals)
            return received

        remote = agent_clients(job)
        before = states.load_server(s, job)
        done_round = step(Staged(alg, cfg, job.seed, selected, uploads, server_round),
                          RoundState(round_ - 1, states.load_global(job), before, None),
                          round_, release)
        server, glob = done_round.server_state, done_round.global_msg
        clients = list(s.scalars(sa.select(JobClient).where(JobClient.job_id == job_id)
                                 .order_by(JobClient.client_index)
                                 .with_for_update(key_share=True)))  # before tombstones
        moved = [jc for jc in clients if jc.client_index in staged
                 and jc.client_index not in remote]
        for jc in clients:
            if jc.client_index in staged:
                jc.transmissions += staged[jc.client_index].upload is not None
        states.commit_locals(s, job_id, moved, round_)
        s.flush()
        scrub_job_clients(s, job, clients)  # deletions win over evaluation and publishing
        locals_ = states.load_locals(s, job_id, [jc for jc in clients
                                                 if jc.client_index not in remote])
        metrics = _evaluate(s, job, alg, cfg, glob, clients, locals_)
        started = (job.latest_metrics or {}).get("round_started", time.time())
        seconds = max(0.0, time.time() - started)
        done = _select(s, job, alg, glob, clients, locals_, round_) or round_ >= job.rounds
        if done:
            glob = _choose_prior(s, job, alg, glob, clients, locals_)
        ranking = _final_ranking(s, job, alg, glob, clients, locals_) if done else None
        missed = [job.tenant_ids[i] for i in missing]
        if missed:
            log.info("job %s round %s closed at its deadline without %s", job_id, round_,
                     missed)
        s.add(JobRound(job_id=job_id, round=round_, objective=metrics["objective"],
                       test_rmse=metrics["test_rmse"], test_mae=metrics["test_mae"],
                       per_tenant=metrics["per_tenant"], participants=selected,
                       uploads=n_uploads, seconds=seconds, ranking=ranking))
        refused = {str(job.tenant_ids[i]): r.refused for i, r in staged.items() if r.refused}
        refused.update(released_refusals)
        if refused:
            job.stopped_tenants = {**refused, **(job.stopped_tenants or {})}
        states.store_global(job, glob)
        states.save_server(s, job, before, server)
        job.current_round = round_
        job.attempts, job.error = 0, None  # failures are counted per round
        job.latest_metrics = {"round": round_, "objective": metrics["objective"],
                              "test_rmse": metrics["test_rmse"],
                              "test_mae": metrics["test_mae"], "seconds": seconds,
                              **({"missed_deadline": missed} if missed else {})}
        s.execute(sa.delete(RoundUpload).where(RoundUpload.job_id == job_id,
                                               RoundUpload.round == round_))
        if done:
            _finish(s, job, alg, glob, clients, locals_, ranking)
        s.commit()
    if not done:
        dispatch.send(TASK_START, job_id, round_ + 1)
    return seconds


def _finish(s: Session, job: TrainingJob, alg: Algorithm, glob: Message,
            clients: list[JobClient], locals_: dict[int, Message],
            ranking: dict[str, Any] | None = None) -> None:
    """Mark the job completed, decide who serves its lists (the model or popularity,
    :func:`app.training.selection.lists_decision`) and publish every tenant's serving
    factors (or fail it, publishing nothing, when any factor is not finite)."""
    from app.training.reports import is_private
    from app.training.selection import lists_decision
    from app.training.snapshots import non_finite_factors, write_snapshot

    ranking = ranking or {}
    job.serving = lists_decision(job.algorithm, ranking.get("overall"),
                                 (ranking.get("popularity") or {}).get("overall"),
                                 (job.serving or {}).get("policy", "auto"))

    remote = agent_clients(job)  # an agent serves its own users from its own factors
    clients = [jc for jc in clients if jc.client_index not in remote]
    factors = {jc.tenant_id: alg.factors(glob, locals_[jc.client_index]) for jc in clients}
    job.finished_at = utcnow()
    problem = non_finite_factors(factors)
    if problem:
        job.status, job.error = "failed", problem
        return
    job.status = "completed"
    private = is_private(job)
    for jc in clients:
        a, b = factors[jc.tenant_id]
        # a DP job serves its whole (registered, public) catalogue: which items the
        # tenant's users rated is not released; otherwise the tenant's own rated items
        trained = None if private else np.unique(_fit_and_valid(job, jc)[0].cols)
        link = None if alg.serving_link is None else alg.serving_link(
            glob, locals_[jc.client_index])
        write_snapshot(s, jc.tenant_id, job, jc.user_keys, a, b, trained, link)


def record_failure(sessions: Sessions, job_id: int, exc: BaseException) -> bool:
    """Count a step's failure on its job; at ``max_attempts`` failures without a round
    committing in between, mark the job ``failed`` with the error (the watchdog resumes
    only queued and running jobs). Returns True when the job is now failed."""
    with sessions() as s:
        job = s.scalar(sa.select(TrainingJob).where(TrainingJob.id == job_id)
                       .with_for_update())
        if job is None or job.status not in ("queued", "running"):
            return False
        job.attempts += 1
        error = f"{type(exc).__name__}: {exc}"
        if job.attempts >= job.max_attempts:
            job.status = "failed"
            job.error = f"{error} (attempt {job.attempts} of {job.max_attempts}; job failed)"
        else:
            job.error = f"{error} (attempt {job.attempts} of {job.max_attempts}; retried)"
        s.commit()
        return job.status == "failed"


def _bounded(step: Callable[..., Any]) -> Callable[..., Any]:
    """Run a pipeline step; a failure other than an outage of the database or the broker
    is counted on the job before it propagates (see record_failure), so a step that always
    raises fails its job instead of being resumed for ever."""

    @functools.wraps(step)
    def run(sessions: Sessions, dispatch: Dispatcher, job_id: int, *args: int) -> Any:
        try:
            return step(sessions, dispatch, job_id, *args)
        except OUTAGES:
            raise
        except Exception as exc:
            try:
                record_failure(sessions, job_id, exc)
            except Exception:  # noqa: BLE001 - never hide the step's own error
                log.exception("could not record the failure of job %s", job_id)
            raise

    return run


TASKS: dict[str, Callable[..., Any]] = {
    TASK_START: _bounded(start_round),
    TASK_CLIENT: _bounded(client_step),
    TASK_AGGREGATE: _bounded(aggregate),
}


def resume(sessions: Sessions, dispatch: Dispatcher, job_id: int) -> bool:
    """Re-send the next round of an unfinished job (after a crash); False if nothing to do.

    Safe to call while the round is still running: every task is idempotent.
    """
    with sessions() as s:
        job = s.get(TrainingJob, job_id)
        if job is None or job.status not in ("queued", "running", "failed"):
            return False
        if job.status == "failed":  # the operator fixed the cause: a fresh set of attempts
            job.status, job.error, job.attempts = "running", None, 0
            s.commit()
        next_round = job.current_round + 1
        if next_round > job.rounds:  # every round ran (and was charged): publish only
            _publish(s, job)
            return True
    dispatch.send(TASK_START, job_id, next_round)
    return True


def _publish(s: Session, job: TrainingJob) -> None:
    """Finish a job whose rounds are all committed (it failed at publication): evaluate
    nothing and charge nothing again, only :func:`_finish` on the committed states, with
    the final round's stored ranking (so the lists decision compares the same figures)."""
    alg, _ = algorithm_of(job)
    ranking = s.scalar(sa.select(JobRound.ranking).where(JobRound.job_id == job.id,
                                                         JobRound.round == job.current_round))
    remote = agent_clients(job)
    clients = list(s.scalars(sa.select(JobClient).where(JobClient.job_id == job.id)
                             .order_by(JobClient.client_index)))
    locals_ = states.load_locals(s, job.id, [jc for jc in clients
                                             if jc.client_index not in remote])
    _finish(s, job, alg, states.load_global(job), clients, locals_, ranking)
    s.commit()


def planned_transmissions(alg: Algorithm, job_rounds: int, per_round: int, seed: int,
                          n_clients: int, global_msg: Message) -> dict[int, int]:
    """How often each client index will transmit at most (the budget check's plan):
    :func:`privacy.release.transmission_plan` for this algorithm's selection."""
    return privacy_release.transmission_plan(n_clients, job_rounds, per_round, seed,
                                             alg.select, global_msg)


def item_ids_bytes(ids: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(ids, dtype=np.int64), allow_pickle=False)
    return buf.getvalue()


def item_ids_from_bytes(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


