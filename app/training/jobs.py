"""Creating, cancelling and reporting training jobs (the admin side of training)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from algorithms import RatingBlock, registry
from algorithms.base import Algorithm
from algorithms.data import tenant_split
from algorithms.scale import with_public_scale
from algorithms.simulate import initialise_client, initialise_server
from app import store
from app.idempotency import IdempotencyError, request_hash, row_for_key  # noqa: F401
from app.models import REGISTERED, Item, Rating, Tenant, User
from app.training import dry_round, states
from app.training.dry_round import DryRound, Outcome, stand_in, tenant_inputs
from app.training.ledger import load_ledger
from app.training.models import JobClient, TrainingJob
from app.training.pipeline import item_ids_bytes, planned_transmissions
from app.training.reservations import as_reserved, budget_ledger, over_budget
from app.training.selection import initial as initial_selection
from privacy import user_level
from privacy.accountant import Spend
from privacy.ledger import BudgetExceeded, NotPrivateRefused, check_plan, check_schedule
from privacy.randomness import new_key
from privacy.wrapper import DPSpec, transmission_event


class JobRefused(Exception):
    """A job cannot be created; ``status`` is the HTTP status the API answers with."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


@dataclasses.dataclass(frozen=True)
class JobSpec:
    algorithm: str
    tenant_ids: list[int]
    rounds: int
    per_round: int
    seed: int
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: tenant unit (DPSpec fields), user unit (``unit: user``, placement, epsilon, delta)
    #: or None: the default of :func:`_default_privacy`
    dp: dict[str, Any] | None = None
    test_fraction: float = 0.2
    allow_not_private: bool = False
    parent_job_id: int | None = None
    max_attempts: int = 3
    """Failed steps (without a round committing in between) before the job is failed."""
    agents: list[int] = dataclasses.field(default_factory=list)
    """Tenants whose client step runs in their own ``fedrec agent`` (their ratings are not
    in this database); the others are hosted (client step in a worker)."""
    round_seconds: float = 300.0
    """An agent's upload deadline, counted from the round's start."""
    wire: str = "float64"
    """dtype of the agents' uploads on the wire: float64 (exact) or float32 (half the bytes)."""
    rounds_given: bool = True
    """Whether ``rounds`` was asked for: a default is cut to the rounds a release-bounded
    algorithm uses, an explicit larger number is refused (:func:`fit_rounds`)."""
    validation_fraction: float | None = None
    """Share of each hosted tenant's training ratings that chooses the run length
    (:mod:`app.training.selection`); None: :data:`~app.training.selection.DEFAULT_FRACTION`
    for a job without a DP guarantee and without agents, else 0 (a DP job does not
    select on private data)."""
    pair_job_id: int | None = None
    """The job created together with this one (the default job's ranking/rating pair)."""
    lists: str = "auto"
    """Who serves the lists once the job completes: "auto", the better of its model and
    popularity on held-out data (:func:`app.training.selection.lists_decision`), or
    "model", its model whatever the comparison (which the report still shows)."""
    dry_round_seconds: float | None = None
    """Wall-clock bound of the dry round (:func:`_dry_run`): the API sets its
    ``FEDREC_DRY_ROUND_SECONDS``; None (a scheduled retraining in the worker): unbounded."""
    dry_rounds: Callable[[DryRound], Outcome] | None = None
    """Where the dry round runs: None, in this process; the API with a broker hands it to
    a worker (:func:`app.training.dry_round.remote`), so it needs ``dry_round_seconds``."""


def useful_rounds(cfg: Any) -> int | None:
    """Rounds an algorithm that stops uploading after a set number of releases uses: those
    releases (DPALS's ``sweeps``, the user-gradient methods' ``releases``) and one round
    re-solving the users against the final model; None when every round uploads."""
    releases = registry.user_releases(cfg, 0)
    return releases + 1 if releases else None


def fit_rounds(alg: Algorithm, cfg: Any, spec: JobSpec) -> JobSpec:
    """``spec`` whose rounds the algorithm uses: a default cut to :func:`useful_rounds`; an
    explicit larger number refused (422 naming ``rounds``): its extra rounds would send
    nothing and change nothing, silently."""
    useful = useful_rounds(cfg)
    if useful is None or spec.rounds <= useful:
        return spec
    if not spec.rounds_given:
        return dataclasses.replace(spec, rounds=useful)
    field = "sweeps" if hasattr(cfg, "sweeps") else "releases"
    raise JobRefused(422, f"invalid rounds: {spec.rounds} is more than {alg.name} uses: its "
                          f"{useful - 1} {field} (config.{field}) upload in rounds 1-"
                          f"{useful - 1} and round {useful} re-solves the users against the "
                          f"final model, so rounds {useful + 1}-{spec.rounds} would send "
                          f"nothing; give rounds <= {useful}, or raise config.{field}")


