"""What is left of forgotten users in a tenant's rating blocks and user keys (right to be
forgotten): pure helpers shared by the coordinator's scrub of hosted tenants
(:mod:`app.training.forget`) and the tenant agent's own (:mod:`agent.forget`).

A tenant's blocks index its users by row, in the order of its user-key list; forgetting
keeps the row (so every per-user array of the local state keeps its shape) but drops the
user's ratings, zeroes the row of the local state (:meth:`algorithms.Message.forget_rows`)
and unlinks the key (``FORGOTTEN``), so nothing maps the row back to the person.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import numpy as np

from algorithms.block import RatingBlock

FORGOTTEN = ""
"""The key a forgotten user's row carries once unlinked."""


def forgotten_rows(user_keys: Sequence[str], forgotten: Container[str]) -> list[int]:
    """The row indices of the ``forgotten`` keys in ``user_keys``."""
    return [i for i, key in enumerate(user_keys) if key != FORGOTTEN and key in forgotten]


def without_forgotten(block: RatingBlock, user_keys: Sequence[str],
                      forgotten: Container[str]) -> RatingBlock:
    """``block`` without the rows of the ``forgotten`` keys (the block itself if none)."""
    rows = forgotten_rows(user_keys, forgotten)
    return block.subset(~np.isin(block.rows, rows)) if rows else block


def unlinked(user_keys: Sequence[str], forgotten: Container[str]) -> list[str]:
    """``user_keys`` with each ``forgotten`` key replaced by ``FORGOTTEN``."""
    return [FORGOTTEN if key in forgotten else key for key in user_keys]
