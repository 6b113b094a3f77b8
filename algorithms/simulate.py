"""The round engine: p clients and the server for R rounds, evaluated every round.

:func:`drive` owns the loop (select, client steps with their privatizer, aggregation, server
step, record, hooks); :class:`PerClient` is the default set of steps, and variants (RFRec's
all-clients-at-once path, federated clustering) plug in their own :class:`Steps` instead of
copying the loop. :func:`simulate` is the CLI's and the benchmarks' entry point.
The client half of a round is :func:`client_round` (local step, then the release through
the caller's privatizer) wherever it runs: here, in the service's client-step task and in
``fedrec agent``; the server half is :func:`step` over :class:`Staged` in the service.
This driver derives every public random stream exactly as the service does
(:mod:`algorithms.rng`), so
without privacy a seeded service job and a seeded simulation give the same numbers (privacy
noise and per-user sampling are fresh and secret, :mod:`privacy.randomness`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

import numpy as np

from algorithms import pool
from algorithms.base import Algorithm, predict
from algorithms.block import RatingBlock
from algorithms.data import Federation
from algorithms.messages import Message
from algorithms.rng import (
    SAMPLING,
    SERVER,
    client_init_rng,
    deferred_client_rng,
    derive_rng,
)

#: key under which an aggregated upload (a sum over tenants) reaches the server step
AGGREGATE = -1


class Privatizer(Protocol):
    """Wraps an upload before it leaves client ``client`` in round ``round_``.

    Returns the privatised upload, or ``None`` to stop that client transmitting (e.g. its
    budget is exhausted). Implemented by :mod:`privacy`; the algorithms never see it.
    """

    def __call__(self, upload: Message, client: int, round_: int) -> Message | None: ...


class Aggregator(Protocol):
    """Turns a round's uploads into what the server step receives (e.g. their sum with
    noise added once, for central user-level DP). Implemented by :mod:`privacy`."""

    def __call__(self, uploads: Mapping[int, Message], round_: int
                 ) -> Mapping[int, Message]: ...


@dataclasses.dataclass
class RoundRecord:
    round: int
    objective: float
    test_rmse: float
    test_mae: float
    seconds: float
    participants: int
    uploads: int
    upload_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SimulationResult:
    """What a run produced: the per-round history and the final states."""

    history: list[RoundRecord]
    global_msg: Message
    server_state: Message
    local_states: list[Message]

    @property
    def final(self) -> RoundRecord:
        return self.history[-1]


def tenant_errors(alg: Algorithm, global_msg: Message, local_state: Message,
                  block: RatingBlock, scale: tuple[float, float] | None = None
                  ) -> tuple[float, float, int]:
    """(sum of squared errors, sum of absolute errors, count) of one tenant's entries."""
    if block.nnz == 0:
        return 0.0, 0.0, 0
    pred = predict(alg, global_msg, local_state, block.rows, block.cols)
    if scale is not None:
        pred = np.clip(pred, *scale)
    err = pred - block.vals
    return float(err @ err), float(np.abs(err).sum()), block.nnz


def combine_errors(parts: Sequence[tuple[float, float, int]]) -> tuple[float, float]:
    """RMSE and MAE from per-tenant error sums, summed in tenant order."""
    sq = ab = 0.0
    n = 0
    for s, a, c in parts:
        sq, ab, n = sq + s, ab + a, n + c
    if n == 0:
        return float("nan"), float("nan")
    return float(np.sqrt(sq / n)), ab / n


def evaluate(alg: Algorithm, global_msg: Message, local_states: Sequence[Message],
             blocks: Sequence[RatingBlock], scale: tuple[float, float] | None = None
             ) -> tuple[float, float]:
    """RMSE and MAE over all entries of ``blocks`` (predictions clipped to ``scale``)."""
    return combine_errors([tenant_errors(alg, global_msg, s, b, scale)
                           for s, b in zip(local_states, blocks, strict=True)])


def total_objective(alg: Algorithm, global_msg: Message, local_states: Sequence[Message],
                    blocks: Sequence[RatingBlock], cfg: Any) -> float:
    return float(sum(alg.objective(global_msg, s, b, cfg)
                     for s, b in zip(local_states, blocks, strict=True)))