def _validated(spec: JobSpec) -> tuple[Algorithm, Any, DPSpec]:
    try:
        alg = registry.get(spec.algorithm)
    except KeyError as exc:
        raise JobRefused(422, str(exc.args[0])) from None
    if alg.data_kind != "ratings":
        raise JobRefused(422, f"algorithm {alg.name} is for binary data; the service trains "
                              "rating models")
    try:
        cfg = alg.config(**spec.config)
        request = _default_privacy(alg, cfg) if spec.dp is None else spec.dp
        dp = request if user_level.is_user_level(request) else DPSpec(**request)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        msg = first["msg"].removeprefix("Value error, ")
        raise JobRefused(422, f"invalid {where}: {msg}") from None
    if not alg.privacy_preserving and not spec.allow_not_private:
        raise JobRefused(422, f"{alg.name} is not privacy-preserving (its uploads reveal "
                              "ratings); set allow_not_private to run it anyway")
    if len(set(spec.tenant_ids)) != len(spec.tenant_ids) or not spec.tenant_ids:
        raise JobRefused(422, "tenant_ids must be a non-empty list without duplicates")
    if set(spec.agents) - set(spec.tenant_ids):
        extra = sorted(set(spec.agents) - set(spec.tenant_ids))
        raise JobRefused(422, "invalid agents: every agent must be one of the job's tenants; "
                              f"not in tenant_ids: {', '.join(map(str, extra))}")
    if (spec.agents and isinstance(request, dict) and user_level.is_user_level(request)
            and request.get("placement", "central") == "central"):
        raise JobRefused(422, "invalid privacy.placement: agent tenants noise their own "
                              "uploads, so a job with agents needs placement 'tenant' (with "
                              "'central' an agent would send its un-noised bounded sum and "
                              "the coordinator could read its users' contributions)")
    if (isinstance(request, dict) and user_level.is_user_level(request)
            and request.get("secure_aggregation")):
        hosted = sorted(set(spec.tenant_ids) - set(spec.agents))
        if hosted:
            raise JobRefused(422, "invalid privacy.secure_aggregation: every tenant must be "
                                  "an agent (the masking and the noise run in fedrec agent); "
                                  f"hosted tenants: {', '.join(map(str, hosted))}")
        if request.get("placement", "central") != "tenant":
            raise JobRefused(422, "invalid privacy.secure_aggregation: needs placement "
                                  "'tenant'")
        if len(spec.tenant_ids) < 2 or spec.per_round == 1:
            raise JobRefused(422, "invalid privacy.secure_aggregation: a round needs at least "
                                  "2 tenants to hide one among (tenant_ids and per_round)")
        if spec.wire != "float64":
            raise JobRefused(422, "invalid wire: secure aggregation encodes the uploads in "
                                  "fixed point itself; use float64")
    _validation_fraction(spec, alg, dp)
    if isinstance(dp, dict) and registry.user_bounds(alg.name, cfg) is None:
        raise JobRefused(422, f"invalid privacy.unit: {alg.name} cannot protect a user (its "
                              "uploads are not sums of per-user bounded terms); use dpals, "
                              "dp-fedmavg or dp-fedmc-admm, or the tenant unit through dp")
    return alg, cfg, dp


def _private(alg: Algorithm, dp: Any) -> bool:
    """Whether a job with these settings carries a DP guarantee (user or tenant unit)."""
    if isinstance(dp, dict):
        return True
    return dp.mechanism != "none" and alg.privacy_preserving


def _validation_fraction(spec: JobSpec, alg: Algorithm, dp: Any) -> float:
    """The job's validation carve-out (:attr:`JobSpec.validation_fraction`); 422 for one a
    DP job or a job with agents cannot have."""
    from app.training.selection import DEFAULT_FRACTION

    private, agents = _private(alg, dp), bool(spec.agents)
    if spec.validation_fraction is None:
        return 0.0 if private or agents else DEFAULT_FRACTION
    if spec.validation_fraction > 0 and private:
        raise JobRefused(422, "invalid validation_fraction: a differentially private job "
                              "cannot choose its run length on the tenants' validation "
                              "ratings (an uncharged, data-dependent release); use 0")
    if spec.validation_fraction > 0 and agents:
        raise JobRefused(422, "invalid validation_fraction: agent tenants keep their "
                              "ratings, so no carve-out can be scored here; use 0")
    return float(spec.validation_fraction)


