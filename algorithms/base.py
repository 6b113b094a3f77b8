"""The client-step / server-step contract every federated algorithm follows.

An algorithm is a validated config class plus pure functions over frozen messages
(:class:`algorithms.Message` subclasses, serialisable to bytes):

``init_server(n_items, n_clients, cfg, rng) -> (server_state, global_msg)``
    Runs once on the coordinator. ``global_msg`` is what every client receives (V and
    whatever round-level scalars the clients need, e.g. the number of clients p).
``init_client(block, global_msg, cfg, rng) -> local_state``
    Runs once inside each tenant (U_i drawn here). Never seen by the server.
``client_step(global_msg, local_state, block, cfg, rng) -> (local_state', upload | None)``
    One round of local work inside tenant i. The upload holds only factor matrices and
    scalars, never a rating value or a rated-item index. ``None`` means "nothing sent this
    round" (e.g. RFRecF local iterations): nothing to privatise or charge.
``server_step(server_state, uploads, cfg, rng) -> (server_state', global_msg')``
    Aggregation on the coordinator from the uploads only; ``uploads`` maps client index to
    upload message (the server sees who transmitted).
``factors(global_msg, local_state) -> (A, B)``
    Prediction factors of one tenant: its predicted rating matrix is ``A @ B`` with A of
    shape (m_i, r') and B of shape (r', n). Bias terms and a global mean are folded in as
    extra columns/rows, so serving is one matrix-vector product per user.
``objective(global_msg, local_state, block, cfg) -> float``
    This tenant's share of the training objective (for progress reports).

Optionally ``server_prepare`` / ``server_apply``: the server step split in an
upload-independent part and the rest, so that the round engine can run the first beside
the client steps (see the fields of :class:`Algorithm`).

States are :class:`Message` subclasses too, so the service persists them as bytes.
No function mutates its arguments, and every random draw comes from the ``rng`` passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from algorithms.block import RatingBlock
from algorithms.messages import Message


class AlgorithmConfig(BaseModel):
    """Base of every algorithm's config: frozen, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @classmethod
    def paper_settings(cls, **overrides: Any) -> AlgorithmConfig:
        """The ``paper`` preset: the paper's literal settings, ``overrides`` replacing fields.

        Every algorithm's config answers this (``registry.get(name).config.paper_settings()``);
        the defaults are the recommended, validated settings. This base version returns the
        defaults, for configs whose defaults *are* the paper's (Felb, Felb-MU, the binary
        baseline); the others override it.
        """
        return cls(**overrides)


def default_select(
    global_msg: Message, n_clients: int, per_round: int, rng: np.random.Generator
) -> np.ndarray:
    """S_k: ``per_round`` clients uniformly without replacement (FedMC-ADMM's scheme)."""
    from algorithms.rng import sample_clients

    return sample_clients(rng, n_clients, per_round)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """A federated algorithm: its name, config class and pure step functions."""

    name: str
    config: type[AlgorithmConfig]
    init_server: Callable[[int, int, Any, np.random.Generator], tuple[Message, Message]]
    init_client: Callable[[RatingBlock, Message, Any, np.random.Generator], Message]
    client_step: Callable[
        [Message, Message, RatingBlock, Any, np.random.Generator], tuple[Message, Message | None]
    ]
    server_step: Callable[
        [Message, Mapping[int, Message], Any, np.random.Generator], tuple[Message, Message]
    ]
    factors: Callable[[Message, Message], tuple[np.ndarray, np.ndarray]]
    objective: Callable[[Message, Message, RatingBlock, Any], float]
    #: which clients run ``client_step`` in a round; default: S_k uniform without replacement
    select: Callable[[Message, int, int, np.random.Generator], np.ndarray] = default_select
    #: False for methods whose uploads reveal ratings (FedMGS's sufficient statistics)
    privacy_preserving: bool = True
    #: "ratings" (real-valued MC) or "binary" (Felb family)
    data_kind: str = "ratings"
    #: the recommended run: number of clients, clients per round, rounds (CLI defaults);
    #: per_round 0 means every client every round
    run_defaults: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"clients": 100, "per_round": 10, "rounds": 100})
    #: predicted values of entries (rows, cols) of one tenant, for models whose prediction
    #: is not the matrix product of ``factors`` (RFRec's sigmoid link); None: ``A @ B``
    predict_entries: Callable[[Message, Message, np.ndarray, np.ndarray], np.ndarray] | None \
        = None
    #: for such a model, the monotone link of serving: ``(offset, spread)`` such that a
    #: prediction is ``offset + spread * sigmoid(A @ B)`` of ``factors`` (ranking by
    #: ``A @ B`` is then the same ranking); None: the prediction is ``A @ B`` itself
    serving_link: Callable[[Message, Message], tuple[float, float] | None] | None = None
    #: the server step in two parts, so that the round engine can run the first alongside
    #: the client steps: ``server_prepare(server_state, cfg, expected=ids) -> (fresh,
    #: tasks)`` does what does not depend on the uploads (e.g. FedMC-ADMM's fresh copy of
    #: its per-tenant contributions, except the rows of the clients ``expected`` to
    #: upload); ``fresh`` is ready once every zero-argument callable in ``tasks`` has run
    #: (in any order, on any thread). ``server_apply(fresh, uploads, cfg, rng,
    #: previous=server_state, expected=ids)`` finishes the step on it and may modify
    #: ``fresh`` (nothing else). ``server_step`` must give exactly the same numbers. None
    #: (both): the engine calls ``server_step``.
    server_prepare: Callable[..., tuple[Message, list[Callable[[], Any]]]] | None = None
    server_apply: Callable[..., tuple[Message, Message]] | None = None


def predict(alg: Algorithm, global_msg: Message, local_state: Message,
            rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Predicted values of entries (rows[t], cols[t]) of one tenant, without a dense product."""
    if alg.predict_entries is not None:
        return alg.predict_entries(global_msg, local_state, rows, cols)
    a, b = alg.factors(global_msg, local_state)
    return np.einsum("ij,ji->i", a[rows], b[:, cols])
