"""Differential privacy as a wrapper around a client step's upload.

The algorithms never see it: :class:`DPPrivatizer` is the ``privatizer(upload, client,
round_)`` callable of :func:`algorithms.simulate.simulate` (and of the service's client-step
task). For each upload it (1) checks that the tenant can afford one more transmission, else
records the stop and returns ``None``; (2) clips every array of the upload jointly and adds
noise from a fresh generator (:func:`privacy.randomness.fresh_noise_generator`: secret,
never derived from the job seed); (3) charges the ledger; and only then (4) returns the
noisy upload.

Unit protected: a tenant's whole rating block (all its users' ratings). Neighbouring inputs
are *any block replaced by any other* (replace-one), because the adversary is the curious
server that receives each tenant's upload individually and sees who transmits: a tenant's
presence cannot be hidden (add/remove is observable from the transmission itself), so what
DP can protect is the content. Whatever the block, the clipped upload lies in the ball of
radius C, so two blocks move it by at most the ball's diameter:

* ``norm="l2"`` (clip of the concatenation's Frobenius norm to C): Delta_2 = 2C, and
  Delta_1 = 2C sqrt(d) for d entries;
* ``norm="l1"``: Delta_1 = 2C (and Delta_2 <= 2C);
* ``norm="value"`` (RFRec eq. 9, entries in [-C, C]): Delta_1 = 2C d, Delta_2 = 2C sqrt(d).

(Under add/remove of a tenant whose absence sends a fixed upload, e.g. zero, the
sensitivity would be C; that relation does not fit a server that sees who transmits.)
Gaussian noise is calibrated to Delta_2, Laplace to Delta_1. Multi-array uploads (FedMC-ADMM
sends W_i and Y_i) are clipped *jointly*: the norm of the concatenation is at most C, so one
sensitivity covers the whole upload and both arrays get the same noise scale.

Scalar (non-array) fields of an upload pass through unchanged and are NOT covered; they must
not depend on the ratings (:func:`unprotected_fields` lists them).

``mechanism="bernoulli"`` is the XOR noise of Felb (Sec. 4.1.3) for Boolean uploads (every
entry 0 or 1, e.g. the rounded factors of the voting baseline): each bit is flipped with
probability p, no clipping. Any block may change every one of the d bits, so one
transmission is pure eps-DP with eps = d ln((1-p)/p) (:mod:`privacy.bernoulli`); its noise
multiplier is z = 1 / eps, given directly or through ``flip_prob``. A non-Boolean upload is
refused (``TypeError``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from algorithms.messages import Message
from privacy.accountant import NOT_PRIVATE, Event
from privacy.bernoulli import (
    bernoulli_epsilon,
    bernoulli_xor,
    flip_prob_for_epsilon,
    is_boolean,
)
from privacy.clipping import clip_arrays, joint_norm
from privacy.gaussian import gaussian_noise, gaussian_release
from privacy.laplace import laplace_noise, laplace_release, rfrec_entry_epsilon
from privacy.ledger import BudgetExceeded, Ledger, charged_release, check_plan
from privacy.randomness import fresh_noise_generator
from privacy.threat_model import threat_model

UNIT_TENANT = ("tenant: a tenant's whole rating block; neighbouring = the block replaced "
               "by any other block (replace-one), sensitivity = diameter of the clip ball")


class DPSpec(BaseModel):
    """How uploads are privatised. Frozen; impossible values raise ``ValueError``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mechanism: Literal["none", "laplace", "gaussian", "bernoulli"] = "gaussian"
    #: clip norm; None = "l2" for Gaussian, "l1" for Laplace (the norm each is calibrated to)
    norm: Literal["l2", "l1", "value"] | None = None
    #: clip bound C (norm bound of the concatenated upload, or entry bound for "value")
    clip: float = Field(1.0, gt=0, allow_inf_nan=False)
    #: noise relative to the sensitivity: sigma / Delta_2 (Gaussian) or b / Delta_1 (Laplace)
    noise_multiplier: float | None = Field(None, gt=0, allow_inf_nan=False)
    #: absolute per-entry noise: sigma (Gaussian) or b (Laplace), e.g. RFRec's s
    noise_scale: float | None = Field(None, gt=0, allow_inf_nan=False)
    #: Bernoulli only: the flip probability p of every bit (instead of noise_multiplier)
    flip_prob: float | None = Field(None, gt=0, lt=0.5)
    #: the delta at which epsilon is reported (and of the tenants' budgets)
    delta: float = Field(1e-5, gt=0, lt=1)
    #: the unit protected; only the tenant's whole block has a sensitivity from the clip
    unit: Literal["tenant"] = "tenant"

    @model_validator(mode="after")
    def _one_noise(self) -> DPSpec:
        if self.mechanism == "bernoulli":
            if self.noise_scale is not None:
                raise ValueError("bernoulli noise has no scale: give noise_multiplier "
                                 "or flip_prob")
            if (self.noise_multiplier is not None) + (self.flip_prob is not None) != 1:
                raise ValueError("give exactly one of noise_multiplier and flip_prob")
            return self
        if self.flip_prob is not None:
            raise ValueError("flip_prob applies to the bernoulli mechanism only")
        given = (self.noise_multiplier is not None) + (self.noise_scale is not None)
        if self.mechanism != "none" and given != 1:
            raise ValueError("give exactly one of noise_multiplier and noise_scale")
        return self

    @property
    def clip_norm(self) -> str:
        if self.norm is not None:
            return self.norm
        return "l1" if self.mechanism == "laplace" else "l2"


