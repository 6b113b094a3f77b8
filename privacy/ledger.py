"""Privacy budgets and the ledger that charges every transmission against them.

A tenant has a budget (epsilon_max, delta). The :class:`Ledger` records, per tenant, every
charged transmission (as :class:`privacy.accountant.Event` runs) and the rounds in which it
transmitted; its whole state is a plain JSON-ready dict (:meth:`Ledger.to_dict`), which the
service persists per tenant and the simulator keeps in memory.

Two checks keep the budgets (the architecture's invariant 2, "accounting first"):

* before a run, :func:`check_plan` computes each participating tenant's projected spend
  (what it already spent plus its planned transmissions) and refuses the run with
  :class:`BudgetExceeded`, naming the tenant and the numbers;
* during a run, :meth:`Ledger.can_afford` is asked before every transmission; a tenant that
  cannot afford one more stops transmitting (:meth:`Ledger.stop`) and the run reports it.

Transmissions without a DP guarantee (:data:`privacy.accountant.NOT_PRIVATE`) bind too: a
tenant may make one only if its budget says so (``allow_not_private``, an explicit opt-in,
off by default), and each is charged as epsilon = infinity. Its spend is then infinite for
good, so every later differentially private run that includes it is refused: a guarantee
that no longer holds is never reported.

Planned transmissions: by default the worst case, every round (:func:`worst_case_plan`).
With client sampling the server sees who transmits, so a sampled tenant pays in full for
each transmission (no amplification by sampling) and pays nothing for rounds it sits out;
its true count is at most ``rounds``. The worst case is the safe basis for refusing a run.
When the sampling schedule is known in advance (it is derived from the job's seed),
:func:`plan_from_schedule` gives the exact counts; if a tenant then transmits more than
planned, the in-run check still stops it, so the guarantee never depends on the plan.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from privacy.accountant import NONE, Event, Spend, compose, spend

LEDGER_VERSION = 1
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Budget:
    """A tenant's privacy budget: total epsilon over all its transmissions, at ``delta``;
    ``allow_not_private`` lets it make transmissions without a DP guarantee (epsilon = inf)."""

    epsilon_max: float
    delta: float
    allow_not_private: bool = False

    def __post_init__(self) -> None:
        if not self.epsilon_max > 0:
            raise ValueError(f"epsilon_max must be positive, got {self.epsilon_max!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")


class BudgetExceeded(ValueError):
    """A tenant's projected spend exceeds its budget; the run is refused."""

    def __init__(self, tenant: str, projected: float, budget: Budget, spent: float,
                 planned: int, others: int = 0) -> None:
        self.tenant, self.projected, self.budget = tenant, projected, budget
        self.spent, self.planned = spent, planned
        if math.isinf(spent):
            msg = (f"privacy budget exceeded: tenant {tenant} has spent epsilon = infinity "
                   "(its data was sent without noise by an earlier job, or tuned on "
                   "raw ratings by a tuning job), so no "
                   "differentially private job can include it")
        else:
            msg = (f"privacy budget exceeded: tenant {tenant} would spend epsilon "
                   f"{projected:.4g} ({spent:.4g} already spent + {planned} planned "
                   f"transmissions) > epsilon_max {budget.epsilon_max:.4g} at delta "
                   f"{budget.delta:.3g}")
        if others:
            msg += f"; {others} other tenant(s) too"
        super().__init__(msg)


class NotPrivateRefused(ValueError):
    """Tenants without the ``allow_not_private`` opt-in would transmit without a DP
    guarantee; the run is refused. ``tenants`` lists every one of them."""

    def __init__(self, tenants: list[str]) -> None:
        self.tenants = list(tenants)
        super().__init__(f"tenant(s) {', '.join(self.tenants)} did not opt in to "
                         "non-private training (allow_non_private is false): this job would "
                         "send their data without a differential privacy guarantee")


def _key(tenant: Hashable) -> str:
    return str(tenant)


