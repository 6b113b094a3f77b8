"""Where a job's states live between tasks, and a worker's verified copies of them.

* The server state is stored in two pieces: the shared part on the job row
  (``TrainingJob.server_state``: the state with its ``client_parts`` arrays emptied) and
  each client's rows of those arrays as a :class:`JobServerPart` (e.g. FedMC-ADMM's
  contribution C_i). A server step rewrites only the parts it changed: with 10 of 100
  tenants sampled, 10 rows instead of the whole 31 MiB state.
* A tenant's local state is versioned (:class:`JobLocalState`, one row per round that
  wrote it); the client step stages a new version, the aggregate step commits it by
  moving ``JobClient.state_round`` and deletes the version it superseded. No state is
  copied from a staging table into another.
* Every part, version and block carries a blake2b digest of its bytes. A worker keeps
  decoded copies in memory keyed by those digests and asks the database only for the
  digests (a few bytes per tenant); a blob is fetched only when its digest is not in
  memory (a fresh worker, another worker's round, a forgotten user's scrub).

The caches are content-addressed (a digest names exactly one byte string) and their
arrays are never modified in place, so a copy is valid whatever committed or rolled back.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import threading
from collections.abc import Iterable

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from algorithms import Message
from app.training.models import JobLocalState, JobServerPart

_LOCK = threading.Lock()
#: decoded local states by (job id, client index, digest), least recently used first
_LOCAL: collections.OrderedDict[tuple[int, int, str], Message] = collections.OrderedDict()
_LOCAL_BYTES = 0
#: job id -> (digest of every client part, the client-part arrays they decode to)
_SERVER: collections.OrderedDict[int, tuple[dict[int, str], dict[str, np.ndarray]]] = \
    collections.OrderedDict()
_SERVER_JOBS = 4


def cache_limit() -> int:
    """Bytes of decoded local states a process keeps (FEDREC_STATE_CACHE_MB, default 256)."""
    return int(float(os.environ.get("FEDREC_STATE_CACHE_MB", "256")) * 2 ** 20)


def digest(data: bytes) -> str:
    """The digest stored beside a blob: blake2b, 128 bits, hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def clear_caches() -> None:
    """Forget every in-memory copy (tests; a process that wants to re-read everything)."""
    global _LOCAL_BYTES
    with _LOCK:
        _LOCAL.clear()
        _SERVER.clear()
        _GLOBAL.clear()
        _LOCAL_BYTES = 0


# ---------------------------------------------------------------------------- local states

def _remember_local(key: tuple[int, int, str], msg: Message) -> None:
    global _LOCAL_BYTES
    with _LOCK:
        if key in _LOCAL:
            _LOCAL.move_to_end(key)
            return
        _LOCAL[key] = msg
        _LOCAL_BYTES += msg.nbytes()
        limit = cache_limit()
        while _LOCAL and _LOCAL_BYTES > limit:
            _, old = _LOCAL.popitem(last=False)
            _LOCAL_BYTES -= old.nbytes()


def _cached_local(key: tuple[int, int, str]) -> Message | None:
    with _LOCK:
        msg = _LOCAL.get(key)
        if msg is not None:
            _LOCAL.move_to_end(key)
        return msg


def stage_local(s: Session, job_id: int, client: int, round_: int, state: Message) -> str:
    """Add version ``round_`` of the client's local state (the caller commits); returns
    its digest."""
    blob = state.to_bytes()
    d = digest(blob)
    s.add(JobLocalState(job_id=job_id, client_index=client, round=round_, state=blob,
                        digest=d))
    _remember_local((job_id, client, d), state)
    return d


def load_locals(s: Session, job_id: int, clients: Iterable) -> dict[int, Message]:
    """The committed local states of ``clients`` (JobClient rows), decoded: from memory
    when their stored digest is there, else fetched (and remembered)."""
    out: dict[int, Message] = {}
    fetch = []
    for jc in clients:
        msg = _cached_local((job_id, jc.client_index, jc.state_digest))
        if msg is None:
            fetch.append((jc.client_index, jc.state_round))
        else:
            out[jc.client_index] = msg
    for chunk in range(0, len(fetch), 256):
        rows = s.execute(sa.select(JobLocalState.client_index, JobLocalState.digest,
                                   JobLocalState.state)
                         .where(JobLocalState.job_id == job_id,
                                sa.tuple_(JobLocalState.client_index,
                                          JobLocalState.round).in_(fetch[chunk:chunk + 256])))
        for c, d, blob in rows:
            msg = Message.from_bytes(blob)
            out[c] = msg
            _remember_local((job_id, c, d), msg)
    missing = {c for c, _ in fetch} - set(out)
    if missing:
        raise LookupError(f"job {job_id}: no stored local state of client(s) "
                          f"{sorted(missing)} at the committed round")
    return out