def sensitivity(spec: DPSpec, n_entries: int) -> float:
    """Replace-one sensitivity of the clipped upload in the mechanism's norm (see module)."""
    c, norm = spec.clip, spec.clip_norm
    if spec.mechanism == "laplace":
        return {"l1": 2 * c, "l2": 2 * c * math.sqrt(n_entries), "value": 2 * c * n_entries}[norm]
    return {"l2": 2 * c, "l1": 2 * c, "value": 2 * c * math.sqrt(n_entries)}[norm]


def event_for(spec: DPSpec, n_entries: int) -> Event:
    """The privacy event of one transmission of ``n_entries`` values under ``spec``."""
    if spec.mechanism == "none":
        raise ValueError("mechanism 'none' has no privacy event")
    if spec.mechanism == "bernoulli":
        z = spec.noise_multiplier
        if z is None:
            z = 1.0 / bernoulli_epsilon(spec.flip_prob, n_entries)
        return Event("bernoulli", float(z), 1)
    z = spec.noise_multiplier
    if z is None:
        z = spec.noise_scale / sensitivity(spec, n_entries)
    return Event(spec.mechanism, float(z), 1)


def transmission_event(spec: DPSpec, n_entries: int, private_algorithm: bool = True) -> Event:
    """What one transmission is charged: :func:`event_for` when it carries a DP guarantee,
    else :data:`privacy.accountant.NOT_PRIVATE` (epsilon = infinity). No guarantee means no
    noise (``mechanism="none"``) or an algorithm whose uploads reveal ratings whatever the
    noise (``privacy_preserving=False``, e.g. FedMGS)."""
    if spec.mechanism == "none" or not private_algorithm:
        return NOT_PRIVATE
    return event_for(spec, n_entries)


def flip_probability(spec: DPSpec, n_entries: int) -> float:
    """Bernoulli: p given, or 1 / (1 + e^{eps/d}) with eps = 1 / noise multiplier."""
    if spec.mechanism != "bernoulli":
        raise ValueError(f"mechanism {spec.mechanism!r} has no flip probability")
    if spec.flip_prob is not None:
        return spec.flip_prob
    return flip_prob_for_epsilon(1.0 / spec.noise_multiplier, n_entries)


def noise_scale(spec: DPSpec, n_entries: int) -> float:
    """Per-entry noise: sigma (Gaussian) or b (Laplace) = noise multiplier x sensitivity."""
    if spec.mechanism == "bernoulli":
        raise ValueError("bernoulli noise has a flip probability, not a scale")
    if spec.noise_scale is not None:
        return spec.noise_scale
    return spec.noise_multiplier * sensitivity(spec, n_entries)


def n_entries(upload: Message) -> int:
    """The number of values the wrapper clips and noises."""
    return int(sum(a.size for a in upload.arrays().values()))


def unprotected_fields(upload: Message) -> list[str]:
    """Scalar fields of ``upload``: passed through unchanged, not covered by the guarantee."""
    return [f.name for f in dataclasses.fields(upload)
            if not isinstance(getattr(upload, f.name), np.ndarray)]


