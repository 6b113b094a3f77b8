"""The coordinator's side of tenant agents: manifest, round status, uploads and declines.

An *agent tenant* of a job keeps its ratings, its local state U_i and its own privacy
ledger on its own machine and runs its client step in ``fedrec agent`` (package
:mod:`agent`). It takes part in the same round state machine as a hosted tenant
(:mod:`app.training.pipeline`): ``start_round`` opens round k (sending hosted tenants'
client steps to the workers and giving the round a deadline); an agent selected in round k
downloads the global message, runs its step, privatises and charges its own ledger, and
PUTs the upload, which is staged here exactly as a hosted client step stages its own
(:class:`RoundUpload`, with the charge in :class:`LedgerEntry` in the same transaction);
the round's ``aggregate`` runs when every selected tenant staged something (quorum) or,
for the agents still missing, once the deadline passed (they sit the round out).

Round phases (what :func:`round_status` reports as ``phase``): ``wait`` (nothing for this
tenant: not started, not selected, or already sent), ``upload`` (selected, send before
``deadline``), ``closed`` (the job ended). With secure aggregation (every tenant an agent)
the ``upload`` phase is carried out as four messages, keys, shares, masked input and
unmasking (:mod:`app.training.secure`, :func:`accept_secagg`), each through the same
staging, deadline and idempotency rules; no upload is ever sent.

Refusals (4xx, nothing changes): the round is not the open one, or is past its deadline
(409, "late"); the tenant is not selected (409); a different upload for the same round
(409, "duplicate"); an upload that is not a message of the job's upload type and shape, or
not finite (422); a reported charge that is not the job's (422). The identical upload sent
again is accepted once (200, ``replayed``): an agent retries safely after a crash.

Privacy: the coordinator records each agent upload's charge (the event the job's privacy
settings imply, cross-checked against the one the agent reports) in the job's ledger view,
so reports and budgets see it; the agent's own ledger is the one that refuses. User-level
jobs with agents must use placement ``tenant`` (refused at creation otherwise): with
``central`` an agent would have to send its un-noised bounded sum, which the coordinator
could read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from algorithms import Message, registry
from algorithms.messages import MessageRefused, messages_equal, read_expected
from app.models import Item, Tenant
from app.training import pipeline, secure
from app.training.ledger import charge_received
from app.training.models import RoundUpload, TrainingJob
from privacy import user_level
from privacy.accountant import Event
from privacy.release import expected_event, release_of
from privacy.wrapper import DPSpec, bound_problem, n_entries

PROTOCOL = 1
PHASES = ("upload",)
#: phases of an upload under secure aggregation (:mod:`app.training.secure`)
SECAGG_PHASES = secure.PHASES


class AgentRefused(Exception):
    """An agent request that changes nothing; ``status`` is the HTTP answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def enrolled_jobs(s: Session, tenant_id: int) -> list[TrainingJob]:
    """Jobs in which the tenant is an agent, newest first."""
    jobs = s.scalars(sa.select(TrainingJob).where(TrainingJob.agents.is_not(None))
                     .order_by(TrainingJob.id.desc())).all()
    return [j for j in jobs if tenant_id in (j.agents or {}).get("tenants", [])]


def agent_job(s: Session, job_id: int, tenant_id: int, lock: bool = False
              ) -> tuple[TrainingJob, int]:
    """(job, the tenant's client index); 404 unless the tenant is one of its agents."""
    q = sa.select(TrainingJob).where(TrainingJob.id == job_id)
    job = s.scalar(q.with_for_update(read=True) if lock else q)
    if job is None or tenant_id not in (job.agents or {}).get("tenants", []):
        raise AgentRefused(404, "Training job not found")
    return job, job.tenant_ids.index(tenant_id)


