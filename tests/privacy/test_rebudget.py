"""privacy.ledger.rebudget: a budget change checked against what was already spent."""

from __future__ import annotations

import math

import pytest

from privacy.accountant import NOT_PRIVATE, Event, spend
from privacy.ledger import Budget, BudgetChangeRefused, Ledger, rebudget

EVENT = Event("gaussian", 2.0, 1)


def spent_ledger(n: int, allow: bool = False) -> Ledger:
    ledger = Ledger.open({"a": Budget(50.0, 1e-5, allow)})
    for r in range(n):
        ledger.charge("a", EVENT, r + 1)
    return ledger


def test_a_raise_keeps_delta_and_opt_in_and_a_cut_stops_at_the_spend():
    ledger = spent_ledger(3)
    spent = spend([EVENT.times(3)], 1e-5).epsilon  # independent of the ledger's bookkeeping
    assert rebudget(ledger, "a", 80.0) == Budget(80.0, 1e-5, False)
    assert rebudget(ledger, "a", spent) == Budget(spent, 1e-5, False)
    with pytest.raises(BudgetChangeRefused, match=r"below the epsilon tenant a has already "
                                                  r"spent"):
        rebudget(ledger, "a", spent * 0.99)
    with pytest.raises(ValueError, match="epsilon_max must be positive"):
        rebudget(ledger, "a", 0.0)


def test_after_a_noise_free_transmission_any_budget_still_refuses_dp_runs():
    ledger = Ledger.open({"a": Budget(5.0, 1e-5, True)})
    ledger.charge("a", NOT_PRIVATE, 1)
    assert math.isinf(ledger.spent("a").epsilon)
    raised = rebudget(ledger, "a", 1000.0)
    assert raised.epsilon_max == 1000.0
    state = ledger.to_dict()
    state["tenants"]["a"]["epsilon_max"] = raised.epsilon_max
    assert not Ledger.from_dict(state).can_afford("a", EVENT)
