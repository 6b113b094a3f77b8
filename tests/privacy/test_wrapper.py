"""The DP wrapper: clip + noise every array of an upload, charge first, stop when broke."""

import dataclasses
import json
import math

import numpy as np
import pytest

from algorithms.messages import Message
from privacy.accountant import Event, spend
from privacy.gaussian import gaussian_release
from privacy.laplace import laplace_release
from privacy.ledger import Budget, BudgetExceeded, Ledger, worst_case_plan
from privacy.samplers import grid
from privacy.wrapper import (
    DPPrivatizer,
    DPSpec,
    bound_problem,
    event_for,
    privacy_report,
    privatize,
    sensitivity,
    unprotected_fields,
)


@dataclasses.dataclass(frozen=True)
class TinyUpload(Message):
    """Two arrays like an ADMM upload (W_i, Y_i) and one scalar."""

    W: np.ndarray
    Y: np.ndarray
    tag: int = 0


def _upload():
    return TinyUpload(W=np.array([[3.0, 0.0], [0.0, 0.0]]), Y=np.array([0.0, 4.0, 0.0]), tag=7)


def _ledger(cap=math.inf, n=3, delta=1e-5):
    return Ledger.open({i: Budget(cap, delta) for i in range(n)})


def _on_grid(x, gamma):
    return np.array_equal(np.asarray(x) / gamma, np.rint(np.asarray(x) / gamma))


def test_gaussian_privatize_is_joint_clip_plus_noise_of_scale_z_times_2c():
    spec = DPSpec(mechanism="gaussian", clip=0.5, noise_multiplier=2.0)
    out, event = privatize(_upload(), spec, np.random.default_rng(11))
    rng = np.random.default_rng(11)  # independent evaluation: norm 5 -> factor 0.1
    sigma = 2.0 * (2 * 0.5)
    # the release of each clipped array on the grid, rounding paid over all 7 entries
    want_w = gaussian_release(np.array([[0.3, 0.0], [0.0, 0.0]]), sigma, rng, 1.0, 7)
    want_y = gaussian_release(np.array([0.0, 0.4, 0.0]), sigma, rng, 1.0, 7)
    np.testing.assert_array_equal(out.W, want_w)
    np.testing.assert_array_equal(out.Y, want_y)
    assert _on_grid(out.W, grid(sigma)) and _on_grid(out.Y, grid(sigma))
    assert event == Event("gaussian", 2.0, 1) and out.tag == 7
    # nearly no noise: the joint clip shows (norm 5 -> factor 0.1 on both arrays)
    quiet = DPSpec(mechanism="gaussian", clip=0.5, noise_scale=1e-9)
    out, _ = privatize(_upload(), quiet, np.random.default_rng(0))
    np.testing.assert_allclose(out.W, [[0.3, 0.0], [0.0, 0.0]], atol=1e-7)
    np.testing.assert_allclose(out.Y, [0.0, 0.4, 0.0], atol=1e-7)


def test_laplace_privatize_uses_the_l1_clip_by_default():
    spec = DPSpec(mechanism="laplace", clip=1.4, noise_multiplier=3.0)
    out, event = privatize(_upload(), spec, np.random.default_rng(2))
    rng = np.random.default_rng(2)  # L1 norm 7 -> factor 0.2; b = 3 * 2 * 1.4
    want_w = laplace_release(0.2 * _upload().W, 8.4, rng, 2.8, 7)
    want_y = laplace_release(0.2 * _upload().Y, 8.4, rng, 2.8, 7)
    np.testing.assert_array_equal(out.W, want_w)
    np.testing.assert_array_equal(out.Y, want_y)
    assert event == Event("laplace", 3.0, 1)
    quiet = DPSpec(mechanism="laplace", clip=1.4, noise_scale=1e-9)
    out, _ = privatize(_upload(), quiet, np.random.default_rng(0))
    np.testing.assert_allclose(out.W, 0.2 * _upload().W, atol=1e-7)