class Ledger:
    """Per-tenant budgets and charged events. State = :meth:`to_dict` (plain, JSON-ready)."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != LEDGER_VERSION:
            raise ValueError(f"unsupported ledger version {state.get('version')!r}")
        self._state = copy.deepcopy(dict(state))

    @classmethod
    def open(cls, budgets: Mapping[Hashable, Budget]) -> Ledger:
        """A fresh ledger with one account per tenant (no spend yet)."""
        tenants = {_key(t): {"epsilon_max": _eps_to_json(b.epsilon_max), "delta": b.delta,
                             "allow_not_private": b.allow_not_private,
                             "history": [], "rounds": [], "stopped_at": None}
                   for t, b in budgets.items()}
        return cls({"version": LEDGER_VERSION, "tenants": tenants})

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the state (lists, dicts, floats, ints, str, None only)."""
        return copy.deepcopy(self._state)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Ledger:
        return cls(state)

    def tenants(self) -> list[str]:
        return list(self._state["tenants"])

    def _account(self, tenant: Hashable) -> dict[str, Any]:
        try:
            return self._state["tenants"][_key(tenant)]
        except KeyError:
            raise KeyError(f"tenant {tenant} has no privacy budget in this ledger") from None

    def budget(self, tenant: Hashable) -> Budget:
        acc = self._account(tenant)
        return Budget(_eps_from_json(acc["epsilon_max"]), float(acc["delta"]),
                      bool(acc.get("allow_not_private", False)))

    def history(self, tenant: Hashable) -> list[Event]:
        return [Event.from_list(e) for e in self._account(tenant)["history"]]

    def rounds(self, tenant: Hashable) -> list[int]:
        """The rounds in which the tenant transmitted (and was charged)."""
        return list(self._account(tenant)["rounds"])

    def stopped(self) -> dict[str, int]:
        """Tenants whose budget ran out, with the first round they could not transmit."""
        return {t: a["stopped_at"] for t, a in self._state["tenants"].items()
                if a["stopped_at"] is not None}

    def spent(self, tenant: Hashable) -> Spend:
        """What the tenant has spent so far, at its budget's delta."""
        return spend(self.history(tenant), self.budget(tenant).delta)

    def projected(self, tenant: Hashable, event: Event) -> Spend:
        """What the tenant would have spent after ``event`` (count transmissions) more."""
        return spend(self.history(tenant) + [event], self.budget(tenant).delta)

    def can_afford(self, tenant: Hashable, event: Event) -> bool:
        """Within budget after ``event``; a transmission without a DP guarantee only with
        the tenant's ``allow_not_private`` opt-in (it spends epsilon = infinity)."""
        if event.mechanism == NONE:
            return self.budget(tenant).allow_not_private
        return self.projected(tenant, event).epsilon <= self.budget(tenant).epsilon_max

    def charge(self, tenant: Hashable, event: Event, round_: int) -> Spend:
        """Record one transmission (``event.count`` must be 1); refuse it if unaffordable."""
        if event.count != 1:
            raise ValueError("charge one transmission at a time (event.count == 1)")
        after = self.projected(tenant, event)
        if event.mechanism == NONE and not self.can_afford(tenant, event):
            raise NotPrivateRefused([_key(tenant)])
        if event.mechanism != NONE and not self.can_afford(tenant, event):
            raise BudgetExceeded(_key(tenant), after.epsilon, self.budget(tenant),
                                 self.spent(tenant).epsilon, 1)
        acc = self._account(tenant)
        acc["history"] = [e.as_list() for e in compose(self.history(tenant) + [event])]
        acc["rounds"].append(int(round_))
        return after

    def with_reserved(self, reserved: Mapping[Hashable, Sequence[Event]]) -> Ledger:
        """A copy in which each tenant has also spent the events ``reserved`` for it
        (what other accepted runs still plan to charge), for checking a new run's plan
        against the budget those runs leave; the copy is never charged."""
        out = self.to_dict()
        for tenant, events in reserved.items():
            acc = out["tenants"][_key(tenant)]
            acc["history"] = [e.as_list() for e in compose(
                [Event.from_list(e) for e in acc["history"]] + list(events))]
        return Ledger.from_dict(out)

    def stop(self, tenant: Hashable, round_: int) -> None:
        """Record that the tenant stopped transmitting in ``round_`` (first stop is kept)."""
        acc = self._account(tenant)
        if acc["stopped_at"] is None:
            acc["stopped_at"] = int(round_)


