"""Budgets and the ledger: round-trip, charging, refusal before a run, exhaustion."""

import json
import math

import pytest

from privacy.accountant import NOT_PRIVATE, Event, spend
from privacy.ledger import (
    Budget,
    BudgetExceeded,
    Charge,
    Ledger,
    NotPrivateRefused,
    check_plan,
    plan_from_schedule,
    projected_spend,
    worst_case_plan,
)

G = Event("gaussian", 5.0)


def _ledger(cap=8.0, n=3, delta=1e-5):
    return Ledger.open({i: Budget(cap, delta) for i in range(n)})


def test_ledger_round_trips_through_json():
    led = _ledger()
    led.charge(1, G, round_=3)
    led.stop(2, round_=4)
    state = json.loads(json.dumps(led.to_dict(), allow_nan=False))
    back = Ledger.from_dict(state)
    assert back.to_dict() == led.to_dict()
    assert back.history(1) == [G] and back.rounds(1) == [3] and back.stopped() == {"2": 4}


def test_unlimited_budget_is_stored_as_none():
    led = Ledger.open({"a": Budget(math.inf, 1e-5)})
    assert led.to_dict()["tenants"]["a"]["epsilon_max"] is None
    assert Ledger.from_dict(led.to_dict()).budget("a").epsilon_max == math.inf


def test_to_dict_is_a_copy():
    led = _ledger()
    led.to_dict()["tenants"]["0"]["history"].append(["gaussian", 1.0, 1])
    assert led.history(0) == []


def test_charges_compose_into_the_spend():
    led = _ledger(cap=100.0)
    for k in (1, 2, 5):
        led.charge(0, G, round_=k)
    assert led.rounds(0) == [1, 2, 5] and led.history(0) == [G.times(3)]
    assert led.spent(0) == spend([G.times(3)], 1e-5)
    assert led.spent(1).epsilon == 0.0


def test_charge_beyond_the_budget_is_refused_with_the_numbers():
    led = _ledger(cap=0.5)
    want = spend([G], 1e-5).epsilon
    with pytest.raises(BudgetExceeded) as err:
        led.charge(2, G, round_=1)
    assert str(err.value) == (
        f"privacy budget exceeded: tenant 2 would spend epsilon {want:.4g} (0 already "
        "spent + 1 planned transmissions) > epsilon_max 0.5 at delta 1e-05")
    assert led.history(2) == []


def test_can_afford_flips_exactly_at_the_budget():
    cap = spend([G.times(4)], 1e-5).epsilon
    led = _ledger(cap=cap)
    for k in range(4):
        assert led.can_afford(0, G)
        led.charge(0, G, round_=k)
    assert not led.can_afford(0, G)


def test_check_plan_names_the_tenant_and_the_numbers():
    led = Ledger.open({"a": Budget(50.0, 1e-5), "b": Budget(2.0, 1e-5), "c": Budget(1.0, 1e-5)})
    led.charge("b", G, round_=1)
    spent = spend([G], 1e-5).epsilon
    proj = spend([G.times(11)], 1e-5).epsilon
    with pytest.raises(BudgetExceeded) as err:
        check_plan(led, {"a": 10, "b": 10, "c": 10}, G)
    assert str(err.value) == (
        f"privacy budget exceeded: tenant b would spend epsilon {proj:.4g} ({spent:.4g} "
        "already spent + 10 planned transmissions) > epsilon_max 2 at delta 1e-05; "
        "1 other tenant(s) too")
    assert (err.value.tenant, err.value.planned) == ("b", 10)


def test_check_plan_passes_and_returns_the_projection():
    led = _ledger(cap=100.0)
    proj = check_plan(led, worst_case_plan(range(3), 7), G)
    assert proj["1"] == spend([G.times(7)], 1e-5)


def test_plans():
    assert worst_case_plan([0, 1], 5) == {"0": 5, "1": 5}
    assert plan_from_schedule([[0, 2], [2], [1, 2]]) == {"0": 1, "2": 3, "1": 1}


def test_projected_spend_of_a_tenant_with_no_planned_transmission_is_its_spend():
    led = _ledger()
    led.charge(0, G, round_=1)
    assert projected_spend(led, {0: 0}, G)["0"] == led.spent(0)


def test_unknown_tenant_and_bad_budgets_are_refused():
    with pytest.raises(KeyError, match="tenant 9 has no privacy budget in this ledger"):
        _ledger().spent(9)
    with pytest.raises(ValueError, match="epsilon_max must be positive, got 0"):
        Budget(0, 1e-5)
    with pytest.raises(ValueError, match="unsupported ledger version 7"):
        Ledger.from_dict({"version": 7, "tenants": {}})


