"""Right to be forgotten, for what training derived from a user's ratings.

Deleting a user (:func:`forget_user`) removes their ratings and, in the same transaction,
records a tombstone (:class:`app.models.ForgottenUser`), removes the user's row from every
factor snapshot of the tenant and the user's ratings from every stored job block (train
and held-out), replacing the user's key there by ``FORGOTTEN``.

That scrub only reaches the rows committed when the deletion runs, so the tombstone does
the rest: a job whose ratings snapshot predates the deletion (it may commit its rows just
after it) honours the tombstone at every later step. A client step trains without the
user's ratings (:func:`without_forgotten`), the aggregate step scrubs the stored blocks
(:func:`scrub_job_clients`) before evaluating or publishing, and a published snapshot
never holds a ``FORGOTTEN`` row. The user's rows of every job's stored local state (U_i,
and whatever else an algorithm keeps per user: ``Message.user_rows``), committed or staged
for a round not yet aggregated, are set to zero in the same scrub.

Locks (PostgreSQL): the deletion locks the tenant's job rows before it reads the
snapshots, and the aggregate step locks its job rows before it reads the tombstones, so
whichever commits second sees the other: a snapshot published concurrently is scrubbed by
the deletion, or the aggregate step sees the tombstone. The deletion never waits for the
aggregate step's lock on the job itself (``tests/integration/test_forgetting_pg.py``).
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np
import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.orm import Session

from algorithms import RatingBlock
from algorithms.forgetting import FORGOTTEN as FORGOTTEN  # re-exported: its users import it here
from algorithms.forgetting import forgotten_rows, unlinked
from algorithms.forgetting import without_forgotten as without_forgotten
from app import store
from app.models import ForgottenUser, Rating, RatingStats, Tenant, User, utcnow
from app.training.models import FactorSnapshot, JobClient, TrainingJob


def forget_user(s: Session, tenant_id: int, user_key: str) -> int | None:
    """Forget the user (caller commits): how many ratings were deleted, 0 when the user
    was forgotten before and nothing remained (the scrub is re-applied all the same), None
    when the tenant never had the user."""
    deleted = store.delete_user(s, tenant_id, user_key)  # also bumps ratings_version
    tomb = s.get(ForgottenUser, (tenant_id, user_key))
    if deleted is None and tomb is None:
        return None
    if deleted is not None:
        version = s.scalar(sa.select(Tenant.ratings_version).where(Tenant.id == tenant_id))
        if tomb is None:
            tomb = ForgottenUser(tenant_id=tenant_id, user_key=user_key)
            s.add(tomb)
        tomb.version, tomb.forgotten_at = version, utcnow()
        # the last computed statistics counted the user: gone with the ratings (the route
        # has them recomputed once this commits)
        s.execute(sa.delete(RatingStats).where(RatingStats.tenant_id == tenant_id))
        s.flush()
    rows = s.execute(sa.select(JobClient.job_id, JobClient.client_index, JobClient.user_keys,
                               TrainingJob.ratings_version)
                     .join(TrainingJob, TrainingJob.id == JobClient.job_id)
                     .where(JobClient.tenant_id == tenant_id)
                     .with_for_update(of=JobClient, key_share=True)).all()  # see module doc
    blocks = [orm.undefer(JobClient.train_block), orm.undefer(JobClient.test_block)]
    with s.no_autoflush:  # one UPDATE per row: a second one would re-check its foreign key
        for job_id, index, keys, versions in rows:
            if user_key in keys and tomb.version > _version(versions, tenant_id):
                scrub_client(s, s.get(JobClient, (job_id, index), options=blocks),
                             {user_key})
    _scrub_snapshots(s, tenant_id, user_key)
    return deleted or 0


def _scrub_snapshots(s: Session, tenant_id: int, user_key: str) -> None:
    for snap in s.scalars(sa.select(FactorSnapshot).where(FactorSnapshot.tenant_id ==
                                                          tenant_id)):
        if user_key in snap.user_keys:
            _scrub_snapshot(snap, user_key)


def is_agent_tenant(s: Session, tenant_id: int) -> bool:
    """Whether the tenant is an agent (``fedrec agent``) of any job: its ratings, if any,
    are on its own machine, so only its agent can forget them there."""
    jobs = s.scalars(sa.select(TrainingJob.agents).where(TrainingJob.agents.is_not(None)))
    return any(tenant_id in (agents or {}).get("tenants", []) for agents in jobs)


def forgets_on_agent(s: Session, tenant_id: int, known: bool) -> bool:
    """Whether the request to forget a user this database holds no ratings of is for the
    tenant's agent to carry out: the tenant is an agent of a job (:func:`is_agent_tenant`),
    or the user is not ``known`` here and the tenant holds no ratings here at all, as an
    agent tenant before its first job. Its agent fetches the request before it joins a
    job and leaves the user out from the start; for a tenant that has simply uploaded
    nothing yet the request forgets nothing, and ratings of the user uploaded later are a
    new consent (:class:`ForgottenUser`)."""
    if is_agent_tenant(s, tenant_id):
        return True
    if known:
        return False
    rated = sa.select(Rating.user_id).join(User, User.id == Rating.user_id).where(
        User.tenant_id == tenant_id).limit(1)
    return s.scalar(rated) is None


def forget_agent_user(s: Session, tenant_id: int, user_key: str) -> int:
    """Record that the tenant's agent must forget the user (caller commits): a tombstone
    of a new ratings version (the agent fetches tombstones newer than the last it applied,
    :func:`tombstones_after`, and forgets the user on its machine: ``agent.forget``) and
    the user's rows gone from the tenant's serving snapshots. Repeatable: each request is
    sent again under a new version (a no-op for an agent that still has the user
    forgotten). Returns the version."""
    version = s.scalar(sa.update(Tenant).where(Tenant.id == tenant_id)
                       .values(ratings_version=Tenant.ratings_version + 1)
                       .returning(Tenant.ratings_version))
    tomb = s.get(ForgottenUser, (tenant_id, user_key))
    if tomb is None:
        tomb = ForgottenUser(tenant_id=tenant_id, user_key=user_key)
        s.add(tomb)
    tomb.version, tomb.forgotten_at = version, utcnow()
    s.flush()
    _scrub_snapshots(s, tenant_id, user_key)
    return version


def tombstones_after(s: Session, tenant_id: int, after: int, limit: int = 1000
                     ) -> list[ForgottenUser]:
    """The tenant's tombstones of a version above ``after``, oldest first (at most
    ``limit``): what its agent has still to apply."""
    return list(s.scalars(sa.select(ForgottenUser)
                          .where(ForgottenUser.tenant_id == tenant_id,
                                 ForgottenUser.version > after)
                          .order_by(ForgottenUser.version, ForgottenUser.user_key)
                          .limit(limit)))


def _version(versions: dict | None, tenant_id: int) -> int:
    """The tenant's ratings_version when a job read its ratings (-1: not recorded), from
    the job's ``ratings_version`` map."""
    return int((versions or {}).get(str(tenant_id), -1))


