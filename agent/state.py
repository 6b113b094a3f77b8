"""The agent's state directory: its privacy ledger and each job's local state.

Layout of ``DIR``::

    agent.json                  ledger (privacy.ledger.Ledger state) and per-job records
    user-draws.key              the secret key of the tenant's per-user privacy draws
                                (privacy.randomness.UserPRF; owner-only, never sent)
    forgotten.json              the users forgotten on this machine (agent.forget), and the
                                version of the last coordinator forget request applied
    .lock                       taken by each step of a running agent and by a forget
    jobs/<id>/manifest.json     the job's manifest as the coordinator sent it
    jobs/<id>/train.block, test.block, users.json   the tenant's split (never uploaded)
    jobs/<id>/local.msg         U_i and the rest of the local state, after the last round
    jobs/<id>/global.msg        the last global message received
    jobs/<id>/pending-<k>.upload / pending-<k>.local   round k's result until it is acked

Every write is atomic (temporary file, fsync, rename), and ``agent.json`` is written last:
a round's charge is recorded with its round id in the same write that records the pending
upload, *before* the upload is sent. After a crash the agent finds the pending round and
re-sends the same bytes (the coordinator answers an identical upload as a replay), so no
round is charged twice; a crash before that write leaves no charge and nothing sent, and
recomputing the round draws fresh privacy noise (:mod:`privacy.randomness`), charged once.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from privacy.ledger import Budget, Ledger
from privacy.randomness import new_key

STATE_VERSION = 1


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` all at once (a reader sees the old or the new file);
    ``durable``: on disk (file and directory entry fsynced) before this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        sync_dir(path.parent)


def sync_dir(path: Path) -> None:
    """fsync a directory: the renames in it are on disk."""
    dirfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


class AgentState:
    """The state directory; :meth:`save` persists ``ledger`` and ``jobs`` atomically."""

    def __init__(self, root: Path, data: dict[str, Any]) -> None:
        self.root, self._data = Path(root), data
        self.ledger = Ledger.from_dict(data["ledger"])

    @classmethod
    def open(cls, root: Path | str, account: str, budget: Budget | None = None
             ) -> AgentState:
        """Open (or create) the state of ``account``; ``budget`` (the tenant's own
        epsilon_max, delta and opt-in) replaces the stored one when given."""
        root = Path(root)
        path = root / "agent.json"
        if path.exists():
            data = json.loads(path.read_text())
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"{path}: unsupported agent state version "
                                 f"{data.get('version')!r}")
            if data["account"] != account:
                raise ValueError(f"{path} belongs to tenant {data['account']}, not {account}: "
                                 "use another --state-dir")
        else:
            if budget is None:
                raise ValueError(f"no agent state in {root}: give the budget (--epsilon-max)")
            data = {"version": STATE_VERSION, "account": account,
                    "ledger": Ledger.open({account: budget}).to_dict(), "jobs": {}}
        state = cls(root, data)
        if budget is not None:
            state.set_budget(budget)
        state.save()
        return state

    @property
    def account(self) -> str:
        return self._data["account"]

    @property
    def jobs(self) -> dict[str, dict[str, Any]]:
        return self._data["jobs"]

    def set_budget(self, budget: Budget) -> None:
        state = self.ledger.to_dict()
        acc = state["tenants"][self.account]
        acc["epsilon_max"] = None if budget.epsilon_max == float("inf") else budget.epsilon_max
        acc["delta"], acc["allow_not_private"] = budget.delta, budget.allow_not_private
        self.ledger = Ledger.from_dict(state)

    def save(self) -> None:
        self._data["ledger"] = self.ledger.to_dict()
        atomic_write(self.root / "agent.json",
                     json.dumps(self._data, indent=1, sort_keys=True).encode())

    @property
    def user_draws_key(self) -> bytes:
        """The secret key of this tenant's per-user privacy draws (its users' caps and
        Poisson samples): created fresh on first use, kept owner-only in the state
        directory, never sent (the agent is the tenant, so it may hold it)."""
        path = self.root / "user-draws.key"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(new_key())
                f.flush()
                os.fsync(f.fileno())
            sync_dir(self.root)
        return path.read_bytes()

    def job_dir(self, job_id: int | str) -> Path:
        return self.root / "jobs" / str(job_id)

    def write(self, job_id: int | str, name: str, data: bytes, durable: bool = True) -> None:
        atomic_write(self.job_dir(job_id) / name, data, durable)

    def rename(self, job_id: int | str, source: str, target: str) -> None:
        """Move a job file over another, durably (no copy of its bytes). A missing source
        was moved already (a crash after the move, before the state recorded it)."""
        try:
            os.replace(self.job_dir(job_id) / source, self.job_dir(job_id) / target)
        except FileNotFoundError:
            return
        sync_dir(self.job_dir(job_id))

    def read(self, job_id: int | str, name: str) -> bytes:
        return (self.job_dir(job_id) / name).read_bytes()

    def drop(self, job_id: int | str, name: str) -> None:
        (self.job_dir(job_id) / name).unlink(missing_ok=True)
