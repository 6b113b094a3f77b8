"""The privacy seam of a stored job: every release of a round, whatever the unit.

A job's privacy settings (``job.dp``) name the unit: the tenant's block
(:mod:`privacy.wrapper`) or one user (:mod:`privacy.user_level`, placement ``tenant`` or
``central``). :func:`release_upload` is what happens to a tenant's upload before it is
staged, :func:`release_round` what happens to the round's uploads before the server step.
Both end in :func:`privacy.ledger.charged_release` (check budget, privatise, charge), the
rule :class:`privacy.wrapper.DPPrivatizer` and :class:`privacy.user_level.
UserLevelPrivatizer` follow in the simulator. The service loads the tenants' ledger from
its database, calls these, and persists the events they charged in the transaction that
stores the release; it adds no rule of its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from algorithms import registry
from algorithms._messages import Message
from algorithms._rng import SAMPLING, derive_rng, sample_clients
from algorithms.base import default_select
from privacy import user_level
from privacy.accountant import Event
from privacy.ledger import Ledger
from privacy.wrapper import DPSpec, release


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


def central(dp: Mapping[str, Any]) -> bool:
    """Whether the round's uploads are noised once, as a sum, by :func:`release_round`."""
    return user_level.is_user_level(dp) and dp.get("placement") == "central"


def release_upload(dp: Mapping[str, Any], algorithm: str, cfg: Any, upload: Message,
                   account: Hashable, ledger: Ledger, rng: np.random.Generator, round_: int,
                   index: int = 0, private_algorithm: bool = True
                   ) -> tuple[Message | None, Event | None, str | None]:
    """One tenant's upload as it leaves the tenant: (upload as sent, event charged to
    ``ledger``, refusal reason).

    Tenant unit: :func:`privacy.wrapper.release` (clip, noise, charge; a transmission
    without a guarantee is charged epsilon = infinity, only with the tenant's opt-in).
    User level, placement ``tenant``: :func:`privacy.user_level.release_one` of release
    ``index`` of this tenant's users. User level, placement ``central``: the bounded
    upload unchanged and uncharged (:func:`release_round` charges and noises the sum).
    """
    if not user_level.is_user_level(dp):
        return release(upload, DPSpec(**dp), account, ledger, rng, round_, private_algorithm)
    spec = user_level.from_settings(dp)
    if spec.placement == "central":
        return upload, None, None
    return user_level.release_one(spec, registry.user_bounds(algorithm, cfg), upload,
                                  account, ledger, index, rng, round_)


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