def test_rfrec_value_clip_with_an_absolute_scale():
    # RFRec eq. 9: Clip(V, 0.2) + Laplace(0, 0.04); whole-message Delta_1 = 2 * 0.2 * d
    spec = DPSpec(mechanism="laplace", norm="value", clip=0.2, noise_scale=0.04)
    out, event = privatize(_upload(), spec, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    np.testing.assert_array_equal(out.W, laplace_release(np.clip(_upload().W, -0.2, 0.2),
                                                         0.04, rng, 2 * 0.2 * 7, 7))
    assert event.noise_multiplier == pytest.approx(0.04 / (2 * 0.2 * 7))
    assert 1 / event.noise_multiplier == pytest.approx(7 * 10.0)  # d x RFRec's 2 delta / s


@pytest.mark.parametrize("mechanism,norm,want", [
    ("gaussian", "l2", 2.0), ("gaussian", "l1", 2.0), ("gaussian", "value", 2.0 * 3.0),
    ("laplace", "l1", 2.0), ("laplace", "l2", 2.0 * 3.0), ("laplace", "value", 2.0 * 9.0),
])
def test_replace_one_sensitivity_is_the_diameter_of_the_clip_ball(mechanism, norm, want):
    spec = DPSpec(mechanism=mechanism, norm=norm, clip=1.0, noise_multiplier=1.0)
    assert sensitivity(spec, n_entries=9) == pytest.approx(want)


def test_privatize_refuses_integer_arrays():
    @dataclasses.dataclass(frozen=True)
    class Bad(Message):
        idx: np.ndarray

    with pytest.raises(TypeError, match="cannot add noise to Bad.idx of dtype int64"):
        privatize(Bad(np.arange(3)), DPSpec(noise_multiplier=1.0), np.random.default_rng(0))


def test_scalar_fields_are_listed_as_unprotected():
    assert unprotected_fields(_upload()) == ["tag"]


def test_spec_needs_exactly_one_noise():
    with pytest.raises(ValueError, match="give exactly one of noise_multiplier and noise_scale"):
        DPSpec(mechanism="gaussian")
    with pytest.raises(ValueError, match="give exactly one of noise_multiplier and noise_scale"):
        DPSpec(noise_multiplier=1.0, noise_scale=1.0)
    assert DPSpec(mechanism="none").mechanism == "none"


def test_privatizer_draws_fresh_noise_whatever_the_seed_and_charges():
    """Issue 29: the noise never derives from the (public) job seed: two privatizers on
    the same seed, client and round noise the same upload differently, and neither draw
    is the seeded stream the wrapper used to draw from."""
    spec = DPSpec(noise_multiplier=1.5)
    priv = DPPrivatizer(spec, _ledger(), seed=42)
    out = priv(_upload(), client=2, round_=5)
    again = DPPrivatizer(spec, _ledger(), seed=42)(_upload(), client=2, round_=5)
    assert not np.array_equal(out.W, again.W)
    old_stream = np.random.default_rng(np.random.SeedSequence([42, 5, 3_000_002]))
    seeded, _ = privatize(_upload(), spec, old_stream)
    assert not np.array_equal(out.W, seeded.W)
    assert priv.ledger.rounds(2) == [5] and priv.ledger.history(2) == [Event("gaussian", 1.5)]
    assert priv.ledger.rounds(0) == []


def test_privatizer_does_not_mutate_the_ledger_it_was_given():
    led = _ledger()
    DPPrivatizer(DPSpec(noise_multiplier=1.0), led, seed=0)(_upload(), 0, 1)
    assert led.history(0) == []


def test_privatizer_stops_a_tenant_whose_budget_runs_out():
    ev = Event("gaussian", 3.0)
    cap = spend([ev.times(2)], 1e-5).epsilon
    priv = DPPrivatizer(DPSpec(noise_multiplier=3.0), _ledger(cap=cap), seed=1)
    sent = [priv(_upload(), 0, k) is not None for k in range(1, 5)]
    assert sent == [True, True, False, False]
    assert priv.ledger.stopped() == {"0": 3} and priv.ledger.rounds(0) == [1, 2]
    assert priv.ledger.spent(0).epsilon <= cap


def test_privatizer_state_is_its_ledger_dict():
    spec = DPSpec(noise_multiplier=1.0)
    a = DPPrivatizer(spec, _ledger(), seed=3)
    a(_upload(), 1, 1)
    b = DPPrivatizer(spec, Ledger.from_dict(json.loads(json.dumps(a.ledger.to_dict()))), 3)
    a(_upload(), 1, 2)
    b(_upload(), 1, 2)  # the noise differs (fresh), the ledger state does not
    assert a.ledger.to_dict() == b.ledger.to_dict()


def test_mechanism_none_passes_uploads_through_uncharged():
    priv = DPPrivatizer(DPSpec(mechanism="none"), _ledger(), seed=0)
    up = _upload()
    assert priv(up, 0, 1) is up and priv.ledger.rounds(0) == []
    assert priv.report()["epsilon_per_tenant"] is None


def test_check_plan_refuses_before_the_run():
    priv = DPPrivatizer(DPSpec(noise_multiplier=1.0), _ledger(cap=5.0), seed=0)
    with pytest.raises(BudgetExceeded, match="tenant 0 would spend epsilon"):
        priv.check_plan(worst_case_plan(range(3), 100))


def test_check_plan_needs_the_upload_size_for_a_value_clip_scale():
    spec = DPSpec(mechanism="laplace", norm="value", clip=0.2, noise_scale=0.04)
    priv = DPPrivatizer(spec, _ledger(), seed=0)
    with pytest.raises(ValueError, match="n_entries is needed to account an absolute noise "
                                         "scale with the value clip"):
        priv.check_plan({0: 1})
    priv.check_plan({0: 1}, n_entries=7)


def test_report_is_json_ready_and_complete():
    cap = spend([Event("gaussian", 2.0, 2)], 1e-5).epsilon
    priv = DPPrivatizer(DPSpec(noise_multiplier=2.0, clip=0.5), _ledger(cap=cap), seed=0)
    for k in (1, 2, 3):
        priv(_upload(), 0, k)
    priv(_upload(), 1, 1)
    rep = json.loads(json.dumps(priv.report(), allow_nan=False))
    assert rep["epsilon_per_tenant"] == {
        "0": pytest.approx(cap), "1": pytest.approx(spend([Event("gaussian", 2.0)], 1e-5).epsilon),
        "2": 0.0}
    assert rep["epsilon_max"] == pytest.approx(cap)
    assert rep["transmissions_per_tenant"] == {"0": 2, "1": 1, "2": 0}
    assert rep["stopped"] == {"0": 3} and rep["delta"] == 1e-5
    assert rep["unit"].startswith("tenant: a tenant's whole rating block")
    assert rep["sensitivity"] == 1.0 and rep["noise_scale"] == 2.0
    assert "privacy.rdp" in rep["accounting"]


def test_report_gives_rfrecs_figure_labelled_per_entry_per_transmission():
    spec = DPSpec(mechanism="laplace", norm="value", clip=0.2, noise_scale=0.04)
    rep = privacy_report(spec, _ledger(), n_entries=7)
    assert rep["rfrec_entry_epsilon_per_transmission"] == pytest.approx(10.0)
    assert rep["noise_multiplier"] == pytest.approx(event_for(spec, 7).noise_multiplier)


@pytest.mark.parametrize("spec", [
    DPSpec(mechanism="gaussian", noise_multiplier=1.0, clip=2.0),
    DPSpec(mechanism="gaussian", noise_scale=0.01, clip=2.0, norm="value"),
    DPSpec(mechanism="laplace", noise_multiplier=0.5, clip=2.0),
    DPSpec(mechanism="laplace", noise_scale=0.1, clip=1.0, norm="l2"),
])
def test_privatised_uploads_lie_within_the_bound_and_scaled_ones_do_not(spec):
    """Norm bounding ("Can You Really Backdoor Federated Learning?"): every privatised
    upload passes :func:`bound_problem` (200 draws, the upload far past the clip), and the
    same upload sent unclipped, or privatised and scaled by 1e6, is refused."""
    big = TinyUpload(W=np.full((2, 2), 5e3), Y=np.full(3, -5e3), tag=7)
    for seed in range(200):
        sent, _ = privatize(big, spec, np.random.default_rng(seed))
        assert bound_problem(sent, spec) is None
    assert "norm" in bound_problem(big, spec)
    scaled = sent.replace(W=sent.W * 1e6, Y=sent.Y * 1e6)
    assert "more than clip" in bound_problem(scaled, spec)


def test_bernoulli_uploads_must_stay_bits():
    spec = DPSpec(mechanism="bernoulli", flip_prob=0.1)
    bits = TinyUpload(W=np.array([[1.0, 0.0], [0.0, 1.0]]), Y=np.array([0.0, 1.0, 1.0]), tag=1)
    assert bound_problem(bits, spec) is None
    assert "other than 0 and 1" in bound_problem(bits.replace(Y=np.array([0.0, 1.0, 2.0])),
                                                  spec)


def test_reserved_spend_counts_as_spent_in_a_copy_only():
    ledger = Ledger.open({"a": Budget(5.0, 1e-5)})
    event = Event("gaussian", 1.0, 1)
    ledger.charge("a", event, 1)
    held = ledger.with_reserved({"a": [event.times(3)]})
    assert held.spent("a").transmissions == 4 and ledger.spent("a").transmissions == 1
    assert held.spent("a").epsilon == pytest.approx(
        spend([event.times(4)], 1e-5).epsilon, rel=1e-12)
