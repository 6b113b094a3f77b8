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


def stage_local(s: Session, job_id: int, client: int, round_: int, state: Message) -> None:
    """Add version ``round_`` of the client's local state (the caller commits)."""
    blob = state.to_bytes()
    d = digest(blob)
    s.add(JobLocalState(job_id=job_id, client_index=client, round=round_, state=blob,
                        digest=d))
    _remember_local((job_id, client, d), state)


def local_digests(s: Session, job_id: int, versions: dict[int, int]) -> dict[int, str]:
    """client -> digest of its version ``versions[client]`` (absent: no such version)."""
    if not versions:
        return {}
    q = sa.select(JobLocalState.client_index, JobLocalState.round, JobLocalState.digest
                  ).where(JobLocalState.job_id == job_id)
    if len(versions) < 64:  # else every version of the job: one scan beats a long IN list
        q = q.where(JobLocalState.client_index.in_(list(versions)))
    return {c: d for c, r, d in s.execute(q) if versions.get(c) == r}


def load_locals(s: Session, job_id: int, versions: dict[int, int]) -> dict[int, Message]:
    """The local states ``{client: version round}`` asks for, decoded: from memory when
    the stored digest matches, else fetched (and remembered)."""
    digests = local_digests(s, job_id, versions)
    missing = set(versions) - set(digests)
    if missing:
        raise LookupError(f"job {job_id}: no stored local state of client(s) "
                          f"{sorted(missing)} at the committed round")
    out: dict[int, Message] = {}
    fetch = []
    for c, d in digests.items():
        msg = _cached_local((job_id, c, d))
        if msg is None:
            fetch.append(c)
        else:
            out[c] = msg
    for chunk in range(0, len(fetch), 256):
        keys = [(c, versions[c]) for c in fetch[chunk:chunk + 256]]
        rows = s.execute(sa.select(JobLocalState.client_index, JobLocalState.digest,
                                   JobLocalState.state)
                         .where(JobLocalState.job_id == job_id,
                                sa.tuple_(JobLocalState.client_index,
                                          JobLocalState.round).in_(keys)))
        for c, d, blob in rows:
            msg = Message.from_bytes(blob)
            out[c] = msg
            _remember_local((job_id, c, d), msg)
    return out


def load_local(s: Session, job_id: int, client: int, round_: int) -> Message:
    return load_locals(s, job_id, {client: round_})[client]


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
    moved = [jc for jc in clients]
    for jc in moved:
        jc.state_round = round_
    if moved:
        s.execute(sa.delete(JobLocalState).where(
            JobLocalState.job_id == job_id,
            JobLocalState.client_index.in_([jc.client_index for jc in moved]),
            JobLocalState.round < round_))


def rewrite_versions(s: Session, job_id: int, client: int, change) -> None:
    """Replace every stored version (committed and staged) of the client's local state by
    ``change(message)`` (a forgotten user's scrub), digests with them."""
    for row in s.scalars(sa.select(JobLocalState).where(
            JobLocalState.job_id == job_id, JobLocalState.client_index == client)):
        blob = change(Message.from_bytes(row.state)).to_bytes()
        row.state, row.digest = blob, digest(blob)


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


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (a NaN equals itself, -0.0 differs from 0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).reshape(-1).view(np.uint8),
        np.ascontiguousarray(b).reshape(-1).view(np.uint8))


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
        parts = {}
        for chunk in range(0, len(stale), 256):
            parts.update(s.execute(sa.select(JobServerPart.client_index, JobServerPart.part)
                                   .where(JobServerPart.job_id == job.id,
                                          JobServerPart.client_index.in_(
                                              stale[chunk:chunk + 256]))).all())
        if arrays is None:  # nothing in memory: stack every part
            decoded = [_unpack(shared, parts[i]) for i in range(len(digests))]
            arrays = {n: np.stack([d[k] for d in decoded]) for k, n in enumerate(names)}
        else:  # a copy with the stale rows replaced: cached arrays never change
            arrays = {n: a.copy() for n, a in arrays.items()}
            for i in stale:
                for n, a in zip(names, _unpack(shared, parts[i]), strict=True):
                    arrays[n][i] = a
        _remember_server(job.id, digests, arrays)
    return shared.replace(**arrays)


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
    changed = [i for i in range(n)
               if not all(_same(getattr(old, m)[i], getattr(new, m)[i]) for m in names)]
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