#: a job that names no privacy: users protected at this target, as DPALS meets it on
#: MovieLens (central placement, delta 1e-6)
DEFAULT_USER_PRIVACY = {"unit": user_level.USER, "placement": "central", "epsilon": 8.0,
                        "delta": 1e-6}
#: ... and, for an algorithm that cannot bound a user, the tenant unit's default noise
DEFAULT_TENANT_DP = {"mechanism": "gaussian", "noise_multiplier": 1.0}


def _default_privacy(alg: Algorithm, cfg: Any) -> dict[str, Any]:
    """The privacy of a job that names none: the user unit when the algorithm can bound a
    user, else the tenant unit's default."""
    if registry.user_bounds(alg.name, cfg) is not None:
        return dict(DEFAULT_USER_PRIVACY)
    return dict(DEFAULT_TENANT_DP)


def _public_scale(alg: Algorithm, cfg: Any, request: dict[str, Any],
                  scale: tuple[float, float]) -> Any:
    """``cfg`` with the tenants' declared rating scale as its public scale, for a config
    that takes one (DPALS: ``scale_min``/``scale_max`` set its centre and rating clip, and
    so the per-user sensitivity) and was not given one: the declared scales are public,
    the data's own range is not (:func:`algorithms.scale.with_public_scale`)."""
    return with_public_scale(cfg, request, scale)


def _catalogue(s: Session, registered_only: bool = False) -> np.ndarray:
    return store.catalogue_ids(s, registered_only)


#: why a differentially private job's catalogue is the registered items only
REGISTERED_ONLY = ("a differentially private job trains on and serves only the items an "
                   "admin registered (PUT /v1/admin/items); items created by uploads "
                   "(auto_create_items) are left out, with their ratings, because their "
                   "existence is a function of a user's rating")


def has_guarantee(alg: Algorithm, dp: Any) -> bool:
    """Whether a job with privacy settings ``dp`` (a user-level dict or a
    :class:`DPSpec`) gives a differential privacy guarantee: noise, and an algorithm whose
    uploads do not reveal ratings whatever the noise."""
    if isinstance(dp, dict):
        return user_level.is_user_level(dp) or (
            dp.get("mechanism") != "none" and alg.privacy_preserving)
    return dp.mechanism != "none" and alg.privacy_preserving


def _tenant_block(s: Session, tenant: Tenant, registered_only: bool = False,
                  catalogue: np.ndarray | None = None) -> tuple[RatingBlock, np.ndarray]:
    """One tenant's ratings, sorted by (user, item) so the split is reproducible
    (``registered_only``: of the registered items only, :data:`REGISTERED_ONLY`;
    ``catalogue``: over these item ids, read earlier, instead of the catalogue now)."""
    block, user_keys = store.load_block(s, tenant.id, registered_only, catalogue)
    if block.nnz == 0:
        raise _no_ratings(tenant, registered_only)
    return dry_round.sorted_block(block), user_keys


def snapshot_blocks(s: Session, tenants: list[Tenant]) -> tuple[list[RatingBlock],
                                                                 list[np.ndarray], np.ndarray]:
    """Every tenant's ratings (:func:`_tenant_block`) and the catalogue's item ids."""
    read = [_tenant_block(s, t) for t in tenants]
    return [b for b, _ in read], [k for _, k in read], _catalogue(s)


def _without_views(block: RatingBlock) -> RatingBlock:
    """The same block (the same arrays) without the CSR/CSC views and compact copy a round
    cached on it: about 2.3x the block's own arrays, which nothing reads again here. A copy
    of the dataclass's fields carries every field (the secret user draws too) and none of
    the cached properties."""
    return dataclasses.replace(block)


def _heap_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover - not glibc
        return None
    return getattr(libc, "malloc_trim", None)


_MALLOC_TRIM = _heap_trim()


def release_memory() -> bool:
    """Give the free pages of the process's heaps back to the system (glibc's
    ``malloc_trim(0)``, every thread's arena; False where there is no glibc). Job creation
    calls it after the dry round and after each tenant's block is written: numpy arrays
    under glibc's (risen) mmap threshold come from the heap, and the freed pages of one
    tenant's block, or of the dry round's thread, would otherwise stay resident while the
    next is read. Only freed memory is released; no allocation setting changes."""
    if _MALLOC_TRIM is None:  # pragma: no cover - not glibc
        return False
    _MALLOC_TRIM(0)
    return True


