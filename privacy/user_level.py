r"""User-level differential privacy for algorithms whose uploads are sums of per-user terms.

Unit protected: **one user account of one tenant** (add or remove all of its ratings;
:data:`privacy.threat_model.UNIT_DETAIL`: a person with accounts in several tenants is
several units). The model is joint DP (the billboard model): a user's own factor stays
with the tenant that holds the user's ratings and is never released; what is released is
item-side sums over users, each user's term bounded by the algorithm
(:class:`algorithms.user_bounds.UserBounds`):

* a *gram* array holds, per item, ``sum_u x_u x_u^T`` (symmetric d x d);
* a *rhs* array holds, per item, ``sum_u s_uj x_u``;
* *clipped-sum* arrays (the gradient methods, :mod:`algorithms.dp_fedmavg`,
  :mod:`algorithms.dp_fedmc_admm`) hold a sum over users of a per-user term whose L2 norm
  over all of that user's entries in all of them is clipped to C. Adding or removing a
  user moves them by at most C in L2 (:func:`clipped_sensitivity`), and one release adds
  Gaussian noise of standard deviation ``z C`` to every entry: one Gaussian event of noise
  multiplier z, accounted as below;

over at most ``k = max_ratings`` items per user, with ``||x_u|| <= G_x`` and
``|s_uj| <= G_r``. Removing user u changes the releases by u's own terms only (another
user's x depends only on that user's ratings and the public V), so

* gram: the noise is drawn on the upper triangle (diagonal included) and mirrored, so the
  released vector is the upper triangles; its L2 change is
  ``sqrt(sum_j sum_{a<=b} (x_a x_b)^2) = sqrt(k (||x||^4 + sum_a x_a^4) / 2)
  <= sqrt(k) G_x^2`` (:func:`gram_sensitivity`; also at most the full Frobenius change
  ``sqrt(sum_j ||x x^T||_F^2) = sqrt(k) ||x||^2``);
* rhs: ``sqrt(sum_j s_uj^2 ||x||^2) <= sqrt(k) G_r G_x`` (:func:`rhs_sensitivity`).

* *centre* arrays (optional, any algorithm): ``sum_u (a_u, 1)`` with ``|a_u| <= 1`` the
  user's mean rating relative to the public scale (:func:`algorithms.user_bounds.
  centre_terms`): L2 change ``sqrt(2)`` (:func:`centre_sensitivity`). From them the server
  estimates the centre of the predictions (a data mean instead of the scale's middle).

One release (one sweep) adds Gaussian noise ``sigma_g = z Delta_g / sqrt(rho)`` to the gram
and ``sigma_r = z Delta_r / sqrt(1 - rho)`` to the rhs (``rho = gram_share``, default 0.2).
The pair is the Gaussian mechanism on ``(gram / sigma_g, rhs / sigma_r)`` with L2 sensitivity
``sqrt((Delta_g/sigma_g)^2 + (Delta_r/sigma_r)^2) = sqrt(rho + 1 - rho) / z = 1 / z``. With
centre arrays, they get the share ``rho_c`` (the bounds' ``centre_share``) and every other
array's share is multiplied by ``1 - rho_c`` (:func:`array_shares`): the shares still sum to
1, so the whole release, centre included, is still one Gaussian event of noise
multiplier z per user per release, composed in Renyi DP by :mod:`privacy.accountant` (with
Poisson sampling of users inside a tenant at rate q, the subsampled-Gaussian RDP of
:mod:`privacy.rdp`; no amplification for which tenants transmit, which the server sees).

Placement (a property of the round, not of the algorithm):

* ``central``: tenants send their bounded sums; the aggregation step adds the noise once to
  the total before the server step uses it. Protects each user against other tenants and
  what is published (V, reports, lists: :mod:`privacy.threat_model`, which states per
  adversary what it learns); the coordinator holds the sums.
* ``tenant``: each tenant adds the full noise to its own upload before sending; the sum
  carries T times the variance (without secure aggregation), but a curious coordinator
  sees only noisy uploads.

Every release is charged to the :class:`privacy.ledger.Ledger` (one account per tenant,
standing for each of its users, who all take part in the same releases) before the noisy
sum is handed on; a tenant that cannot afford a release is left out of it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from algorithms.messages import Message
from algorithms.pool import sum_arrays
from algorithms.user_bounds import UserBounds
from privacy import samplers
from privacy.accountant import Event, noise_for_epsilon, schedule_events, spend
from privacy.gaussian import gaussian_noise, gaussian_release
from privacy.ledger import Budget, Ledger, charged_release, check_schedule
from privacy.randomness import fresh_noise_generator
from privacy.threat_model import UNIT, threat_model

UNIT_USER = (f"user: {UNIT} (add/remove all of its ratings); joint DP, each user's "
             "factor stays in the tenant and only per-user-bounded item sums are released")

#: key under which a central aggregation hands the one noisy sum to the server step
AGGREGATE = -1

ACCOUNTING_USER = (
    "Renyi DP of the Gaussian mechanism per user and release (privacy.rdp; "
    "q = the Poisson rate of users inside a tenant, 1 when every user contributes; no "
    "amplification by tenant selection), composed over the counted releases and converted "
    "to (epsilon, delta) by privacy.rdp.epsilon_from_rdp")

#: who each placement protects the users against
ADVERSARY = {
    "central": ("the coordinator is trusted with each tenant's bounded item sums (a hosted "
                "tenant's ratings are with the operator anyway); each user is protected "
                "against other tenants and against what they are shown (V, the registered "
                "catalogue, reports, lists computed from V): see threat_model for what "
                "each adversary learns"),
    "tenant": ("each tenant noises its own contribution before it leaves: each user is "
               "protected also against a curious coordinator (at T times the noise variance "
               "of central placement, without secure aggregation)"),
    "tenant+secure_aggregation": (
        "each tenant adds 1/sqrt(t) of the noise (distributed discrete Gaussian, t = the "
        "fewest surviving tenants the round tolerates) and masks its upload (secure "
        "aggregation, Bonawitz et al. CCS 2017): the coordinator, following the protocol "
        "and keeping every message, learns only the noisy sum of the surviving tenants' "
        "uploads and which tenants took part and dropped; each user is protected against "
        "it at the charged epsilon. A coalition of the coordinator and c < t tenants "
        "learns nothing more than the sum of the other survivors' uploads, but can remove "
        "its own members' noise: against it the noise multiplier is z sqrt((T' - c) / t) "
        "(T' survivors). Tenants without the coordinator see only encrypted shares and the "
        "published model. Not covered: an active coordinator lying about dropouts"),
}


def adversary_of(spec: UserLevelSpec) -> str:
    """The adversary text of a spec's placement (secure aggregation included)."""
    if spec.secure_aggregation:
        return ADVERSARY["tenant+secure_aggregation"]
    return ADVERSARY[spec.placement]


