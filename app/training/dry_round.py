"""The dry round: round 1 of a new job's first tenant, run and thrown away before the job
is stored.

A config that validates but makes a step raise (e.g. RFRec's ``link='sigmoid'``, whose
predictions are no factor product to serve), or whose round 1 runs past
``FEDREC_DRY_ROUND_SECONDS``, is refused with 422 at once instead of failing in a worker.
The round also gives the number of values of an upload (the DP event's size) and the
upload's :func:`upload_schema` (what agents must send).

**Where it runs.** With a broker (production), in a Celery worker, where the rest of the
numeric work runs: the API sends a :class:`DryRound` (ids, the config and the catalogue's
item ids; no rating, no secret) ahead of queued training tasks
(:data:`app.queue.TRAINING_PRIORITY`) and holds no database transaction while it waits;
the worker reads the tenant's block from the database itself and answers. The API process
then never runs the round's compiled kernels nor holds its arrays. The bound counts a
worker's start and, from there, the round's own run (:func:`app.queue.ask`). Without a
broker (the embedded default) it runs in the calling process, on a thread of its own
within its bound; a retraining that beat starts inside a worker runs it there, on the
calling thread, unbounded. Both run :func:`round_one` on inputs made by
:func:`tenant_inputs`, the same function that makes the inputs the job stores.

Outcomes travel as values, ``("ok", (size, schema))``, ``("refused", (status, detail))``
or ``("error", (exception type, message))``, so they cross a thread or a broker alike;
:func:`app.training.jobs._dry_run` turns them into the API's answer.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from algorithms import RatingBlock, registry
from algorithms.base import Algorithm
from algorithms.data import tenant_split
from algorithms.simulate import (
    client_round,
    initialise_client,
    initialise_server,
    server_round,
    tenant_errors,
)
from app import store
from app.training.selection import carve
from privacy.randomness import new_key, with_user_draws
from privacy.wrapper import n_entries

Outcome = tuple[str, Any]

TASK = "fedrec.training.dry_round"
"""The Celery task that runs a dry round in a worker (:func:`answer`)."""


def sorted_block(block: RatingBlock) -> RatingBlock:
    """``block`` sorted by (user, item), so a tenant's split is the same wherever its
    block was read."""
    order = np.lexsort((block.cols, block.rows))
    return RatingBlock(block.rows[order], block.cols[order], block.vals[order],
                       block.n_users, block.n_items)


def tenant_inputs(alg: Algorithm, cfg: Any, glob, block: RatingBlock, keys: np.ndarray,
                  client: int, tenant_id: int, seed: int, test_fraction: float,
                  scale: tuple[float, float], fraction: float,
                  draws_key: bytes | None) -> tuple[RatingBlock, RatingBlock, Any]:
    """One tenant's train and test blocks and its round-0 local state, as a job stores
    them: the seeded split, each user's cap drawn from ``draws_key`` (a secret; user-level
    jobs only), the validation carve-out left out of what it trains on."""
    train, test = tenant_split(block, client, seed, test_fraction, scale)
    if draws_key is not None:  # each user's cap drawn from a secret, not the seed
        train = with_user_draws(train, draws_key, tenant_id, [str(k) for k in keys])
    fit = carve(train, seed, client, fraction)[0]  # what the job trains on
    return train, test, initialise_client(alg, cfg, fit, glob, seed, client)


def stand_in(n_items: int, scale: tuple[float, float]) -> RatingBlock:
    """Two made-up users at the scale's midpoint: enough to try a config's round 1 when
    every tenant is an agent (no real rating is here to try it on)."""
    cols = np.arange(min(n_items, 4), dtype=np.int64)
    rows = np.arange(len(cols), dtype=np.int64) % 2
    mid = np.full(len(cols), (scale[0] + scale[1]) / 2)
    return RatingBlock(rows, cols, mid, 2, n_items).with_scale(scale)


def upload_schema(upload) -> dict[str, Any]:
    """What an agent's upload must look like: message type, array names, shapes, dtypes,
    and its scalar fields as round 1 gave them (their JSON types are the ones accepted)."""
    cls = type(upload)
    arrays = upload.arrays()
    return {"type": f"{cls.__module__}.{cls.__qualname__}",
            "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)}
                       for k, v in arrays.items()},
            "scalars": {f.name: getattr(upload, f.name) for f in dataclasses.fields(upload)
                        if f.name not in arrays}}


def round_one(alg: Algorithm, cfg: Any, seed: int, server, glob, local, train: RatingBlock,
              test: RatingBlock, scale: tuple[float, float], client: int
              ) -> tuple[int, dict[str, Any] | None]:
    """Round 1 of one tenant, unprivatised and discarded: its client step, the server step
    on its upload, the evaluation and the serving factors, as the pipeline runs them.
    Returns the upload's number of values and :func:`upload_schema` (1 and None: round 1
    uploads nothing)."""
    local_1, upload = client_round(alg, cfg, 1, seed, client, glob, local, train)
    uploads = {} if upload is None else {0: upload}
    # the new server state is dropped at once, not held through the evaluation (at
    # 20 tenants x 10k items, FedMC-ADMM's copy of C is 17.6 MB)
    glob_1 = server_round(alg, cfg, 1, seed, server, uploads)[1]
    tenant_errors(alg, glob_1, local_1, test, scale)
    alg.objective(glob_1, local_1, train, cfg)
    alg.factors(glob_1, local_1)
    if upload is None:
        return 1, None
    return n_entries(upload), upload_schema(upload)


def outcome(work: Callable[[], Any]) -> Outcome:
    """``work()``'s result as ("ok", result), or its failure as ("error", (exception
    type, message)): any failure of a step is the config's."""
    try:
        return "ok", work()
    except Exception as exc:  # noqa: BLE001 - any failure of a step is the config's
        return "error", (type(exc).__name__, str(exc))