def forgotten_since(s: Session, job: TrainingJob,
                    tenant_ids: Iterable[int] | None = None) -> dict[int, set[str]]:
    """tenant id -> the keys its tombstones newer than the job's snapshot name."""
    tenants = list(job.tenant_ids if tenant_ids is None else tenant_ids)
    oldest = min((_version(job.ratings_version, t) for t in tenants), default=-1)
    rows = s.execute(sa.select(ForgottenUser.tenant_id, ForgottenUser.user_key,
                               ForgottenUser.version)
                     .where(ForgottenUser.tenant_id.in_(tenants),
                            ForgottenUser.version > oldest))
    out: dict[int, set[str]] = {}
    for tenant_id, key, version in rows:
        if version > _version(job.ratings_version, tenant_id):
            out.setdefault(tenant_id, set()).add(key)
    return out


def newest_tombstone(tenant_id: sa.ColumnElement) -> sa.ScalarSelect:
    """The version of the newest tombstone of the tenant ``tenant_id`` names (NULL: none),
    as a column of a larger query (a client step reads it with the job)."""
    return (sa.select(sa.func.max(ForgottenUser.version))
            .where(ForgottenUser.tenant_id == tenant_id).scalar_subquery())


def newer_tombstone(job: TrainingJob, tenant_id: int, newest: int | None) -> bool:
    """Whether a tombstone of version ``newest`` (:func:`newest_tombstone`) postdates the
    job's snapshot of the tenant's ratings (then :func:`forgotten_since` names the keys)."""
    return newest is not None and newest > _version(job.ratings_version, tenant_id)