#: data-dependent figures a user-level run uses without charging them, and why that is
#: acceptable; stated in every report (issue: "no unaccounted data-dependent constant")
PUBLIC_INPUTS = {
    "n_users": ("the number of users the tenants hold, treated as public (the operator's "
                "account count): used only to check delta < 1 / n_users and stated in this "
                "report; it sets no noise scale, and the guarantee does not hide it"),
    "rating_scale": ("the tenants' declared rating scales (set when a tenant is created, "
                     "not computed from ratings): the rating clip, the starting centre "
                     "and the middle and half width that bound each user's centre term "
                     "(the centre itself is released, charged with each release)"),
}


def release_report(spec: UserLevelSpec, ledger: Ledger,
                   charges: Sequence[tuple[Any, int, Event]]) -> dict[str, Any]:
    """JSON-ready report of a user-level job: unit, placement, adversary, delta,
    accounting, epsilon spent by each account's users, and every release counted
    (``charges``: (account, round, event) of each charge of this job). Epsilon is
    stated at the job's delta (a tenant's budget is checked at the budget's own delta)."""
    eps = {str(t): spend(ledger.history(t), spec.delta).epsilon for t in ledger.tenants()}
    worst = max(eps.values(), default=0.0)
    return {
        "mechanism": "gaussian", "private": True, "unit": USER, "unit_detail": UNIT_USER,
        "placement": spec.placement, "secure_aggregation": spec.secure_aggregation,
        "adversary": adversary_of(spec),
        "guarantee": (f"differentially private: epsilon {worst:.4g} at delta "
                      f"{spec.delta:.3g} for every user (unit: {UNIT}), placement "
                      f"{spec.placement}"),
        "threat_model": threat_model(spec.placement, spec.secure_aggregation, worst),
        "target_epsilon": spec.epsilon, "epsilon_max": worst, "epsilon_per_tenant": eps,
        "delta": spec.delta, "users": spec.n_users, "accounting": ACCOUNTING_USER,
        "public_inputs": PUBLIC_INPUTS,
        "planned_releases": spec.releases,
        "releases": [{"tenant": str(t), "round": int(r),
                      "noise_multiplier": ev.noise_multiplier,
                      "sample_rate": ev.sample_rate} for t, r, ev in charges],
    }


