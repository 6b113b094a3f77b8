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
* An upload's arrays that are arrays of the new local state (a noise-free FedMC-ADMM
  upload is the new W_i and Y_i) are stored once, in that version: the staged upload
  names them (``RoundUpload.from_state``) and the aggregate step takes them from there
  (:func:`stage_upload`, :func:`load_uploads`).
* Every part, version and block carries a tag: a blake2b digest of a block's bytes, and
  for the states a round writes 128 random bits drawn at each write (hashing them cost
  more than a millisecond per tenant). Either way a tag names exactly one byte string. A
  worker keeps decoded copies in memory keyed by those tags and asks the database only
  for the tags (a few bytes per tenant); a blob is fetched only when its tag is not in
  memory (a fresh worker, another worker's round, a forgotten user's scrub).

The caches are keyed by tag and their arrays are never modified in place, so a copy is
valid whatever committed or rolled back.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import secrets
import threading
from collections.abc import Iterable

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from algorithms import Message
from app.training.models import JobLocalState, JobServerPart, RoundUpload

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
    """The digest stored beside a rating block: blake2b, 128 bits, hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def new_tag() -> str:
    """The tag stored beside a state written by a round: 128 random bits, hex, drawn anew
    at every write, so a tag names exactly one byte string as a digest would, without
    hashing the ~10 MB a FedMC-ADMM round on MovieLens 1M writes."""
    return secrets.token_hex(16)


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


def stage_local(s: Session, job_id: int, client: int, round_: int, state: Message,
                remember: bool = True) -> str:
    """Insert version ``round_`` of the client's local state (the caller commits); returns
    its tag. ``remember``: also keep it decoded in this process's cache (not where the
    state is only written, as the API does when it creates a job: there each tenant's
    state would stay in memory up to FEDREC_STATE_CACHE_MB for nothing)."""
    blob = state.to_bytes()
    d = new_tag()
    s.execute(_INSERT_LOCAL, {"job_id": job_id, "client_index": client, "round": round_,
                              "state": blob, "digest": d})
    if remember:
        _remember_local((job_id, client, d), state)
    return d


#: the row inserts of a client step, as Core statements (the ORM's unit of work costs more
#: per row than the statement itself)
_INSERT_LOCAL = sa.insert(JobLocalState.__table__)
_INSERT_UPLOAD = sa.insert(RoundUpload.__table__)


def load_locals(s: Session, job_id: int, clients: Iterable) -> dict[int, Message]:
    """The committed local states of ``clients`` (JobClient rows), decoded: from memory
    when their stored digest is there, else fetched (and remembered)."""
    return _load_versions(s, job_id, {jc.client_index: (jc.state_round, jc.state_digest)
                                      for jc in clients})


def _load_versions(s: Session, job_id: int, versions: dict[int, tuple[int, str | None]]
                   ) -> dict[int, Message]:
    """client index -> its local state version (round, digest), decoded: from memory when
    the digest is there, else fetched (and remembered)."""
    out: dict[int, Message] = {}
    fetch = []
    for client, (round_, d) in versions.items():
        msg = _cached_local((job_id, client, d)) if d is not None else None
        if msg is None:
            fetch.append((client, round_))
        else:
            out[client] = msg
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
                          f"{sorted(missing)} at the round asked for")
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
        row.state, row.digest = blob, new_tag()
        if row.round == jc.state_round:
            jc.state_digest = row.digest


# -------------------------------------------------------------------------------- uploads

def stage_upload(s: Session, job_id: int, client: int, round_: int, local: Message,
                 upload: Message | None, refused: str | None) -> None:
    """Insert the client's upload of the round (None: nothing sent), staged beside its
    local state version ``round_`` (the caller commits).

    An array of the upload that *is* an array of that local state (the same object: an
    upload sent as computed, with no noise added, e.g. FedMC-ADMM's W_i and Y_i) is stored
    once, in the local state: the upload's bytes hold it empty and ``from_state`` names the
    local field it is. A noisy upload's arrays are new objects and are stored in full, and
    so are fields the local state keeps per user (a forgotten user's scrub rewrites those).
    """
    refs: dict[str, str] = {}
    blob = None
    if upload is not None:
        kept = {id(a): name for name, a in local.arrays().items()
                if name not in local.user_rows}
        refs = {name: kept[id(a)] for name, a in upload.arrays().items() if id(a) in kept}
        blob = upload.replace(**{n: getattr(upload, n)[:0] for n in refs}).to_bytes()
    s.execute(_INSERT_UPLOAD, {"job_id": job_id, "round": round_, "client_index": client,
                               "refused": refused, "upload": blob,
                               "from_state": refs or None})


def load_uploads(s: Session, job_id: int, round_: int, rows: Iterable[RoundUpload]
                 ) -> dict[int, Message]:
    """The uploads of ``rows`` (a round's :class:`RoundUpload` rows; those that sent
    nothing left out), decoded, with the fields stored in the client's staged local state
    (``from_state``) taken from that version: from memory when its digest is there."""
    rows = [r for r in rows if r.upload is not None]
    refer = [r for r in rows if r.from_state]
    staged: dict[int, Message] = {}
    if refer:
        digests = dict(s.execute(sa.select(JobLocalState.client_index, JobLocalState.digest)
                                 .where(JobLocalState.job_id == job_id,
                                        JobLocalState.round == round_,
                                        JobLocalState.client_index.in_(
                                            [r.client_index for r in refer]))).all())
        staged = _load_versions(s, job_id, {r.client_index: (round_, digests.get(
            r.client_index)) for r in refer})
    out: dict[int, Message] = {}
    for r in rows:
        msg = Message.from_bytes(r.upload)
        if r.from_state:
            local = staged[r.client_index]
            msg = msg.replace(**{n: getattr(local, m) for n, m in r.from_state.items()})
        out[r.client_index] = msg
    return out


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
    msg = Message.from_bytes(job.global_msg)
    if d:
        _remember_global(d, msg)
    return msg


def store_global(job, msg: Message) -> None:
    """Set the job's global message and its digest (the caller commits)."""
    blob = msg.to_bytes()
    job.global_msg, job.global_digest = blob, new_tag()
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
        rows.append({"job_id": job.id, "client_index": i, "part": blob, "digest": new_tag()})
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
        rows.append({"job_id": job.id, "client_index": i, "part": blob, "digest": new_tag()})
    if rows:
        s.execute(sa.update(JobServerPart), rows)
    with _LOCK:
        cached = _SERVER.get(job.id)
    if cached is not None:  # content-addressed: valid whether or not this commits
        digests = {**cached[0], **{r["client_index"]: r["digest"] for r in rows}}
        _remember_server(job.id, digests, {m: getattr(new, m) for m in names})
    return len(rows)
