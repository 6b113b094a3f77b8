r"""A differentially private choice among a few candidates, scored on the users' validation
ratings: the last, charged release of a user-level job that selects.

What is released. Each tenant scores every candidate c_1..c_K (a public grid) on its users'
validation carve-out and sends the K-vector of sums over its users of a per-user score in
[0, 1] (for the popularity prior's weight of ``dp-ials``: each user's NDCG@10,
:func:`algorithms.ials.prior_scores`). Adding or removing one user moves every
candidate's sum by at most 1, so the K-vector moves by at most ``sqrt(K)`` in L2 (one
user's scores stay with that user's tenant; the others' do not depend on it, the model
being fixed when the selection runs). The sum over tenants is released with Gaussian
noise ``sigma = z_s sqrt(K)``: one Gaussian event of multiplier ``z_s`` per user, the
event :meth:`privacy.user_level.UserLevelSpec.selection_event` plans (the share
``selection_share`` of the job's privacy, composed with the sweeps by the accountant).
The choice, the argmax of the noisy sums (ties to the first candidate), is
post-processing. No count is released: every candidate's sum runs over the same users,
so the argmax of the sums is the argmax of the means.

Placements, as the sweeps': ``central`` (:func:`release_central`): every contributing
tenant is charged, then the sum is noised once on a grid (:func:`privacy.gaussian.
gaussian_release`, the rounding paid for). ``tenant`` with secure aggregation
(:func:`release_secure`): each tenant is charged before its input leaves, quantises its
vector, adds its ``1 / sqrt(t)`` part of the distributed discrete Gaussian and masks it
(:mod:`privacy.distributed`'s rule and analysis; t the fewest survivors tolerated); the
coordinator unmasks the sum only. Both go through :func:`privacy.ledger.charged_release`
(check budget, privatise, charge); the noise comes from a fresh generator
(:func:`privacy.randomness.fresh_noise_generator`), never from a seed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from privacy import secagg
from privacy.distributed import MIN_INTEGER_SIGMA, round_id
from privacy.gaussian import gaussian_release
from privacy.ledger import Ledger, charged_release
from privacy.randomness import fresh_noise_generator
from privacy.user_level import UserLevelSpec

#: what :func:`privacy.ledger.refusal` calls the selection release
WHAT = "selection release"


def sensitivity(candidates: int) -> float:
    """L2 change of the K-vector of per-candidate sums when one user (per-user scores in
    [0, 1]) is added or removed: ``sqrt(K)``."""
    return math.sqrt(candidates)


def check_scores(scores: Mapping[Hashable, np.ndarray], users: Mapping[Hashable, int]
                 ) -> int:
    """K, after checking every tenant's vector has K finite entries in [0, users_i]: a sum
    of per-user scores in [0, 1] over its ``users[i]`` users (a larger one cannot come from
    bounded users, and would move the choice beyond the sensitivity)."""
    sizes = {np.shape(v) for v in scores.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1:
        raise ValueError(f"every tenant must send one K-vector of scores, got {sizes}")
    for account, v in scores.items():
        v = np.asarray(v, dtype=np.float64)
        if not (np.all(np.isfinite(v)) and v.min() >= 0 and v.max() <= users[account]):
            raise ValueError(f"tenant {account}'s selection scores are not sums of per-user "
                             f"scores in [0, 1] over its {users[account]} users")
    return next(iter(sizes))[0]


def _event(spec: UserLevelSpec):
    event = spec.selection_event()
    if event is None:
        raise ValueError("the job plans no selection release (selection_share is 0)")
    return event


def release_central(spec: UserLevelSpec, scores: Mapping[Hashable, np.ndarray],
                    users: Mapping[Hashable, int], ledger: Ledger, round_: int
                    ) -> tuple[np.ndarray | None, dict[Hashable, Any], dict[Hashable, str]]:
    """Central placement: every tenant that can afford the selection event is charged,
    then the sum of their vectors is released with noise ``z_s sqrt(K)``. Returns (noisy
    sums or None when nobody could pay, {account: event charged}, {account: refusal})."""
    k = check_scores(scores, users)
    event = _event(spec)
    sigma = event.noise_multiplier * sensitivity(k)

    def noisy_sum(kept: list) -> np.ndarray:
        total = np.sum([np.asarray(scores[a], dtype=np.float64) for a in sorted(kept)],
                       axis=0)
        return gaussian_release(total, sigma, fresh_noise_generator(), sensitivity(k))

    return charged_release(ledger, sorted(scores), event, round_, noisy_sum, WHAT)


def integer_sigma(spec: UserLevelSpec, candidates: int, threshold: int,
                  fp: secagg.FixedPoint) -> float:
    """Each tenant's discrete Gaussian sigma (integer units) under secure aggregation:
    ``z_s Delta_int / sqrt(t)`` with ``Delta_int = 2^f sqrt(K) + sqrt(K)`` (the
    rounding of each of the K entries paid for, :func:`privacy.distributed.
    integer_sensitivity`'s rule)."""
    delta_int = fp.scale * sensitivity(candidates) + math.sqrt(candidates)
    sigma = _event(spec).noise_multiplier * delta_int / math.sqrt(threshold)
    if sigma < MIN_INTEGER_SIGMA:
        raise ValueError(f"integer noise sigma {sigma:.3g} is below {MIN_INTEGER_SIGMA} "
                         "(raise the fixed-point bits)")
    return sigma


def release_secure(spec: UserLevelSpec, scores: Mapping[int, np.ndarray],
                   users: Mapping[int, int], ledger: Ledger, round_: int, seed: int,
                   fp: secagg.FixedPoint | None = None, drop: Sequence[int] = ()
                   ) -> tuple[np.ndarray | None, dict[int, Any], dict[int, str]]:
    """Tenant placement with secure aggregation: each tenant is charged (refused ones send
    nothing), then quantises its vector, adds its part of the distributed discrete
    Gaussian (fresh generator per tenant) and masks it; the coordinator unmasks the sum
    of the survivors (``drop``: tenants that vanish after sending shares, for tests).
    Returns (noisy sums or None, {account: event charged}, {account: refusal})."""
    k = check_scores(scores, users)
    fp = fp or secagg.FixedPoint()
    event = _event(spec)
    charged: dict[int, Any] = {}
    refused: dict[int, str] = {}
    for account in sorted(scores):  # each tenant's own check before its input leaves
        _, paid, why = charged_release(ledger, [account], event, round_, lambda _: None,
                                       WHAT)
        charged.update(paid)
        refused.update(why)
    kept = sorted(charged)
    if not kept:
        return None, charged, refused
    n = len(kept)
    t = secagg.threshold_for(n, spec.dropout_tolerance) if n > 1 else 1
    sigma = integer_sigma(spec, k, t, fp)
    limit = fp.bound(n) * fp.scale
    inputs = {}
    for i in kept:
        noisy = (fp.quantise(np.asarray(scores[i], dtype=np.float64), n)
                 + secagg.discrete_gaussian((k,), sigma, fresh_noise_generator()))
        if np.any(np.abs(noisy) > limit):
            raise secagg.SecAggError("noisy value outside the fixed-point range")
        inputs[i] = noisy.view(np.uint64)
    if n == 1:
        total = inputs[kept[0]]
    else:
        total = secagg.run_round(inputs, round_id(seed, round_) + b":selection",
                                 dropout_tolerance=spec.dropout_tolerance,
                                 drop_before_input=sorted(set(drop) & set(kept))).total
    return fp.decode(total), charged, refused


def choose(candidates: Sequence[float], noisy_sums: np.ndarray | None,
           default: float) -> float:
    """The candidate with the largest noisy sum (post-processing; the first on ties), or
    ``default`` when nothing was released."""
    if noisy_sums is None or len(noisy_sums) != len(candidates):
        return float(default)
    return float(candidates[int(np.argmax(noisy_sums))])


def release_tenant(spec: UserLevelSpec, scores: Mapping[Hashable, np.ndarray],
                   users: Mapping[Hashable, int], ledger: Ledger, round_: int
                   ) -> tuple[np.ndarray | None, dict[Hashable, Any], dict[Hashable, str]]:
    """Tenant placement without secure aggregation: each tenant is charged, then noises
    its own vector in full (``z_s sqrt(K)``) before it leaves; the sum of the noisy
    vectors is released (T times central's noise variance)."""
    k = check_scores(scores, users)
    event = _event(spec)
    sigma = event.noise_multiplier * sensitivity(k)
    total, charged, refused = None, {}, {}
    for account in sorted(scores):
        noisy, paid, why = charged_release(
            ledger, [account], event, round_,
            lambda _, a=account: gaussian_release(np.asarray(scores[a], dtype=np.float64),
                                                  sigma, fresh_noise_generator(),
                                                  sensitivity(k)), WHAT)
        charged.update(paid)
        refused.update(why)
        if noisy is not None:
            total = noisy if total is None else total + noisy
    return total, charged, refused


def select(spec: UserLevelSpec, candidates: Sequence[float],
           scores: Mapping[Hashable, np.ndarray], users: Mapping[Hashable, int],
           ledger: Ledger, round_: int, default: float, seed: int = 0
           ) -> tuple[float, dict[str, Any]]:
    """(the chosen candidate, the record of the choice) of a job whose privacy ``spec``
    plans a selection: the release of the placement (:func:`release_central`,
    :func:`release_tenant` or :func:`release_secure`), charged to ``ledger``, then its
    argmax (:func:`choose`; ``default`` when nobody could pay). The record states the
    candidates, the noisy sums, the noise and the event charged: what a job's selection
    record and report show."""
    if spec.secure_aggregation:
        noisy, charged, refused = release_secure(spec, scores, users, ledger, round_, seed)
    elif spec.placement == "tenant":
        noisy, charged, refused = release_tenant(spec, scores, users, ledger, round_)
    else:
        noisy, charged, refused = release_central(spec, scores, users, ledger, round_)
    event = _event(spec)
    k = len(candidates)
    chosen = choose(candidates, noisy, default)
    record = {
        "mechanism": "gaussian", "candidates": [float(c) for c in candidates],
        "chosen": chosen, "default": float(default),
        "noisy_ndcg_sums": None if noisy is None else [float(x) for x in noisy],
        "noise_multiplier": event.noise_multiplier, "sensitivity": sensitivity(k),
        # the released sums' noise: tenant placement adds each charged tenant's own
        "noise_std": event.noise_multiplier * sensitivity(k) * math.sqrt(
            max(len(charged), 1) if spec.placement == "tenant" and not
            spec.secure_aggregation else 1),
        "selection_share": spec.selection_share, "round": int(round_),
        "tenants_charged": len(charged), "refused": {str(a): w for a, w in refused.items()},
        "note": ("each tenant's users' validation NDCG@10 sums per candidate, released with "
                 "Gaussian noise (one user moves each sum by at most 1: L2 sensitivity "
                 "sqrt(K)); charged as one event of the job's planned budget, the argmax "
                 "is post-processing")}
    return chosen, record


def choose_prior(spec: UserLevelSpec, ledger: Ledger, glob: Any,
                 parts: Sequence[tuple[Any, Any, Any, tuple[float, float]]],
                 accounts: Sequence[Hashable], round_: int, seed: int = 0
                 ) -> tuple[Any, dict[str, Any] | None]:
    """(the model with its popularity prior's beta chosen by the charged selection, the
    record) for a ``dp-ials`` model (:class:`algorithms.ials.GlobalModel` with a prior);
    ``(glob, None)`` for any other. ``parts``: each tenant's (local state, fit block,
    validation carve-out, scale), ``accounts`` its ledger account; each tenant scores
    :data:`algorithms.ials.DP_PRIOR_GRID` on its carve-out
    (:func:`algorithms.ials.prior_scores`) and :func:`select` releases and picks."""
    from algorithms.ials import DP_PRIOR_GRID, GlobalModel, prior_scores

    if not isinstance(glob, GlobalModel) or glob.prior is None or not parts:
        return glob, None
    scores = {a: prior_scores(glob, state, fit, valid, scale, DP_PRIOR_GRID)
              for a, (state, fit, valid, scale) in zip(accounts, parts, strict=True)}
    users = {a: part[1].n_users for a, part in zip(accounts, parts, strict=True)}
    beta, record = select(spec, DP_PRIOR_GRID, scores, users, ledger, round_,
                          glob.prior_weight, seed)
    return glob.replace(prior_weight=beta), record