def gram_sensitivity(bounds: UserBounds) -> float:
    """L2 change of the released gram upper triangles when one user is added or removed."""
    return math.sqrt(bounds.max_ratings) * bounds.x_norm ** 2


def rhs_sensitivity(bounds: UserBounds) -> float:
    """L2 change of the released rhs sums when one user is added or removed."""
    return math.sqrt(bounds.max_ratings) * bounds.rating_bound * bounds.x_norm


def clipped_sensitivity(bounds: UserBounds) -> float:
    """L2 change of the released clipped-sum arrays (all together) when one user is added
    or removed: the clip norm C of one user's joint term."""
    return float(bounds.clip_norm)


def centre_sensitivity(bounds: UserBounds) -> float:
    """L2 change of the released centre sums when one user is added or removed."""
    return float(bounds.centre_norm)


def sensitivities(bounds: UserBounds) -> dict[str, float]:
    """The declared sensitivity of each kind of bounded array the algorithm releases."""
    out = ({"clipped": clipped_sensitivity(bounds)} if bounds.clipped else
           {"gram": gram_sensitivity(bounds), "rhs": rhs_sensitivity(bounds)})
    if bounds.centre:
        out["centre"] = centre_sensitivity(bounds)
    return out


def array_sensitivity(bounds: UserBounds, name: str) -> float:
    """The sensitivity of the kind of bounded array ``name`` is."""
    if name in bounds.gram:
        return gram_sensitivity(bounds)
    if name in bounds.rhs:
        return rhs_sensitivity(bounds)
    if name in bounds.clipped:
        return clipped_sensitivity(bounds)
    if name in bounds.centre:
        return centre_sensitivity(bounds)
    raise KeyError(f"{name!r} is not a bounded array")


def array_shares(bounds: UserBounds, gram_share: float = 0.2) -> dict[str, float]:
    """The share of a release's privacy each bounded array gets: gram ``rho``, rhs
    ``1 - rho``, clipped-sum 1, each times ``1 - rho_c`` when there are centre arrays, which
    get ``rho_c = centre_share``. Array kinds' shares sum to 1, so noising array ``a`` with
    ``z Delta_a / sqrt(share_a)`` is one Gaussian mechanism of multiplier z on all of them
    (the one rule for central, tenant and distributed noise)."""
    rest = 1.0 - bounds.centre_share if bounds.centre else 1.0
    out = {name: gram_share * rest for name in bounds.gram}
    out.update({name: (1.0 - gram_share) * rest for name in bounds.rhs})
    out.update({name: rest for name in bounds.clipped})
    out.update({name: bounds.centre_share for name in bounds.centre})
    return out


