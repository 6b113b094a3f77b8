"""In-process driver: p clients and the server for R rounds, evaluated every round.

The same pure functions run one per Celery task in the service; this driver derives
every random stream exactly as the service does (:mod:`algorithms._rng`), so a seeded
service job and a seeded simulation give the same numbers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from algorithms._messages import Message
from algorithms._rng import SAMPLING, SERVER, client_init_rng, client_rng, derive_rng
from algorithms.base import Algorithm, predict
from algorithms.block import RatingBlock
from algorithms.data import Federation


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


def client_round(alg: Algorithm, cfg: Any, round_: int, seed: int, client: int,
                 global_msg: Message, local_state: Message, block: RatingBlock,
                 privatizer: Privatizer | None = None) -> tuple[Message, Message | None]:
    """Client ``client``'s step in round ``round_``: new local state and what it sends."""
    local_state, up = alg.client_step(global_msg, local_state, block, cfg,
                                      client_rng(seed, round_, client))
    if up is not None and privatizer is not None:
        up = privatizer(up, client, round_)
    return local_state, up


def server_round(alg: Algorithm, cfg: Any, round_: int, seed: int, server_state: Message,
                 uploads: Mapping[int, Message]) -> tuple[Message, Message]:
    """The server step of round ``round_`` on the uploads only."""
    return alg.server_step(server_state, uploads, cfg, derive_rng(seed, round_, SERVER))


def run_round(alg: Algorithm, cfg: Any, round_: int, seed: int, per_round: int,
              global_msg: Message, server_state: Message, local_states: list[Message],
              blocks: Sequence[RatingBlock], privatizer: Privatizer | None = None,
              aggregator: Aggregator | None = None,
              ) -> tuple[Message, Message, list[Message], np.ndarray, Mapping[int, Message]]:
    """One communication round; returns new (global, server, locals, selected, uploads).

    ``uploads`` are what the tenants sent; with an ``aggregator`` the server step receives
    ``aggregator(uploads, round_)`` instead."""
    selected = select_clients(alg, global_msg, len(blocks), per_round, seed, round_)
    locals_ = list(local_states)
    uploads: dict[int, Message] = {}
    for i in (int(c) for c in selected):
        locals_[i], up = client_round(alg, cfg, round_, seed, i, global_msg, locals_[i],
                                      blocks[i], privatizer)
        if up is not None:
            uploads[i] = up
    received = uploads if aggregator is None else aggregator(uploads, round_)
    server_state, global_msg = server_round(alg, cfg, round_, seed, server_state, received)
    return global_msg, server_state, locals_, selected, uploads


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


def simulate(alg: Algorithm, cfg: Any, fed: Federation, *, rounds: int, per_round: int,
             seed: int, privatizer: Privatizer | None = None,
             aggregator: Aggregator | None = None, evaluate_every: int = 1,
             on_round: Callable[[RoundRecord], None] | None = None) -> SimulationResult:
    """Run ``rounds`` rounds with ``per_round`` clients each; evaluate on ``fed.test``.

    Seconds per round count client and server work only (evaluation excluded).
    """
    if rounds < 0:
        raise ValueError("rounds must be non-negative")
    server_state, global_msg, local_states = initialise(alg, cfg, fed.train, seed)
    history: list[RoundRecord] = []
    for k in range(1, rounds + 1):
        t0 = time.perf_counter()
        global_msg, server_state, local_states, selected, uploads = run_round(
            alg, cfg, k, seed, per_round, global_msg, server_state, local_states, fed.train,
            privatizer, aggregator)
        seconds = time.perf_counter() - t0
        if k % evaluate_every == 0 or k == rounds:
            rmse, mae = evaluate(alg, global_msg, local_states, fed.test, fed.scale)
            obj = total_objective(alg, global_msg, local_states, fed.train, cfg)
        else:
            rmse = mae = obj = float("nan")
        rec = RoundRecord(k, obj, rmse, mae, seconds, len(selected), len(uploads),
                          sum(u.nbytes() for u in uploads.values()))
        history.append(rec)
        if on_round is not None:
            on_round(rec)
    return SimulationResult(history, global_msg, server_state, local_states)