def _no_ratings(tenant: Tenant, registered_only: bool) -> JobRefused:
    what = "ratings of registered items" if registered_only else "ratings"
    return JobRefused(422, f"tenant {tenant.id} ({tenant.name}) has no {what} to train on"
                      + (f" ({REGISTERED_ONLY})" if registered_only else ""))


def _rated(s: Session, tenants: list[Tenant], registered_only: bool = False
           ) -> dict[int, int]:
    """How many users with ratings (of registered items, with ``registered_only``) each
    tenant has (one query; absent: none). Refuses (422) the first tenant without any, as
    reading its block would."""
    query = (sa.select(User.tenant_id, sa.func.count(sa.distinct(Rating.user_id)))
             .join(User, User.id == Rating.user_id)
             .where(User.tenant_id.in_([t.id for t in tenants])).group_by(User.tenant_id))
    if registered_only:
        query = query.join(Item, Item.id == Rating.item_id).where(Item.origin == REGISTERED)
    users = dict(s.execute(query).all())
    for t in tenants:
        if not users.get(t.id):
            raise _no_ratings(t, registered_only)
    return users


def _read(s: Session, spec: JobSpec, alg: Algorithm, cfg: Any, private: bool,
          size: bool = True) -> tuple[list[Tenant], list[int], dict[int, int], np.ndarray]:
    """The job's tenants (404 for an unknown one), the indices of the hosted ones, how
    many users with ratings each hosted tenant has (422 for none), the catalogue's item
    ids (422 when empty), and the config sized against them (:func:`_check_size`; not
    again with ``size`` False, for a read that repeats one that sized it)."""
    tenants = [s.get(Tenant, t, populate_existing=True) for t in spec.tenant_ids]
    missing = [t for t, row in zip(spec.tenant_ids, tenants, strict=True) if row is None]
    if missing:
        raise JobRefused(404, f"unknown tenant id(s): {', '.join(map(str, missing))}")
    agents = set(spec.agents)
    hosted = [i for i, t in enumerate(tenants) if t.id not in agents]
    users = _rated(s, [tenants[i] for i in hosted], private)
    item_ids = _catalogue(s, private)
    if not len(item_ids):
        raise JobRefused(422, "the item catalogue is empty: add items before training" if
                         not private else f"no registered items: {REGISTERED_ONLY}")
    if size:
        _check_size(s, alg, cfg, len(item_ids), [tenants[i] for i in hosted[:1]])
    return tenants, hosted, users, item_ids