class UserLevelSpec(BaseModel):
    """Target guarantee of a user-level run. Impossible values raise ``ValueError``
    naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: float = Field(gt=0, allow_inf_nan=False)
    delta: float = Field(gt=0, lt=1)
    #: users protected: delta must be below 1 / n_users. Treated as PUBLIC (not charged):
    #: the number of users the tenants hold, known to the operator and stated in reports;
    #: it sets no noise scale and enters nothing released but that check and the report
    #: (:data:`PUBLIC_INPUTS`). Add/remove of one user moves it by one.
    n_users: int = Field(ge=1)
    #: releases each user takes part in (DPALS: the sweeps)
    releases: int = Field(ge=1)
    placement: Literal["central", "tenant"] = "central"
    #: Poisson rate of users inside a tenant per release (hidden from the server); must
    #: equal the algorithm's declared ``UserBounds.sample_rate``
    sample_rate: float = Field(1.0, gt=0, le=1)
    #: share rho of the release's privacy spent on the gram arrays (the rest on the rhs);
    #: 0.2 chosen for DPALS on a validation carve-out of MovieLens 1M (its item solve uses
    #: the grams mostly through their traces, so the rhs deserves more)
    gram_share: float = Field(0.2, gt=0, lt=1)
    #: g >= 1: release k (0-based) gets a share of the privacy proportional to g^k, so
    #: later releases (closer to the final model) are less noisy; 1 = equal shares. 2.5
    #: chosen for DPALS on a validation carve-out of MovieLens 1M at epsilon 1 and 8
    release_growth: float = Field(2.5, ge=1, le=100, allow_inf_nan=False)
    #: placement ``tenant`` only: tenants add distributed noise and mask their uploads so
    #: the coordinator sees only the sum (:mod:`privacy.distributed`)
    secure_aggregation: bool = False
    #: secure aggregation: largest fraction of a round's tenants that may drop; each
    #: tenant's noise is planned for the fewest survivors t = n - floor(fraction n)
    dropout_tolerance: float = Field(0.1, ge=0, lt=0.5)
    #: share of the job's privacy spent on one extra release after the sweeps: the DP
    #: choice of a served hyper-parameter on the tenants' validation carve-out
    #: (:mod:`privacy.selection`); 0: the job selects nothing and plans no such release
    selection_share: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _delta_below_one_over_users(self) -> UserLevelSpec:
        if self.delta >= 1.0 / self.n_users:
            raise ValueError(f"delta must be below 1 / number of users = "
                             f"{1.0 / self.n_users:.3g}, got {self.delta!r}")
        if self.secure_aggregation and self.placement != "tenant":
            raise ValueError("secure_aggregation needs placement 'tenant' (central placement "
                             "already sees only one noisy sum)")
        if self.secure_aggregation and self.sample_rate < 1:
            raise ValueError("secure_aggregation is accounted for sample_rate 1 only (the "
                             "distributed discrete Gaussian has no subsampled analysis here)")
        if self.selection_share > 0 and self.sample_rate < 1:
            raise ValueError("selection_share needs sample_rate 1 (the selection release "
                             "reads every user's validation score, unsampled)")
        if self.epsilon > 100:
            raise ValueError(f"epsilon must be at most 100 (no meaningful guarantee "
                             f"beyond), got {self.epsilon!r}")
        return self

    def weights(self) -> list[float]:
        """Relative privacy share of each release, mean 1 (``release_growth``)."""
        raw = [self.release_growth ** k for k in range(self.releases)]
        mean = sum(raw) / len(raw)
        return [w / mean for w in raw]

    def plan_weights(self) -> list[float]:
        """The weights of every planned Gaussian event: the releases' (:meth:`weights`)
        times ``1 - selection_share``, then, with a selection, its weight
        ``selection_share * releases``. They sum to ``releases`` either way; at q = 1 the
        RDP of event k is ``w_k / (2 z^2)`` times the order, so the selection gets exactly
        the share ``selection_share`` of the job's privacy."""
        s = self.selection_share
        if s == 0:
            return self.weights()
        return [w * (1.0 - s) for w in self.weights()] + [s * self.releases]

    def noise_multiplier(self) -> float:
        """Base z: event k uses ``z / sqrt(w_k)`` (:meth:`plan_weights`), and the planned
        Gaussian events at rate q spend at most epsilon together."""
        return _solved_noise(self)

    def planned_events(self) -> list[Event]:
        """Every event the job plans to charge each user: the releases
        (:meth:`schedule`), then the selection's (:meth:`selection_event`) if any; what a
        budget check must afford."""
        return schedule_events("gaussian", self.noise_multiplier(), self.plan_weights(),
                               self.sample_rate)

    def schedule(self) -> list[Event]:
        """The planned event of each release, in order (the selection's not included)."""
        return self.planned_events()[: self.releases]

    def selection_event(self) -> Event | None:
        """The event of the selection release (None: the job plans none)."""
        return self.planned_events()[-1] if self.selection_share > 0 else None


