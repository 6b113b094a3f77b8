"""Secure aggregation between a job's agents over HTTP: the coordinator's side.

A user-level job with placement ``tenant`` and ``secure_aggregation`` (every tenant an
agent) runs each round's release through the protocol of :mod:`privacy.secagg`
(Bonawitz et al., *Practical Secure Aggregation for Privacy-Preserving Machine Learning*,
CCS 2017) with the distributed discrete Gaussian of :mod:`privacy.distributed`:

``keys`` (each selected agent advertises its public keys) -> ``shares`` (each member of
the roster U1 sends its encrypted Shamir shares) -> ``masked`` (each member of U2 sends its
noised, quantised and masked upload, after charging its own ledger; the coordinator records
the same charge in its ledger view) -> ``unmask`` (each survivor of U3 answers the unmask
request). Each message is staged per (job, round, tenant, phase) in
:class:`SecAggMessage` with the rules of an upload (:func:`app.training.agents.accept_upload`):
the same bytes again are a replay (200), different ones 409 (duplicate), a message for a
phase that closed or a round past its deadline 409 (late), a malformed one 422.

What an agent reads between phases is a pure function of the stored messages and the
clock (:func:`view`): a phase closes when every tenant expected in it posted, or at its own
cut-off (the round's window split in four equal parts); those who had not posted by then
are the round's dropouts, tolerated up to ``dropout_tolerance``. The answer to ``unmask``
stages the tenant's (empty) round result, so the round completes as usual; the aggregate
step then unmasks the sum (:func:`secure_sum`), decodes it into the upload the server step
receives under :data:`algorithms.simulate.AGGREGATE`, exactly as
:class:`privacy.distributed.SecureAggregationPrivatizer` feeds ``fedrec simulate``.

The coordinator stores and sees the advertised public keys, the AEAD ciphertexts of the
shares, the masked inputs (uniform-looking mod 2^64), the unmasking shares (of each
survivor's self-mask seed and of each dropout's mask key, never both for one tenant) and
the unmasked noisy sum; no tenant's upload, noised or not.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from algorithms import Message, registry
from algorithms.simulate import AGGREGATE
from app.training import pipeline
from app.training.ledger import charge_received
from app.training.models import RoundUpload, SecAggMessage, TrainingJob
from privacy import distributed, secagg, user_level
from privacy.release import Release, release_of

PHASES = ("keys", "shares", "masked", "unmask")
TYPES = {"keys": secagg.AdvertiseKeys, "shares": secagg.ShareKeys,
         "masked": secagg.MaskedInput, "unmask": secagg.UnmaskResponse}
#: fixed-point code of the uploads (agents and coordinator agree on it by this constant)
FIXED_POINT = secagg.FixedPoint()


class Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def enabled(job: TrainingJob | dict[str, Any]) -> bool:
    dp = job.dp if isinstance(job, TrainingJob) else job
    return bool(dp) and release_of(dp) is Release.USER_SECURE


def round_id(job: TrainingJob, round_: int) -> bytes:
    """Binds every key, share and mask to this job's round (and to this database's job)."""
    return f"fedrec-job:{job.id}:{job.created_at}:{int(round_)}".encode()


def template(job: TrainingJob) -> Message:
    """A zero upload of the job's upload type and shapes (what the sum is decoded into)."""
    schema = job.agents["upload"]
    module, _, name = schema["type"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**{k: np.zeros(v["shape"], dtype=v["dtype"])
                  for k, v in schema["arrays"].items()})


def bounds_of(job: TrainingJob):
    alg = registry.get(job.algorithm)
    return registry.user_bounds(alg.name, alg.config(**job.config))


def vector_length(job: TrainingJob) -> int:
    return int(distributed.pack(template(job), bounds_of(job)).size)


