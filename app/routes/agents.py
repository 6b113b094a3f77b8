"""Tenant agents: the jobs a tenant takes part in from its own machine (``fedrec agent``).

Tenant-key authenticated under the tenant's own path (404 for any other tenant, and for a
job the tenant is not an agent of). The protocol and its refusals are described in
:mod:`app.training.agents`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from app.deps import UNPROCESSABLE, OwnTenantDep, ServingTenantDep, errors
from app.inputs import Input
from app.problems import ApiError
from app.routes import API_PREFIX
from app.schemas import MAX_DB_INT, PathId
from app.training import agents, pipeline
from app.training.forget import tombstones_after
from app.training.runner import dispatch_from_api

router = APIRouter(prefix=API_PREFIX, tags=["tenant: agent"], responses=errors(401, 404))
JOBS = "/tenants/{tenant_id}/agent/jobs"
MAX_UPLOAD_BYTES = 256 << 20
MAX_WAIT = 60.0


DECLINED = "declined by the tenant's agent"


class Decline(Input):
    reason: str = Field(min_length=1, max_length=2000)


class _Answer(BaseModel):
    """An answer of the agent protocol; fields a newer server adds pass through."""

    model_config = ConfigDict(extra="allow")


class AgentJob(_Answer):
    id: int
    status: str
    completed_rounds: int
    rounds: int


class AgentJobs(_Answer):
    data: list[AgentJob]


class AgentUploadSchema(_Answer):
    type: str = Field(description="The message class the upload must be.")
    arrays: dict[str, dict[str, Any]] = Field(description="name -> {shape, dtype}.")


class AgentManifest(_Answer):
    """Everything an agent needs to run its client step as a hosted tenant would."""

    protocol: int
    job_id: int
    algorithm: str
    config: dict[str, Any]
    privacy: dict[str, Any] = Field(description="The job's privacy settings, as stored.")
    privacy_preserving: bool
    seed: int
    rounds: int
    per_round: int
    n_clients: int
    client_index: int
    tenant_id: int
    test_fraction: float
    scale: list[float] = Field(description="[min, max] over the job's tenants.")
    tenant_scale: list[float]
    items: list[str] = Field(description="The item catalogue in column order.")
    titles: list[str | None]
    round_seconds: float
    wire: str
    upload: AgentUploadSchema | None
    phases: list[str]
    secure_aggregation: bool


class AgentRound(_Answer):
    """Where the job is for this agent."""

    job_id: int
    status: str
    completed_rounds: int
    rounds: int
    round: int | None
    selected: bool
    uploaded: bool
    deadline: float | None = Field(description="Unix time the open round closes.")
    phase: str = Field(description="upload, wait or closed.")


class AgentAccepted(_Answer):
    """An upload or decline staged (or replayed)."""

    round: int
    replayed: bool
    charged: list[Any] | None = Field(description="The event charged: [mechanism, z, count].")


class SecaggStatus(_Answer):
    round: int
    phase: str
    reason: str | None
    round_id: Any
    frac_bits: int
    posted: list[str]
    roster: Any
    inbox: Any
    request: Any


class SecaggAccepted(_Answer):
    round: int
    phase: str
    replayed: bool
    charged: Any


def _session(request: Request):
    return request.app.state.sessions()


_CODES = {404: "job_not_found", 409: "round_conflict", 422: "invalid_upload"}
_DROPPED = {409: "budget_exceeded", 422: "upload_out_of_bounds"}


def _refused(exc: agents.AgentRefused) -> HTTPException:
    """The refusal as a problem with a stable code (late and duplicate uploads by name)."""
    if isinstance(exc, agents.AgentDropped):
        return ApiError(exc.status, _DROPPED[exc.status], exc.detail)
    prefix = exc.detail.split(":", 1)[0]
    code = {"late": "late_upload", "duplicate": "duplicate_upload"}.get(
        prefix, _CODES.get(exc.status, "agent_refused"))
    return ApiError(exc.status, code, exc.detail)


def _accept(request: Request, job_id: int, round_: int, step, *args) -> dict[str, Any]:
    """``step(session, *args)`` (an agents.accept_*/decline) in one session, its refusal
    as a problem; when it completes the round, the round's aggregate is sent."""
    with _session(request) as s:
        try:
            out = step(s, *args)
        except agents.AgentDropped as exc:  # the round goes on without this tenant
            if exc.complete:
                dispatch_from_api(request.app, pipeline.TASK_AGGREGATE, job_id, round_)
            raise _refused(exc) from None
        except agents.AgentRefused as exc:
            raise _refused(exc) from None
    if out.pop("complete"):
        dispatch_from_api(request.app, pipeline.TASK_AGGREGATE, job_id, round_)
    return out