def create_job(s: Session, spec: JobSpec, idempotency: tuple[str, str] | None = None,
               dry_run: bool = False) -> TrainingJob | JobPlan:
    """Validate, check every tenant's budget, snapshot the ratings and initialise the job
    (``dry_run``: stop after the checks and return the :class:`JobPlan`, writing nothing).

    The ratings of all tenants are read in one REPEATABLE READ transaction on PostgreSQL,
    so the job trains on one consistent snapshot while uploads continue. They are read,
    split and stored one tenant at a time (each tenant's rows are flushed before the next
    is read), so the memory this takes is about one tenant's block, not the federation's.
    ``idempotency`` is the (Idempotency-Key, request hash) stored with the job; a
    concurrent creation with the same key fails the commit (IntegrityError) and creates
    nothing.
    """
    alg, cfg, dp = _validated(spec)
    spec = fit_rounds(alg, cfg, spec)
    private = has_guarantee(alg, dp)
    tried = None
    if spec.dry_rounds is not None:
        # checked, then tried by a worker, before the snapshot begins: no transaction (nor
        # pooled connection) is held while the worker answers
        tenants, hosted, _, tried_items = _read(s, spec, alg, cfg, private)
        scale = (min(t.rating_min for t in tenants), max(t.rating_max for t in tenants))
        i = hosted[0] if hosted else 0
        request = DryRound(
            algorithm=alg.name, config=_public_scale(alg, cfg, spec.config, scale).model_dump(
                mode="json"), seed=spec.seed, n_clients=len(tenants), client=i,
            tenant_id=tenants[i].id if hosted else None, registered_only=private,
            test_fraction=spec.test_fraction, scale=scale,
            tenant_scale=(tenants[i].rating_min, tenants[i].rating_max),
            fraction=_validation_fraction(spec, alg, dp), user_level=isinstance(dp, dict),
            items=tried_items.tolist(),
            seconds=spec.dry_round_seconds or DEFAULT_DRY_ROUND_SECONDS)
        s.rollback()
        tried = _dry_run(spec.dry_rounds, request)
    if s.get_bind().dialect.name == "postgresql":
        if s.in_transaction():  # the isolation level can only be chosen as one begins
            s.commit()
        s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    # sized once: the read before the dry round counted the first tenant's ratings already
    tenants, hosted, users, item_ids = _read(s, spec, alg, cfg, private, tried is None)
    # the job's catalogue is the one its dry round tried (the upload's shapes are its)
    catalogue = None if tried is None else tried_items
    item_ids = item_ids if catalogue is None else catalogue
    agents = set(spec.agents)
    scale = (min(t.rating_min for t in tenants), max(t.rating_max for t in tenants))
    cfg = _public_scale(alg, cfg, spec.config, scale)
    server, glob = initialise_server(alg, cfg, len(item_ids), len(tenants), spec.seed)

    draws_key = new_key() if isinstance(dp, dict) else None  # user level: secret caps
    fraction = _validation_fraction(spec, alg, dp)

    def inputs(i: int) -> tuple[RatingBlock, RatingBlock, np.ndarray, Any]:
        block, keys = _tenant_block(s, tenants[i], private, catalogue)
        return (*tenant_inputs(alg, cfg, glob, block, keys, i, tenants[i].id, spec.seed,
                               spec.test_fraction, scale, fraction, draws_key), keys)

    per_round = spec.per_round or len(tenants)
    first = None
    if tried is not None:  # a worker tried round 1 (above)
        size, schema = tried
    elif hosted:
        i = hosted[0]
        train, test, local, keys = inputs(i)
        first = (train, test, keys, local)
        release_memory()  # what reading the block freed, before the round adds its own
        size, schema = _dry_run(None, functools.partial(
            dry_round.round_one, alg, cfg, spec.seed, server, glob, local, train, test,
            (tenants[i].rating_min, tenants[i].rating_max), i), spec.dry_round_seconds)
        # kept until it is written, without the CSR/CSC views the round cached on it
        first = (_without_views(train), *first[1:])
        del train, test, keys, local
    else:  # nobody's ratings here: the config is tried on a public stand-in block
        public = stand_in(len(item_ids), scale)
        local = initialise_client(alg, cfg, public, glob, spec.seed, 0)
        size, schema = _dry_run(None, functools.partial(
            dry_round.round_one, alg, cfg, spec.seed, server, glob, local, public, public,
            scale, 0), spec.dry_round_seconds)
        del local
    release_memory()  # the dry round's arrays, freed on its thread's heap
    if isinstance(dp, dict):
        # agents' users are not counted here (their number is theirs to keep)
        n_users = sum(users[tenants[i].id] for i in hosted)
        settings, projected, reserve = _check_user_level(s, alg, cfg, spec, dp, n_users,
                                                         glob, per_round, len(tenants))
    else:
        projected, reserve = _check_budgets(s, alg, spec, dp, size, glob, per_round,
                                            tenants)
        settings = dp.model_dump()
    if dry_run:
        s.rollback()  # nothing was written; end the snapshot transaction
        return JobPlan(alg.name, settings, _projections(s, spec.tenant_ids, projected))
    key, digest = idempotency or (None, None)
    job = TrainingJob(
        status="queued", algorithm=alg.name, config=cfg.model_dump(), dp=settings,
        rounds=spec.rounds, per_round=per_round, seed=spec.seed,
        test_fraction=spec.test_fraction, tenant_ids=list(spec.tenant_ids),
        item_ids=item_ids_bytes(item_ids), current_round=0,
        parent_job_id=spec.parent_job_id,
        ratings_version={str(t.id): t.ratings_version for t in tenants},
        idempotency_key=key, request_hash=digest, max_attempts=spec.max_attempts,
        reserved=as_reserved(reserve),
        agents=None if not agents else {
            "tenants": [t for t in spec.tenant_ids if t in agents],
            "round_seconds": float(spec.round_seconds), "wire": spec.wire,
            "upload": schema},
        validation_fraction=fraction, pair_job_id=spec.pair_job_id,
        serving={"policy": spec.lists},
        selection=initial_selection(alg.name, fraction, _private(alg, dp), bool(agents)))
    states.store_global(job, glob)
    s.add(job)
    s.flush()
    states.new_server(s, job, server)
    del server  # written: not held while the tenants' blocks are read (FedMC-ADMM's C is
    # tenants x items x (rank + 1) values, 17.6 MB at 20 tenants and 10k items)
    placeholder = agent_placeholder(len(item_ids))  # an agent's ratings stay with it
    for i, t in enumerate(tenants):
        if t.id in agents:  # and so does its state
            train, test = tenant_split(placeholder, i, spec.seed, spec.test_fraction, scale)
            keys, local = np.array([], dtype=str), None
        elif first is not None and i == hosted[0]:
            (train, test, keys, local), first = first, None
        else:
            train, test, local, keys = inputs(i)
        train_bytes, test_bytes = train.to_bytes(), test.to_bytes()
        s.add(JobClient(job_id=job.id, client_index=i, tenant_id=t.id,
                        user_keys=[str(k) for k in keys],
                        train_block=train_bytes, test_block=test_bytes,
                        train_digest=states.digest(train_bytes),
                        test_digest=states.digest(test_bytes),
                        state_round=None if local is None else 0,
                        state_digest=None if local is None
                        else states.stage_local(s, job.id, i, 0, local,
                                                            remember=False),
                        transmissions=0))
        s.flush()  # written: the session keeps no strong reference to the bytes
        # nor does this loop while the next tenant is read: one block in memory at a time
        del train, test, keys, local, train_bytes, test_bytes
        release_memory()
    s.commit()
    _confirm(s, job)
    return job