def too_long(seconds: float) -> Outcome:
    return "refused", (422, f"invalid config: round 1 takes longer than the dry-run bound "
                            f"of {seconds:g} s (FEDREC_DRY_ROUND_SECONDS) with these "
                            f"settings on this data; a smaller rank or fewer steps fit")


#: dry rounds that may run at once in one process, the overrunning ones included (a
#: thread cannot be stopped: one past its bound runs to its end, holding its slot)
MAX_DRY_ROUNDS = 2
_dry_slots = threading.BoundedSemaphore(MAX_DRY_ROUNDS)


def within(work: Callable[[], Any], seconds: float) -> Outcome:
    """:func:`outcome` of ``work()`` on a thread of its own, answered within ``seconds``
    of wall clock (the wait for a slot included), or 422 naming the bound once it has run
    that long (the request returns; the round finishes on its thread and is discarded).
    503 while :data:`MAX_DRY_ROUNDS` rounds are running throughout."""
    deadline = time.monotonic() + seconds
    if not _dry_slots.acquire(timeout=seconds):
        return "refused", (503, f"{MAX_DRY_ROUNDS} dry rounds are running already; retry "
                                f"in a few seconds (each is bounded by "
                                f"FEDREC_DRY_ROUND_SECONDS = {seconds:g} s)")
    box: dict[str, Any] = {}

    def wait() -> None:  # runs the round; its slot is held until it ends
        try:
            box["outcome"] = outcome(work)
        finally:
            _dry_slots.release()

    waiter = threading.Thread(target=wait, name="fedrec-dry-round", daemon=True)
    waiter.start()
    waiter.join(max(deadline - time.monotonic(), 0.0))
    if waiter.is_alive():
        return too_long(seconds)
    # a round that died of a BaseException (not the config's failure) left no outcome
    return box.get("outcome", ("error", ("interrupted", "the dry round did not finish")))


