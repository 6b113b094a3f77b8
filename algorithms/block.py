"""A tenant's rating block: the observed entries of M_i as COO index arrays.

Rows are the tenant's local user indices 0..n_users-1, columns the shared item indices
0..n_items-1. Blocks never leave the client step. CSR/CSC views are built once and cached;
every kernel works on the observed entries only (no dense n_users x n_items matrix).
"""

from __future__ import annotations

import dataclasses
import io
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from algorithms.rng import UserDraws


@dataclasses.dataclass(frozen=True, eq=False)
class RatingBlock:
    """Observed ratings of one tenant.

    Parameters
    ----------
    rows, cols : int32 arrays of length nnz
        Local user index and global item index of each observed rating.
    vals : float64 array of length nnz
        The rating values.
    n_users, n_items : int
        Shape of the block M_i.
    scale : (lo, hi) or None
        The tenant's declared rating scale (e.g. 1-5 stars, -10..10). Algorithms normalise
        ratings by it (:mod:`algorithms.scale`) so their settings mean the same on every
        scale; ``None`` (blocks stored before the field existed) falls back to the data's
        own range.
    user_draws : UserDraws or None
        The tenant's secret per-user draws of privacy sampling (the per-user cap and
        Poisson sample of the user-level DP algorithms), attached by the privacy layer
        where the block is used (:mod:`privacy.randomness`); kept by every derived block,
        never serialised. None: those algorithms use their seeded stream.
    """

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    n_users: int
    n_items: int
    scale: tuple[float, float] | None = None
    user_draws: UserDraws | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", np.ascontiguousarray(self.rows, dtype=np.int32))
        object.__setattr__(self, "cols", np.ascontiguousarray(self.cols, dtype=np.int32))
        object.__setattr__(self, "vals", np.ascontiguousarray(self.vals, dtype=np.float64))
        n = self.rows.shape[0]
        if self.cols.shape != (n,) or self.vals.shape != (n,):
            raise ValueError("rows, cols and vals must be 1-d arrays of equal length")
        if n and (self.rows.min() < 0 or self.rows.max() >= self.n_users):
            raise ValueError("row index out of range")
        if n and (self.cols.min() < 0 or self.cols.max() >= self.n_items):
            raise ValueError("column index out of range")
        object.__setattr__(self, "n_users", int(self.n_users))
        object.__setattr__(self, "n_items", int(self.n_items))
        if not np.all(np.isfinite(self.vals)):
            raise ValueError("ratings must be finite")
        if self.scale is not None:
            lo, hi = (float(x) for x in self.scale)
            if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                raise ValueError("scale must be (lo, hi) with finite lo < hi")
            object.__setattr__(self, "scale", (lo, hi))

    @property
    def nnz(self) -> int:
        return int(self.rows.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_users, self.n_items)

    @cached_property
    def csr(self) -> sp.csr_array:
        """M_i as a CSR array (duplicates are not expected; they would be summed)."""
        return sp.csr_array((self.vals, (self.rows, self.cols)), shape=self.shape)

    @cached_property
    def csc(self) -> sp.csc_array:
        return self.csr.tocsc()

    @cached_property
    def rated_items(self) -> np.ndarray:
        """Sorted unique item indices this tenant has rated."""
        return np.unique(self.cols)

    @cached_property
    def compact(self) -> tuple[np.ndarray, RatingBlock]:
        """(``rated_items``, the same ratings with each column renumbered to its position
        in ``rated_items``): a block over the rated items only, for steps in which an
        unrated item's column cannot change (its work then follows the ratings, not the
        catalogue). The renumbering is monotone, so CSR/CSC views keep their order."""
        items = self.rated_items
        local = np.searchsorted(items, self.cols).astype(np.int32)
        return items, RatingBlock(self.rows, local, self.vals, self.n_users, items.shape[0],
                                  self.scale, self.user_draws)

    def with_values(self, vals: np.ndarray) -> RatingBlock:
        """Same pattern, other values (e.g. centred ratings or residuals)."""
        return RatingBlock(self.rows, self.cols, vals, self.n_users, self.n_items, self.scale,
                           self.user_draws)

    def subset(self, mask: np.ndarray) -> RatingBlock:
        """The entries selected by a boolean mask, same shape."""
        return RatingBlock(
            self.rows[mask], self.cols[mask], self.vals[mask], self.n_users, self.n_items,
            self.scale, self.user_draws)

    def with_scale(self, scale: tuple[float, float] | None) -> RatingBlock:
        """Same entries, declared rating scale ``scale``."""
        return RatingBlock(self.rows, self.cols, self.vals, self.n_users, self.n_items, scale,
                           self.user_draws)

    def with_user_draws(self, draws: UserDraws | None) -> RatingBlock:
        """Same entries, per-user privacy draws ``draws`` (no copy, no re-validation)."""
        out = object.__new__(RatingBlock)
        for f in dataclasses.fields(self):
            object.__setattr__(out, f.name, getattr(self, f.name))
        object.__setattr__(out, "user_draws", draws)
        return out

    def to_bytes(self) -> bytes:
        """Compressed ``.npz`` of the block (how the service materialises it once per job);
        the declared scale is an optional ``scale`` array, so blocks without it (and blocks
        stored before it existed) load as ``scale=None``."""
        buf = io.BytesIO()
        extra = {} if self.scale is None else {"scale": np.array(self.scale, dtype=np.float64)}
        np.savez_compressed(buf, rows=self.rows, cols=self.cols, vals=self.vals,
                            shape=np.array(self.shape, dtype=np.int64), **extra)
        return buf.getvalue()

    @staticmethod
    def from_bytes(data: bytes) -> RatingBlock:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            n_users, n_items = (int(x) for x in z["shape"])
            scale = tuple(float(x) for x in z["scale"]) if "scale" in z.files else None
            return RatingBlock(z["rows"], z["cols"], z["vals"], n_users, n_items, scale)