def manifest(s: Session, job: TrainingJob, client: int) -> dict[str, Any]:
    """Everything an agent needs to run its client step as a hosted tenant would."""
    tenants = {t.id: t for t in s.scalars(sa.select(Tenant)
                                          .where(Tenant.id.in_(job.tenant_ids)))}
    own = tenants[job.tenant_ids[client]]
    ids = pipeline.item_ids_from_bytes(job.item_ids)
    rows = s.execute(sa.select(Item.id, Item.key, Item.title)
                     .where(Item.id.in_(ids.tolist()))).all()
    keys = {i: k for i, k, _ in rows}
    titles = {i: t for i, _, t in rows}
    return {"protocol": PROTOCOL, "job_id": job.id, "algorithm": job.algorithm,
            "config": job.config, "privacy": job.dp,
            "privacy_preserving": registry.get(job.algorithm).privacy_preserving,
            "seed": job.seed, "rounds": job.rounds, "per_round": job.per_round,
            "n_clients": len(job.tenant_ids), "client_index": client,
            "tenant_id": own.id, "test_fraction": job.test_fraction,
            "scale": [min(t.rating_min for t in tenants.values()),
                      max(t.rating_max for t in tenants.values())],
            "tenant_scale": [own.rating_min, own.rating_max],
            "items": [keys[i] for i in ids.tolist()],
            "titles": [titles[i] for i in ids.tolist()],
            "round_seconds": job.agents["round_seconds"], "wire": job.agents["wire"],
            "upload": job.agents["upload"], "phases": list(PHASES),
            "secure_aggregation": secure.enabled(job)}


_SELECTED: dict[tuple[int, int, int, str], list[int]] = {}


def _selected(job: TrainingJob, round_: int) -> list[int]:
    """S_k of the open round, cached per process: it is drawn from the global message of
    round k - 1, which never changes once committed (the key holds the job's creation
    time, so a cache never confuses two databases' jobs with the same id)."""
    key = (job.id, round_, job.current_round, str(job.created_at))
    out = _SELECTED.get(key)
    if out is None:
        out = pipeline._selected(job, registry.get(job.algorithm), round_)
        if len(_SELECTED) > 4096:
            _SELECTED.clear()
        _SELECTED[key] = out
    return out


def round_status(s: Session, job: TrainingJob, client: int) -> dict[str, Any]:
    """Where the job is for this agent: the open round, whether it must upload, by when."""
    done = job.current_round
    out: dict[str, Any] = {"job_id": job.id, "status": job.status, "completed_rounds": done,
                           "rounds": job.rounds, "round": None, "selected": False,
                           "uploaded": False, "deadline": None, "phase": "wait"}
    if job.status not in ("queued", "running"):
        out["phase"] = "closed"
        return out
    k = done + 1
    deadline = pipeline.round_deadline(job, k)
    out["round"], out["deadline"] = k, deadline
    if deadline is None:
        return out  # not started yet
    out["selected"] = client in _selected(job, k)
    # One statement reads the job's round with the upload row: read separately, an
    # aggregate committing between the two reads (it deletes the round's uploads and moves
    # the round on) would make an uploaded round look open, and the agent would release
    # it a second time (read committed, as PostgreSQL and SQLite both give here).
    moved_on, uploaded = s.execute(sa.select(
        TrainingJob.current_round != done,
        sa.exists().where(RoundUpload.job_id == job.id, RoundUpload.round == k,
                          RoundUpload.client_index == client))
        .where(TrainingJob.id == job.id)).one()
    if moved_on:
        return out  # the round closed meanwhile: wait (the next look sees the new one)
    out["uploaded"] = bool(uploaded)
    if out["selected"] and not out["uploaded"] and time.time() < deadline:
        out["phase"] = "upload"
    return out


def deadline_passed(job: TrainingJob) -> bool:
    """The open round waits for agents past its deadline (its aggregate is due)."""
    deadline = pipeline.round_deadline(job, job.current_round + 1)
    return (job.status in ("queued", "running") and deadline is not None
            and time.time() >= deadline)


