"""Rating-scale normalisation shared by every rating algorithm (once, not per algorithm).

The recommended settings (regularisation weights, step sizes, initial scales) were
validated on 1-5 star data. Inside the client step every algorithm therefore works on the
tenant's ratings divided by its *unit*,

    model = r / unit,   unit = (hi - lo) / (REF_HI - REF_LO),

where (lo, hi) is the tenant's declared scale (:attr:`RatingBlock.scale`) or, for a block
without one, the block's own range: a spread of 4 in the model whatever the scale, so a
regularisation weight, a step size or an initial scale means the same on a 0.5-5
half-star, a -10..10 continuous or a 0/1 scale as on 1-5 stars. Predictions are
multiplied back by the unit (the tenant's U_i carries it, so the factors keep their
shapes), and RMSE is reported in the tenant's scale.

Why a pure scaling and no shift: every recommended setting centres the ratings (a
tenant mean or bias terms), so the offset does not matter to it, while a model without
centring (the papers' plain U V) would have to fit a shift it cannot represent; scaling
keeps a low-rank matrix low-rank, even when tenants' units differ (U_i absorbs its own).
On 1-5 data the unit is 1 and the block is used as it is (bit-identical to no mapping).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from algorithms.block import RatingBlock

#: the scale the recommended settings were validated on (MovieLens stars)
REF_LO, REF_HI = 1.0, 5.0


def scale_of(block: RatingBlock) -> tuple[float, float]:
    """The tenant's declared (lo, hi), else the block's own range (the reference scale for
    an empty or constant block, where there is nothing to normalise)."""
    if block.scale is not None:
        return block.scale
    if block.nnz:
        lo, hi = float(block.vals.min()), float(block.vals.max())
        if lo < hi:
            return lo, hi
    return REF_LO, REF_HI


def unit_of(block: RatingBlock) -> float:
    """The tenant's rating unit: its scale's spread over the reference spread."""
    lo, hi = scale_of(block)
    return (hi - lo) / (REF_HI - REF_LO)


_CACHE: weakref.WeakKeyDictionary[RatingBlock, tuple[float, RatingBlock]] = \
    weakref.WeakKeyDictionary()


def normalised(block: RatingBlock, unit: float) -> RatingBlock:
    """The block with its ratings divided by ``unit`` (the block itself when it is 1).

    ``unit`` is the one the tenant's local state recorded at initialisation
    (:func:`unit_of`), not recomputed from the block, so a state stored before units
    existed (unit 1) keeps training exactly as it did. Cached per block object, so a
    simulation builds each tenant's mapped block (and its CSR/CSC views) once, not every
    round.
    """
    if unit == 1.0:
        return block
    cached = _CACHE.get(block)
    if cached is None or cached[0] != unit:
        cached = (unit, block.with_values(block.vals / unit))
        _CACHE[block] = cached
    return cached[1]


def centre_of(block: RatingBlock, unit: float) -> float:
    """The centre of a tenant's predictions, in units: the mean of ``block`` (already
    divided by ``unit``, :func:`normalised`), or, for a tenant without training ratings,
    the middle of its scale (declared, else the reference's) instead of 0, the bottom of
    a 0-centred scale and below the bottom of a 1-5 one."""
    if block.nnz:
        return float(block.vals.mean())
    lo, hi = scale_of(block)
    return (lo + hi) / 2.0 / unit


def rating_factors(a: np.ndarray, b: np.ndarray, unit: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Prediction factors in the tenant's scale from factors (A, B) in its units:
    (unit A) B, same shapes, one product."""
    return (a, b) if unit == 1.0 else (unit * a, b)


#: standard deviation of MovieLens 100k's ratings (stars): the spread, in units, of the
#: data the recommended regularisation weights were validated on
REF_STD = 1.1257
RIDGE_POWER = 2.0
#: ratings at which a tenant's own spread and the reference weigh the same in
#: :func:`ridge_scale_of` (a prior worth this many ratings)
RIDGE_PRIOR_RATINGS = 200.0


def ridge_scale_of(block: RatingBlock, unit: float) -> float:
    """How much the tenant's ratings vary, in units, relative to MovieLens (``REF_STD``):
    the standard deviation of its ratings divided by ``unit``, over ``REF_STD``, clipped to
    [1/8, 8] (1 for a block with fewer than two ratings or no variation).

    An l2 penalty on factors is not invariant under a rescaling of the ratings: with
    ratings c r the same fit needs factors sqrt(c) as large, whose penalty grows by c
    while the squared error grows by c^2, so a weight lambda on c r acts like lambda / c
    on r. Normalising by the declared range makes the *range* 4 units on every scale, but
    data that use part of their range (a -10..10 set with standard deviation 3.5: 0.7
    units) or spread over all of it (0/1 data: 2 units) still differ in c. Multiplying a
    ridge weight by this factor makes it mean the same whatever the spread. Computed by
    the tenant from its own training ratings (nothing leaves it).

    A small tenant's spread says more about who its users are than about the scale (a
    tenant of three users, one of whom gives every item the same rating, has a small
    one), so the factor is shrunk toward 1 in proportion to how few ratings back it: its
    logarithm is weighted ``n / (n + RIDGE_PRIOR_RATINGS)``. Without this, tenants of 3
    users of a 300-user set with a quarter such raters lost up to 8x of their ridge and
    FedMC-ADMM's default overfitted them."""
    if block.nnz < 2:
        return 1.0
    std = float(np.std(block.vals)) / unit
    if not std > 0:
        return 1.0
    weight = block.nnz / (block.nnz + RIDGE_PRIOR_RATINGS)
    return float(np.clip((std / REF_STD) ** (RIDGE_POWER * weight), 0.125, 8.0))


#: config fields of a public rating scale (DPALS, DP-FedMAvg, DP-FedMC-ADMM: their centre
#: and rating clip, and so a user's sensitivity, are set from it, never from the data)
PUBLIC_SCALE_FIELDS = ("scale_min", "scale_max")


def with_public_scale(cfg: Any, given: Iterable[str], scale: tuple[float, float]) -> Any:
    """``cfg`` with ``scale`` as its public rating scale, for a config that takes one and
    was not given one (``given``: the fields the user set); otherwise ``cfg`` itself.

    The service passes the tenants' declared scale; the simulator the data's range (its
    stand-in for a declared scale). Without this the 1-5 default put the centre of a
    0-100 or -10..10 set at 3."""
    fields = set(PUBLIC_SCALE_FIELDS)
    lo, hi = (float(x) for x in scale)
    if not fields <= set(type(cfg).model_fields) or fields & set(given) or not lo < hi:
        return cfg
    return type(cfg)(**{**cfg.model_dump(), "scale_min": lo, "scale_max": hi})


def public_unit(cfg: Any) -> float:
    """The rating unit of a config with a public scale (``scale_min``, ``scale_max``): its
    spread over the reference spread when ``cfg.normalise``, else 1 (raw ratings, the
    behaviour of configs stored before the field). From the config alone, never the data,
    so a per-user bound stated in units (a rating clip) stays data-independent."""
    if not getattr(cfg, "normalise", False):
        return 1.0
    return (cfg.scale_max - cfg.scale_min) / (REF_HI - REF_LO)