def refusal(ledger: Ledger, account: Hashable, event: Event, round_: int,
            what: str = "transmission") -> str | None:
    """None when ``account`` can afford ``event``; else why not, in words a tenant reads
    (a transmission without a DP guarantee: it did not opt in; else: its budget)."""
    if ledger.can_afford(account, event):
        return None
    if event.mechanism == NONE:
        return (f"refused in round {round_}: the tenant did not opt in to non-private "
                "training (allow_non_private is false)")
    spent, cap = ledger.spent(account).epsilon, ledger.budget(account).epsilon_max
    return (f"budget exhausted in round {round_}: epsilon spent {spent:.4g}, one more "
            f"{what} would exceed epsilon_max {cap:.4g}")


def charged_release(ledger: Ledger, accounts: Iterable[Hashable], event: Event, round_: int,
                    privatise: Callable[[list[Hashable]], T], what: str = "transmission"
                    ) -> tuple[T | None, dict[Hashable, Event], dict[Hashable, str]]:
    """Check budget, privatise, charge: the one rule every noisy release follows.

    Every account that cannot afford ``event`` is refused (with :func:`refusal`'s reason);
    ``privatise(kept)`` builds the noisy release of the others (noise is drawn, nothing is
    handed on yet); each of them is charged ``event`` in ``ledger``; only then is the
    release returned. Nobody able to pay: nothing is privatised or charged. Returns
    (release or None, {account: event charged}, {account: refusal}). The simulator's
    in-memory ledger and the service's database ledger (loaded, charged, persisted by the
    caller in the transaction that stores the release) go through the same function.
    """
    accounts = list(accounts)
    refused = {a: why for a in accounts
               if (why := refusal(ledger, a, event, round_, what)) is not None}
    kept = [a for a in accounts if a not in refused]
    if not kept:
        return None, {}, refused
    released = privatise(kept)
    for a in kept:
        ledger.charge(a, event, round_)
    return released, {a: event for a in kept}, refused


#: who released a charged transmission: the coordinator (a hosted tenant's upload or a
#: central sum), the tenant's own agent (recorded by the coordinator), or a tuning job
BY_COORDINATOR, BY_AGENT, BY_TUNING = "coordinator", "agent", "tuning"


@dataclasses.dataclass(frozen=True)
class Charge:
    """One charged transmission as a persisted ledger stores it, whoever released it: the
    event (:meth:`privacy.accountant.Event.as_list`), the privacy settings it was charged
    under (None for a tuning job), who released it (:data:`BY_COORDINATOR`,
    :data:`BY_AGENT`, :data:`BY_TUNING`) and a note (why a charged release was never
    used, or what a tuning job did). :meth:`row` is the one row shape written;
    :meth:`from_row` also reads the shapes stored before it."""

    event: Event
    dp: Mapping[str, Any] | None = None
    by: str = BY_COORDINATOR
    note: str | None = None

    def row(self) -> dict[str, Any]:
        """The JSON row: ``{"event", "dp", "by", "note"}``, every key always present."""
        return {"event": self.event.as_list(),
                "dp": None if self.dp is None else dict(self.dp),
                "by": self.by, "note": self.note}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Charge:
        """A stored row, of :meth:`row`'s shape or an older one: ``{"event", "dp"}`` (a
        hosted release), ``{"event", "dp", "by", "refused"?}`` (an agent's upload),
        ``{"event", "dp", "by", "secure_aggregation"}`` (an agent's masked input),
        ``{"event", "tuning", "reason"}`` (a tuning job)."""
        by = row.get("by") or (BY_TUNING if row.get("tuning") else BY_COORDINATOR)
        note = row.get("note") or row.get("refused") or row.get("reason")
        return cls(Event.from_list(row["event"]), row.get("dp"), str(by), note)