def _close_if_due(request: Request, job) -> None:
    """Past its deadline the open round's aggregate is sent (at most every 2 s per round
    and process: the task itself is idempotent)."""
    if not agents.deadline_passed(job):
        return
    sent = request.app.state.agent_closes
    key, now = (job.id, job.current_round + 1), time.monotonic()
    if now - sent.get(key, -1e9) < 2.0:
        return
    sent[key] = now
    dispatch_from_api(request.app, pipeline.TASK_AGGREGATE, job.id, job.current_round + 1)


@router.get(JOBS, response_model=AgentJobs)
def list_agent_jobs(tenant: OwnTenantDep, request: Request) -> dict[str, Any]:
    """The jobs this tenant takes part in as an agent, newest first."""
    with _session(request) as s:
        jobs = agents.enrolled_jobs(s, tenant.id)
        return {"data": [{"id": j.id, "status": j.status, "completed_rounds": j.current_round,
                          "rounds": j.rounds} for j in jobs]}


@router.get(JOBS + "/{job_id}", response_model=AgentManifest)
def read_manifest(tenant: OwnTenantDep, job_id: PathId, request: Request) -> dict[str, Any]:
    """The job's manifest: algorithm, config, privacy, seed, this tenant's client index,
    the scales and the item catalogue in column order (the columns of V)."""
    with _session(request) as s:
        try:
            job, client = agents.agent_job(s, job_id, tenant.id)
        except agents.AgentRefused as exc:
            raise _refused(exc) from None
        return agents.manifest(s, job, client)


POLL_SECONDS = 0.25
POLLED = {429: {"description": "Too many round requests of this tenant in progress "
                               "(FEDREC_MAX_AGENT_POLLS); see Retry-After."}}


async def _poll(request: Request, tenant_id: int, look, done, wait: float
                ) -> dict[str, Any]:
    """``look()`` (one short session in the threadpool) until ``done(status)`` or ``wait``
    seconds passed, holding one of the tenant's poll slots (429 beyond
    FEDREC_MAX_AGENT_POLLS) and no database connection between looks."""
    end = time.monotonic() + wait
    with request.app.state.agent_polls.slot(tenant_id):
        while True:
            status = await run_in_threadpool(look)
            if done(status) or time.monotonic() >= end:
                return status
            await asyncio.sleep(min(POLL_SECONDS, max(0.0, end - time.monotonic())))


@router.get(JOBS + "/{job_id}/round", response_model=AgentRound, responses=POLLED)
async def read_round(tenant: ServingTenantDep, job_id: PathId, request: Request,
                     wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description=(
                         "Long-poll: answer as soon as this tenant has something to do "
                         "or the job moved past round 'after', within this many seconds."))]
                     = 0.0,
                     after: Annotated[int, Query(ge=0, le=MAX_DB_INT)] = 0
                     ) -> dict[str, Any]:
    """The open round for this tenant: ``phase`` upload (selected: send before
    ``deadline``), wait, or closed (the job ended)."""

    def look() -> dict[str, Any]:
        with _session(request) as s:
            try:
                job, client = agents.agent_job(s, job_id, tenant.id)
            except agents.AgentRefused as exc:
                raise _refused(exc) from None
            _close_if_due(request, job)
            return agents.round_status(s, job, client)

    return await _poll(request, tenant.id, look, lambda status: (
        status["phase"] != "wait" or status["completed_rounds"] > after), wait)


@router.get(JOBS + "/{job_id}/global", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}},
                "description": "The global message's bytes."}})
def read_global(tenant: OwnTenantDep, job_id: PathId, request: Request) -> Response:
    """The current global message (input of round ``Fedrec-Round`` + 1), as message bytes."""
    with _session(request) as s:
        try:
            job, _ = agents.agent_job(s, job_id, tenant.id)
        except agents.AgentRefused as exc:
            raise _refused(exc) from None
        return Response(job.global_msg, media_type="application/octet-stream",
                        headers={"Fedrec-Round": str(job.current_round),
                                 "Fedrec-Status": job.status})


@router.put(JOBS + "/{job_id}/rounds/{round_}/upload", response_model=AgentAccepted, responses={
    **errors(409), **UNPROCESSABLE,
    413: {"description": "The upload is too large."}})