def select_clients(alg: Algorithm, global_msg: Message, n_clients: int, per_round: int,
                   seed: int, round_: int) -> np.ndarray:
    """S_k, drawn from the round's sampling stream."""
    return alg.select(global_msg, n_clients, per_round, derive_rng(seed, round_, SAMPLING))


def local_step(alg: Algorithm, cfg: Any, round_: int, seed: int, client: int,
               global_msg: Message, local_state: Message, block: RatingBlock
               ) -> tuple[Message, Message | None]:
    """The local half of client ``client``'s round: the algorithm's client step on the
    client's public stream, (new local state, upload before its release)."""
    return alg.client_step(global_msg, local_state, block, cfg,
                           deferred_client_rng(seed, round_, client))


def send(upload: Message | None, privatizer: Privatizer | None, client: int, round_: int
         ) -> Message | None:
    """The release half of client ``client``'s round: what leaves it, its upload through
    ``privatizer`` (privacy's "check budget, privatise, charge"); None when it has nothing
    to send or its budget refused the release."""
    if upload is None or privatizer is None:
        return upload
    return privatizer(upload, client, round_)


def client_round(alg: Algorithm, cfg: Any, round_: int, seed: int, client: int,
                 global_msg: Message, local_state: Message, block: RatingBlock,
                 privatizer: Privatizer | None = None) -> tuple[Message, Message | None]:
    """Client ``client``'s round: its local step, then the release of its upload; returns
    the new local state and what it sends.

    The one client half of a round: the in-process engine (:class:`PerClient`, which
    runs the two halves apart so the local steps can share threads while the releases
    keep the order of the selection), the service's client-step task and ``fedrec
    agent`` all go through it; the privatizer is theirs (the simulator's privatizers,
    or :class:`privacy.release.UploadRelease` on the tenant's ledger), the rule is
    privacy's."""
    local_state, up = local_step(alg, cfg, round_, seed, client, global_msg, local_state,
                                 block)
    return local_state, send(up, privatizer, client, round_)


def server_round(alg: Algorithm, cfg: Any, round_: int, seed: int, server_state: Message,
                 uploads: Mapping[int, Message]) -> tuple[Message, Message]:
    """The server step of round ``round_`` on the uploads only."""
    return alg.server_step(server_state, uploads, cfg, derive_rng(seed, round_, SERVER))


def initialise(alg: Algorithm, cfg: Any, blocks: Sequence[RatingBlock], seed: int
               ) -> tuple[Message, Message, list[Message]]:
    """Round-0 states: the server's and every client's, from the seed."""
    server_state, global_msg = initialise_server(alg, cfg, blocks[0].n_items, len(blocks), seed)
    local_states = [initialise_client(alg, cfg, b, global_msg, seed, i)
                    for i, b in enumerate(blocks)]
    return server_state, global_msg, local_states


def initialise_server(alg: Algorithm, cfg: Any, n_items: int, n_clients: int, seed: int
                      ) -> tuple[Message, Message]:
    """Round-0 server state and global message, from the seed."""
    return alg.init_server(n_items, n_clients, cfg, derive_rng(seed, 0, SERVER))


def initialise_client(alg: Algorithm, cfg: Any, block: RatingBlock, global_msg: Message,
                      seed: int, client: int) -> Message:
    """Round-0 local state of client ``client`` (run by the tenant that holds ``block``)."""
    return alg.init_client(block, global_msg, cfg, client_init_rng(seed, client))


@dataclasses.dataclass
class RoundState:
    """Where a run stands after round ``round`` (0: initialised), as the engine hands it to
    hooks. ``local_states`` is a list of client states for the per-client steps, or a
    variant's own representation (e.g. RFRec's stacked arrays); ``uploads`` are what the
    tenants sent this round (before any aggregator), ``previous_global`` the broadcast they
    answered, ``seconds`` the round's client and server work."""

    round: int
    global_msg: Any
    server_state: Any
    local_states: Any
    selected: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    uploads: Mapping[int, Any] = dataclasses.field(default_factory=dict)
    previous_global: Any = None
    seconds: float = 0.0
    #: of ``seconds``, the part spent before the server step (selection, clients, aggregation)
    client_seconds: float = 0.0