def _confirm(s: Session, job: TrainingJob) -> None:
    """Settle a race with another creation on the same tenants (see
    :mod:`app.training.reservations`): withdraw this job (409) when its reservation no
    longer fits next to the others committed meanwhile."""
    why = over_budget(s, job)
    if why is None:
        s.commit()  # releases the tenants' lock
        return
    s.execute(sa.delete(TrainingJob).where(TrainingJob.id == job.id))  # under the lock
    s.commit()
    raise JobRefused(409, why)


#: config fields that size the model (factor rows) and that multiply a round's work
RANK_FIELDS = ("rank", "k")
STEP_FIELDS = ("inner_steps", "q1", "q2", "q_hat", "iterations")
#: what one job's model may take in memory (its global model, server state and a round's
#: copies of them), and the work of its dry round: (ratings + items) x d^2 x steps
MAX_MODEL_BYTES = 2 << 30
MAX_ROUND_WORK = 2e11


def _check_size(s: Session, alg: Algorithm, cfg: Any, n_items: int,
                first: list[Tenant]) -> None:
    """422 naming the config field before anything is allocated or run: the model must fit
    in :data:`MAX_MODEL_BYTES` (n_items x d, x d again for per-item Gram blocks, 4 copies)
    and the dry round's estimated work in :data:`MAX_ROUND_WORK`, with d = rank + 2 and
    the first hosted tenant's ratings (the block the dry round trains on)."""
    values = cfg.model_dump()
    rank = next((f for f in RANK_FIELDS if isinstance(values.get(f), int)), None)
    d = values[rank] + 2 if rank else 2
    bounds = registry.user_bounds(alg.name, cfg)
    model = 4 * 8 * n_items * d * (d if bounds is not None and bounds.gram else 1)
    if rank and model > MAX_MODEL_BYTES:
        raise JobRefused(422, f"invalid config.{rank}: {values[rank]} over {n_items} items "
                              f"needs about {model / 2**30:.3g} GiB for the model; at most "
                              f"{MAX_MODEL_BYTES / 2**30:g} GiB")
    nnz = _n_ratings(s, first[0]) if first else 4
    steps = {f: values[f] for f in STEP_FIELDS if isinstance(values.get(f), int)
             and values[f] > 0}
    work = (nnz + n_items) * d * d * max(1, sum(steps.values()))
    if work > MAX_ROUND_WORK:
        field = (rank if rank and (nnz + n_items) * d * d > MAX_ROUND_WORK or not steps
                 else max(steps, key=steps.get))
        raise JobRefused(422, f"invalid config.{field}: a round would do about {work:.3g} "
                              f"units of work ((ratings + items) x (rank + 2)^2 x steps); "
                              f"at most {MAX_ROUND_WORK:.3g}")


def _n_ratings(s: Session, tenant: Tenant) -> int:
    return int(s.scalar(sa.select(sa.func.count()).select_from(Rating).join(
        User, User.id == Rating.user_id).where(User.tenant_id == tenant.id)) or 0)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """What a job would do, without doing it: its privacy settings (the noise solved for
    the target) and each tenant's epsilon spent so far and after the job."""

    algorithm: str
    privacy: dict[str, Any]
    tenants: dict[str, dict[str, Any]]


def _projections(s: Session, tenant_ids: list[int], projected: dict[str, Spend]
                 ) -> dict[str, dict[str, Any]]:
    ledger = load_ledger(s, tenant_ids)
    out = {}
    for t in tenant_ids:
        spent, budget = ledger.spent(t).epsilon, ledger.budget(t)
        after = projected[str(t)].epsilon if str(t) in projected else spent
        out[str(t)] = {"epsilon_spent": _finite(spent), "epsilon_after": _finite(after),
                       "epsilon_max": budget.epsilon_max, "delta": budget.delta}
    return out


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "infinity"


