"""Bernoulli (XOR) noise as a DP mechanism: flip probability vs epsilon, the wrapper, the
ledger's charge and the ``--dp bernoulli`` options."""

import argparse
import dataclasses
import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp

from algorithms.messages import Message
from privacy.accountant import ORDERS, Event, spend
from privacy.bernoulli import bernoulli_rdp, flip_prob_for_epsilon
from privacy.cli import add_dp_arguments, privatizer_from_args, spec_from_args
from privacy.ledger import Budget, Ledger
from privacy.wrapper import DPPrivatizer, DPSpec, event_for, flip_probability, privatize


@dataclasses.dataclass(frozen=True)
class BitsUpload(Message):
    """A Boolean upload stored as floats (like the voting baseline's rounded V_i)."""

    v: np.ndarray
    w: np.ndarray


def _bits(shape=(20, 50), seed=0):
    rng = np.random.default_rng(seed)
    return BitsUpload(v=(rng.random(shape) < 0.3).astype(np.float64),
                      w=(rng.random(10) < 0.5).astype(np.float64))


def _rr_divergence(eps, alpha):
    """D_alpha(P || Q) of randomized response with flip probability 1/(1+e^eps), directly."""
    p = 1.0 / (1.0 + math.exp(eps))
    log_p, log_q = np.log([1 - p, p]), np.log([p, 1 - p])
    terms = alpha * log_p + (1 - alpha) * log_q  # log of P^alpha Q^(1-alpha), both outcomes
    return float(np.logaddexp(*terms)) / (alpha - 1)


def _args(*argv):
    return add_dp_arguments(argparse.ArgumentParser(prog="t")).parse_args(list(argv))


def test_flip_rate_matches_the_epsilon_formula():
    d = 200_000
    up = BitsUpload(v=np.zeros((400, 500)), w=np.ones(0))
    eps_per_transmission = 0.5 * d  # 0.5 per bit
    spec = DPSpec(mechanism="bernoulli", noise_multiplier=1.0 / eps_per_transmission)
    p = flip_probability(spec, d)
    assert p == pytest.approx(1.0 / (1.0 + math.exp(0.5)))
    noisy, event = privatize(up, spec, np.random.default_rng(3))
    flips = int(noisy.v.sum())  # every 1 of an all-zero upload is a flip
    sd = math.sqrt(d * p * (1 - p))
    assert abs(flips - d * p) < 5 * sd
    assert event == Event("bernoulli", 1.0 / eps_per_transmission, 1)


def test_flip_prob_gives_d_log_odds_epsilon_per_transmission():
    up = _bits()
    d = 20 * 50 + 10
    spec = DPSpec(mechanism="bernoulli", flip_prob=0.2)
    ev = event_for(spec, d)
    assert 1.0 / ev.noise_multiplier == pytest.approx(d * math.log(0.8 / 0.2))
    noisy, _ = privatize(up, spec, np.random.default_rng(1))
    changed = np.concatenate([(noisy.v != up.v).ravel(), (noisy.w != up.w).ravel()])
    assert noisy.v.dtype == np.float64 and set(np.unique(noisy.v)) <= {0.0, 1.0}
    assert 0 < changed.sum() < d  # some but not all bits flipped
    again, _ = privatize(up, spec, np.random.default_rng(1))
    assert np.array_equal(again.v, noisy.v) and np.array_equal(again.w, noisy.w)


def test_non_boolean_upload_is_refused():
    up = BitsUpload(v=np.array([[0.0, 0.4]]), w=np.array([1.0]))
    with pytest.raises(TypeError, match=r"BitsUpload.v has entries other than 0 and 1"):
        privatize(up, DPSpec(mechanism="bernoulli", flip_prob=0.1), np.random.default_rng(0))


def test_spec_validation():
    with pytest.raises(ValueError, match="bernoulli noise has no scale"):
        DPSpec(mechanism="bernoulli", noise_scale=1.0)
    with pytest.raises(ValueError, match="exactly one of noise_multiplier and flip_prob"):
        DPSpec(mechanism="bernoulli", noise_multiplier=1.0, flip_prob=0.1)
    with pytest.raises(ValueError, match="exactly one of noise_multiplier and flip_prob"):
        DPSpec(mechanism="bernoulli")
    with pytest.raises(ValueError, match="flip_prob applies to the bernoulli mechanism only"):
        DPSpec(mechanism="gaussian", noise_multiplier=1.0, flip_prob=0.1)
    with pytest.raises(ValueError):
        DPSpec(mechanism="bernoulli", flip_prob=0.5)


