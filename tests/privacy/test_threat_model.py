"""The threat model is stated once (privacy/threat_model.py) and carried by every report."""

import math

import pytest

import algorithms.dpals as D
from privacy import threat_model as tm
from privacy.ledger import Budget, Ledger
from privacy.user_level import UNIT_USER, UserLevelPrivatizer, UserLevelSpec
from privacy.wrapper import DPSpec, privacy_report


def _rows(report):
    return {r["adversary"]: r for r in report["threat_model"]["adversaries"]}


@pytest.mark.parametrize("placement,secure", [("central", False), ("tenant", False),
                                              ("tenant", True)])
def test_a_user_level_report_names_every_adversary_with_the_charged_epsilon(placement, secure):
    cfg = D.DPALSConfig(rank=2, sweeps=2)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-6, n_users=1000, releases=2,
                         placement=placement, secure_aggregation=secure)
    report = UserLevelPrivatizer(spec, D.user_bounds(cfg), 2, seed=0).report()
    model = report["threat_model"]
    assert model["unit"] == "one user account of one tenant"
    assert "one user account of one tenant" in report["unit_detail"] == UNIT_USER
    assert model["placement"] == tm.placement_key(placement, secure)
    rows = _rows(report)
    assert list(rows) == list(tm.ADVERSARIES)
    # the other users of a tenant see only lists computed from V: the charged epsilon
    assert rows["other users of the same tenant"]["epsilon"] == report["epsilon_max"]
    coordinator = rows["operator/coordinator"]["epsilon"]
    assert (coordinator == tm.TRUSTED) == (placement == "central")


def test_the_central_claim_is_no_longer_against_anyone_who_sees_recommendations():
    text = " ".join(learns for learns, _ in tm.THREAT_MODEL["central"].values())
    assert "raw ratings" in tm.THREAT_MODEL["central"]["operator/coordinator"][0]
    assert "nothing computed from other accounts' raw ratings" in text
    assert "tuning" in tm.NOT_COVERED and "auto_create_items" in tm.NOT_COVERED


def test_a_tenant_unit_report_carries_the_table_and_a_noise_free_one_says_infinity():
    ledger = Ledger.open({0: Budget(8.0, 1e-5)})
    report = privacy_report(DPSpec(mechanism="gaussian", noise_multiplier=1.0), ledger)
    assert report["threat_model"]["unit"] == tm.UNIT
    none = privacy_report(DPSpec(mechanism="none"), ledger)
    assert {r["epsilon"] for r in none["threat_model"]["adversaries"]} == {"infinity"}


def test_an_infinite_epsilon_is_written_as_infinity():
    model = tm.threat_model("tenant", epsilon=math.inf)
    assert _rows({"threat_model": model})["agents"]["epsilon"] == "infinity"