def test_stop_keeps_the_first_round():
    led = _ledger()
    led.stop(0, 4)
    led.stop(0, 9)
    assert led.stopped() == {"0": 4}


def test_a_transmission_without_a_guarantee_needs_the_opt_in_and_spends_infinity():
    led = Ledger.open({"in": Budget(10.0, 1e-5, allow_not_private=True),
                       "out": Budget(10.0, 1e-5), "out2": Budget(10.0, 1e-5)})
    assert led.can_afford("in", NOT_PRIVATE) and not led.can_afford("out", NOT_PRIVATE)
    with pytest.raises(NotPrivateRefused) as err:
        check_plan(led, {"in": 3, "out": 3, "out2": 1}, NOT_PRIVATE)
    assert err.value.tenants == ["out", "out2"]
    assert str(err.value) == (
        "tenant(s) out, out2 did not opt in to non-private training (allow_non_private is "
        "false): this job would send their data without a differential privacy guarantee")
    with pytest.raises(NotPrivateRefused):
        led.charge("out", NOT_PRIVATE, round_=1)
    assert led.history("out") == []
    led.charge("in", G, round_=1)
    assert led.spent("in").epsilon == spend([G], 1e-5).epsilon  # finite so far
    assert math.isinf(led.charge("in", NOT_PRIVATE, round_=2).epsilon)
    assert math.isinf(led.spent("in").epsilon) and led.spent("in").transmissions == 2
    # infinity is spent for good: no DP transmission is affordable any more, and a plan is
    # refused with a message that says why
    assert not led.can_afford("in", Event("gaussian", 1e6))
    with pytest.raises(BudgetExceeded) as err:
        check_plan(led, {"in": 1}, G)
    assert str(err.value) == (
        "privacy budget exceeded: tenant in has spent epsilon = infinity (its data was sent "
        "without noise by an earlier job, or tuned on raw ratings by a tuning job), so no "
        "differentially private job can include it")
    # the state stays JSON (the opt-in round-trips, the event is ["none", 0.0, 1])
    again = Ledger.from_dict(json.loads(json.dumps(led.to_dict(), allow_nan=False)))
    assert again.budget("in").allow_not_private and math.isinf(again.spent("in").epsilon)


def test_not_private_events_have_no_noise():
    assert NOT_PRIVATE == Event("none", 0.0, 1)
    with pytest.raises(ValueError, match="noise multiplier 0"):
        Event("none", 1.0)
    assert spend([NOT_PRIVATE.times(0)], 1e-5).epsilon == 0.0


# --- the one row shape of a persisted ledger --------------------------------------------

def test_a_charge_is_written_in_one_shape_and_read_back():
    dp = {"unit": "user", "placement": "tenant", "epsilon": 4.0}
    event = Event("gaussian", 1.5, 1, 0.25)
    for by, note in (("coordinator", None), ("agent", "refused: upload x[0] too large"),
                     ("tuning", "not private")):
        row = Charge(event, dp, by, note).row()
        assert set(row) == {"event", "dp", "by", "note"}
        assert json.loads(json.dumps(row)) == row  # plain JSON
        assert Charge.from_row(row) == Charge(event, dp, by, note)
    assert Charge(NOT_PRIVATE).row() == {"event": ["none", 0.0, 1], "dp": None,
                                         "by": "coordinator", "note": None}


#: rows as the service stored them before the one shape, and what each reads as
OLD_ROWS = [
    ({"event": ["gaussian", 2.0, 1], "dp": {"mechanism": "gaussian"}},
     Charge(Event("gaussian", 2.0, 1), {"mechanism": "gaussian"}, "coordinator", None)),
    ({"event": ["gaussian", 2.0, 1, 0.5], "dp": {"unit": "user"}, "by": "agent",
      "refused": "x[3] has norm 9"},
     Charge(Event("gaussian", 2.0, 1, 0.5), {"unit": "user"}, "agent", "x[3] has norm 9")),
    ({"event": ["gaussian", 3.0, 1], "dp": {"unit": "user"}, "by": "agent"},
     Charge(Event("gaussian", 3.0, 1), {"unit": "user"}, "agent", None)),
    ({"event": ["gaussian", 3.0, 1], "dp": {"unit": "user"}, "by": "agent",
      "secure_aggregation": True},
     Charge(Event("gaussian", 3.0, 1), {"unit": "user"}, "agent", None)),
    ({"event": ["none", 0.0, 1], "tuning": True, "reason": "not private: tuning"},
     Charge(NOT_PRIVATE, None, "tuning", "not private: tuning")),
]


@pytest.mark.parametrize(("row", "charge"), OLD_ROWS)
def test_rows_of_the_older_shapes_are_still_read(row, charge):
    assert Charge.from_row(row) == charge
    assert Charge.from_row(Charge.from_row(row).row()) == charge  # rewritten: the same
