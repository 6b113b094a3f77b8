"""Deterministic random streams derived from a job seed: the public, non-private draws.

The seed governs initialisation, the train/test split, tenant selection and the
algorithms' non-private randomness: every such draw comes from a generator derived from
(seed, round, stream), so a run interrupted after round k and resumed reproduces exactly
what an uninterrupted run draws, and the service (one Celery task per tenant per round)
reproduces the simulator. The seed is stored, returned and sent to agents, so nothing a
privacy guarantee rests on derives from it: privacy noise and privacy sampling (the per-user
cap and Poisson sample) come from :mod:`privacy.randomness`, which the algorithms reach only
through a block's :class:`UserDraws`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

# Stream identifiers. Client streams are CLIENT + client index.
INIT_SERVER = 0
SAMPLING = 1
SERVER = 2
SPLIT = 3
PARTITION = 5
INIT_CLIENT = 1_000_000
CLIENT = 2_000_000


def derive_rng(seed: int, round_: int, stream: int) -> np.random.Generator:
    """A generator for one (seed, round, stream) triple, independent of every other triple."""
    if seed < 0 or round_ < 0 or stream < 0:
        raise ValueError("seed, round and stream must be non-negative")
    return np.random.default_rng(np.random.SeedSequence([seed, round_, stream]))


def client_rng(seed: int, round_: int, client: int) -> np.random.Generator:
    """The generator of client ``client``'s step in round ``round_``."""
    return derive_rng(seed, round_, CLIENT + client)


class Deferred:
    """Stands for the generator ``derive()`` returns, deriving it at its first use: most
    client steps never draw (FedMC-ADMM's, the DP steps at user rate 1), and deriving one
    costs tens of microseconds under the GIL, per tenant and round. Draws are those of the
    generator itself."""

    __slots__ = ("_derive", "_gen")

    def __init__(self, derive: Callable[[], np.random.Generator]) -> None:
        self._derive = derive
        self._gen: np.random.Generator | None = None

    def __getattr__(self, name: str) -> Any:
        if self._gen is None:
            self._gen = self._derive()
        return getattr(self._gen, name)


def deferred_client_rng(seed: int, round_: int, client: int) -> Deferred:
    """:func:`client_rng`, derived at its first use (:class:`Deferred`)."""
    if seed < 0 or round_ < 0 or client < 0:
        raise ValueError("seed, round and stream must be non-negative")
    return Deferred(lambda: client_rng(seed, round_, client))


def client_init_rng(seed: int, client: int) -> np.random.Generator:
    """The generator of client ``client``'s initial local state."""
    return derive_rng(seed, 0, INIT_CLIENT + client)


def sample_clients(rng: np.random.Generator, n_clients: int, per_round: int) -> np.ndarray:
    """S_k: ``per_round`` distinct clients drawn uniformly without replacement, sorted.

    ``per_round >= n_clients`` selects everybody (full participation).
    """
    if per_round <= 0:
        raise ValueError("per_round must be positive")
    if per_round >= n_clients:
        return np.arange(n_clients)
    return np.sort(rng.choice(n_clients, size=per_round, replace=False))


class UserDraws(Protocol):
    """Per-user privacy draws of one tenant, keyed by user identity and a secret
    (:class:`privacy.randomness.UserPRF`): a user's draws do not depend on the other users
    the tenant holds. Attached to a tenant's block (:attr:`algorithms.block.RatingBlock.
    user_draws`) by the privacy layer; without it, the DP algorithms draw from their seeded
    stream (reproducible, for runs without privacy)."""

    def user_uniforms(self, purpose: str, round_: int, n_users: int) -> np.ndarray: ...

    def rating_uniforms(self, purpose: str, rows: np.ndarray, cols: np.ndarray,
                        users: np.ndarray | None = None) -> np.ndarray: ...