def _open_round(s: Session, job: TrainingJob, client: int, round_: int) -> None:
    """409 unless ``round_`` is open, this tenant is selected in it and before its deadline."""
    if job.status not in ("queued", "running"):
        raise AgentRefused(409, f"job {job.id} is {job.status}: round {round_} is closed")
    if round_ <= job.current_round:
        raise AgentRefused(409, f"late: round {round_} is closed (job {job.id} has "
                                f"completed {job.current_round} rounds)")
    deadline = pipeline.round_deadline(job, round_)
    if round_ > job.current_round + 1 or round_ > job.rounds or deadline is None:
        raise AgentRefused(409, f"round {round_} has not started (job {job.id} has completed "
                                f"{job.current_round} rounds)")
    if client not in _selected(job, round_):
        raise AgentRefused(409, f"tenant {job.tenant_ids[client]} is not selected in round "
                                f"{round_}")
    if time.time() >= deadline:
        raise AgentRefused(409, f"late: round {round_}'s deadline passed "
                                f"{time.time() - deadline:.1f} s ago; it closes without "
                                f"tenant {job.tenant_ids[client]}")


def parse_upload(job: TrainingJob, data: bytes) -> Message:
    """The upload as the job's message type with float64 arrays; 422 naming what is wrong.

    Names, shapes and dtypes are checked against the job's upload schema from the
    archive's headers before any array is inflated, and each array is read up to the size
    its schema allows (:func:`algorithms.messages.read_expected`): a compressed body
    cannot make the coordinator allocate more than one expected upload. Every scalar field
    must be one the message declares, of the type the job's own round 1 produced, and
    finite (:func:`_checked_scalars`)."""
    schema = job.agents.get("upload")
    if schema is None:
        raise AgentRefused(422, f"job {job.id}'s algorithm sends no uploads")
    wire = {"float64"} if job.agents.get("wire") == "float64" else {"float64", "float32"}
    want = {name: (w["shape"], {w["dtype"]} | (wire if w["dtype"] == "float64" else set()))
            for name, w in schema["arrays"].items()}
    try:
        cls, scalars, arrays = read_expected(data, schema["type"], want)
    except MessageRefused as exc:
        where = "upload" if exc.field is None else f"upload.{exc.field}"
        raise AgentRefused(422, f"{where} {exc.problem}") from None
    cast = {}
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise AgentRefused(422, f"upload.{name} has non-finite values")
        cast[name] = a.astype(schema["arrays"][name]["dtype"])
    try:
        return cls(**cast, **_checked_scalars(cls, schema, scalars))
    except TypeError as exc:
        raise AgentRefused(422, f"upload is not a {schema['type']} ({exc})") from None


