"""Config fields that several algorithms share, each declared once.

A field here is an ``Annotated`` type carrying its description, bounds and (where every
user of it agrees) its default; a config declares it in its own place, e.g.
``scale_min: ScaleMin``, or with its own default, ``lam: RidgeU = 0.1``, which replaces
the default only. They are types rather than fields of a common base class because a
config's field order is public: it is the order of ``fedrec simulate --help`` and of a
stored job's config, and pydantic puts a base class's fields before the subclass's own.
``tests/algorithms/test_config_schemas.py`` holds every config to its schema.

Groups: the public rating scale and the released centre, with the local user solve, of
the user-level methods (DPALS, DP-FedMAvg, DP-FedMC-ADMM; :mod:`algorithms._centre`,
:mod:`algorithms.scale`); the item solve of the ALS methods (DPALS, iALS); the factor
model of FedMAvg and FedMGS.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from algorithms._centre import DEFAULT_SHARE
from algorithms.scale import public_unit

#: default ridge of the local user bias: a user with one rating keeps a quarter of its
#: offset from the centre (sparse data: docs/benchmarks/sparse_sets.md)
USER_BIAS_RIDGE = 3.0
#: default fewest ratings of a user with a factor (fewer: its bias alone)
FACTOR_MIN_RATINGS = 3

# --------------------------------------------------------------- public scale and centre

ScaleMin = Annotated[float, Field(1.0, description="public rating scale: lowest rating")]
ScaleMax = Annotated[float, Field(5.0, description="public rating scale: highest rating")]
PublicCentre = Annotated[float | None, Field(
    None, description="public centre mu (default: the middle of the rating scale); "
    "with release_centre, only until the first release")]
ReleaseCentre = Annotated[bool, Field(
    True, description="mu is the mean of the users' mean ratings, estimated from "
    "centre_share of each release and charged with it (false: public_centre, nothing "
    "spent on it, as jobs stored before this field)")]
CentreShare = Annotated[float, Field(
    DEFAULT_SHARE, description="share of each release's privacy spent on the centre "
    "(release_centre)")]
Normalise = Annotated[bool, Field(
    True, description="divide ratings by the public scale's unit, (scale_max - "
    "scale_min) / 4, inside the tenant, so clips, ridges and steps mean the same on any "
    "scale as on 1-5 stars (false: raw ratings, as jobs stored before this field)")]

# ------------------------------------------------------------------- local user solve

LamU = Annotated[float, Field(1.0, description="ridge weight of the local user solve")]
FactorMinRatings = Annotated[int, Field(
    FACTOR_MIN_RATINGS, description="users with fewer ratings get no factor, only their "
    "bias (1: off)")]
LamBias = Annotated[float | None, Field(
    USER_BIAS_RIDGE, description="ridge weight of the user bias in the local solve (a "
    "user with n ratings keeps n / (n + lam_bias) of its mean offset; None: lam_u)")]
UserBias = Annotated[bool, Field(True, description="learn a local user bias")]
InitScaleV = Annotated[float, Field(
    0.1, description="std of the random initial V (public)")]

# ------------------------------------------------------------------ ALS item solve

BiasRank = Annotated[int, Field(
    description="r, latent factors (one item-bias coordinate extra)")]
NoiseRidge = Annotated[float, Field(
    1.0, description="extra item ridge per unit of the noise's spectral norm")]

# ------------------------------------------------------ FedMAvg / FedMGS factor model

FactorRank = Annotated[int, Field(10, ge=1, description="rank r of U_i V")]
RidgeU = Annotated[float, Field(ge=0, description="lambda: ridge weight on U_i")]
RidgeForm = Annotated[Literal["plain", "per_rating"], Field(
    "per_rating", description="ridge form: plain, or weighted by rating counts")]
FactorInit = Annotated[Literal["normal", "uniform"], Field(
    "normal", description="distribution of U, V")]
FactorInitScale = Annotated[float, Field(
    0.1, gt=0, description="std (normal) or upper bound (uniform)")]
Center = Annotated[bool, Field(
    True, description="predict U V + the tenant's mean training rating")]


class CentredScale:
    """What a config with the public scale, centre and local solve fields above derives
    from them (DPALS and the user-level gradient methods): its rating unit, public centre
    and the checks they need."""

    @property
    def unit(self: Any) -> float:
        """Ratings are divided by this inside the tenant (:func:`public_unit`)."""
        return public_unit(self)

    @property
    def mu(self: Any) -> float:
        """The public centre, in units."""
        mid = (self.scale_min + self.scale_max) / 2
        return (mid if self.public_centre is None else self.public_centre) / self.unit

    def check_centred_scale(self: Any) -> None:
        """ValueError naming the field unless the scale, centre share and the fewest
        ratings of a factor are valid."""
        if not self.scale_max > self.scale_min:
            raise ValueError("scale_max must exceed scale_min")
        if not 0 < self.centre_share < 1:
            raise ValueError("centre_share must be in (0, 1)")
        if self.factor_min_ratings < 1:
            raise ValueError("factor_min_ratings must be at least 1")