def agent_placeholder(n_items: int) -> RatingBlock:
    """The stored block of an agent tenant: none of its ratings (they stay with it)."""
    empty = np.zeros(0, dtype=np.int64)
    return RatingBlock(empty, empty, np.zeros(0), 0, n_items)


#: the dry round's bound when none is set but a worker runs it (the API always sets one)
DEFAULT_DRY_ROUND_SECONDS = 30.0


def _dry_run(remote: Callable[[DryRound], Outcome] | None, work: Any,
             seconds: float | None = None) -> tuple[int, dict[str, Any] | None]:
    """The dry round's answer (:mod:`app.training.dry_round`): ``work`` run here (a
    callable, within ``seconds`` of wall clock; None: unbounded), or, with ``remote``,
    the :class:`DryRound` ``work`` run by a worker. Returns the number of values of an
    upload and its schema; a failing or overrunning round is refused (422), a round no
    worker answered is 503."""
    if remote is not None:
        kind, value = remote(work)
    elif seconds is None:
        kind, value = dry_round.outcome(work)
    else:
        kind, value = dry_round.within(work, seconds)
    if kind == "refused":
        raise JobRefused(*value)
    if kind == "error":
        raise JobRefused(422, f"invalid config: round 1 fails with these settings "
                              f"({value[0]}: {value[1]})")
    size, schema = value
    return int(size), schema


def _check_user_level(s: Session, alg: Algorithm, cfg: Any, spec: JobSpec,
                      request: dict[str, Any], n_users: int, glob, per_round: int,
                      n_clients: int) -> tuple[dict[str, Any], dict[str, Spend], dict]:
    """Plan a user-level job: solve its noise for the target over the releases each user
    takes part in, and refuse it (409) unless every tenant can afford that schedule.

    Returns the settings the job stores, each tenant's projection and its planned events
    (the job's reservation). A release is one
    round's upload of a tenant's users; a user takes part in at most as many as its tenant
    transmits (and DPALS and the gradient methods stop uploading after their sweeps /
    releases)."""
    bounds = registry.user_bounds(alg.name, cfg)
    plan = planned_transmissions(alg, spec.rounds, per_round, spec.seed, n_clients, glob)
    releases = min(max(plan.values()), registry.user_releases(cfg, spec.rounds))
    try:
        planned = user_level.plan(request, bounds, max(1, n_users), max(releases, 1))
        events = list(planned.planned_events())
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        # a field's own error has its name in loc; the spec's cross-field checks (delta
        # against the number of users) name the field first in the message
        name = str(first["loc"][0]) if first["loc"] else msg.split()[0]
        field = {"epsilon": "target_epsilon"}.get(name, name)
        raise JobRefused(422, f"invalid privacy.{field}: {msg}") from None
    try:
        projected = check_schedule(budget_ledger(s, spec.tenant_ids), spec.tenant_ids,
                                   events)
    except BudgetExceeded as exc:
        raise JobRefused(409, str(exc)) from None
    return user_level.to_settings(planned), projected, {t: events for t in spec.tenant_ids}


def _check_budgets(s: Session, alg: Algorithm, spec: JobSpec, dp: DPSpec, size: int, glob,
                   per_round: int, tenants: list[Tenant]) -> tuple[dict[str, Spend], dict]:
    """409 unless every tenant can afford its planned transmissions on top of past jobs'
    charges and what other accepted jobs reserved (:mod:`app.training.reservations`);
    a job without a DP guarantee needs every transmitting tenant's opt-in instead, and
    is charged as epsilon = infinity. Returns each transmitting tenant's projection and
    its planned events (the job's reservation)."""
    plan = planned_transmissions(alg, spec.rounds, per_round, spec.seed, len(tenants), glob)
    tenant_plan = {spec.tenant_ids[i]: n for i, n in plan.items() if n}
    event = transmission_event(dp, size, alg.privacy_preserving)
    try:
        return (check_plan(budget_ledger(s, spec.tenant_ids), tenant_plan, event),
                {t: [event.times(n)] for t, n in tenant_plan.items()})
    except BudgetExceeded as exc:
        raise JobRefused(409, str(exc)) from None
    except NotPrivateRefused as exc:
        names = {str(t.id): t.name for t in tenants}
        who = ", ".join(f"{t} ({names[t]})" for t in exc.tenants)
        why = ("dp mechanism 'none' sends their uploads without noise"
               if dp.mechanism == "none" else
               f"{alg.name} uploads reveal their ratings whatever the noise")
        raise JobRefused(409, f"tenant(s) {who} did not opt in to non-private training "
                              f"(allow_non_private is false): {why}") from None