@functools.lru_cache(maxsize=256)
def _solved_noise(spec: UserLevelSpec) -> float:
    """The bisection of :meth:`UserLevelSpec.noise_multiplier`, once per spec: about 4 ms at
    q = 1 (closed-form RDP), but seconds at q < 1 (the subsampled-Gaussian RDP at
    fractional orders), and every release asks for its event."""
    weights = spec.plan_weights()
    return noise_for_epsilon("gaussian", spec.epsilon, spec.delta, len(weights),
                             sample_rate=spec.sample_rate, weights=weights)


def noise_stds(bounds: UserBounds, z: float, gram_share: float = 0.2) -> dict[str, float]:
    """Per-array noise standard deviation of one release at joint noise multiplier z:
    ``z Delta / sqrt(share)`` with the shares of :func:`array_shares` (the gram arrays get
    ``gram_share``; clipped-sum arrays get ``z C`` without centre arrays)."""
    shares = array_shares(bounds, gram_share)
    return {name: z * array_sensitivity(bounds, name) / math.sqrt(shares[name])
            for name in bounds.arrays}


def symmetric_noise(shape: tuple[int, ...], sigma: float, rng: np.random.Generator
                    ) -> np.ndarray:
    """N(0, sigma^2) on the upper triangle of each trailing d x d block, mirrored below."""
    z = gaussian_noise(shape, sigma, rng)
    upper = np.triu(np.ones(shape[-2:], dtype=bool))
    z = np.where(upper, z, 0.0)
    return z + np.swapaxes(np.triu(z, 1), -1, -2)


def symmetric_release(value: np.ndarray, sigma: float, rng: np.random.Generator,
                      sensitivity: float) -> np.ndarray:
    """A symmetric array (trailing d x d blocks) plus symmetric Gaussian noise, on a grid:
    the upper triangles (diagonal included, the entries the gram sensitivity is stated on)
    are rounded to the grid and noised as :func:`privacy.samplers.gaussian_release` does,
    with the rounding paid for over those entries, then mirrored."""
    shape = np.shape(value)
    upper = np.triu(np.ones(shape[-2:], dtype=bool))
    entries = int(np.prod(shape[:-2], dtype=np.int64)) * int(upper.sum())
    gamma = samplers.grid(sigma)
    s = samplers.integer_scale(sigma, gamma, sensitivity, entries, "l2")
    m = np.where(upper, samplers.snap(value, gamma)
                 + samplers.discrete_gaussian(shape, s, rng), 0.0)
    return (m + np.swapaxes(np.triu(m, 1), -1, -2)) * gamma


def add_noise(upload: Message, bounds: UserBounds, stds: Mapping[str, float],
              rng: np.random.Generator) -> Message:
    """A copy with noise added to every bounded array, in the bounds' field order, and the
    upload's noise fields updated (standard deviations add in quadrature). Each array is
    released on its grid (:func:`privacy.samplers.gaussian_release`) with its integer
    noise scaled by its own rounding, so every array keeps sigma / Delta, and the joint
    release the noise multiplier z it is charged."""
    changes: dict[str, Any] = {}
    for name in bounds.arrays:
        arr = getattr(upload, name)
        put = symmetric_release if name in bounds.gram else gaussian_release
        changes[name] = put(arr, stds[name], rng, array_sensitivity(bounds, name))
        field = bounds.noise_fields[name]
        changes[field] = float(math.hypot(getattr(upload, field), stds[name]))
    return upload.replace(**changes)


def sum_uploads(uploads: Sequence[Message], bounds: UserBounds) -> Message:
    """Entry-wise sum of the bounded arrays (noise fields add in quadrature)."""
    first = uploads[0]
    changes: dict[str, Any] = {}
    for name in bounds.arrays:  # np.sum(..., axis=0)'s numbers, without stacking a copy
        changes[name] = sum_arrays([getattr(u, name) for u in uploads])
        field = bounds.noise_fields[name]
        changes[field] = float(math.sqrt(sum(getattr(u, field) ** 2 for u in uploads)))
    return first.replace(**changes)