class Steps(Protocol):
    """The parts of a round: who takes part, the client steps, the server step, and the
    record after it. :class:`PerClient` (every selected client stepped one by one, each
    upload through the privatizer) is the default; a variant replaces a part by passing
    its own ``Steps`` to :func:`drive` (RFRec's all-clients-at-once path, clustering)."""

    def select(self, k: int, state: RoundState) -> np.ndarray: ...

    def clients(self, k: int, state: RoundState, selected: np.ndarray
                ) -> tuple[Any, Mapping[int, Any]]: ...

    def server(self, k: int, server_state: Any, received: Mapping[int, Any]
               ) -> tuple[Any, Any]: ...

    def record(self, state: RoundState, due: bool) -> tuple[RoundState, Any, bool]: ...


def step(steps: Steps, state: RoundState, k: int, aggregator: Aggregator | None = None
         ) -> RoundState:
    """Round ``k`` from ``state``: select, client steps (bounded and privatised there),
    aggregation (``aggregator``: e.g. central noise on the sum), server step."""
    t0 = time.perf_counter()
    selected = steps.select(k, state)
    local_states, uploads = steps.clients(k, state, selected)
    received = uploads if aggregator is None else aggregator(uploads, k)
    t1 = time.perf_counter()
    server_state, global_msg = steps.server(k, state.server_state, received)
    return RoundState(k, global_msg, server_state, local_states, selected, uploads,
                      state.global_msg, time.perf_counter() - t0, t1 - t0)


ROUND_WATCHERS: ContextVar[tuple[Callable[[int, int, Any], None], ...]] = ContextVar(
    "round_watchers", default=())
"""Callbacks ``(round, rounds, record)`` every :func:`drive` in this context calls after
each round (see :func:`watch_rounds`)."""


@contextmanager
def watch_rounds(callback: Callable[[int, int, Any], None]) -> Iterator[None]:
    """Call ``callback(round, rounds, record)`` after every round of every run driven
    inside the block, however deep (the lab's progress bar, ``python -m bench``); nothing else
    changes."""
    token = ROUND_WATCHERS.set((*ROUND_WATCHERS.get(), callback))
    try:
        yield
    finally:
        ROUND_WATCHERS.reset(token)


def drive(steps: Steps, state: RoundState, rounds: int, *,
          aggregator: Aggregator | None = None, evaluate_every: int = 1,
          on_round: Callable[[Any], None] | None = None,
          on_state: Callable[[RoundState], bool | None] | None = None
          ) -> tuple[list[Any], RoundState]:
    """The round engine: rounds ``state.round + 1 .. rounds`` of ``steps``; returns every
    round's record and the last state.

    After each round ``steps.record`` builds the round's record (evaluated when the round
    is a multiple of ``evaluate_every`` or the last one; ``evaluate_every`` 0: never) and
    may end the run (a stopping rule); then ``on_round(record)`` and ``on_state(state)``
    are called, and the run ends early if ``on_state`` returns True. A round's uploads
    stay in the state until the next round starts (the returned state keeps the last
    round's), so two rounds' uploads are never held at once: DPALS's per-item Grams of
    100 tenants are 270 MB on an 11,000-item catalogue.
    """
    if rounds < 0:
        raise ValueError("rounds must be non-negative")
    if evaluate_every < 0:
        raise ValueError("evaluate_every must be non-negative")
    history: list[Any] = []
    watchers = ROUND_WATCHERS.get()
    first = state.round + 1
    for k in range(first, rounds + 1):
        if k > first:  # the hooks have seen the last round's uploads: free them before
            state = dataclasses.replace(state, uploads={})  # this round's are made
        state = step(steps, state, k, aggregator)
        due = evaluate_every > 0 and (k % evaluate_every == 0 or k == rounds)
        state, rec, stop = steps.record(state, due)
        history.append(rec)
        for watcher in watchers:
            watcher(k, rounds, rec)
        if on_round is not None:
            on_round(rec)
        if on_state is not None and on_state(state):
            break
        if stop:
            break
    return history, state


