r"""White-box audit of the noisy sums fedrec releases: a canary at the sensitivity bound.

The attack-based audits of :mod:`privacy.audit` see only the trained model, with a canary
that is not the worst case. This one audits the *release functions themselves* (the
ones the product calls), in the white-box setting of *Tight Auditing of Differentially
Private Machine Learning* (Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini and
Terzis, USENIX Security 2023): the auditor knows every contribution but one canary, sees
the noisy release of one round, and must tell whether the canary was in it.

* **Canary** (:func:`canary`): for each bounded array a, one entry moved by exactly the
  declared sensitivity Delta_a (on a gram array a diagonal entry, which the upper
  triangle holds once): the largest change one user may make, in every array at once.
* **Score** (:func:`lr_score`): the Gaussian likelihood-ratio statistic
  ``sum_a <y_a - r_a, c_a> / sigma_a^2`` normalised by ``mu = sqrt(sum_a ||c_a||^2 /
  sigma_a^2)``; ``r`` is the auditor's reference (the release without canary and without
  noise). For the claimed mechanism it is N(0, 1) without the canary and N(mu, 1) with
  it, mu = 1 / z: the most powerful test (Neyman-Pearson).
* **Bounds**: (i) :func:`held_out_bound`, rigorous: the threshold is chosen on one half
  of the runs and the false positive / negative rates measured on the other half, each
  replaced by its Clopper-Pearson upper bound, giving epsilon >= log((1 - delta - FNR) /
  FPR) at the stated confidence (the bound of :func:`privacy.audit.epsilon_lower_bound`
  at one pre-chosen threshold); it cannot exceed what the run count can show
  (:func:`privacy.audit.max_measurable_epsilon`). (ii) :func:`gdp_fit`: the Gaussian-DP
  parameter of the two score samples (difference of means over the pooled standard
  deviation, with a one-sided lower confidence bound) converted to epsilon at delta
  (Dong, Roth and Su, "Gaussian Differential Privacy"; the fit of Nasr et al. 2023),
  not capped by the run count but resting on the scores being Gaussian with equal
  variance (true of the additive mechanism audited here; not of a mixture, q < 1).

An audit *can fail*: :func:`run_audit` drives a release under a noise source
(:data:`FRESH`: a new generator from the operating system per run; :data:`REUSED`: the
same generator state every run; :data:`KNOWN`: a generator whose seed the attacker knows,
as for noise derived from a stored job seed, so the attacker replays it on the reference).
The two controls must be caught (empirical epsilon above the claim); the fresh
mechanism must stay below it. Pure numpy / scipy on top of the release functions of
:mod:`privacy.user_level` and :mod:`privacy.distributed`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import chi2, norm

from algorithms.messages import Message
from algorithms.user_bounds import UserBounds
from privacy import distributed, secagg, user_level
from privacy.accountant import spend
from privacy.audit import clopper_pearson, epsilon_from_rates, epsilon_lower_bound
from privacy.gaussian import analytic_delta
from privacy.ledger import Budget, Ledger
from privacy.randomness import fresh_noise_generator

FRESH, REUSED, KNOWN = "fresh", "reused", "known"
#: a fitted mu above this (the scores' spread below 1 / MU_CAP of their separation) is
#: reported as infinite: separation without noise, up to floating-point rounding
MU_CAP = 1e6
NOISE_SOURCES = (FRESH, REUSED, KNOWN)
PLACEMENTS = ("central", "tenant", "secure_aggregation", "central_sampled")


# --------------------------------------------------------------------------- canary, score

def canary(bounds: UserBounds, template: Message) -> dict[str, np.ndarray]:
    """Per bounded array, a change of exactly its declared sensitivity on one entry (item
    0, coordinate 0: a gram array's diagonal), zero elsewhere."""
    out = {}
    for name in bounds.arrays:
        c = np.zeros(np.shape(getattr(template, name)))
        c[(0,) * c.ndim] = user_level.array_sensitivity(bounds, name)
        out[name] = c
    return out


def with_canary(upload: Message, c: Mapping[str, np.ndarray]) -> Message:
    """``upload`` with the canary added to its bounded arrays."""
    return upload.replace(**{k: getattr(upload, k) + v for k, v in c.items()})


def lr_score(release: Message, reference: Message, c: Mapping[str, np.ndarray],
             stds: Mapping[str, float]) -> float:
    """The likelihood-ratio statistic of "canary in", in units of one standard deviation
    of the claimed noise (N(0, 1) out, N(mu, 1) in; see the module docstring)."""
    num = sum(float(np.sum((getattr(release, k) - getattr(reference, k)) * v)) / stds[k] ** 2
              for k, v in c.items())
    return num / math.sqrt(mu_of(c, stds)) if mu_of(c, stds) > 0 else 0.0


def mu_of(c: Mapping[str, np.ndarray], stds: Mapping[str, float]) -> float:
    """sum_a ||c_a||^2 / sigma_a^2 (mu squared)."""
    return sum(float(np.sum(v ** 2)) / stds[k] ** 2 for k, v in c.items())


# --------------------------------------------------------------------------- bounds

def held_out_bound(s_in: np.ndarray, s_out: np.ndarray, delta: float, alpha: float = 0.05
                   ) -> dict[str, Any]:
    """Empirical epsilon at a threshold chosen on held-out runs: the first half of each
    sample picks the threshold (the best of :func:`privacy.audit.epsilon_lower_bound`),
    the second half is counted at it (Clopper-Pearson upper rates, confidence 1 - alpha)."""
    s_in, s_out = np.asarray(s_in, float), np.asarray(s_out, float)
    hi, ho = s_in.size // 2, s_out.size // 2
    t = epsilon_lower_bound(s_in[:hi], s_out[:ho], delta, alpha)["threshold"]
    test_in, test_out = s_in[hi:], s_out[ho:]
    fp, fn = int(np.sum(test_out >= t)), int(np.sum(test_in < t))
    fpr_hi = clopper_pearson(fp, test_out.size, alpha)[1]
    fnr_hi = clopper_pearson(fn, test_in.size, alpha)[1]
    eps = float(epsilon_from_rates(np.asarray(fpr_hi), np.asarray(fnr_hi), delta))
    cap = float(epsilon_from_rates(clopper_pearson(0, test_out.size, alpha)[1],
                                    clopper_pearson(0, test_in.size, alpha)[1], delta))
    return {"epsilon": eps, "threshold": float(t), "fpr": fp / test_out.size,
            "fnr": fn / test_in.size, "test_runs": int(test_in.size + test_out.size),
            "max_measurable": cap, "confidence": 1 - alpha}


def gdp_epsilon(mu: float, delta: float) -> float:
    """Epsilon at ``delta`` of mu-Gaussian DP: the smallest eps with
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) <= delta (:func:`privacy.gaussian.
    analytic_delta` with sigma / Delta = 1 / mu); inf for mu = inf, 0 for mu <= 0."""
    if mu <= 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    lo, hi = 0.0, 1.0
    while analytic_delta(hi, 1.0 / mu) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-6 * max(hi, 1.0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if analytic_delta(mid, 1.0 / mu) > delta else (lo, mid)
    return hi


def gdp_fit(s_in: np.ndarray, s_out: np.ndarray, delta: float, alpha: float = 0.05
            ) -> dict[str, Any]:
    """Gaussian-DP fit of the scores: mu_hat = (mean_in - mean_out) / pooled sd and a
    lower bound at confidence about 1 - alpha (the mean difference at its one-sided
    1 - alpha/2 lower end, over the sd at its chi-square 1 - alpha/2 upper end), each
    converted to epsilon at ``delta`` by :func:`gdp_epsilon`."""
    s_in, s_out = np.asarray(s_in, float), np.asarray(s_out, float)
    diff = float(s_in.mean() - s_out.mean())
    dof = s_in.size + s_out.size - 2
    sd = math.sqrt((np.sum((s_in - s_in.mean()) ** 2)
                    + np.sum((s_out - s_out.mean()) ** 2)) / dof)
    if sd <= MU_CAP ** -1 * abs(diff):  # scores (almost) without spread: noise-free
        mu_hat = mu_lo = math.inf if diff > 0 else 0.0
    else:
        se = sd * math.sqrt(1 / s_in.size + 1 / s_out.size)
        mu_hat = diff / sd
        mu_lo = max(diff - norm.ppf(1 - alpha / 2) * se, 0.0) / (
            sd * math.sqrt(dof / chi2.ppf(alpha / 2, dof)))
    return {"mu": mu_hat, "mu_lower": mu_lo, "epsilon": gdp_epsilon(mu_hat, delta),
            "epsilon_lower": gdp_epsilon(mu_lo, delta), "confidence": 1 - alpha}


# --------------------------------------------------------------------------- releases

@dataclasses.dataclass(frozen=True)
class Scenario:
    """What one audit drives: the tenants' bounded uploads, the algorithm's bounds, the
    user-level spec (placement, claimed epsilon) and the canary's tenant (0)."""

    spec: user_level.UserLevelSpec
    bounds: UserBounds
    uploads: Mapping[int, Message]

    @property
    def template(self) -> Message:
        return self.uploads[min(self.uploads)]


def _ledger(s: Scenario) -> Ledger:
    return Ledger.open({i: Budget(math.inf, s.spec.delta) for i in s.uploads})


def release_central(s: Scenario, c: Mapping[str, np.ndarray] | None,
                    rngs: Sequence[np.random.Generator]) -> Message:
    """One central release (:func:`privacy.user_level.release_sum`, index 0) of the
    tenants' uploads, the canary in tenant 0's when ``c`` is given."""
    ups = dict(s.uploads)
    if c is not None:
        ups[0] = with_canary(ups[0], c)
    noisy, _, refused = user_level.release_sum(s.spec, s.bounds, ups, _ledger(s), 0,
                                               rngs[0], 1)
    assert noisy is not None and not refused
    return noisy


def release_central_uncharged(s: Scenario, c: Mapping[str, np.ndarray] | None,
                              rngs: Sequence[np.random.Generator]) -> Message:
    """What :func:`privacy.user_level.release_sum` noises, without its ledger charge: the
    sum (:func:`privacy.user_level.sum_uploads`) noised by :func:`privacy.user_level.
    add_noise` at release 0's standard deviations. Used at q < 1, where each charge
    costs seconds (the subsampled-Gaussian RDP at fractional orders, privacy.rdp)."""
    ups = dict(s.uploads)
    if c is not None:
        ups[0] = with_canary(ups[0], c)
    total = user_level.sum_uploads([ups[i] for i in sorted(ups)], s.bounds)
    return user_level.add_noise(total, s.bounds,
                                user_level.release_stds(s.spec, s.bounds, 0), rngs[0])


def release_tenant(s: Scenario, c: Mapping[str, np.ndarray] | None,
                   rngs: Sequence[np.random.Generator]) -> Message:
    """Tenant 0's own noisy upload (:func:`privacy.user_level.release_one`, index 0)."""
    up = s.uploads[0] if c is None else with_canary(s.uploads[0], c)
    noisy, _, refused = user_level.release_one(s.spec, s.bounds, up, 0, _ledger(s), 0,
                                               rngs[0], 1)
    assert noisy is not None and refused is None
    return noisy


def secagg_stds(s: Scenario, fp: secagg.FixedPoint) -> dict[str, float]:
    """Each tenant's integer noise sigma per array (:func:`privacy.distributed.
    integer_stds` at the round's threshold)."""
    t = secagg.threshold_for(len(s.uploads), s.spec.dropout_tolerance)
    return distributed.integer_stds(s.spec, s.bounds, s.template, 0, t, fp)


def release_secagg(s: Scenario, c: Mapping[str, np.ndarray] | None,
                   rngs: Sequence[np.random.Generator], fp: secagg.FixedPoint | None = None
                   ) -> Message:
    """The decoded sum of secure aggregation: every tenant's :func:`privacy.distributed.
    tenant_input` (quantised, integer noise from its own generator), summed modulo 2^64
    (what :func:`privacy.secagg.aggregate` returns once the masks cancel) and decoded by
    :func:`privacy.distributed.decode_sum`."""
    fp = fp or secagg.FixedPoint()
    stds, n = secagg_stds(s, fp), len(s.uploads)
    total = np.zeros(distributed.pack(s.template, s.bounds).size, dtype=np.uint64)
    for k, (i, up) in enumerate(sorted(s.uploads.items())):
        up = with_canary(up, c) if (c is not None and i == 0) else up
        total += distributed.tenant_input(up, s.bounds, stds, n, fp, rngs[k])
    return distributed.decode_sum(total, s.template, s.bounds, stds, n, fp)


def reference_sum(s: Scenario) -> Message:
    """What the central and secure-aggregation releases are without canary and noise."""
    return user_level.sum_uploads([s.uploads[i] for i in sorted(s.uploads)], s.bounds)


def claimed_stds(s: Scenario, placement: str) -> dict[str, float]:
    """The per-array noise standard deviation the claim is computed for (real units):
    the release's planned noise; for secure aggregation the sum of the tenants' noise."""
    if placement == "secure_aggregation":
        fp = secagg.FixedPoint()
        n = len(s.uploads)
        return {k: v * math.sqrt(n) / fp.scale for k, v in secagg_stds(s, fp).items()}
    return user_level.release_stds(s.spec, s.bounds, 0)


# --------------------------------------------------------------------------- runs

#: the release function of each placement (central_sampled: central with the canary's
#: user Poisson-sampled at the spec's rate, by the algorithms' own sampler)
RELEASES: dict[str, Callable[..., Message]] = {
    "central": release_central, "tenant": release_tenant,
    "secure_aggregation": release_secagg, "central_sampled": release_central_uncharged}


def generators(source: str, run: int, n: int) -> list[np.random.Generator]:
    """The noise generators of one run: fresh and secret (the claim's
    assumption), the same state in every run (reused), or seeded by the run number (known
    to the attacker, like noise derived from a stored seed)."""
    if source == FRESH:
        return [fresh_noise_generator() for _ in range(n)]
    if source == REUSED:
        return [np.random.default_rng([29, k]) for k in range(n)]
    if source == KNOWN:
        return [np.random.default_rng([29, run, k]) for k in range(n)]
    raise ValueError(f"unknown noise source {source!r}; expected one of {NOISE_SOURCES}")


def _included(s: Scenario, placement: str) -> bool:
    """Whether the canary user takes part: always, or with the spec's Poisson rate drawn
    by the algorithms' own sampler (:func:`algorithms.dpals.sample_users`) from a fresh
    secret generator."""
    if placement != "central_sampled":
        return True
    from algorithms.block import RatingBlock
    from algorithms.dpals import sample_users

    one = RatingBlock(np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0), 1, 1)
    return bool(sample_users(one, s.spec.sample_rate, 0, fresh_noise_generator())[0])


def one_score(s: Scenario, placement: str, source: str, run: int, canary_in: bool,
              c: Mapping[str, np.ndarray], stds: Mapping[str, float],
              reference: Message) -> float:
    """The attacker's score of one run (see :func:`lr_score`). With known noise the
    attacker replays the generators on the release without canary and scores the
    difference; otherwise it scores against the noise-free reference."""
    release = RELEASES[placement]
    n = len(s.uploads) if placement == "secure_aggregation" else 1
    put = c if canary_in and _included(s, placement) else None
    y = release(s, put, generators(source, run, n))
    if source == KNOWN:
        reference = release(s, None, generators(source, run, n))
    return lr_score(y, reference, c, stds)


def claimed_epsilon(s: Scenario) -> float:
    """What the ledger charges for the audited release (release 0), at the spec's delta."""
    return spend([user_level.release_event(s.spec, 0)], s.spec.delta).epsilon


def run_audit(s: Scenario, placement: str, source: str = FRESH, runs: int = 400,
              alpha: float = 0.05) -> dict[str, Any]:
    """``runs`` releases with the canary and ``runs`` without, alternating; the claim, the
    held-out Clopper-Pearson bound and the Gaussian-DP fit (not for the sampled placement,
    whose scores are a mixture), and whether the audit refutes the claim."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; expected one of {PLACEMENTS}")
    c = canary(s.bounds, s.template)
    stds = claimed_stds(s, placement)
    ref = s.uploads[0] if placement == "tenant" else reference_sum(s)
    s_in = np.array([one_score(s, placement, source, 2 * r, True, c, stds, ref)
                     for r in range(runs)])
    s_out = np.array([one_score(s, placement, source, 2 * r + 1, False, c, stds, ref)
                      for r in range(runs)])
    claim = claimed_epsilon(s)
    held = held_out_bound(s_in, s_out, s.spec.delta, alpha)
    mu = math.sqrt(mu_of(c, stds))
    out = {"placement": placement, "noise": source, "claimed_epsilon": claim,
           "delta": s.spec.delta, "runs_per_side": runs, "mu_claimed": mu,
           # the exact epsilon of one Gaussian release of that mu (Balle and Wang): what
           # a perfect audit of the fresh mechanism would approach; the claim is its
           # RDP upper bound
           "epsilon_exact_gaussian": gdp_epsilon(mu, s.spec.delta),
           "held_out": held, "mean_score_in": float(s_in.mean()),
           "mean_score_out": float(s_out.mean())}
    worst = held["epsilon"]
    if placement != "central_sampled":
        out["gdp"] = gdp_fit(s_in, s_out, s.spec.delta, alpha)
        worst = max(worst, out["gdp"]["epsilon_lower"])
    out["empirical_epsilon"] = worst
    out["refutes_claim"] = bool(worst > claim)
    return out
