r"""Distributed DP over secure aggregation: placement ``tenant`` with central accuracy.

Each tenant of a round quantises its bounded sums, adds its part of the noise in the
integer domain and masks the result (:mod:`privacy.secagg`); the coordinator unmasks only
the sum, which carries (at least) the noise of central placement.

Quantise first, then add integer noise (Kairouz, Liu and Steinke, *The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation*, ICML 2021):

1. the tenant packs its upload into one vector (:func:`pack`: each gram block's upper
   triangle, diagonal included, then the rhs) and rounds it, ``q = rint(2^f x)``
   (:class:`privacy.secagg.FixedPoint`, f = 20 fractional bits by default);
2. one user changes one tenant's x on at most ``k`` items, so ``q`` moves by at most
   ``2^f Delta + sqrt(m)`` in L2, m = the entries of those items (each rounding moves an
   entry by at most 1/2, so a difference by at most 1): :func:`integer_sensitivity`.
   The rounding is data-dependent, so it is paid for in the sensitivity, never ignored;
3. the tenant adds discrete Gaussian noise ``N_Z(0, sigma_i^2)`` per block with
   ``sigma_i = z Delta_int / sqrt(share) / sqrt(t)`` (share: ``gram_share`` or its
   complement, times ``1 - centre_share`` with centre arrays, which get ``centre_share``:
   :func:`privacy.user_level.array_shares`; t = the fewest survivors the round tolerates,
   :func:`privacy.secagg.threshold_for`);
4. the sum over the T' >= t survivors is, by Kairouz et al. Thm. 2, (eps^2/2)-concentrated
   DP with ``eps^2 <= Delta_int^2 / (T' sigma_i^2) + 5 tau`` per block; tau underflows to
   exactly 0 in double precision once ``sigma_i >= 9`` (checked, refused otherwise), so the
   pair of blocks is ``1 / (2 z'^2)``-zCDP with ``z' = z sqrt(T' / t) >= z``.

Accounting: every tenant is charged the planned Gaussian event of noise multiplier z (RDP
of the Gaussian = ``alpha / (2 z^2)``, the same curve as that zCDP), i.e. exactly what
central placement charges. The noise actually present is larger by ``sqrt(T' / t)``
(recorded per release as ``noise_multiplier_present``): the charge is an upper bound that
holds whoever of the tolerated tenants drops, because the budget must be checked before
the noise leaves the tenant. With no dropout the excess is ``sqrt(n / t)`` (1.054 at the
default tolerance of 10%), the price of robustness. Against the coordinator together with
c colluding tenants, who know their own noise, the multiplier is ``z sqrt((T' - c) / t)``.
Subsampled users (q < 1) are refused: the discrete Gaussian's subsampled RDP is not the
continuous one privacy.rdp computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from algorithms.dpals import UserBounds
from algorithms.messages import Message
from privacy import secagg
from privacy.ledger import charged_release
from privacy.randomness import fresh_noise_generator
from privacy.user_level import (
    AGGREGATE,
    UserLevelPrivatizer,
    UserLevelSpec,
    array_sensitivity,
    array_shares,
    release_event,
)

#: integer noise below this sigma would leave tau > 0 (not accounted): refused
MIN_INTEGER_SIGMA = 9.0


def _blocks(template: Message, bounds: UserBounds | None) -> list[tuple[str, bool]]:
    """(array name, packed as upper triangles) in packing order."""
    if bounds is None:
        return [(name, False) for name in template.arrays()]
    return ([(n, True) for n in bounds.gram]
            + [(n, False) for n in (*bounds.rhs, *bounds.centre)])


def pack(upload: Message, bounds: UserBounds | None = None) -> np.ndarray:
    """The upload's arrays as one float vector: with ``bounds``, each gram array's upper
    triangles (d(d+1)/2 per item) then the rhs arrays; without, every array in full."""
    parts = []
    for name, upper in _blocks(upload, bounds):
        arr = np.asarray(getattr(upload, name), dtype=np.float64)
        if upper:
            iu = np.triu_indices(arr.shape[-1])
            arr = arr[..., iu[0], iu[1]]
        parts.append(arr.ravel())
    return np.concatenate(parts)


def unpack(vector: np.ndarray, template: Message, bounds: UserBounds | None = None
           ) -> Message:
    """Inverse of :func:`pack` (gram arrays mirrored), shaped like ``template``."""
    expected = pack(template, bounds).size
    if vector.size != expected:
        raise ValueError(f"vector of {vector.size} values does not fit the upload "
                         f"({expected})")
    changes: dict[str, Any] = {}
    at = 0
    for name, upper in _blocks(template, bounds):
        shape = np.shape(getattr(template, name))
        if upper:
            d = shape[-1]
            iu = np.triu_indices(d)
            size = int(np.prod(shape[:-2])) * len(iu[0])
            out = np.zeros(shape)
            out[..., iu[0], iu[1]] = vector[at:at + size].reshape(*shape[:-2], len(iu[0]))
            out = out + np.swapaxes(np.triu(out, 1), -1, -2)
        else:
            size = int(np.prod(shape))
            out = vector[at:at + size].reshape(shape)
        changes[name] = out
        at += size
    return template.replace(**changes)


def integer_sensitivity(bounds: UserBounds, template: Message, fp: secagg.FixedPoint
                        ) -> dict[str, float]:
    """L2 change of each quantised array when one user is added or removed:
    ``2^f Delta + sqrt(m)``, m = entries of the at most k items the user touches."""
    out = {}
    for name, upper in _blocks(template, bounds):
        shape = np.shape(getattr(template, name))
        items = min(bounds.max_ratings, shape[0])
        per_item = (shape[-1] * (shape[-1] + 1) // 2 if upper
                    else int(np.prod(shape[1:])))
        real = array_sensitivity(bounds, name)
        out[name] = fp.scale * real + math.sqrt(items * per_item)
    return out


def integer_stds(spec: UserLevelSpec, bounds: UserBounds, template: Message, index: int,
                 threshold: int, fp: secagg.FixedPoint) -> dict[str, float]:
    """Each tenant's discrete Gaussian sigma per array for release ``index`` (integer units):
    ``z Delta_int / sqrt(share) / sqrt(t)``."""
    z = release_event(spec, index).noise_multiplier
    sens = integer_sensitivity(bounds, template, fp)
    shares = array_shares(bounds, spec.gram_share)
    out = {}
    for name, _ in _blocks(template, bounds):
        out[name] = z * sens[name] / math.sqrt(shares[name]) / math.sqrt(threshold)
        if out[name] < MIN_INTEGER_SIGMA:
            raise ValueError(f"integer noise sigma {out[name]:.3g} of {name} is below "
                             f"{MIN_INTEGER_SIGMA} (raise the fixed-point bits)")
    return out


def tenant_input(upload: Message, bounds: UserBounds, stds: Mapping[str, float],
                 n_parties: int, fp: secagg.FixedPoint, rng: np.random.Generator
                 ) -> np.ndarray:
    """What a tenant feeds to :func:`privacy.secagg.mask_input`: its packed upload,
    quantised, plus discrete Gaussian noise (gram noise drawn on the upper triangles, which
    is all that is packed), as uint64."""
    q = fp.quantise(pack(upload, bounds), n_parties)
    at, parts = 0, []
    for name, upper in _blocks(upload, bounds):
        shape = np.shape(getattr(upload, name))
        size = (int(np.prod(shape[:-2])) * shape[-1] * (shape[-1] + 1) // 2 if upper
                else int(np.prod(shape)))
        parts.append(q[at:at + size] + secagg.discrete_gaussian((size,), stds[name], rng))
        at += size
    noisy = np.concatenate(parts)
    limit = fp.bound(n_parties) * fp.scale
    if np.any(np.abs(noisy) > limit):
        raise secagg.SecAggError("noisy value outside the fixed-point range")
    return noisy.view(np.uint64)


def decode_sum(total: np.ndarray, template: Message, bounds: UserBounds,
               stds: Mapping[str, float] | None, survivors: int, fp: secagg.FixedPoint
               ) -> Message:
    """The decoded sum as an upload; its noise fields hold the noise actually present
    (``sigma_i sqrt(T')`` in real units)."""
    out = unpack(fp.decode(total), template, bounds)
    if stds is None:
        return out
    return out.replace(**{bounds.noise_fields[name]: stds[name] * math.sqrt(survivors)
                          / fp.scale for name in stds})


def round_id(seed: int, round_: int) -> bytes:
    return f"fedrec-simulate:{int(seed)}:{int(round_)}".encode()


class SecureSum:
    """Aggregator that sums a round's uploads by secure aggregation, with no noise (the
    coordinator sees only the sum; the server step gets ``{AGGREGATE: sum}``)."""

    def __init__(self, seed: int, fp: secagg.FixedPoint | None = None,
                 dropout_tolerance: float = secagg.DEFAULT_DROPOUT_TOLERANCE) -> None:
        self.seed, self.fp = int(seed), fp or secagg.FixedPoint()
        self.tolerance = dropout_tolerance
        self.rounds: list[dict[str, Any]] = []

    def __call__(self, uploads: Mapping[int, Message], round_: int
                 ) -> Mapping[int, Message]:
        if len(uploads) < 2:
            return uploads
        template = uploads[min(uploads)]
        n = len(uploads)
        inputs = {i: self.fp.encode(pack(u), n) for i, u in uploads.items()}
        res = secagg.run_round(inputs, round_id(self.seed, round_),
                               dropout_tolerance=self.tolerance)
        self._record(round_, res)
        return {AGGREGATE: unpack(self.fp.decode(res.total), template)}

    def _record(self, round_: int, res: secagg.RoundResult) -> None:
        self.rounds.append({"round": int(round_), "tenants": len(res.survivors),
                            "dropped": list(res.dropped), "threshold": res.roster.threshold,
                            "bytes_per_tenant": max(res.bytes_sent.values())})


class SecureAggregationPrivatizer(UserLevelPrivatizer):
    """Placement ``tenant`` with secure aggregation, in-process.

    As privatizer (tenant side): check the tenant can afford the round's release and charge
    it the planned event; the bounded upload stays with the tenant. As aggregator: every
    tenant quantises, noises (a fresh generator per tenant,
    :func:`privacy.randomness.fresh_noise_generator`) and masks its upload, and the
    coordinator's side of :func:`privacy.secagg.run_round` unmasks the sum, which is all the
    server step receives. ``drop`` (tests): tenant ids that vanish after sending shares.
    """

    def __init__(self, spec: UserLevelSpec, bounds: UserBounds, n_clients: int, seed: int,
                 ledger=None, fp: secagg.FixedPoint | None = None,
                 drop: Sequence[int] = ()) -> None:
        if not spec.secure_aggregation:
            raise ValueError("SecureAggregationPrivatizer needs secure_aggregation=True")
        if bounds.clipped:  # their integer sensitivity is not derived here
            raise ValueError("secure aggregation is implemented for DPALS's gram and rhs "
                             "releases; this algorithm releases clipped gradient sums: use "
                             "placement central, or tenant without secure aggregation")
        super().__init__(spec, bounds, n_clients, seed, ledger)
        self.fp = fp or secagg.FixedPoint()
        self.drop = set(drop)

    def __call__(self, upload: Message, client: int, round_: int) -> Message | None:
        """The tenant's side: :func:`charge_release` (check, charge) before its input
        leaves, as ``fedrec agent`` does; a refused tenant stops for the rest of the run."""
        if str(client) in self.ledger.stopped():
            return None
        kept, _, refused = charge_release(self.spec, upload, client, self.ledger,
                                          len(self.releases), round_)
        if refused is not None:
            self.ledger.stop(client, round_)
        return kept

    def aggregate(self, uploads: Mapping[int, Message], round_: int
                  ) -> Mapping[int, Message]:
        if not uploads:
            return uploads
        index = len(self.releases)
        n = len(uploads)
        t = secagg.threshold_for(n, self.spec.dropout_tolerance) if n > 1 else 1
        template = uploads[min(uploads)]
        stds = integer_stds(self.spec, self.bounds, template, index, t, self.fp)
        inputs = {i: tenant_input(u, self.bounds, stds, n, self.fp,
                                  fresh_noise_generator())
                  for i, u in uploads.items()}
        if n == 1:  # nothing to hide the input among: the noise alone (t = 1) protects it
            total, survivors, dropped, rec = inputs[min(inputs)], (min(inputs),), (), {}
        else:
            res = secagg.run_round(inputs, round_id(self.seed, round_),
                                   dropout_tolerance=self.spec.dropout_tolerance,
                                   drop_before_input=sorted(self.drop & set(inputs)))
            total, survivors, dropped = res.total, res.survivors, res.dropped
            rec = {"bytes_per_tenant": max(res.bytes_sent.values())}
        taus = [secagg.ddg_tau(s, len(survivors)) for s in stds.values()]
        if max(taus) > 0:
            raise ValueError(f"distributed discrete Gaussian tau {max(taus):.3g} > 0")
        out = decode_sum(total, template, self.bounds, stds, len(survivors), self.fp)
        self._record(round_, list(survivors), index)
        z = self.event(index).noise_multiplier
        self.releases[-1].update({
            "threshold": t, "dropped": [int(d) for d in dropped],
            "noise_multiplier_present": z * math.sqrt(len(survivors) / t),
            "integer_noise_std_per_tenant": stds, "ddg_tau": max(taus),
            "frac_bits": self.fp.frac_bits, **rec})
        return {AGGREGATE: out}

    def report(self) -> dict[str, Any]:
        out = super().report()
        out.update({"secure_aggregation": True,
                    "dropout_tolerance": self.spec.dropout_tolerance,
                    "frac_bits": self.fp.frac_bits,
                    "accounting_note": (
                        "each tenant is charged the planned Gaussian event of multiplier z "
                        "(the RDP curve alpha / (2 z^2) is the zCDP of the distributed "
                        "discrete Gaussian sum at t survivors with tau = 0); the noise "
                        "present is z sqrt(T'/t) >= z, see noise_multiplier_present")})
        return out


def charge_release(spec: UserLevelSpec, upload: Message, account: Any, ledger: Any,
                   index: int, round_: int) -> tuple[Message | None, Any, str | None]:
    """A tenant's side of release ``index`` under secure aggregation (``fedrec agent``):
    check its account can afford the planned event and charge it
    (:func:`privacy.ledger.charged_release`) before anything noisy leaves; the bounded
    upload stays with the tenant, to be noised by :func:`tenant_input` and masked. Returns
    (upload, event charged, refusal reason), as :func:`privacy.user_level.release_one`."""
    kept, charged, refused = charged_release(ledger, [account], release_event(spec, index),
                                             round_, lambda _: upload, "user-level release")
    if refused:
        return None, None, refused[account]
    return kept, charged[account], None