async def put_upload(tenant: OwnTenantDep, job_id: PathId, round_: PathId, request: Request,
                     fedrec_charge: Annotated[str | None, Header(min_length=1, description=(
                         "The event the agent charged its own ledger, JSON "
                         "[mechanism, z, count]; checked against the job's."))] = None
                     ) -> dict[str, Any]:
    """This tenant's privatised upload for round ``round_`` (message bytes). The identical
    bytes again are a replay (200, nothing charged twice); anything else for the same round
    is 409, and so is a late upload."""
    data = await request.body()
    if len(data) > MAX_UPLOAD_BYTES:
        raise HTTPException(413, f"upload is {len(data)} bytes; at most {MAX_UPLOAD_BYTES}")
    return await run_in_threadpool(_accept, request, job_id, round_, agents.accept_upload,
                                   job_id, tenant.id, round_, data, fedrec_charge)


@router.post(JOBS + "/{job_id}/rounds/{round_}/decline", response_model=AgentAccepted,
             responses={**errors(409), **UNPROCESSABLE})
def post_decline(tenant: OwnTenantDep, job_id: PathId, round_: PathId, request: Request,
                 body: Decline | None = None) -> dict[str, Any]:
    """This tenant will not transmit in round ``round_`` (its own ledger refused); the
    round does not wait for it and the job lists it in ``stopped_tenants``. The body's
    ``reason`` is optional."""
    return _accept(request, job_id, round_, agents.decline, job_id, tenant.id, round_,
                   body.reason if body else DECLINED)


@router.get(JOBS + "/{job_id}/rounds/{round_}/secagg", response_model=SecaggStatus,
            responses={**errors(409), **POLLED})
async def read_secagg(tenant: ServingTenantDep, job_id: PathId, round_: PathId,
                      request: Request,
                      wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description=(
                          "Long-poll: answer as soon as the open phase is not 'after', "
                          "within this many seconds."))] = 0.0,
                      after: Annotated[str | None, Query(max_length=16)] = None
                      ) -> dict[str, Any]:
    """Secure aggregation of round ``round_``: the open ``phase`` (keys, shares, masked,
    unmask, done or failed), the key roster, this tenant's share inbox and the unmask
    request once their phases closed, and the phases this tenant has posted."""

    def look() -> dict[str, Any]:
        with _session(request) as s:
            try:
                return agents.secagg_status(s, job_id, tenant.id, round_)
            except agents.AgentRefused as exc:
                raise _refused(exc) from None

    return await _poll(request, tenant.id, look, lambda status: status["phase"] != after,
                       wait)


@router.post(JOBS + "/{job_id}/rounds/{round_}/secagg/{phase}", response_model=SecaggAccepted,
             responses={**errors(409), **UNPROCESSABLE})
async def post_secagg(tenant: OwnTenantDep, job_id: PathId, round_: PathId, phase: str,
                      request: Request) -> dict[str, Any]:
    """This tenant's secure-aggregation message of ``phase`` for round ``round_``: JSON
    ``{"message": ..., "charge": [mechanism, z, count]}`` (the charge with the masked
    input only). The same message again is a replay (200); a different one, a closed phase
    or a round past its deadline is 409; a malformed one 422."""
    data = await request.body()
    if len(data) > MAX_UPLOAD_BYTES:
        raise HTTPException(413, f"message is {len(data)} bytes; at most {MAX_UPLOAD_BYTES}")
    try:
        body = json.loads(data)
        wire, reported = body["message"], body.get("charge")
    except (ValueError, TypeError, KeyError, AttributeError):
        wire, reported = agents.MALFORMED, None  # refused once the job and round are known
    return await run_in_threadpool(_accept, request, job_id, round_, agents.accept_secagg,
                                   job_id, tenant.id, round_, phase, wire, reported)


class ForgetRequest(_Answer):
    user: str
    version: int = Field(description="The tenant's ratings version of the request.")
    forgotten_at: str


class ForgetRequests(_Answer):
    data: list[ForgetRequest]
    last: int = Field(description="The newest version listed, or ``after`` when none: "
                                  "pass it as ``after`` next time.")


@router.get("/tenants/{tenant_id}/agent/forgotten", response_model=ForgetRequests)
def list_forgotten(tenant: OwnTenantDep, request: Request,
                   after: Annotated[int, Query(ge=-1, le=MAX_DB_INT, description=(
                       "the version of the last request applied"))] = -1
                   ) -> dict[str, Any]:
    """The users this tenant asked to forget (``DELETE .../users/{user}/ratings``) after
    version ``after``, oldest first: its agent forgets each on the tenant's machine and
    passes the last ``version`` as ``after`` next time (``last``: the newest listed, or
    ``after`` when none)."""
    with _session(request) as s:
        rows = tombstones_after(s, tenant.id, after)
        data = [{"user": t.user_key, "version": t.version,
                 "forgotten_at": t.forgotten_at.isoformat()} for t in rows]
    return {"data": data, "last": data[-1]["version"] if data else after}
