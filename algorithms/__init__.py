"""Federated matrix-completion algorithms as pure numpy/scipy code.

See :mod:`algorithms.base` for the client-step / server-step contract and
:mod:`algorithms.simulate` for the in-process driver.
"""

from algorithms._messages import Message, messages_equal
from algorithms._rng import client_rng, derive_rng, sample_clients
from algorithms.base import Algorithm, AlgorithmConfig, predict
from algorithms.block import RatingBlock

__all__ = [
    "Algorithm",
    "AlgorithmConfig",
    "Message",
    "RatingBlock",
    "client_rng",
    "derive_rng",
    "messages_equal",
    "predict",
    "sample_clients",
]