USER = "user"
"""The ``unit`` of a job's privacy settings that selects user-level DP."""


def is_user_level(dp: Mapping[str, Any]) -> bool:
    """Whether a job's stored privacy settings protect users (else a tenant's block)."""
    return dp.get("unit") == USER


def plan(request: Mapping[str, Any], bounds: UserBounds, n_users: int, releases: int
         ) -> UserLevelSpec:
    """The spec of a user-level run from its request (``placement``, ``epsilon``,
    ``delta`` and optional tuning fields): the number of users and of releases and the
    sampling rate come from the data and the algorithm, never from the request."""
    fields = {k: v for k, v in request.items() if k in UserLevelSpec.model_fields}
    fields.update(n_users=int(n_users), releases=int(releases),
                  sample_rate=bounds.sample_rate)
    if "release_growth" not in fields and bounds.release_growth is not None:
        fields["release_growth"] = bounds.release_growth  # the algorithm's preference
    return UserLevelSpec(**fields)


def to_settings(spec: UserLevelSpec) -> dict[str, Any]:
    """What a job stores: the spec as a plain dict, tagged with the unit."""
    return {"unit": USER, **spec.model_dump()}


def from_settings(dp: Mapping[str, Any]) -> UserLevelSpec:
    """Inverse of :func:`to_settings`."""
    return UserLevelSpec(**{k: v for k, v in dp.items() if k != "unit"})


def release_event(spec: UserLevelSpec, index: int) -> Event:
    """The event of release ``index`` (0-based) of the planned schedule; beyond the plan,
    the last one's."""
    events = spec.schedule()  # a few milliseconds: solved again rather than cached
    return events[min(index, len(events) - 1)]


def release_stds(spec: UserLevelSpec, bounds: UserBounds, index: int) -> dict[str, float]:
    """Noise standard deviations of release ``index``."""
    return noise_stds(bounds, release_event(spec, index).noise_multiplier, spec.gram_share)


#: what :func:`privacy.ledger.refusal` calls one user-level release
_RELEASE = "user-level release"


def release_one(spec: UserLevelSpec, bounds: UserBounds, upload: Message, account: Any,
                ledger: Ledger, index: int, rng: np.random.Generator, round_: int
                ) -> tuple[Message | None, Event | None, str | None]:
    """Placement ``tenant``: check the account can afford release ``index``, noise the
    upload, charge ``ledger`` (:func:`privacy.ledger.charged_release`); returns (noisy
    upload, event charged, refusal reason)."""
    noisy, charged, refused = charged_release(
        ledger, [account], release_event(spec, index), round_,
        lambda _: add_noise(upload, bounds, release_stds(spec, bounds, index), rng), _RELEASE)
    if refused:
        return None, None, refused[account]
    return noisy, charged[account], None


def release_sum(spec: UserLevelSpec, bounds: UserBounds, uploads: Mapping[Any, Message],
                ledger: Ledger, index: int, rng: np.random.Generator, round_: int
                ) -> tuple[Message | None, dict[Any, Event], dict[Any, str]]:
    """Placement ``central``: every contributor that can afford release ``index`` is
    charged in ``ledger``, and their uploads are summed and noised once
    (:func:`privacy.ledger.charged_release`).

    Returns (noisy sum or None when nobody could pay, {account: event charged},
    {account: refusal reason}). The sum is returned only after every charge."""
    def noisy_sum(kept: list) -> Message:
        total = sum_uploads([uploads[a] for a in sorted(kept)], bounds)
        return add_noise(total, bounds, release_stds(spec, bounds, index), rng)

    return charged_release(ledger, sorted(uploads), release_event(spec, index), round_,
                           noisy_sum, _RELEASE)