def local_state_bytes(s: Session, job_id: int, client: int) -> bytes | None:
    """The stored bytes of the client's committed local state (None: an agent's)."""
    from app.training.models import JobClient

    return s.scalar(sa.select(JobLocalState.state).join(
        JobClient, sa.and_(JobClient.job_id == JobLocalState.job_id,
                           JobClient.client_index == JobLocalState.client_index,
                           JobClient.state_round == JobLocalState.round))
        .where(JobLocalState.job_id == job_id, JobLocalState.client_index == client))


def committed_states(s: Session, job_id: int) -> list[bytes | None]:
    """Every client's committed local state as stored, in client order (None: an agent's)."""
    from app.training.models import JobClient

    return list(s.scalars(sa.select(JobLocalState.state).select_from(JobClient).outerjoin(
        JobLocalState, sa.and_(JobClient.job_id == JobLocalState.job_id,
                               JobClient.client_index == JobLocalState.client_index,
                               JobClient.state_round == JobLocalState.round))
        .where(JobClient.job_id == job_id).order_by(JobClient.client_index)))


def commit_locals(s: Session, job_id: int, clients: Iterable, round_: int) -> None:
    """Point each of ``clients`` (JobClient rows with a staged version ``round_``) at that
    version and delete the versions it supersedes (the caller commits)."""
    moved = list(clients)
    if moved:
        staged = dict(s.execute(sa.select(JobLocalState.client_index, JobLocalState.digest)
                                .where(JobLocalState.job_id == job_id,
                                       JobLocalState.round == round_)).all())
        for jc in moved:
            jc.state_round, jc.state_digest = round_, staged[jc.client_index]
        s.execute(sa.delete(JobLocalState).where(
            JobLocalState.job_id == job_id,
            JobLocalState.client_index.in_([jc.client_index for jc in moved]),
            JobLocalState.round < round_))


def rewrite_versions(s: Session, jc, change) -> None:
    """Replace every stored version (committed and staged) of the client's (a JobClient
    row's) local state by ``change(message)`` (a forgotten user's scrub), digests with
    them."""
    for row in s.scalars(sa.select(JobLocalState).where(
            JobLocalState.job_id == jc.job_id, JobLocalState.client_index == jc.client_index)):
        blob = change(Message.from_bytes(row.state)).to_bytes()
        row.state, row.digest = blob, digest(blob)
        if row.round == jc.state_round:
            jc.state_digest = row.digest


# -------------------------------------------------------------------------- global message

_GLOBAL: collections.OrderedDict[str, Message] = collections.OrderedDict()
_GLOBAL_SIZE = 8


def load_global(job) -> Message:
    """The job's global message: from memory when its stored digest is there, else the
    deferred column is loaded (the job's session must be open)."""
    d = job.global_digest
    with _LOCK:
        msg = _GLOBAL.get(d) if d else None
    if msg is not None:
        return msg
    blob = job.global_msg
    msg = Message.from_bytes(blob)
    _remember_global(d or digest(blob), msg)
    return msg


def store_global(job, msg: Message) -> None:
    """Set the job's global message and its digest (the caller commits)."""
    blob = msg.to_bytes()
    job.global_msg, job.global_digest = blob, digest(blob)
    _remember_global(job.global_digest, msg)


def _remember_global(d: str, msg: Message) -> None:
    with _LOCK:
        _GLOBAL[d] = msg
        _GLOBAL.move_to_end(d)
        while len(_GLOBAL) > _GLOBAL_SIZE:
            _GLOBAL.popitem(last=False)


# ---------------------------------------------------------------------------- server state

def _part(state: Message, i: int) -> bytes:
    buf = io.BytesIO()
    for name in state.client_parts:
        np.save(buf, np.ascontiguousarray(getattr(state, name)[i]), allow_pickle=False)
    return buf.getvalue()


def _unpack(state: Message, blob: bytes) -> list[np.ndarray]:
    buf = io.BytesIO(blob)
    return [np.load(buf, allow_pickle=False) for _ in state.client_parts]


def _shared(state: Message) -> bytes:
    return state.replace(**{n: getattr(state, n)[:0] for n in state.client_parts}).to_bytes()