def privatize(upload: Message, spec: DPSpec, rng: np.random.Generator
              ) -> tuple[Message, Event]:
    """Clip all arrays of ``upload`` jointly and add noise; return (noisy copy, event).

    Noise is drawn from ``rng`` array by array in field order (the callers pass a fresh
    generator, :func:`privacy.randomness.fresh_noise_generator`). Bernoulli: every entry
    must be 0 or 1; bits are XORed (no clipping), dtypes kept.
    """
    arrays = upload.arrays()
    if spec.mechanism == "bernoulli":
        return _privatize_bits(upload, spec, rng)
    for name, a in arrays.items():
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"cannot add noise to {type(upload).__name__}.{name} "
                            f"of dtype {a.dtype}: uploads must be floating point")
    d = n_entries(upload)
    event, scale, sens = event_for(spec, d), noise_scale(spec, d), sensitivity(spec, d)
    put = gaussian_release if spec.mechanism == "gaussian" else laplace_release
    clipped = clip_arrays(arrays, spec.clip, spec.clip_norm)
    # on a grid, rounding paid for over all d entries (privacy.samplers)
    noisy = {k: put(v, scale, rng, sens, d).astype(arrays[k].dtype)
             for k, v in clipped.items()}
    return upload.replace(**noisy), event


#: standard deviations of slack in :func:`bound_problem`: an honest upload is refused
#: with probability below exp(-TAIL^2 / 2) (Gaussian) / exp(-TAIL) (Laplace)
TAIL = 10.0


def bound_problem(upload: Message, spec: DPSpec) -> str | None:
    """Why ``upload`` cannot be a :func:`privatize` output under ``spec`` (None: it can).

    A privatised upload is a clipped upload plus the declared noise, so its norm is at
    most the clip ball's radius plus the noise's norm, which concentrates: Gaussian
    ``||N||_2 <= sigma (sqrt(d) + TAIL)``, Laplace ``||N||_1 <= b (d + 4 TAIL sqrt(d) +
    4 TAIL^2)``; Bernoulli bits stay bits. An upload past that bound was not clipped:
    receiving it would let one tenant move the model without limit, so the server refuses
    it (norm bounding, as in "Can You Really Backdoor Federated Learning?", Sun et al.,
    2019, here at the bound the privacy guarantee already implies)."""
    arrays = upload.arrays()
    if spec.mechanism == "none":
        return None
    if spec.mechanism == "bernoulli":
        bad = [k for k, a in arrays.items() if not np.isin(a, (0, 1)).all()]
        return f"{bad[0]} has entries other than 0 and 1" if bad else None
    d, c, norm = n_entries(upload), spec.clip, spec.clip_norm
    scale = noise_scale(spec, d)
    if spec.mechanism == "gaussian":  # measured in L2
        radius = c * math.sqrt(d) if norm == "value" else c
        bound, which = radius + scale * (math.sqrt(d) + TAIL), "l2"
    else:  # Laplace, measured in L1
        radius = {"l1": c, "l2": c * math.sqrt(d), "value": c * d}[norm]
        bound, which = radius + scale * (d + 4 * TAIL * math.sqrt(d) + 4 * TAIL ** 2), "l1"
    got = joint_norm({k: np.asarray(a, dtype=np.float64) for k, a in arrays.items()}, which)
    if not got <= bound:
        return (f"has {which} norm {got:.6g}, more than clip {c:g} plus the declared noise "
                f"allow ({bound:.6g})")
    return None


def _privatize_bits(upload: Message, spec: DPSpec, rng: np.random.Generator
                    ) -> tuple[Message, Event]:
    """XOR every bit of a Boolean upload with Bernoulli(p) (Felb Sec. 4.1.3)."""
    arrays = upload.arrays()
    for name, a in arrays.items():
        if not is_boolean(a):
            raise TypeError(f"Bernoulli (XOR) noise needs Boolean uploads: "
                            f"{type(upload).__name__}.{name} has entries other than 0 and 1")
    d = n_entries(upload)
    p = flip_probability(spec, d)
    noisy = {k: bernoulli_xor(v.astype(bool), p, rng).astype(v.dtype)
             for k, v in arrays.items()}
    return upload.replace(**noisy), event_for(spec, d)