class PerClient:
    """The default :class:`Steps`: clients of ``alg`` selected by its ``select``, stepped on
    ``workers`` threads (None: one per core, :func:`algorithms.pool.map_tasks`; 1: one by
    one in the calling thread; the same numbers either way), each upload through
    ``privatizer``, the algorithm's server step, and a :class:`RoundRecord` evaluated on
    ``test`` (when given)."""

    def __init__(self, alg: Algorithm, cfg: Any, seed: int, per_round: int,
                 train: Sequence[RatingBlock], test: Sequence[RatingBlock] | None = None,
                 scale: tuple[float, float] | None = None,
                 privatizer: Privatizer | None = None, workers: int | None = None) -> None:
        self.alg, self.cfg, self.seed, self.per_round = alg, cfg, int(seed), per_round
        self.train, self.test, self.scale, self.privatizer = train, test, scale, privatizer
        self.workers = workers
        self._prepared: tuple[Message, Message, list[int]] | None = None

    def select(self, k: int, state: RoundState) -> np.ndarray:
        return select_clients(self.alg, state.global_msg, len(self.train), self.per_round,
                              self.seed, k)

    def clients(self, k: int, state: RoundState, selected: np.ndarray
                ) -> tuple[list[Message], dict[int, Message]]:
        """The selected clients' rounds, :func:`client_round` in its two halves: the local
        steps on ``workers`` threads (each computed as serially), then each release
        (:func:`send`) in the order of ``selected``, so a privatizer's ledger and records
        are the same whatever the threads. An algorithm
        with a two-part server step (``server_prepare``) has its first part's tasks run on
        the same threads, after the client steps (largest first): they fill the gaps."""
        locals_ = list(state.local_states)
        ids = [int(c) for c in selected]

        def run(i: int) -> tuple[Message, Message | None]:
            return local_step(self.alg, self.cfg, k, self.seed, i, state.global_msg,
                              locals_[i], self.train[i])

        tasks: list[Callable[[], Any]] = [functools.partial(run, i) for i in ids]
        weights = [float(self.train[i].nnz) for i in ids]
        self._prepared = None
        if self.alg.server_prepare is not None and self.alg.server_apply is not None:
            fresh, fill = self.alg.server_prepare(state.server_state, self.cfg, expected=ids)
            self._prepared = (state.server_state, fresh, ids)
            tasks += fill
            weights += [0.0] * len(fill)  # a stable sort keeps them last, in their order
        with pool.using(self.workers):
            stepped = pool.run_all(tasks, weights=weights)[:len(ids)]
        uploads: dict[int, Message] = {}
        for i, (local, up) in zip(ids, stepped, strict=True):
            locals_[i] = local
            up = send(up, self.privatizer, i, k)
            if up is not None:
                uploads[i] = up
        return locals_, uploads

    def server(self, k: int, server_state: Message, received: Mapping[int, Message]
               ) -> tuple[Message, Message]:
        """The server step; the second part only (``server_apply``) when :meth:`clients`
        prepared the first for this very state."""
        prepared, self._prepared = self._prepared, None
        with pool.using(self.workers):  # e.g. FedMC-ADMM's server state copied on them
            if prepared is not None and prepared[0] is server_state:
                return self.alg.server_apply(prepared[1], received, self.cfg,
                                             derive_rng(self.seed, k, SERVER),
                                             previous=server_state, expected=prepared[2])
            return server_round(self.alg, self.cfg, k, self.seed, server_state, received)

    def record(self, state: RoundState, due: bool
               ) -> tuple[RoundState, RoundRecord, bool]:
        rmse = mae = obj = float("nan")
        if due and self.test is not None:
            rmse, mae = evaluate(self.alg, state.global_msg, state.local_states,
                                        self.test, self.scale)
            obj = total_objective(self.alg, state.global_msg, state.local_states,
                                  self.train, self.cfg)
        rec = RoundRecord(state.round, obj, rmse, mae, state.seconds, len(state.selected),
                          len(state.uploads),
                          sum(u.nbytes() for u in state.uploads.values()))
        return state, rec, False


