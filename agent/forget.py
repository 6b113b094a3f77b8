"""Right to be forgotten on the tenant's machine: the agent's tombstones and its scrub.

``fedrec agent forget USER`` (or the coordinator's record of ``DELETE /v1/tenants/{id}/
users/{user}/ratings`` for an agent tenant, fetched on the agent's poll loop) records a
tombstone in ``DIR/forgotten.json`` and scrubs every joined job as the coordinator scrubs
a hosted tenant's (:mod:`algorithms.forgetting`): the user's ratings leave the stored
train and test blocks, their rows of the local state (committed ``local.msg`` and a staged
``pending-<k>.local``) are set to zero, and their key in ``users.json`` is unlinked, so
``fedrec agent recommend`` no longer knows them. A running agent re-reads the tombstones
under the state directory's lock before each step (:meth:`agent.run.Agent.exclusive`), so
its later rounds leave the user out; a job joined later leaves their ratings out of its
split although the data source still has them. An upload already sent (a privatised
release) is not recalled, as for a hosted tenant.

A tombstone stays until ``fedrec agent forget --undo USER``: the operator's statement that
the user consented again (the agent's form of the hosted rule "a later upload is a new
consent"): jobs joined after it train on the user's ratings again; jobs joined before keep
them out. Every file is written atomically; a scrub interrupted half-way is finished by
the next one (each step is idempotent, ``users.json`` is written last).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agent.state import atomic_write
from algorithms import Message, RatingBlock
from algorithms.forgetting import forgotten_rows, unlinked, without_forgotten

FILE = "forgotten.json"


def load(root: Path | str) -> dict[str, Any]:
    """``{"users": {key: {"at": ..., "by": "operator"|"coordinator"}}, "after": v}``:
    the tombstones and the version of the last coordinator request applied."""
    path = Path(root) / FILE
    if not path.exists():
        return {"users": {}, "after": -1}
    return json.loads(path.read_text())


def save(root: Path | str, tombs: dict[str, Any]) -> None:
    atomic_write(Path(root) / FILE, json.dumps(tombs, indent=1, sort_keys=True).encode())


@contextlib.contextmanager
def locked(root: Path | str) -> Iterator[None]:
    """The state directory's lock: a forget and a running agent's step take turns."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def forget(root: Path | str, user: str, by: str = "operator", at: str | None = None
           ) -> tuple[bool, int]:
    """Tombstone ``user`` and scrub every joined job (lock held by the caller):
    (whether the tombstone is new, ratings removed)."""
    tombs = load(root)
    new = user not in tombs["users"]
    if new:
        tombs["users"][user] = {"by": by, "at": at}
        save(root, tombs)
    return new, scrub_all(root, {user})


def undo(root: Path | str, user: str) -> bool:
    """Remove ``user``'s tombstone (a new consent): whether there was one."""
    tombs = load(root)
    if tombs["users"].pop(user, None) is None:
        return False
    save(root, tombs)
    return True


def job_ids(root: Path | str) -> list[str]:
    jobs = Path(root) / "jobs"
    return sorted(p.name for p in jobs.iterdir() if (p / "users.json").exists()) \
        if jobs.exists() else []


def scrub_all(root: Path | str, forgotten: set[str]) -> int:
    """Scrub the ``forgotten`` users from every joined job: ratings removed."""
    return sum(scrub_job(Path(root) / "jobs" / job, forgotten) for job in job_ids(root))


def scrub_job(where: Path, forgotten: set[str]) -> int:
    """Drop the users' ratings from a job's blocks, zero their rows of its local state
    (committed and staged) and unlink their keys: ratings removed (0: none there)."""
    users = json.loads((where / "users.json").read_text())
    rows = forgotten_rows(users, forgotten)
    if not rows:
        return 0
    removed = 0
    for name in ("train.block", "test.block"):
        if not (where / name).exists():
            continue
        block = RatingBlock.from_bytes((where / name).read_bytes())
        kept = without_forgotten(block, users, forgotten)
        removed += block.nnz - kept.nnz
        atomic_write(where / name, kept.to_bytes())
    for path in [where / "local.msg", *sorted(where.glob("pending-*.local"))]:
        if not path.exists():  # a setup cut short: the next one writes it afresh
            continue
        state = Message.from_bytes(path.read_bytes())
        atomic_write(path, state.forget_rows(np.asarray(rows)).to_bytes())
    atomic_write(where / "users.json", json.dumps(unlinked(users, forgotten)).encode())
    return removed


def without_users(collected, forgotten: set[str]):
    """The rows of an :class:`algorithms.ingest.Collected` whose user is not ``forgotten``."""
    if not forgotten:
        return collected
    gone = np.array([k in forgotten for k in collected.user_keys] or [False], dtype=bool)
    keep = ~gone[collected.users] if len(collected.users) else np.zeros(0, dtype=bool)
    return dataclasses.replace(collected, users=collected.users[keep],
                               items=collected.items[keep], values=collected.values[keep],
                               micros=collected.micros[keep], lines=collected.lines[keep])


def apply_requests(root: Path | str, requests: list[dict[str, Any]], last: int
                   ) -> list[str]:
    """The coordinator's forget requests (``GET .../agent/forgotten``) applied: tombstones
    recorded with ``last`` as the version to ask after next time, every job scrubbed
    (lock held by the caller). Returns the users newly forgotten."""
    tombs = load(root)
    new = [r["user"] for r in requests if r["user"] not in tombs["users"]]
    for r in requests:
        tombs["users"].setdefault(r["user"], {"by": "coordinator", "at": r["forgotten_at"]})
    tombs["after"] = max(int(tombs["after"]), int(last))
    save(root, tombs)
    scrub_all(root, {r["user"] for r in requests})
    return new