def release(upload: Message, spec: DPSpec, account: Hashable, ledger: Ledger,
            rng: np.random.Generator, round_: int, private_algorithm: bool = True
            ) -> tuple[Message | None, Event | None, str | None]:
    """Check, privatise, charge: one transmission of a tenant (the tenant unit).

    Refused, with the reason, when the account cannot afford it (a transmission without a
    DP guarantee needs the tenant's ``allow_not_private`` opt-in and costs epsilon =
    infinity, see :func:`transmission_event`); else privatised with ``rng`` and charged to
    ``ledger`` before it is returned. Returns (upload as sent, event charged, refusal).
    """
    event = transmission_event(spec, n_entries(upload), private_algorithm)

    def privatise(_: list) -> Message:
        return upload if spec.mechanism == "none" else privatize(upload, spec, rng)[0]

    sent, charged, refused = charged_release(ledger, [account], event, round_, privatise)
    if refused:
        return None, None, refused[account]
    return sent, charged[account], None


class DPPrivatizer:
    """The simulator's / service's ``privatizer(upload, client, round_)``.

    Stateful only through :attr:`ledger` (a :class:`Ledger`, whose state is a plain dict);
    the ledger passed in is copied, never mutated. Every transmission's noise comes from a
    fresh generator (:func:`privacy.randomness.fresh_noise_generator`); ``seed`` (the job
    seed) is kept for the callers' signature only, no draw derives from it.
    """

    def __init__(self, spec: DPSpec, ledger: Ledger, seed: int) -> None:
        self.spec, self.seed = spec, int(seed)
        self.ledger = Ledger.from_dict(ledger.to_dict())

    def __call__(self, upload: Message, client: int, round_: int) -> Message | None:
        if self.spec.mechanism == "none":
            return upload
        if str(client) in self.ledger.stopped():
            return None
        noisy, _, refused = release(upload, self.spec, client, self.ledger,
                                    fresh_noise_generator(), round_)
        if refused is not None:
            self.ledger.stop(client, round_)
        return noisy

    def noise(self, round_: int, client: int, shape: tuple[int, ...]) -> np.ndarray:
        """The noise of client ``client``'s upload (one array of ``shape``) in ``round_``,
        for a path that clips and sums the uploads itself (RFRec's batched path: the
        engine's aggregator adds the noise to the sum): noise of the same law as
        :meth:`__call__` adds, from a fresh generator, checked and charged by the same
        rule (:func:`privacy.ledger.charged_release`). Raises
        :class:`privacy.ledger.BudgetExceeded` when the client cannot afford it (such a
        path cannot leave one client out)."""
        d = int(np.prod(shape))
        event = event_for(self.spec, d)
        draw = gaussian_noise if self.spec.mechanism == "gaussian" else laplace_noise
        if self.spec.mechanism not in ("gaussian", "laplace"):
            raise ValueError(f"mechanism {self.spec.mechanism!r} has no additive noise")
        out, _, refused = charged_release(
            self.ledger, [client], event, round_,
            lambda _: draw(shape, noise_scale(self.spec, d), fresh_noise_generator()))
        if refused:
            self.ledger.stop(client, round_)
            raise BudgetExceeded(str(client), self.ledger.projected(client, event).epsilon,
                                 self.ledger.budget(client), self.ledger.spent(client).epsilon,
                                 1)
        return out

    def check_plan(self, plan: Mapping[Hashable, int], n_entries: int | None = None) -> None:
        """Refuse (``BudgetExceeded``) a run whose planned transmissions exceed a budget.

        ``n_entries`` (values per upload) is needed only when the noise is given as an
        absolute scale with ``norm="value"`` (the sensitivity then depends on it).
        """
        if self.spec.mechanism == "none":
            return
        if n_entries is None and self.spec.flip_prob is not None:
            raise ValueError("n_entries is needed to account a flip probability "
                             "(epsilon = d ln((1-p)/p) over the d bits of an upload)")
        if n_entries is None and self.spec.noise_scale is not None and (
                self.spec.clip_norm == "value" or self.spec.mechanism == "laplace"
                and self.spec.clip_norm == "l2"):
            raise ValueError("n_entries is needed to account an absolute noise scale "
                             f"with the {self.spec.clip_norm} clip")
        check_plan(self.ledger, plan, event_for(self.spec, n_entries or 1))

    def report(self, n_entries: int | None = None) -> dict[str, Any]:
        """JSON-ready summary: epsilon spent per tenant and its maximum, delta, unit, method."""
        return privacy_report(self.spec, self.ledger, n_entries)


