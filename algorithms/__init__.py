"""Federated matrix-completion algorithms as pure numpy/scipy code.

See :mod:`algorithms.base` for the client-step / server-step contract and
:mod:`algorithms.simulate` for the in-process driver.
"""

from algorithms.base import Algorithm, AlgorithmConfig, predict
from algorithms.block import RatingBlock
from algorithms.messages import Message, messages_equal
from algorithms.rng import client_rng, derive_rng, sample_clients

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