class UserLevelPrivatizer:
    """Check budget, privatise, charge for a user-level run.

    Used twice per round by :func:`algorithms.simulate.simulate`: as the ``privatizer`` of
    each upload (placement ``tenant`` noises it there) and as the ``aggregator`` of the
    round's uploads (placement ``central`` sums them and noises the sum once). Every
    release's noise comes from a fresh generator (:func:`privacy.randomness.
    fresh_noise_generator`), never from the seed: the same seed and data give unrelated
    noise. ``seed`` is kept for the signature the callers share (secure aggregation's
    round ids); no draw derives from it.
    """

    def __init__(self, spec: UserLevelSpec, bounds: UserBounds, n_clients: int, seed: int,
                 ledger: Ledger | None = None) -> None:
        if spec.sample_rate != bounds.sample_rate:
            raise ValueError(f"sample_rate {spec.sample_rate} does not match the "
                             f"algorithm's user sampling rate {bounds.sample_rate}")
        self.spec, self.bounds, self.seed = spec, bounds, int(seed)
        self.z = spec.noise_multiplier()
        self.plan = spec.schedule()
        if ledger is None:
            budget = Budget(spec.epsilon, spec.delta)
            ledger = Ledger.open({i: budget for i in range(n_clients)})
        self.ledger = Ledger.from_dict(ledger.to_dict())
        self.releases: list[dict[str, Any]] = []
        check_schedule(self.ledger, range(n_clients), spec.planned_events())

    def event(self, index: int) -> Event:
        """The event of release ``index`` (0-based); beyond the plan, the last one's."""
        return release_event(self.spec, index)

    def stds(self, index: int) -> dict[str, float]:
        """Noise standard deviations of release ``index``."""
        return release_stds(self.spec, self.bounds, index)

    def _index(self, client: int) -> int:
        """Which release of this tenant's users the next one is (its charged count)."""
        return len(self.ledger.rounds(client))

    def __call__(self, upload: Message, client: int, round_: int) -> Message | None:
        """Placement ``tenant``: noise this tenant's upload, charged first
        (:func:`release_one`); refused, the tenant stops. Central: the bounded upload
        passes to :meth:`aggregate`, whose release of the sum checks and charges every
        contributor (:func:`release_sum`), as the service's aggregation step does. A
        stopped tenant sends nothing."""
        if str(client) in self.ledger.stopped():
            return None
        if self.spec.placement == "central":
            return upload
        index = self._index(client)
        noisy, _, refused = release_one(self.spec, self.bounds, upload, client, self.ledger,
                                        index, fresh_noise_generator(), round_)
        if refused is not None:
            self.ledger.stop(client, round_)
            return None
        self._record(round_, [client], index)
        return noisy

    def aggregate(self, uploads: Mapping[int, Message], round_: int
                  ) -> Mapping[int, Message]:
        """Central: one noisy sum ``{AGGREGATE: sum + noise}``, every contributor charged
        before it is returned. Tenant placement: the (already noisy) uploads unchanged."""
        if self.spec.placement == "tenant" or not uploads:
            return uploads
        index = len(self.releases)
        noisy, charged, refused = release_sum(self.spec, self.bounds, uploads, self.ledger,
                                              index, fresh_noise_generator(), round_)
        for c in refused:
            self.ledger.stop(c, round_)
        if noisy is None:
            return {}
        self._record(round_, sorted(charged), index)
        return {AGGREGATE: noisy}

    def _record(self, round_: int, clients: Sequence[int], index: int) -> None:
        if self.releases and self.releases[-1]["round"] == round_:
            self.releases[-1]["tenants"] += len(clients)
            return
        self.releases.append({"round": int(round_), "mechanism": "gaussian",
                              "noise_multiplier": self.event(index).noise_multiplier,
                              "sample_rate": self.spec.sample_rate,
                              "noise_std": self.stds(index), "tenants": len(clients)})

    def report(self) -> dict[str, Any]:
        """JSON-ready summary: :func:`release_report` (unit, placement, adversary, epsilon
        spent, delta, accounting) with this run's noise, bounds and releases."""
        out = release_report(self.spec, self.ledger, [])
        out.update({
            "noise_multiplier": self.z, "release_growth": self.spec.release_growth,
            "planned_noise_multipliers": [e.noise_multiplier for e in self.plan],
            "sample_rate": self.spec.sample_rate, "gram_share": self.spec.gram_share,
            "sensitivity": sensitivities(self.bounds),
            "bounds": ({"max_ratings_per_user": self.bounds.max_ratings,
                        "clip_norm": self.bounds.clip_norm} if self.bounds.clipped else
                       {"max_ratings_per_user": self.bounds.max_ratings,
                        "x_norm": self.bounds.x_norm,
                        "rating_bound": self.bounds.rating_bound})
            | ({"centre_norm": self.bounds.centre_norm,
                "centre_share": self.bounds.centre_share} if self.bounds.centre else {}),
            "noise_std": self.stds(0), "releases": self.releases,
            "stopped": self.ledger.stopped(),
        })
        return out