ACCOUNTING = {
    "gaussian": "Renyi DP of the Gaussian mechanism (privacy.rdp, q=1: no amplification by "
                "client sampling, the server sees who transmits), composed over the rounds "
                "each tenant transmitted, converted to (epsilon, delta) by Balle et al. "
                "2020, Thm. 21 (privacy.rdp.epsilon_from_rdp)",
    "laplace": "Renyi DP of the Laplace mechanism (closed form, Mironov 2017 Prop. 6) on "
               "the accountant's orders, composed over the rounds each tenant transmitted, "
               "converted by privacy.rdp.epsilon_from_rdp; reported epsilon = min(that, "
               "basic composition of pure epsilon)",
    "bernoulli": "XOR noise: each transmission of d bits flipped with probability p is pure "
                 "d ln((1-p)/p)-DP; Renyi DP bounded by randomized response at that epsilon, "
                 "composed over the rounds each tenant transmitted, converted by "
                 "privacy.rdp.epsilon_from_rdp; reported epsilon = min(that, basic composition)",
}


def privacy_report(spec: DPSpec, ledger: Ledger, n_entries: int | None = None
                   ) -> dict[str, Any]:
    """JSON-ready report of a run's privacy (docs/explanation/privacy.md explains it)."""
    if spec.mechanism == "none":
        return {"mechanism": "none", "epsilon_per_tenant": None, "epsilon_max": None,
                "delta": None, "unit": None, "threat_model": threat_model("tenant",
                                                                          private=False),
                "accounting": "none: uploads are sent without noise (no DP guarantee)"}
    spends = {t: ledger.spent(t) for t in ledger.tenants()}
    eps = {t: s.epsilon for t, s in spends.items()}
    out: dict[str, Any] = {
        "mechanism": spec.mechanism,
        "norm": None if spec.mechanism == "bernoulli" else spec.clip_norm,
        "clip": None if spec.mechanism == "bernoulli" else spec.clip,
        "delta": spec.delta, "unit": UNIT_TENANT, "accounting": ACCOUNTING[spec.mechanism],
        "epsilon_per_tenant": eps, "epsilon_max": max(eps.values(), default=0.0),
        "transmissions_per_tenant": {t: s.transmissions for t, s in spends.items()},
        "budget_epsilon_max": _budget_summary(ledger), "stopped": ledger.stopped(),
        # a block's guarantee holds for every account in it: the user table applies
        "threat_model": threat_model("tenant", epsilon=max(eps.values(), default=0.0)),
    }
    out.update(_noise_summary(spec, n_entries))
    if spec.mechanism in ("laplace", "bernoulli"):
        out["epsilon_pure_per_tenant"] = {t: s.epsilon_pure for t, s in spends.items()}
    return out


def _noise_summary(spec: DPSpec, n_entries: int | None) -> dict[str, Any]:
    """Noise multiplier, per-entry scale and sensitivity, where they are determined."""
    if spec.mechanism == "bernoulli":
        if n_entries is None:
            return {"noise_multiplier": spec.noise_multiplier, "flip_prob": spec.flip_prob}
        return {"noise_multiplier": event_for(spec, n_entries).noise_multiplier,
                "flip_prob": flip_probability(spec, n_entries),
                "epsilon_per_transmission": 1.0 / event_for(spec, n_entries).noise_multiplier}
    d_free = spec.clip_norm != "value" and not (
        spec.mechanism == "laplace" and spec.clip_norm == "l2")
    if not d_free and n_entries is None:
        return {"noise_multiplier": spec.noise_multiplier, "noise_scale": spec.noise_scale}
    d = n_entries or 1
    out = {"noise_multiplier": event_for(spec, d).noise_multiplier,
           "noise_scale": noise_scale(spec, d), "sensitivity": sensitivity(spec, d)}
    if spec.mechanism == "laplace" and spec.clip_norm == "value":
        out["rfrec_entry_epsilon_per_transmission"] = rfrec_entry_epsilon(
            spec.clip, noise_scale(spec, d))
    return out


def _budget_summary(ledger: Ledger) -> float | None | dict[str, float | None]:
    """The common epsilon_max of all tenants (None = unlimited), or one per tenant."""
    caps = {t: ledger.budget(t).epsilon_max for t in ledger.tenants()}
    vals = {c for c in caps.values()}
    if len(vals) == 1:
        (cap,) = vals
        return None if math.isinf(cap) else cap
    return {t: (None if math.isinf(c) else c) for t, c in caps.items()}