def _canonical(wire: Any) -> str:
    return json.dumps(wire, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass
class View:
    """The round's protocol as the stored messages and the clock make it."""

    phase: str  # the open phase, "done" (every phase closed) or "failed"
    messages: dict[str, dict[int, Any]]
    roster: secagg.KeyRoster | None = None
    inboxes: dict[int, secagg.ShareInbox] | None = None
    request: secagg.UnmaskRequest | None = None
    reason: str | None = None

    def expected(self, phase: str, selected: Sequence[int]) -> set[int]:
        """Who may post ``phase``: the selected, U1, U2 or U3."""
        if phase == "keys":
            return set(selected)
        if phase == "shares":
            return set(self.roster.members) if self.roster else set()
        if phase == "masked":
            return set(self.inboxes or ())
        return set(self.request.survivors) if self.request else set()


def cut_off(job: TrainingJob, round_: int, phase: str) -> float:
    """When ``phase`` closes whoever is missing: the round's window split in four."""
    deadline = pipeline.round_deadline(job, round_)
    if deadline is None:
        return math.inf
    seconds = job.agents["round_seconds"]
    return deadline - seconds + (PHASES.index(phase) + 1) * seconds / len(PHASES)


def load_messages(s: Session, job_id: int, round_: int, masked: bool = False
                  ) -> dict[str, dict[int, Any]]:
    """The round's messages by phase and client; the masked inputs (the largest, needed by
    the sum only) as None unless ``masked``."""
    out: dict[str, dict[int, Any]] = {p: {} for p in PHASES}
    for c, p in s.execute(sa.select(SecAggMessage.client_index, SecAggMessage.phase)
                          .where(SecAggMessage.job_id == job_id, SecAggMessage.round == round_,
                                 SecAggMessage.phase == "masked")):
        out[p][c] = None
    phases = PHASES if masked else tuple(p for p in PHASES if p != "masked")
    for c, p, body in s.execute(sa.select(SecAggMessage.client_index, SecAggMessage.phase,
                                          SecAggMessage.body)
                                .where(SecAggMessage.job_id == job_id,
                                       SecAggMessage.round == round_,
                                       SecAggMessage.phase.in_(phases))):
        out[p][c] = secagg.from_wire(json.loads(body))
    return out


def view(s: Session, job: TrainingJob, round_: int, selected: Sequence[int],
         now: float | None = None, masked: bool = False) -> View:
    """The open phase and what the closed ones produced (roster, inboxes, request); the
    masked inputs themselves only with ``masked``."""
    now = time.time() if now is None else now
    v = View("keys", load_messages(s, job.id, round_, masked))

    def closed(phase: str) -> bool:
        return v.expected(phase, selected) <= set(v.messages[phase]) or (
            now >= cut_off(job, round_, phase))

    tolerance = job.dp.get("dropout_tolerance", secagg.DEFAULT_DROPOUT_TOLERANCE)
    try:
        if not closed("keys"):
            return v
        v.roster = secagg.make_roster(v.messages["keys"].values(), round_id(job, round_),
                                      vector_length(job), tolerance)
        v.phase = "shares"
        if not closed("shares"):
            return v
        v.inboxes = secagg.route_shares(v.roster, v.messages["shares"].values())
        v.phase = "masked"
        if not closed("masked"):
            return v
        masked = {c: m for c, m in v.messages["masked"].items() if c in v.inboxes}
        v.request = secagg.unmask_request(v.roster, tuple(sorted(v.inboxes)), masked)
        v.phase = "unmask"
        if not closed("unmask"):
            return v
        v.phase = "done"
    except secagg.TooManyDropouts as exc:
        v.phase, v.reason = "failed", str(exc)
    return v


def status(s: Session, job: TrainingJob, client: int, round_: int,
           selected: Sequence[int]) -> dict[str, Any]:
    """What an agent needs for its next message: the open phase, the roster, its own inbox,
    the unmask request (each once its phase closed), and what it has posted."""
    v = view(s, job, round_, selected)
    out: dict[str, Any] = {
        "round": round_, "phase": v.phase, "reason": v.reason,
        "round_id": secagg.to_wire(round_id(job, round_)),
        "frac_bits": FIXED_POINT.frac_bits,
        "posted": [p for p in PHASES if client in v.messages[p]],
        "roster": None if v.roster is None else secagg.to_wire(v.roster),
        "inbox": None, "request": None}
    if v.inboxes is not None and client in v.inboxes:
        out["inbox"] = secagg.to_wire(v.inboxes[client])
    if v.request is not None and client in v.request.survivors:
        out["request"] = secagg.to_wire(v.request)
    return out


def _check(phase: str, msg: Any, client: int, v: View) -> None:
    """422 unless ``msg`` is a well-formed message of ``phase`` from ``client``."""
    if not isinstance(msg, TYPES[phase]) or msg.sender != client:
        raise Refused(422, f"a {phase} message must be a {TYPES[phase].__name__} sent by "
                           f"client {client}")
    if phase == "keys":
        if len(msg.channel_pk) != 32 or len(msg.mask_pk) != 32:
            raise Refused(422, "keys: public keys are 32-byte X25519 keys")
    elif phase == "shares":
        to = sorted(e.recipient for e in msg.shares)
        if (to != sorted(set(v.roster.members) - {client})
                or any(e.sender != client for e in msg.shares)):
            raise Refused(422, "shares: one encrypted share for every other member of the "
                               f"roster {list(v.roster.members)}")
    elif phase == "masked":
        y = msg.y
        if not isinstance(y, np.ndarray) or y.dtype != np.uint64 or y.shape != (
                v.roster.length,):
            raise Refused(422, f"masked: y must be {v.roster.length} uint64 values")
    else:
        if (set(msg.self_mask_shares) != set(v.request.survivors)
                or set(msg.mask_key_shares) != set(v.request.dropped)
                or any(np.shape(a) != (secagg.LIMBS,) for a in
                       [*msg.self_mask_shares.values(), *msg.mask_key_shares.values()])):
            raise Refused(422, "unmask: one share of each survivor's seed and of each "
                               "dropped tenant's key, as the request says")


def accept(s: Session, job: TrainingJob, client: int, round_: int, phase: str,
           wire: Any, reported: list | None, selected: Sequence[int]) -> dict[str, Any]:
    """Stage ``client``'s message of ``phase`` (the caller holds the job's row lock and
    checked the round is open and the client selected). Returns ``{"round", "phase",
    "replayed", "charged", "staged"}``; ``staged``: the round result was staged (unmask)."""
    from app.training import agents  # the upload rules (one copy of them)

    if phase not in PHASES:
        raise Refused(404, f"no phase {phase!r}; phases are {', '.join(PHASES)}")
    body = _canonical(wire)
    prior = s.get(SecAggMessage, (job.id, round_, client, phase))
    if prior is not None:
        if prior.body != body:
            raise Refused(409, f"duplicate: tenant {job.tenant_ids[client]} already sent a "
                               f"different {phase} message for round {round_}")
        s.rollback()
        return {"round": round_, "phase": phase, "replayed": True, "charged": None,
                "staged": False}
    v = view(s, job, round_, selected)
    if v.phase != phase:
        if v.phase in ("done", "failed") or PHASES.index(phase) < PHASES.index(v.phase):
            why = f" ({v.reason})" if v.reason else ""
            raise Refused(409, f"late: the {phase} phase of round {round_} is closed{why}")
        raise Refused(409, f"the {phase} phase of round {round_} is not open yet (open: "
                           f"{v.phase})")
    if client not in v.expected(phase, selected):
        raise Refused(409, f"late: tenant {job.tenant_ids[client]} is not among the round's "
                           f"{phase} participants (it missed an earlier phase)")
    try:
        msg = secagg.from_wire(wire)
    except secagg.SecAggError as exc:
        raise Refused(422, str(exc)) from None
    _check(phase, msg, client, v)
    tenant_id, charged = job.tenant_ids[client], None
    s.add(SecAggMessage(job_id=job.id, round=round_, client_index=client, phase=phase,
                        body=body))
    if phase == "masked":  # the noisy release: the agent charged its ledger before sending
        event = agents.expected_charge(s, job, tenant_id, None)
        if reported is not None and not agents.same_reported(reported, event):
            raise Refused(422, f"charge {reported} is not what job {job.id} charges this "
                               f"release ({event.as_list()})")
        why = charge_received(s, job.id, tenant_id, round_, event, job.dp)
        if why is not None:  # never unmasked: the tenant drops out of the round
            raise Refused(409, f"budget exceeded: tenant {tenant_id}'s masked input is "
                               f"refused ({why})")
        charged = event.as_list()
    if phase == "unmask":  # the tenant's part of the round is done
        s.add(RoundUpload(job_id=job.id, round=round_, client_index=client,
                          upload=None, refused=None))
    try:
        s.commit()
    except IntegrityError:  # the same message raced in first
        s.rollback()
        prior = s.get(SecAggMessage, (job.id, round_, client, phase))
        if prior is None or prior.body != body:
            raise Refused(409, f"duplicate: tenant {tenant_id} already sent a different "
                               f"{phase} message for round {round_}") from None
        return {"round": round_, "phase": phase, "replayed": True, "charged": None,
                "staged": False}
    return {"round": round_, "phase": phase, "replayed": False, "charged": charged,
            "staged": phase == "unmask"}


def secure_sum(s: Session, job: TrainingJob, round_: int, selected: Sequence[int]
               ) -> tuple[dict[int, Message], list[int]]:
    """What the server step receives: ``{AGGREGATE: decoded noisy sum}`` over the survivors
    (or nothing when the protocol could not complete), and the survivors."""
    v = view(s, job, round_, selected, now=math.inf, masked=True)
    if v.request is None:
        return {}, []
    try:
        total = secagg.aggregate(v.roster, v.request, v.messages["masked"],
                                 v.messages["unmask"].values())
    except secagg.TooManyDropouts:
        return {}, []
    survivors = list(v.request.survivors)
    spec, bounds, tmpl = user_level.from_settings(job.dp), bounds_of(job), template(job)
    # release index of this round = releases charged before it (the agents use the same)
    index = max(0, pipeline._job_releases(s, job.id, job.tenant_ids[survivors[0]]) - 1)
    stds = distributed.integer_stds(spec, bounds, tmpl, index, v.roster.threshold,
                                    FIXED_POINT)
    out = distributed.decode_sum(total, tmpl, bounds, stds, len(survivors), FIXED_POINT)
    return {AGGREGATE: out}, survivors