#: standard deviations of slack in :func:`bound_problem` (an honest item exceeds it with
#: probability below exp(-TAIL^2 / 2) per item and array)
TAIL = 10.0


def bound_problem(upload: Message, bounds: UserBounds, stds: Mapping[str, float]
                  ) -> str | None:
    """Why a noisy gram/rhs release ``upload`` (noise ``stds``) cannot be sums of bounded
    users' terms (None: it can, or ``bounds`` declare no count coordinate).

    With ``x``'s last coordinate the constant c, item j's gram sum A_j has
    ``A_j[-1, -1] = c^2 sum_u w_uj`` and its rhs ``b_j = sum_u w_uj s_u x_u``, so
    ``||b_j|| <= rating_bound x_norm A_j[-1, -1] / c^2`` whatever the users. With the
    noise: ``A_j[-1, -1]`` is read at most ``TAIL`` standard deviations low and ``b_j``'s
    noise norm is at most ``sigma (sqrt(d) + TAIL)``. An rhs beyond this was not built
    from bounded users: receiving it would let one tenant move the items' factors
    without limit (norm bounding, "Can You Really Backdoor Federated Learning?", Sun et
    al., 2019, at the bound the user-level sensitivity already implies). Clipped-sum
    arrays with an ``item_ratio`` are checked alike (:func:`_ratio_problem`)."""
    if bounds.item_ratio is not None:
        return _ratio_problem(upload, bounds.item_ratio, stds)
    c = bounds.count_coordinate
    if not c or not bounds.gram or len(bounds.gram) != len(bounds.rhs):
        return None
    for gram, rhs in zip(bounds.gram, bounds.rhs, strict=True):
        a, b = getattr(upload, gram), getattr(upload, rhs)
        weight = np.maximum(a[:, -1, -1] + TAIL * stds[gram], 0.0) / c ** 2
        allowed = (bounds.rating_bound * bounds.x_norm * weight
                   + stds[rhs] * (math.sqrt(b.shape[-1]) + TAIL))
        over = np.flatnonzero(np.linalg.norm(b, axis=-1) > allowed)
        if over.size:
            j = int(over[0])
            return (f"{rhs}[{j}] has norm {np.linalg.norm(b[j]):.6g}, more than {gram}[{j}] "
                    f"allows for bounded users plus the declared noise ({allowed[j]:.6g}); "
                    f"{over.size} item(s) over")
    return None


def _ratio_problem(upload: Message, ratio: tuple[str, str, float],
                   stds: Mapping[str, float]) -> str | None:
    """Why clipped sums ``num``, ``den`` with ``||num[..., j]|| <= r den[j]`` per user
    (:attr:`UserBounds.item_ratio`) cannot be such sums plus their noise: with ``den[j]``
    read at most ``TAIL`` standard deviations low and the noise norm of item j's column
    of ``num`` at most ``sigma (sqrt(d) + TAIL)`` (d its entries), as for gram/rhs
    arrays; a non-finite value is outside too."""
    num, den, r = ratio
    top, bottom = getattr(upload, num), getattr(upload, den)
    n = bottom.shape[-1]
    column = top.reshape(-1, n)
    norms = np.linalg.norm(column, axis=0)
    allowed = (r * np.maximum(bottom + TAIL * stds[den], 0.0)
               + stds[num] * (math.sqrt(column.shape[0]) + TAIL))
    over = np.flatnonzero(~(norms <= allowed))
    if not over.size:
        return None
    j = int(over[0])
    return (f"{num}[:, {j}] has norm {norms[j]:.6g}, more than {den}[{j}] allows for "
            f"bounded users plus the declared noise ({allowed[j]:.6g}); {over.size} "
            f"item(s) over")
