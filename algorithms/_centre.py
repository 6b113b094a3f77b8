r"""A released data centre for the user-level DP algorithms (DPALS, DP-FedMAvg,
DP-FedMC-ADMM): one rule for all three.

Their predictions are ``mu + b_u + c beta_j + u.v_j``, every term but mu shrunk toward 0 by
a ridge. With mu the middle of the public rating scale (3 on 1-5 stars), a user or an item
with one or two ratings is predicted near 3 even when 70% of all ratings are 5s: on a
sparse, skewed (Amazon-like) set, :func:`algorithms.synthetic.generate_skewed_ratings`,
the three did worse than predicting the global mean. With ``release_centre`` each release
also carries

    m = sum over the users in the release of (a_u, 1),
    a_u = clip((mean of u's ratings - middle) / half_width, -1, 1)

(:func:`algorithms.user_bounds.centre_terms`; middle and half width of the *public* scale,
so a_u is bounded whatever the data), declared as centre arrays in the algorithm's
:class:`~algorithms.user_bounds.UserBounds`: one user moves m by at most sqrt(2), and the
privacy layer noises it with the share ``centre_share`` of the same Gaussian event as the
rest of the release (:func:`privacy.user_level.array_shares`), charged to the same ledger.
The server combines the releases so far, each weighted by the inverse of its noise variance
(:func:`update`), into ``centre = middle + half_width * num / den`` (the mean over users of
their mean rating): post-processing of released sums. Until an estimate's denominator is
three noise standard deviations above 0, the public centre stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from algorithms.user_bounds import centre_terms

#: the centre's share of each release's privacy (chosen on MovieLens 100k / 1M and the
#: Amazon-like set of :func:`algorithms.synthetic.generate_skewed_ratings`)
DEFAULT_SHARE = 0.02
#: the denominator must exceed this many of its noise standard deviations
MIN_SIGNAL = 3.0


def released(cfg: Any) -> bool:
    """Whether ``cfg`` releases a centre (``release_centre``)."""
    return bool(getattr(cfg, "release_centre", False))


def middle_and_half_width(cfg: Any) -> tuple[float, float]:
    """The public scale's middle and half width, in the config's units."""
    return ((cfg.scale_min + cfg.scale_max) / 2 / cfg.unit,
            (cfg.scale_max - cfg.scale_min) / 2 / cfg.unit)


def client_sums(rows: np.ndarray, vals: np.ndarray, n_users: int, present: np.ndarray,
                cfg: Any) -> np.ndarray:
    """The tenant's centre sums (2,) over its users in ``present`` (ratings in units)."""
    middle, half = middle_and_half_width(cfg)
    return centre_terms(rows, vals, n_users, present, middle, half)


def update(acc: np.ndarray | None, sums: Sequence[np.ndarray], stds: Sequence[float]
           ) -> np.ndarray:
    """The running (num, den, noise variance of den) after one more release: the round's
    summed centre arrays (``sums``; their noise stds ``stds`` add in quadrature), weighted
    by the inverse of their noise variance (weight 1 without noise)."""
    acc = np.zeros(3) if acc is None else np.asarray(acc, dtype=float)
    total = np.sum(sums, axis=0)
    var = float(sum(s ** 2 for s in stds))
    w = 1.0 / var if var > 0 else 1.0
    return acc + np.array([w * total[0], w * total[1], w * w * var])


def centre_of(acc: np.ndarray | None, cfg: Any) -> float | None:
    """The centre in units from the running sums, or None (keep the public centre) while
    the denominator is within ``MIN_SIGNAL`` noise standard deviations of 0."""
    if acc is None:
        return None
    num, den, var = (float(x) for x in acc)
    if not den > MIN_SIGNAL * np.sqrt(var):
        return None
    middle, half = middle_and_half_width(cfg)
    return middle + half * float(np.clip(num / den, -1.0, 1.0))


def with_centre(cfg: Any, centre: float | None) -> Any:
    """``cfg`` whose ``mu`` (in units) is ``centre``; ``cfg`` itself for None."""
    if centre is None:
        return cfg
    return cfg.model_copy(update={"public_centre": centre * cfg.unit})