def job_for_key(s: Session, key: str, digest: str) -> TrainingJob | None:
    """The job created earlier with this ``Idempotency-Key``, or None; 422 when the key
    was used with a different body, or is empty or too long (see app/idempotency.py)."""
    try:
        return row_for_key(s, TrainingJob, key, digest, "job")
    except IdempotencyError as exc:
        raise JobRefused(422, str(exc)) from None


def discard_job(s: Session, job_id: int) -> None:
    """Delete a job that could not be started (its rows cascade; it charged nothing yet),
    so an error answer leaves no job behind for the watchdog to run later."""
    s.rollback()
    s.execute(sa.delete(TrainingJob).where(TrainingJob.id == job_id))
    s.commit()


def cancel_job(s: Session, job: TrainingJob) -> bool:
    """Stop a queued or running job after its current round; False if already finished."""
    if job.status not in ("queued", "running", "failed"):
        return False
    job.status = "cancelled"
    s.commit()
    return True



#: the default job (no algorithm named): a ranking model serves the lists, a rating model
#: predicts ratings and feeds the RMSE report (docs/explanation/ranking-vs-rating.md)
DEFAULT_RANKING = "dp-ials"
DEFAULT_RATING = "dpals"


def default_pair(spec: JobSpec, rounds_given: bool = True) -> list[JobSpec]:
    """The jobs of a request that names no algorithm: the ranking model first, then the
    rating model (``spec`` with :data:`DEFAULT_RATING`), each at half the user-level
    privacy target, so the pair together stays within it (basic composition); only the
    rating model while no ranking model is registered. Unless ``rounds_given``, each
    runs its algorithm's recommended rounds (its sweeps and a last user solve)."""
    if DEFAULT_RANKING not in registry.names():
        return [spec]
    if spec.config:
        raise JobRefused(422, "invalid config: the default job trains two models "
                              f"({DEFAULT_RANKING} and {DEFAULT_RATING}); name the algorithm "
                              "the config is for")
    dp = spec.dp
    if dp is None or user_level.is_user_level(dp):
        target = dict(DEFAULT_USER_PRIVACY if dp is None else dp)
        dp = {**target, "epsilon": float(target["epsilon"]) / 2}
    def rounds(name: str) -> int:
        return spec.rounds if rounds_given else int(registry.get(name).run_defaults["rounds"])

    # rounds asked of the pair bound both jobs: each is cut to the rounds its algorithm
    # uses (fit_rounds), never refused for a partner that uses more
    return [dataclasses.replace(spec, algorithm=name, dp=dp, rounds=rounds(name),
                                rounds_given=False)
            for name in (DEFAULT_RANKING, DEFAULT_RATING)]


def create_jobs(s: Session, specs: list[JobSpec],
                idempotency: tuple[str, str] | None = None) -> TrainingJob:
    """Create one job, or the default pair (:func:`default_pair`) linked to each other;
    returns the first (the ranking model of a pair). A pair is created whole or not at
    all: when the second is refused, the first is deleted before the refusal propagates."""
    first = create_job(s, specs[0], idempotency)
    if len(specs) == 1:
        return first
    try:
        second = create_job(s, dataclasses.replace(specs[1], pair_job_id=first.id))
    except BaseException:
        discard_job(s, first.id)
        raise
    first = s.get(TrainingJob, first.id)
    first.pair_job_id = second.id
    s.commit()
    return first


def plan_jobs(s: Session, specs: list[JobSpec]) -> JobPlan:
    """The dry run of :func:`create_jobs`: a pair's plan is the first job's, with the
    second's privacy under ``privacy.pair`` and each tenant's ``epsilon_after`` counting
    both jobs' spend (added: basic composition, an upper bound)."""
    plans = [create_job(s, spec, dry_run=True) for spec in specs]
    if len(plans) == 1:
        return plans[0]
    first, second = plans
    tenants = {}
    for t, row in first.tenants.items():
        spent, extra = row["epsilon_spent"], second.tenants[t]["epsilon_after"]
        both = [row["epsilon_after"], extra, spent]
        after = ("infinity" if any(isinstance(x, str) for x in both)
                 else row["epsilon_after"] + extra - spent)
        tenants[t] = {**row, "epsilon_after": after}
    privacy = {**first.privacy, "pair": {"algorithm": second.algorithm,
                                         "privacy": second.privacy}}
    return JobPlan(f"{first.algorithm}+{second.algorithm}", privacy, tenants)
