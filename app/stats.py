"""Statistics of a tenant's rating block. Pure numpy: computed by the Celery task."""

from __future__ import annotations

import dataclasses

import numpy as np

from algorithms.block import RatingBlock


@dataclasses.dataclass(frozen=True)
class BlockStats:
    """Counts, mean and per-value histogram of one block of ratings."""

    n_ratings: int
    n_users: int
    n_items: int
    mean: float | None
    histogram: dict[str, int]


def block_statistics(block: RatingBlock) -> BlockStats:
    """Summarise ``block``: users and items counted only if they have a rating.

    The histogram maps each distinct rating value (formatted with ``%g``) to its count.
    """
    values, counts = np.unique(block.vals, return_counts=True)
    return BlockStats(
        n_ratings=block.nnz,
        n_users=int(np.unique(block.rows).shape[0]),
        n_items=int(block.rated_items.shape[0]),
        mean=float(block.vals.mean()) if block.nnz else None,
        histogram={f"{v:g}": int(c) for v, c in zip(values, counts, strict=True)},
    )
