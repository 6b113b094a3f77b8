r"""What one user can add to a release: the declaration an algorithm makes for user-level DP.

An algorithm whose uploads are sums over users of per-user terms declares the bound of one
user's term (:class:`UserBounds`); :mod:`privacy.user_level` turns the declaration into a
sensitivity, noise and accounting. Two kinds of bounded arrays exist:

* **gram / rhs** arrays (DPALS): per item, ``sum_u w_uj x_u x_u^T`` and ``sum_u w_uj s_uj
  x_u`` over at most k items per user, with ``||x_u|| <= G_x``, ``|s_uj| <= G_r``;
* **clipped-sum** arrays (the gradient methods): a sum over users of a per-user term whose
  L2 norm, taken over *all* of that user's entries in *all* the clipped arrays together, is
  at most ``clip_norm`` C. Adding or removing one user moves their concatenation by at most
  C in L2, so the sensitivity is C.

Either kind may come with **centre** arrays: a sum over users of a small per-user term of L2
norm at most ``centre_norm`` (the user's mean rating, clipped to the public scale, and a
count of one: :func:`centre_terms`), from which the server estimates a data centre for the
predictions instead of the middle of the public scale. They take part in the same release
(one Gaussian event), with the share ``centre_share`` of its privacy
(:func:`privacy.user_level.array_shares`).

This module also holds the pure per-user clip of the clipped-sum arrays
(:func:`clipped_item_sums`), which the client steps call: algorithms own the maths of one
user's term, the privacy layer owns the rule that turns the bound into noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class UserBounds:
    """What one user can add to a release, declared by the algorithm for the privacy layer.

    ``gram`` arrays hold, per item, a sum of ``x x^T`` (symmetric d x d blocks);
    ``rhs`` arrays a sum of ``s x``. A user adds to at most ``max_ratings`` items, with
    ``||x|| <= x_norm`` and ``|s| <= rating_bound``. ``clipped`` arrays hold a sum over
    users of a term whose joint L2 norm over all the ``clipped`` arrays is at most
    ``clip_norm`` (an algorithm declares either gram/rhs arrays or clipped ones).
    ``noise_fields`` maps each array to the scalar field of the upload that records the
    standard deviation of the noise in it. ``sample_rate``: each user enters a release
    independently with this probability, drawn inside the tenant (hidden from the server).
    ``release_growth``: see the field.
    """

    max_ratings: int
    x_norm: float
    rating_bound: float
    gram: tuple[str, ...]
    rhs: tuple[str, ...]
    noise_fields: Mapping[str, str]
    sample_rate: float = 1.0
    clipped: tuple[str, ...] = ()
    clip_norm: float = 0.0
    #: the algorithm's preferred growth of the privacy share per release (None: the privacy
    #: layer's default, tuned for DPALS's few sweeps; gradient methods with many releases
    #: prefer equal shares)
    release_growth: float | None = None
    #: arrays holding a sum over users of a per-user term of L2 norm <= ``centre_norm``
    #: (the released data centre), noised with the share ``centre_share`` of each release
    centre: tuple[str, ...] = ()
    centre_norm: float = 0.0
    centre_share: float = 0.0
    #: a constant last coordinate every ``x`` carries (0: none): a gram array's last
    #: diagonal entry is then ``count_coordinate^2`` times the (weighted) count of terms,
    #: which bounds what the matching rhs array can hold (the privacy layer's value check)
    count_coordinate: float = 0.0
    #: clipped arrays ``(num, den, ratio)`` such that every user's term has, at each item j
    #: (the last axis), ``||num[..., j]|| <= ratio * den[j]``, and so has any sum of them:
    #: the value check of the privacy layer, as ``count_coordinate`` is for gram/rhs arrays
    #: (None: no such relation)
    item_ratio: tuple[str, str, float] | None = None

    def __post_init__(self) -> None:
        if self.clipped and (self.gram or self.rhs):
            raise ValueError("declare either gram/rhs arrays or clipped-sum arrays, not both")
        if self.clipped and not (np.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"clip_norm must be positive and finite, got {self.clip_norm!r}")
        if self.centre and not (np.isfinite(self.centre_norm) and self.centre_norm > 0
                                and 0 < self.centre_share < 1):
            raise ValueError("centre arrays need a positive finite centre_norm and a "
                             f"centre_share in (0, 1), got {self.centre_norm!r}, "
                             f"{self.centre_share!r}")
        missing = [a for a in self.arrays if a not in self.noise_fields]
        if missing:
            raise ValueError(f"no noise field declared for {', '.join(missing)}")

    @property
    def arrays(self) -> tuple[str, ...]:
        """Every bounded array, in the order noise is drawn for them."""
        return (*self.gram, *self.rhs, *self.clipped, *self.centre)

    def with_centre(self, arrays: tuple[str, ...], noise_fields: Mapping[str, str],
                    share: float) -> UserBounds:
        """These bounds with centre arrays (terms of :func:`centre_terms`, norm <= sqrt 2)
        getting the share ``share`` of each release."""
        return dataclasses.replace(self, centre=tuple(arrays), centre_norm=CENTRE_NORM,
                                   centre_share=float(share),
                                   noise_fields={**self.noise_fields, **noise_fields})

    @classmethod
    def clipped_sum(cls, arrays: tuple[str, ...], clip_norm: float,
                    noise_fields: Mapping[str, str], max_ratings: int,
                    sample_rate: float = 1.0, release_growth: float | None = 1.0
                    ) -> UserBounds:
        """Bounds of uploads that are sums of per-user terms clipped jointly to ``clip_norm``
        (``max_ratings``: the cap of ratings per user, reported only)."""
        return cls(max_ratings, 0.0, 0.0, (), (), dict(noise_fields), sample_rate,
                   tuple(arrays), float(clip_norm), release_growth)


#: L2 bound of one user's centre term (a, 1) with |a| <= 1
CENTRE_NORM = float(np.sqrt(2.0))


def centre_terms(rows: np.ndarray, vals: np.ndarray, n_users: int, present: np.ndarray,
                 middle: float, half_width: float) -> np.ndarray:
    """The centre sums ``sum_u (a_u, 1)`` over the users in ``present`` (bool per user)
    with at least one rating, ``a_u = clip((mean of u's ratings - middle) / half_width,
    -1, 1)``: each user's term has L2 norm at most :data:`CENTRE_NORM` whatever its
    ratings, so removing a user moves the sums by at most that. ``(middle, half_width)``
    come from the public scale, never from the data."""
    count = np.bincount(rows, minlength=n_users)
    total = np.bincount(rows, weights=vals, minlength=n_users)
    has = present & (count > 0)
    mean = total[has] / count[has]
    a = np.clip((mean - middle) / half_width, -1.0, 1.0)
    return np.array([a.sum(), float(has.sum())])


def per_user_clip_factors(sq_norms: np.ndarray, clip: float) -> np.ndarray:
    """min(1, C / ||term_u||) for each user from the squared norms of their terms (a zero
    term keeps factor 1; nothing divides by zero)."""
    norms = np.sqrt(np.maximum(sq_norms, 0.0))
    return clip / np.maximum(norms, clip)


def clipped_item_sums(rows: np.ndarray, cols: np.ndarray, terms: list[np.ndarray],
                      n_users: int, n_items: int, clip: float
                      ) -> tuple[list[np.ndarray], np.ndarray]:
    """Per item, the sum over users of each user's clipped term.

    ``terms[a]`` is an (nnz,) or (nnz, d_a) array: rating t of user ``rows[t]`` adds
    ``terms[a][t]`` to item ``cols[t]`` of array a. User u's term is the collection of its
    entries in all the arrays (entries of the same (user, item) pair summed first); its L2
    norm over all of them is scaled down to at most ``clip``. Returns ([array a: (n_items,)
    or (n_items, d_a)], the per-user factors).
    """
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    key = rows * n_items + cols
    uniq, inv = np.unique(key, return_inverse=True)
    u_rows, u_cols = uniq // n_items, uniq % n_items
    merged = []
    for t in terms:
        t2 = np.asarray(t, dtype=np.float64)  # (nnz, d_a); no -1: nnz may be 0
        t2 = t2.reshape(rows.size, int(np.prod(t2.shape[1:])))
        m = np.zeros((uniq.size, t2.shape[1]))
        for c in range(t2.shape[1]):
            m[:, c] = np.bincount(inv, weights=t2[:, c], minlength=uniq.size)
        merged.append(m)
    sq = np.zeros(n_users)
    for m in merged:
        sq += np.bincount(u_rows, weights=np.sum(m * m, axis=1), minlength=n_users)
    factor = per_user_clip_factors(sq, clip)
    scale = factor[u_rows]
    out = []
    for t, m in zip(terms, merged, strict=True):
        s = np.stack([np.bincount(u_cols, weights=m[:, c] * scale, minlength=n_items)
                      for c in range(m.shape[1])], axis=1)
        out.append(s[:, 0] if np.ndim(t) == 1 else s)
    return out, factor