class Staged:
    """The :class:`Steps` of a round whose client steps ran elsewhere (the service's Celery
    client-step tasks and tenant agents, which staged their released uploads): ``select``
    is the round's S_k as drawn before, ``clients`` hands on the staged uploads (the local
    states stay where the tenants committed them), ``server`` is the algorithm's server
    step (``server_step``: :func:`server_round` or a wrapper of it with its signature).
    The service's aggregate task runs :func:`step` over it, so the server side of a round
    (aggregation, then the server step) is the simulator's, not a copy of it."""

    def __init__(self, alg: Algorithm, cfg: Any, seed: int, selected: Sequence[int],
                 uploads: Mapping[int, Message],
                 server_step: Callable[..., tuple[Message, Message]] | None = None) -> None:
        self.alg, self.cfg, self.seed = alg, cfg, int(seed)
        self.selected = np.asarray(list(selected), dtype=np.int64)
        self.uploads = uploads
        self.server_step = server_round if server_step is None else server_step

    def select(self, k: int, state: RoundState) -> np.ndarray:
        return self.selected

    def clients(self, k: int, state: RoundState, selected: np.ndarray
                ) -> tuple[Any, Mapping[int, Message]]:
        return state.local_states, self.uploads

    def server(self, k: int, server_state: Message, received: Mapping[int, Message]
               ) -> tuple[Message, Message]:
        return self.server_step(self.alg, self.cfg, k, self.seed, server_state, received)

    def record(self, state: RoundState, due: bool) -> tuple[RoundState, None, bool]:
        return state, None, False  # the service evaluates and records the round itself


def run_round(alg: Algorithm, cfg: Any, round_: int, seed: int, per_round: int,
              global_msg: Message, server_state: Message, local_states: list[Message],
              blocks: Sequence[RatingBlock], privatizer: Privatizer | None = None,
              aggregator: Aggregator | None = None, workers: int | None = None,
              ) -> tuple[Message, Message, list[Message], np.ndarray, Mapping[int, Message]]:
    """One communication round (:func:`step` of :class:`PerClient`); returns new (global,
    server, locals, selected, uploads).

    ``uploads`` are what the tenants sent; with an ``aggregator`` the server step receives
    ``aggregator(uploads, round_)`` instead; ``workers`` as in :class:`PerClient`."""
    st = step(PerClient(alg, cfg, seed, per_round, blocks, privatizer=privatizer,
                        workers=workers),
              RoundState(round_ - 1, global_msg, server_state, local_states), round_,
              aggregator)
    return st.global_msg, st.server_state, st.local_states, st.selected, st.uploads


def simulate(alg: Algorithm, cfg: Any, fed: Federation, *, rounds: int, per_round: int,
             seed: int, privatizer: Privatizer | None = None,
             aggregator: Aggregator | None = None, evaluate_every: int = 1,
             on_round: Callable[[RoundRecord], None] | None = None,
             on_state: Callable[[RoundState], bool | None] | None = None,
             start: RoundState | None = None, workers: int | None = None
             ) -> SimulationResult:
    """Run ``rounds`` rounds with ``per_round`` clients each; evaluate on ``fed.test``
    every ``evaluate_every`` rounds and at the last (0: never).

    :func:`drive` with :class:`PerClient`. ``on_state`` sees every round's full state
    (e.g. to trace or attack the uploads) and may end the run by returning True;
    ``start`` continues from a state instead of :func:`initialise`; ``workers``: threads
    for the client steps (:class:`PerClient`). Seconds per round count client and server
    work only (evaluation excluded).
    """
    if rounds < 0:
        raise ValueError("rounds must be non-negative")
    if start is None:
        server_state, global_msg, local_states = initialise(alg, cfg, fed.train, seed)
        start = RoundState(0, global_msg, server_state, local_states)
    steps = PerClient(alg, cfg, seed, per_round, fed.train, fed.test, fed.scale, privatizer,
                      workers)
    history, last = drive(steps, start, rounds, aggregator=aggregator,
                          evaluate_every=evaluate_every, on_round=on_round, on_state=on_state)
    return SimulationResult(history, last.global_msg, last.server_state, last.local_states)