def _changed_rows(old: Message, new: Message, names: tuple[str, ...], n: int) -> list[int]:
    """Client indices whose rows of the ``names`` arrays differ bit for bit (a NaN equals
    itself, -0.0 differs from 0.0): one vectorised comparison per array, as integers of
    the element's width."""
    if n == 0:
        return []
    changed = np.zeros(n, dtype=bool)
    for m in names:
        a, b = getattr(old, m), getattr(new, m)
        if a is b:
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return list(range(n))
        size = a.dtype.itemsize
        width = np.dtype(f"u{size}") if size in (1, 2, 4, 8) else np.dtype(np.uint8)
        av = np.ascontiguousarray(a).reshape(n, -1).view(width)
        bv = np.ascontiguousarray(b).reshape(n, -1).view(width)
        changed |= (av != bv).any(axis=1)
    return [int(i) for i in np.flatnonzero(changed)]


def new_server(s: Session, job, state: Message) -> None:
    """Store a new job's round-0 server state (the job row flushed; the caller commits)."""
    job.server_state = _shared(state)
    if not state.client_parts:
        return
    n = getattr(state, state.client_parts[0]).shape[0]
    rows = []
    for i in range(n):
        blob = _part(state, i)
        rows.append({"job_id": job.id, "client_index": i, "part": blob, "digest": digest(blob)})
    if rows:
        s.execute(sa.insert(JobServerPart), rows)


def load_server(s: Session, job) -> Message:
    """The job's full server state: the shared part (``job.server_state``, loaded) and the
    client parts, from memory where their stored digests match."""
    shared = Message.from_bytes(job.server_state)
    names = shared.client_parts
    if not names:
        return shared
    digests = dict(s.execute(sa.select(JobServerPart.client_index, JobServerPart.digest)
                             .where(JobServerPart.job_id == job.id)).all())
    with _LOCK:
        cached = _SERVER.get(job.id)
    have, arrays = cached if cached is not None else ({}, None)
    if arrays is not None and len(have) != len(digests):
        have, arrays = {}, None
    stale = sorted(i for i, d in digests.items() if have.get(i) != d)
    if stale:
        parts = _fetch_parts(s, job.id, stale)
        if arrays is not None:  # a copy with the stale rows replaced (cached arrays never
            arrays = {n: a.copy() for n, a in arrays.items()}  # change in place)
            for i in stale:
                for n, a in zip(names, _unpack(shared, parts[i]), strict=True):
                    if arrays[n][i].shape != a.shape:  # another database's job of this id
                        arrays = None
                        break
                    arrays[n][i] = a
                if arrays is None:
                    break
        if arrays is None:  # nothing usable in memory: stack every part
            parts.update(_fetch_parts(s, job.id, sorted(set(digests) - set(parts))))
            decoded = [_unpack(shared, parts[i]) for i in range(len(digests))]
            arrays = {n: np.stack([d[k] for d in decoded]) for k, n in enumerate(names)}
        _remember_server(job.id, digests, arrays)
    return shared.replace(**arrays)


def _fetch_parts(s: Session, job_id: int, clients: list[int]) -> dict[int, bytes]:
    parts: dict[int, bytes] = {}
    for chunk in range(0, len(clients), 256):
        parts.update(s.execute(sa.select(JobServerPart.client_index, JobServerPart.part)
                               .where(JobServerPart.job_id == job_id,
                                      JobServerPart.client_index.in_(
                                          clients[chunk:chunk + 256]))).all())
    return parts


def _remember_server(job_id: int, digests: dict[int, str], arrays: dict[str, np.ndarray]
                     ) -> None:
    with _LOCK:
        _SERVER[job_id] = (dict(digests), arrays)
        _SERVER.move_to_end(job_id)
        while len(_SERVER) > _SERVER_JOBS:
            _SERVER.popitem(last=False)


def save_server(s: Session, job, old: Message, new: Message) -> int:
    """Store the server state ``new`` that a step computed from ``old`` (the state
    :func:`load_server` returned): the shared part on the job row, and only the client
    parts that differ from ``old``. Returns how many parts were written (the caller
    commits)."""
    job.server_state = _shared(new)
    names = new.client_parts
    if not names:
        return 0
    n = getattr(new, names[0]).shape[0]
    changed = _changed_rows(old, new, names, n)
    rows = []
    for i in changed:
        blob = _part(new, i)
        rows.append({"job_id": job.id, "client_index": i, "part": blob, "digest": digest(blob)})
    if rows:
        s.execute(sa.update(JobServerPart), rows)
    with _LOCK:
        cached = _SERVER.get(job.id)
    if cached is not None:  # content-addressed: valid whether or not this commits
        digests = {**cached[0], **{r["client_index"]: r["digest"] for r in rows}}
        _remember_server(job.id, digests, {m: getattr(new, m) for m in names})
    return len(rows)