def scrub_job_clients(s: Session, job: TrainingJob, clients: list[JobClient]) -> None:
    """Apply the job's newer tombstones to its stored blocks (``clients`` locked)."""
    if s.get_bind().dialect.name == "sqlite":
        # SQLite reads outside a transaction until the first write: take the write lock
        # now, so no deletion commits between reading the tombstones and this commit.
        s.execute(sa.text("UPDATE forgotten_users SET version = version WHERE 0"))
    forgotten = forgotten_since(s, job)
    for jc in clients:
        if jc.tenant_id in forgotten:  # the others have nothing to scrub
            scrub_client(s, jc, forgotten[jc.tenant_id])


def scrub_client(s: Session, jc: JobClient, forgotten: set[str]) -> list[int]:
    """Drop the ``forgotten`` users' ratings from a job's blocks, zero their rows of every
    stored version of its local state (committed and staged) and unlink their keys;
    returns their row indices. Digests are recomputed with the bytes, so no worker's
    in-memory copy of the old ones is used again."""
    from app.training.states import digest, rewrite_versions

    rows = forgotten_rows(jc.user_keys, forgotten)
    if not rows:
        return rows
    for column in ("train", "test"):
        block = RatingBlock.from_bytes(getattr(jc, f"{column}_block"))
        blob = without_forgotten(block, jc.user_keys, forgotten).to_bytes()
        setattr(jc, f"{column}_block", blob)
        setattr(jc, f"{column}_digest", digest(blob))
    rewrite_versions(s, jc, lambda state: state.forget_rows(np.asarray(rows)))
    jc.user_keys = unlinked(jc.user_keys, forgotten)
    return rows


def _scrub_snapshot(snap: FactorSnapshot, user_key: str) -> None:
    row = snap.user_keys.index(user_key)
    with np.load(io.BytesIO(snap.factors), allow_pickle=False) as z:
        arrays = {name: z[name] for name in z.files}  # B, item ids, a link: all kept
    arrays["A"] = np.delete(arrays["A"], row, axis=0)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    snap.factors = buf.getvalue()
    snap.user_keys = [k for k in snap.user_keys if k != user_key]



class TenantInJob(Exception):
    """The tenant takes part in jobs still queued or running (their ids)."""

    def __init__(self, job_ids: list[int]) -> None:
        super().__init__(job_ids)
        self.job_ids = job_ids


def forget_tenant(s: Session, tenant: Tenant) -> dict[str, int]:
    """Delete a tenant and everything stored for it (caller commits): API keys, users,
    ratings, statistics, tombstones, audit log, its blocks and local state in every job,
    its serving snapshots and privacy ledger. Items (the shared catalogue) stay, and so
    do the item factors other tenants received from jobs it took part in: they are a
    release (DP for private jobs) that has already left. Raises :class:`TenantInJob`
    while a queued or running job includes it (cancel those first). Returns what went."""
    active = [job.id for job in s.scalars(sa.select(TrainingJob).where(
        TrainingJob.status.in_(("queued", "running")))) if tenant.id in job.tenant_ids]
    if active:
        raise TenantInJob(active)
    # the tenant's row, then its users, locked as store.delete_user locks one user: an
    # upload in flight (FOR KEY SHARE on its users) finishes first, a new one waits
    s.execute(sa.select(Tenant.id).where(Tenant.id == tenant.id).with_for_update())
    users = list(s.scalars(sa.select(User.id).where(User.tenant_id == tenant.id)
                           .with_for_update()))
    ratings = s.execute(sa.delete(Rating).where(Rating.user_id.in_(users))).rowcount
    s.delete(tenant)  # the rest goes by the foreign keys' ON DELETE CASCADE
    s.flush()
    return {"ratings": ratings, "users": len(users)}