def worst_case_plan(tenants: Iterable[Hashable], rounds: int) -> dict[str, int]:
    """Every tenant transmits in every round: the safe plan for refusing a run."""
    return {_key(t): int(rounds) for t in tenants}


def plan_from_schedule(schedule: Iterable[Iterable[Hashable]]) -> dict[str, int]:
    """Exact counts from the tenants selected in each round (a known sampling schedule)."""
    plan: dict[str, int] = {}
    for selected in schedule:
        for t in selected:
            plan[_key(t)] = plan.get(_key(t), 0) + 1
    return plan


def projected_spend(ledger: Ledger, plan: Mapping[Hashable, int], event: Event
                    ) -> dict[str, Spend]:
    """Each planned tenant's spend after its planned transmissions of ``event``."""
    return {_key(t): ledger.projected(t, event.times(n)) for t, n in plan.items()}


def check_schedule(ledger: Ledger, tenants: Iterable[Hashable], events: Sequence[Event]
                   ) -> dict[str, Spend]:
    """Like :func:`check_plan` for a schedule of possibly different events that every
    listed tenant takes part in; raises :class:`BudgetExceeded` naming the first tenant."""
    proj = {_key(t): spend(ledger.history(t) + list(events), ledger.budget(t).delta)
            for t in tenants}
    over = [t for t, s in proj.items() if s.epsilon > ledger.budget(t).epsilon_max]
    if over:
        t = over[0]
        raise BudgetExceeded(t, proj[t].epsilon, ledger.budget(t), ledger.spent(t).epsilon,
                             len(events), len(over) - 1)
    return proj


def check_plan(ledger: Ledger, plan: Mapping[Hashable, int], event: Event) -> dict[str, Spend]:
    """Refuse a run that would take any tenant over budget; returns the projections.

    Raises
    ------
    BudgetExceeded
        Naming the first tenant over budget (and how many others are), with its projected
        epsilon, what it already spent, its planned transmissions and its budget.
    NotPrivateRefused
        For a transmission without a DP guarantee, naming every planned tenant that did not
        opt in to it.
    """
    counts = {_key(t): int(n) for t, n in plan.items()}
    if event.mechanism == NONE:
        refused = [t for t, n in counts.items() if n and not ledger.can_afford(t, event)]
        if refused:
            raise NotPrivateRefused(refused)
    proj = projected_spend(ledger, counts, event)
    over = [t for t, s in proj.items() if event.mechanism != NONE
            and s.epsilon > ledger.budget(t).epsilon_max]
    if over:
        t = over[0]
        raise BudgetExceeded(t, proj[t].epsilon, ledger.budget(t), ledger.spent(t).epsilon,
                             counts[t], len(over) - 1)
    return proj


def _eps_to_json(eps: float) -> float | None:
    """JSON has no infinity: an unlimited budget is stored as None."""
    return None if math.isinf(eps) else float(eps)


def _eps_from_json(eps: float | None) -> float:
    return math.inf if eps is None else float(eps)


class BudgetChangeRefused(ValueError):
    """A new budget would be below what the tenant has already spent."""


def rebudget(ledger: Ledger, tenant: Hashable, epsilon_max: float) -> Budget:
    """The tenant's budget with ``epsilon_max`` in place of its current one, checked
    against its spend: a raise is allowed (more epsilon for later runs; what was spent
    stays spent), a cut only down to what it has already spent (a budget below its spend
    would state a bound that no longer holds). A tenant that has spent epsilon = infinity
    keeps spending nothing more under any budget (every DP run stays refused)."""
    current = ledger.budget(tenant)
    budget = Budget(float(epsilon_max), current.delta, current.allow_not_private)
    spent = ledger.spent(tenant).epsilon
    if math.isfinite(spent) and budget.epsilon_max < spent:
        raise BudgetChangeRefused(
            f"privacy_budget {budget.epsilon_max:.6g} is below the epsilon tenant "
            f"{_key(tenant)} has already spent ({spent:.6g}); a budget can only be cut "
            "down to its spend")
    return budget