def _checked_scalars(cls: type[Message], schema: dict[str, Any], got: dict[str, Any]
                     ) -> dict[str, Any]:
    """The upload's scalar fields: exactly the message's non-array fields, each of the
    JSON type the job's round 1 gave it (a job stored before the schema kept them: any
    scalar type) and finite; 422 naming the first that is not."""
    names = {f.name for f in dataclasses.fields(cls)} - set(schema["arrays"])
    if set(got) != names:
        raise AgentRefused(422, f"upload has scalar fields {sorted(got)}; expected "
                                f"{sorted(names)}")
    expected = schema.get("scalars", {})
    for name, value in got.items():
        kinds = _SCALAR_KINDS.get(type(expected.get(name, value)), ())
        if type(value) not in kinds:
            raise AgentRefused(422, f"upload.{name} is {value!r}; expected a "
                                    f"{type(expected.get(name, value)).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise AgentRefused(422, f"upload.{name} is {value!r}; expected a finite number")
    return got


#: the JSON types a scalar field may arrive as, by the type round 1 gave it
_SCALAR_KINDS = {float: (float, int), int: (int,), bool: (bool,), str: (str,),
                 type(None): (type(None),)}


def expected_charge(s: Session, job: TrainingJob, tenant_id: int, upload: Message | None
                    ) -> Event:
    """The event the job's privacy settings charge this transmission, as a hosted tenant's
    would be charged: :func:`privacy.release.expected_event` of the tenant's next release
    (``upload``: its size, for the tenant unit; None under secure aggregation)."""
    kind = release_of(job.dp)
    index = pipeline._job_releases(s, job.id, tenant_id) if kind.user_level else 0
    event = expected_event(job.dp, index, 0 if upload is None else n_entries(upload),
                           registry.get(job.algorithm).privacy_preserving)
    if event is None:  # a stored job always has privacy settings
        raise AgentRefused(409, f"job {job.id} has no privacy settings to charge by")
    return event


def same_reported(reported: Any, event: Event) -> bool:
    """Whether the charge an agent reports (JSON [mechanism, z, count]) is ``event``."""
    try:
        return _same_event(Event.from_list(reported), event)
    except (TypeError, ValueError, IndexError):
        return False


def _same_event(a: Event, b: Event) -> bool:
    return (a.mechanism == b.mechanism and a.count == b.count
            and math.isclose(a.noise_multiplier, b.noise_multiplier, rel_tol=1e-9)
            and math.isclose(a.sample_rate, b.sample_rate, rel_tol=1e-9))


def accept_upload(s: Session, job_id: int, tenant_id: int, round_: int, data: bytes,
                  reported: str | None) -> dict[str, Any]:
    """Stage an agent's upload for round ``round_`` with its charge (``reported``: the
    agent's ``Fedrec-Charge`` header, JSON, checked once the job and round are known), in
    one transaction.

    Returns ``{"round", "replayed", "charged", "complete"}``; ``complete`` means the round
    has every selected tenant's result and its aggregate must be sent. Raises
    :class:`AgentRefused` (nothing written) for a late, duplicate or malformed upload, and
    :class:`AgentDropped` (the tenant staged as sitting the round out) for an upload the
    tenant's budget cannot pay for or whose values are outside the job's bound.
    """
    job, client = agent_job(s, job_id, tenant_id, lock=True)
    _open_round(s, job, client, round_)
    if data and secure.enabled(job):
        raise AgentRefused(409, f"job {job_id} uses secure aggregation: send the round's "
                                "keys, shares, masked input and unmasking instead of an "
                                "upload")
    if not data:  # nothing to send this round (e.g. DPALS after its sweeps)
        return _stage_nothing(s, job, client, round_, None)
    upload = parse_upload(job, data)
    prior = s.get(RoundUpload, (job_id, round_, client))
    if prior is not None:
        return _replay(s, job, client, round_, prior, upload)
    event = expected_charge(s, job, tenant_id, upload)
    _check_reported(job, reported, event)
    _check_noise_fields(s, job, tenant_id, upload)
    problem = _bound_problem(s, job, tenant_id, upload)
    refused = charge_received(s, job.id, tenant_id, round_, event, job.dp,
                              None if problem is None else f"refused: upload {problem}")
    if refused is not None:  # its data is discarded unread; nothing was charged
        _drop(s, job, client, round_, f"refused: {refused}", None)
    if problem is not None:  # charged (it was released), never used
        _drop(s, job, client, round_, f"refused: upload {problem}", event)
    s.add(RoundUpload(job_id=job_id, round=round_, client_index=client,
                      upload=upload.to_bytes(), refused=None))
    try:
        s.commit()
    except IntegrityError:  # the same upload raced in first
        s.rollback()
        job, client = agent_job(s, job_id, tenant_id)
        prior = s.get(RoundUpload, (job_id, round_, client))
        if prior is None:
            raise
        return _replay(s, job, client, round_, prior, upload)
    return {"round": round_, "replayed": False, "charged": event.as_list(),
            "complete": _complete(s, job, round_)}


class AgentDropped(AgentRefused):
    """The upload was refused and the tenant sits the round out (staged as refused, so the
    round completes for the others); ``complete``: the round's aggregate is now due."""

    def __init__(self, status: int, detail: str, complete: bool) -> None:
        super().__init__(status, detail)
        self.complete = complete


def _check_reported(job: TrainingJob, reported: str | None, event: Event) -> None:
    """422 unless the agent's ``Fedrec-Charge`` (when sent) is the job's ``event``."""
    if reported is None:
        return
    try:
        theirs = Event.from_list(json.loads(reported))
    except (TypeError, ValueError, IndexError) as exc:
        raise AgentRefused(422, f"Fedrec-Charge is not an event [mechanism, z, count]: "
                                f"{exc}") from None
    if not _same_event(theirs, event):
        raise AgentRefused(422, f"Fedrec-Charge {theirs.as_list()} is not what job "
                                f"{job.id} charges this upload ({event.as_list()})")


def _check_noise_fields(s: Session, job: TrainingJob, tenant_id: int, upload: Message
                        ) -> None:
    """422 unless a user-level upload states the noise the job adds to this release: the
    server step weighs the sums by these fields, so a wrong one (NaN, or noise that was
    never added) would poison the model."""
    if not user_level.is_user_level(job.dp):
        return
    spec, bounds = _user_bounds(job)
    index = pipeline._job_releases(s, job.id, tenant_id)
    for name, std in user_level.release_stds(spec, bounds, index).items():
        field = bounds.noise_fields[name]
        got = getattr(upload, field)
        if not math.isclose(got, std, rel_tol=1e-9):
            raise AgentRefused(422, f"upload.{field} is {got!r}; job {job.id} adds noise of "
                                    f"standard deviation {std!r} to {name} in this release")


def _bound_problem(s: Session, job: TrainingJob, tenant_id: int, upload: Message
                   ) -> str | None:
    """Why an upload's values lie outside what the job's bounds plus its noise allow:
    the clip of a tenant-unit job (:func:`privacy.wrapper.bound_problem`), the per-user
    bounds of a user-level one (:func:`privacy.user_level.bound_problem`); None when
    they do not, or the job declares no bound."""
    if user_level.is_user_level(job.dp):
        spec, bounds = _user_bounds(job)
        index = pipeline._job_releases(s, job.id, tenant_id)
        return user_level.bound_problem(upload, bounds,
                                        user_level.release_stds(spec, bounds, index))
    if not registry.get(job.algorithm).privacy_preserving:
        return None
    return bound_problem(upload, DPSpec(**job.dp))


def _user_bounds(job: TrainingJob):
    """(spec, bounds) of a user-level job."""
    alg = registry.get(job.algorithm)
    return (user_level.from_settings(job.dp),
            registry.user_bounds(job.algorithm, alg.config(**job.config)))


def _drop(s: Session, job: TrainingJob, client: int, round_: int, reason: str,
          charged: Event | None) -> None:
    """Stage the tenant as sitting round ``round_`` out (``reason``), commit (with the
    charge already added, if any), and raise :class:`AgentDropped` stating both."""
    tenant_id = job.tenant_ids[client]
    s.add(RoundUpload(job_id=job.id, round=round_, client_index=client, upload=None,
                      refused=reason[:2000]))
    s.commit()
    status = 409 if charged is None else 422
    charge = ("nothing was charged" if charged is None else
              f"its charge {charged.as_list()} stands (the release was sent)")
    raise AgentDropped(status, f"upload {reason.removeprefix('refused: ')}; tenant "
                               f"{tenant_id} sits out round {round_} and {charge}",
                       _complete(s, job, round_))


def _replay(s: Session, job: TrainingJob, client: int, round_: int, prior: RoundUpload,
            upload: Message | None) -> dict[str, Any]:
    same = (upload is None and prior.upload is None) or (
        upload is not None and prior.upload is not None
        and messages_equal(upload, Message.from_bytes(prior.upload)))
    if not same:
        what = "a decline" if prior.upload is None else "an upload"
        raise AgentRefused(409, f"duplicate: tenant {job.tenant_ids[client]} already sent "
                                f"{what} for round {round_}, different from this one")
    s.rollback()
    return {"round": round_, "replayed": True, "charged": None,
            "complete": _complete(s, job, round_)}


def _complete(s: Session, job: TrainingJob, round_: int) -> bool:
    """Every tenant selected in the round staged its result."""
    staged = s.scalar(sa.select(sa.func.count()).select_from(RoundUpload).where(
        RoundUpload.job_id == job.id, RoundUpload.round == round_))
    return staged >= len(_selected(job, round_))


def decline(s: Session, job_id: int, tenant_id: int, round_: int, reason: str
            ) -> dict[str, Any]:
    """The agent will not transmit in this round (its own budget refused): staged as a
    hosted tenant's refusal is, so the round does not wait for it and the job reports it
    in ``stopped_tenants``."""
    job, client = agent_job(s, job_id, tenant_id, lock=True)
    _open_round(s, job, client, round_)
    return _stage_nothing(s, job, client, round_, f"declined by its agent: {reason}"[:2000])


def _stage_nothing(s: Session, job: TrainingJob, client: int, round_: int,
                   refused: str | None) -> dict[str, Any]:
    """Stage "no upload" for the round: a decline (``refused``) or nothing to send."""
    job_id, tenant_id = job.id, job.tenant_ids[client]
    prior = s.get(RoundUpload, (job_id, round_, client))
    if prior is not None:
        return _replay(s, job, client, round_, prior, None)
    s.add(RoundUpload(job_id=job_id, round=round_, client_index=client,
                      upload=None, refused=refused))
    try:
        s.commit()
    except IntegrityError:
        s.rollback()
        job, client = agent_job(s, job_id, tenant_id)
        return _replay(s, job, client, round_, s.get(RoundUpload, (job_id, round_, client)),
                       None)
    return {"round": round_, "replayed": False, "charged": None,
            "complete": _complete(s, job, round_)}


#: a secure-aggregation body that is not JSON {"message", "charge"?}
MALFORMED = object()


def secagg_status(s: Session, job_id: int, tenant_id: int, round_: int) -> dict[str, Any]:
    """The secure-aggregation phase of round ``round_`` for this agent
    (:func:`app.training.secure.status`); 409 unless the round is open and it is selected."""
    job, client = agent_job(s, job_id, tenant_id)
    if not secure.enabled(job):
        raise AgentRefused(409, f"job {job_id} does not use secure aggregation")
    _open_round(s, job, client, round_)
    return secure.status(s, job, client, round_, _selected(job, round_))


def accept_secagg(s: Session, job_id: int, tenant_id: int, round_: int, phase: str,
                  wire: Any, reported: list | None) -> dict[str, Any]:
    """Stage an agent's secure-aggregation message (:func:`app.training.secure.accept`) under
    the upload's rules: the round must be open, the tenant selected, before the deadline.
    ``complete``: every selected tenant finished the round (its aggregate is due)."""
    job, client = agent_job(s, job_id, tenant_id, lock=True)
    if not secure.enabled(job):
        raise AgentRefused(409, f"job {job_id} does not use secure aggregation")
    _open_round(s, job, client, round_)
    if wire is MALFORMED:
        raise AgentRefused(422, 'the body must be JSON {"message": ..., "charge"?: [...]}')
    try:
        out = secure.accept(s, job, client, round_, phase, wire, reported,
                            _selected(job, round_))
    except secure.Refused as exc:
        s.rollback()
        raise AgentRefused(exc.status, exc.detail) from None
    out["complete"] = bool(out.pop("staged")) and _complete(s, job, round_)
    return out