def test_bernoulli_rdp_is_randomized_response_divergence_and_below_eps():
    for eps in (0.1, 1.0, 4.0):
        for alpha in (1.5, 2.0, 10.0, 256.0):
            got = float(bernoulli_rdp(1.0 / eps, np.array([alpha]))[0])
            assert got == pytest.approx(_rr_divergence(eps, alpha), rel=1e-9)
            assert got <= eps + 1e-12


def test_ledger_charges_each_transmission_and_spend_is_min_of_rdp_and_pure():
    up = _bits()
    d = n = 20 * 50 + 10
    spec = DPSpec(mechanism="bernoulli", noise_multiplier=n / 0.02 * 1.0, delta=1e-5)
    eps0 = 1.0 / spec.noise_multiplier  # 0.02 / d per bit x d bits = 0.02 per transmission
    assert flip_probability(spec, d) == pytest.approx(flip_prob_for_epsilon(eps0, d))
    priv = DPPrivatizer(spec, Ledger.open({0: Budget(math.inf, 1e-5)}), seed=5)
    for k in range(1, 41):
        out = priv(up, 0, k)
        assert out is not None
    # the flips of round 1 are fresh: another privatizer on the same seed flips others
    first = DPPrivatizer(spec, Ledger.open({0: Budget(math.inf, 1e-5)}), seed=5)(up, 0, 1)
    second = DPPrivatizer(spec, Ledger.open({0: Budget(math.inf, 1e-5)}), seed=5)(up, 0, 1)
    assert not np.array_equal(first.v, second.v)
    s = priv.ledger.spent(0)
    assert s.transmissions == 40 and priv.ledger.rounds(0) == list(range(1, 41))
    curve = np.array([40 * _rr_divergence(eps0, a) for a in ORDERS])
    eps_rdp, _ = dpa_rdp.compute_epsilon(list(ORDERS), curve, 1e-5)
    assert s.epsilon_pure == pytest.approx(40 * eps0)
    assert s.epsilon_rdp == pytest.approx(eps_rdp, rel=1e-9)
    assert s.epsilon == pytest.approx(min(eps_rdp, 40 * eps0))
    rep = priv.report(d)
    assert rep["mechanism"] == "bernoulli" and rep["norm"] is None
    assert rep["epsilon_max"] == pytest.approx(s.epsilon)
    assert rep["flip_prob"] == pytest.approx(flip_prob_for_epsilon(eps0, d))


def test_budget_stops_the_tenant_before_it_overspends():
    up = _bits()
    spec = DPSpec(mechanism="bernoulli", noise_multiplier=1.0)  # pure eps 1 per transmission
    two = spend([Event("bernoulli", 1.0, 2)], 1e-5).epsilon
    priv = DPPrivatizer(spec, Ledger.open({0: Budget(two + 1e-9, 1e-5)}), seed=0)
    assert priv(up, 0, 1) is not None and priv(up, 0, 2) is not None
    assert priv(up, 0, 3) is None
    assert priv.ledger.stopped() == {"0": 3}
    assert priv.ledger.spent(0).transmissions == 2


def test_cli_bernoulli_options():
    spec, target = spec_from_args(_args("--dp", "bernoulli", "--dp-flip-prob", "0.1"), 10)
    assert spec.mechanism == "bernoulli" and spec.flip_prob == 0.1 and target is None
    spec, target = spec_from_args(_args("--dp", "bernoulli", "--dp-epsilon", "2"), 25)
    assert target == 2.0
    got = spend([Event("bernoulli", spec.noise_multiplier, 25)], spec.delta).epsilon
    assert got <= 2.0 and got == pytest.approx(2.0, rel=1e-4)
    with pytest.raises(ValueError, match="--dp bernoulli has no noise scale"):
        spec_from_args(_args("--dp", "bernoulli", "--dp-scale", "1"), 10)
    with pytest.raises(ValueError, match="--dp-flip-prob applies to --dp bernoulli only"):
        spec_from_args(_args("--dp", "gaussian", "--dp-flip-prob", "0.1"), 10)
    with pytest.raises(ValueError, match="n_entries is needed to account a flip probability"):
        privatizer_from_args(_args("--dp", "bernoulli", "--dp-flip-prob", "0.1"), 2, 5, 0)
    priv = privatizer_from_args(_args("--dp", "bernoulli", "--dp-flip-prob", "0.1"), 2, 5, 0,
                                n_entries=100)
    assert priv.spec.flip_prob == 0.1