@dataclasses.dataclass(frozen=True)
class DryRound:
    """What a worker needs to run a job's dry round (JSON: no rating, no secret). The
    worker reads the tenant's ratings itself, over the catalogue the API read (``items``,
    so the upload's shapes are the job's), and draws fresh secret user caps of its own
    (the round is discarded; the job's are drawn where it is stored)."""

    algorithm: str
    config: dict[str, Any]
    seed: int
    n_clients: int
    client: int
    tenant_id: int | None
    """None: every tenant is an agent; the round runs on :func:`stand_in`."""
    registered_only: bool
    test_fraction: float
    scale: tuple[float, float]
    """The job's rating scale (the split's); the tenant's own is ``tenant_scale``."""
    tenant_scale: tuple[float, float]
    fraction: float
    user_level: bool
    items: list[int]
    seconds: float


def answer(s: Session, request: DryRound) -> Outcome:
    """Run ``request`` here (a worker's side): read the tenant's block, then run
    :func:`round_one` on it. A tenant whose ratings went meanwhile is refused (422); a
    failure to read (the database down) raises, as any task's would."""
    alg = registry.get(request.algorithm)
    items = np.asarray(request.items, dtype=np.int64)
    scale = (float(request.scale[0]), float(request.scale[1]))
    block = keys = None
    if request.tenant_id is not None:
        block, keys = store.load_block(s, request.tenant_id, request.registered_only,
                                       items)
        s.rollback()  # the read's transaction ends: no snapshot held through the round
        if block.nnz == 0:
            return "refused", (422, f"tenant {request.tenant_id} has no ratings to train "
                                    f"on any more")

    def work() -> tuple[int, dict[str, Any] | None]:
        nonlocal block
        cfg = alg.config(**request.config)
        server, glob = initialise_server(alg, cfg, len(items), request.n_clients,
                                         request.seed)
        if block is None:  # every tenant is an agent
            public = stand_in(len(items), scale)
            local = initialise_client(alg, cfg, public, glob, request.seed, 0)
            return round_one(alg, cfg, request.seed, server, glob, local, public, public,
                             scale, 0)
        train, test, local = tenant_inputs(
            alg, cfg, glob, sorted_block(block), keys, request.client, request.tenant_id,
            request.seed, request.test_fraction, scale, request.fraction,
            new_key() if request.user_level else None)
        block = None
        return round_one(alg, cfg, request.seed, server, glob, local, train, test,
                         (float(request.tenant_scale[0]), float(request.tenant_scale[1])),
                         request.client)

    return outcome(work)


def remote(celery) -> Callable[[DryRound], Outcome]:
    """The API's side with a broker: each request runs in a worker (:data:`TASK`), which
    answers within ``request.seconds`` or is given up on: a round a worker had started is
    too long (422), one no worker took is 503 (busy or no worker running)."""
    from app import queue

    def ask(request: DryRound) -> Outcome:
        state, value = queue.ask(celery, TASK, [dataclasses.asdict(request)],
                                 request.seconds)
        if state == "done" and isinstance(value, list) and len(value) == 2:
            kind, answer_ = value
            return kind, answer_
        if state == "running":
            return too_long(request.seconds)
        if state == "waiting":
            return "refused", (503, f"no worker started the dry round within "
                                    f"{request.seconds:g} s (FEDREC_DRY_ROUND_SECONDS): "
                                    f"the workers are busy, none is running, or they run "
                                    f"an older fedrec without the dry-round task; retry "
                                    f"later")
        if state == "failed" and value.startswith(("WorkerLostError", "TimeLimitExceeded")):
            # the round took its worker process down (its memory, most likely) or ran
            # past the hard limit: the config's, as a step's failure is
            return "error", (value.split(":")[0], "round 1 ended the worker process that "
                                                  "ran it")
        return "refused", (503, f"the worker running the dry round failed ({value}); "
                                f"retry later")

    return ask
