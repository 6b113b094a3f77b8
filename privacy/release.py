"""The privacy seam of a round: which release applies, and every release, whatever the unit.

Privacy settings (a job's ``job.dp``, a run's flags) name the unit: the tenant's block
(:mod:`privacy.wrapper`) or one user (:mod:`privacy.user_level`, placement ``tenant`` or
``central``, with or without secure aggregation), or none. :func:`release_of` is the one
decision of which :class:`Release` they apply; :func:`release_upload` is what happens to a
tenant's upload before it leaves the tenant (:class:`UploadRelease` hands it to
:func:`algorithms.simulate.client_round` as the hosted tenant's and the agent's privatizer),
:func:`release_round` what happens to the round's uploads before the server step,
:func:`expected_event` what one upload is charged.
Both end in :func:`privacy.ledger.charged_release` (check budget, privatise, charge), the
rule :class:`privacy.wrapper.DPPrivatizer` and :class:`privacy.user_level.
UserLevelPrivatizer` follow in the simulator. The service loads the tenants' ledger from
its database, calls these, and persists the events they charged in the transaction that
stores the release; it adds no rule of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np

from algorithms import registry
from algorithms.base import default_select
from algorithms.messages import Message
from algorithms.rng import SAMPLING, derive_rng, sample_clients
from privacy import user_level
from privacy.accountant import Event
from privacy.distributed import charge_release
from privacy.ledger import Ledger
from privacy.randomness import fresh_noise_generator
from privacy.wrapper import DPSpec, release, transmission_event


def transmission_plan(n_clients: int, rounds: int, per_round: int, seed: int,
                      select: Any = None, global_msg: Message | None = None) -> dict[int, int]:
    """How often each client index transmits at most over ``rounds``: the budget check's
    plan, one function for the service, the CLI and the benchmarks.

    With the default sampler (``select`` None or :func:`algorithms.base.default_select`)
    the schedule is ``sample_clients(derive_rng(seed, k, SAMPLING), ...)``, a function of
    the seed only (planning with it leaks nothing), so the counts are exact; any other
    selection gets the worst case, every round. A client that transmits more than planned
    is stopped by the in-run check, so a wrong plan never costs the guarantee."""
    if select is not None and select is not default_select:
        return {i: rounds for i in range(n_clients)}
    counts = dict.fromkeys(range(n_clients), 0)
    for k in range(1, rounds + 1):
        for i in sample_clients(derive_rng(seed, k, SAMPLING), n_clients, per_round):
            counts[int(i)] += 1
    return counts


class Release(enum.Enum):
    """Which release a round's uploads go through, as :func:`release_of` decides it.

    ``PLAIN``: the uploads as they are, nobody charged (a run without privacy).
    ``SECURE_SUM``: no noise, the server step sees only the round's sum (pairwise masks,
    Bonawitz et al., *Practical Secure Aggregation for Privacy-Preserving Machine Learning*).
    ``TENANT``: each upload clipped, noised and charged for the tenant's whole block
    (:func:`privacy.wrapper.release`; mechanism ``none`` or an algorithm without a guarantee
    is charged epsilon = infinity, with the tenant's opt-in only).
    ``USER_TENANT``: each tenant noises its users' upload (:func:`privacy.user_level.
    release_one`). ``USER_CENTRAL``: the bounded uploads pass uncharged and their sum is
    noised once, every contributor charged first (:func:`privacy.user_level.release_sum`).
    ``USER_SECURE``: each tenant is charged before its input leaves
    (:func:`privacy.distributed.charge_release`) and adds its share of the noise inside
    secure aggregation (Kairouz, Liu and Steinke, *The Distributed Discrete Gaussian
    Mechanism for Federated Learning with Secure Aggregation*).
    """

    PLAIN = "plain"
    SECURE_SUM = "secure_sum"
    TENANT = "tenant"
    USER_TENANT = "user_tenant"
    USER_CENTRAL = "user_central"
    USER_SECURE = "user_secure"

    @property
    def user_level(self) -> bool:
        return self in (Release.USER_TENANT, Release.USER_CENTRAL, Release.USER_SECURE)

    @property
    def secure(self) -> bool:
        """The coordinator sees only the round's sum (secure aggregation)."""
        return self in (Release.SECURE_SUM, Release.USER_SECURE)


def release_of(dp: Mapping[str, Any] | None) -> Release:
    """The one decision of which release privacy settings ``dp`` apply: a job's stored
    settings (a :class:`privacy.wrapper.DPSpec` dict for the tenant unit, which may omit
    ``unit``; :func:`privacy.user_level.to_settings` for the user unit) or a run's
    (``{"unit": "none", "secure_aggregation": ...}`` for no privacy, :func:`cli_settings`).
    ``None`` is no privacy. The service, the agent, the coordinator's expected charge and
    ``fedrec simulate`` all ask this function."""
    if dp is None:
        return Release.PLAIN
    unit = dp.get("unit") or "tenant"
    secure = bool(dp.get("secure_aggregation"))
    if unit == "none":
        return Release.SECURE_SUM if secure else Release.PLAIN
    if unit == "tenant":
        if secure:
            raise ValueError("secure_aggregation does not apply to the tenant unit (it "
                             "noises each upload in full)")
        return Release.TENANT
    if unit != user_level.USER:
        raise ValueError(f"unknown privacy unit {unit!r}")
    placement = dp.get("placement", "central")
    if secure:
        if placement != "tenant":
            raise ValueError("secure_aggregation needs placement 'tenant'")
        return Release.USER_SECURE
    return Release.USER_TENANT if placement == "tenant" else Release.USER_CENTRAL


def cli_settings(unit: str, placement: str | None = None, secure_aggregation: bool = False
                 ) -> dict[str, Any]:
    """The settings :func:`release_of` reads, from a run's ``--privacy``, ``--placement``
    and ``--secure-aggregation`` (:func:`privacy.cli.privacy_unit` checked them)."""
    out: dict[str, Any] = {"unit": unit, "secure_aggregation": bool(secure_aggregation)}
    if unit == user_level.USER:
        out["placement"] = placement or "central"
    return out


def central(dp: Mapping[str, Any]) -> bool:
    """Whether the round's uploads are noised once, as a sum, by :func:`release_round`."""
    return release_of(dp) is Release.USER_CENTRAL


def expected_event(dp: Mapping[str, Any], index: int, entries: int,
                   private_algorithm: bool = True) -> Event | None:
    """The event settings ``dp`` charge one tenant for an upload: the user unit's release
    ``index`` (0-based; under central placement :func:`release_round` charges it, to every
    contributor), the tenant unit's transmission of ``entries`` values
    (:func:`privacy.wrapper.transmission_event`); None without privacy (nothing charged)."""
    kind = release_of(dp)
    if kind.user_level:
        return user_level.release_event(user_level.from_settings(dp), index)
    if kind is Release.TENANT:
        return transmission_event(DPSpec(**dp), entries, private_algorithm)
    return None


def release_upload(dp: Mapping[str, Any], algorithm: str, cfg: Any, upload: Message,
                   account: Hashable, ledger: Ledger, rng: np.random.Generator, round_: int,
                   index: int = 0, private_algorithm: bool = True
                   ) -> tuple[Message | None, Event | None, str | None]:
    """One tenant's upload as it leaves the tenant: (upload as sent, event charged to
    ``ledger``, refusal reason). The hosted tenant's client step and ``fedrec agent`` both
    call it; what it does is :func:`release_of`'s decision:

    ``TENANT``: :func:`privacy.wrapper.release` (clip, noise, charge; a transmission
    without a guarantee is charged epsilon = infinity, only with the tenant's opt-in).
    ``USER_TENANT``: :func:`privacy.user_level.release_one` of release ``index`` of this
    tenant's users. ``USER_SECURE``: :func:`privacy.distributed.charge_release` (charged;
    the bounded upload is noised and masked later, by the secure-aggregation exchange).
    ``USER_CENTRAL``: the bounded upload unchanged and uncharged (:func:`release_round`
    charges and noises the sum). ``PLAIN`` / ``SECURE_SUM``: unchanged, uncharged.
    """
    kind = release_of(dp)
    if kind is Release.TENANT:
        return release(upload, DPSpec(**dp), account, ledger, rng, round_, private_algorithm)
    if kind is Release.USER_TENANT:
        return user_level.release_one(user_level.from_settings(dp),
                                      registry.user_bounds(algorithm, cfg), upload,
                                      account, ledger, index, rng, round_)
    if kind is Release.USER_SECURE:
        return charge_release(user_level.from_settings(dp), upload, account, ledger, index,
                              round_)
    return upload, None, None


class UploadRelease:
    """A tenant's release of its upload as the ``privatizer`` of
    :func:`algorithms.simulate.client_round`, for a tenant the service hosts and for
    ``fedrec agent`` alike: :func:`release_upload` under the job's settings ``dp``, with
    noise from a fresh secret generator (:func:`privacy.randomness.fresh_noise_generator`).

    ``books()`` opens the tenant's ledger and says which of its user-level releases this
    one is (0 for the tenant unit); it is called only when there is an upload to release,
    so a service locks the tenant's ledger row for the release only. ``noise`` makes the
    release's generator (the fresh secret one; the service passes its own reference to
    it, which its tests count). What the release charged (:attr:`event`) and why it was
    refused (:attr:`refused`) stay here for the caller to persist with the upload; one
    object serves one client round."""

    def __init__(self, dp: Mapping[str, Any], algorithm: str, cfg: Any, account: Hashable,
                 books: Callable[[], tuple[Ledger, int]], private_algorithm: bool = True,
                 noise: Callable[[], np.random.Generator] = fresh_noise_generator) -> None:
        self.dp, self.algorithm, self.cfg, self.account = dp, algorithm, cfg, account
        self.books, self.private_algorithm, self.noise = books, private_algorithm, noise
        self.event: Event | None = None
        self.refused: str | None = None

    def __call__(self, upload: Message, client: int, round_: int) -> Message | None:
        ledger, index = self.books()
        sent, self.event, self.refused = release_upload(
            self.dp, self.algorithm, self.cfg, upload, self.account, ledger, self.noise(),
            round_, index, self.private_algorithm)
        return sent


def release_round(dp: Mapping[str, Any], algorithm: str, cfg: Any,
                  uploads: Mapping[Hashable, Message], ledger: Ledger, index: int,
                  rng: np.random.Generator, round_: int
                  ) -> tuple[dict[int, Message], dict[Hashable, Event], dict[Hashable, str]]:
    """What the server step receives from the round's uploads (keyed by account), with
    the events charged and the refusals: for central user-level placement one noisy sum
    ``{AGGREGATE: ...}`` of release ``index`` (:func:`privacy.user_level.release_sum`),
    every contributor charged first; otherwise the uploads as they are (already charged)."""
    if not central(dp) or not uploads:
        return dict(uploads), {}, {}
    noisy, charged, refused = user_level.release_sum(
        user_level.from_settings(dp), registry.user_bounds(algorithm, cfg), uploads, ledger,
        index, rng, round_)
    return ({} if noisy is None else {user_level.AGGREGATE: noisy}), charged, refused
