"""Secure aggregation (privacy/secagg.py): masks cancel, dropouts recover, the coordinator's
view of one tenant is hidden, and the messages survive the wire."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from privacy import secagg as S

FP = S.FixedPoint(20)


def _inputs(n: int, length: int = 500, seed: int = 0, scale: float = 50.0):
    rng = np.random.default_rng(seed)
    xs = {i: rng.normal(0.0, scale, length) for i in range(n)}
    return xs, {i: FP.encode(x, n) for i, x in xs.items()}


def test_masks_cancel_exactly_to_the_fixed_point_sum():
    xs, enc = _inputs(7)
    res = S.run_round(enc, b"round-1")
    assert res.survivors == tuple(range(7)) and res.dropped == ()
    exact = np.zeros(500, dtype=np.uint64)
    for v in enc.values():
        exact += v
    assert np.array_equal(res.total, exact)  # bit for bit, mod 2^64
    err = np.abs(FP.decode(res.total) - sum(xs.values()))
    assert err.max() <= FP.error_bound(7)
    # every masked input on its own is far from the tenant's encoding
    for u, m in res.transcript["masked"].items():
        assert np.mean(m.y == enc[u]) < 0.01


def test_fixed_point_range_and_error_bound():
    fp = S.FixedPoint(20)
    assert fp.bound(1000) * 1000 * fp.scale < 2.0 ** 63
    with pytest.raises(S.SecAggError, match="outside the fixed-point range"):
        fp.encode(np.array([fp.bound(10) * 1.01]), 10)
    with pytest.raises(S.SecAggError, match="outside the fixed-point range"):
        fp.encode(np.array([np.nan]), 10)
    x = np.array([-1.25, 3.0, -fp.bound(4)])
    assert np.array_equal(fp.decode(fp.encode(x, 4)), np.rint(x * fp.scale) / fp.scale)


@pytest.mark.parametrize("before_input,before_unmask", [((2,), ()), ((), (4,)),
                                                        ((0, 5), (3,))])
def test_dropouts_within_the_threshold_are_recovered(before_input, before_unmask):
    xs, enc = _inputs(8, seed=1)
    res = S.run_round(enc, b"r", dropout_tolerance=0.4, drop_before_input=before_input,
                      drop_before_unmask=before_unmask)
    assert res.roster.threshold == 5
    assert res.dropped == tuple(sorted(before_input))
    want = [i for i in range(8) if i not in before_input]
    assert res.survivors == tuple(want)
    err = np.abs(FP.decode(res.total) - sum(xs[i] for i in want))
    assert err.max() <= FP.error_bound(8)


def test_too_many_dropouts_is_a_clear_error_before_any_share_is_released():
    _, enc = _inputs(10)
    with pytest.raises(S.TooManyDropouts, match="8 of 10 tenants sent a masked input, "
                       "fewer than the threshold 9"):
        S.run_round(enc, b"r", drop_before_input=(1, 2))
    with pytest.raises(S.TooManyDropouts, match="8 survivors answered the unmasking, fewer "
                       "than the threshold 9"):
        S.run_round(enc, b"r", drop_before_unmask=(1, 2))


def test_threshold_for():
    assert S.threshold_for(100) == 90
    assert S.threshold_for(10, 0.3) == 7
    assert S.threshold_for(3, 0.49) == 2  # strict majority
    with pytest.raises(S.SecAggError, match="dropout_tolerance"):
        S.threshold_for(10, 0.5)


def test_shamir_needs_t_shares_and_fewer_are_consistent_with_any_secret():
    secret = bytes(range(32))
    holders = list(range(9))
    shares = S.shamir_split(secret, holders, 5)
    assert S.shamir_combine({h: shares[h] for h in (8, 1, 4, 6, 0)}) == secret
    few = {h: shares[h] for h in (0, 2, 3, 7)}  # t - 1 = 4 shares
    with pytest.raises(S.SecAggError):
        assert S.shamir_combine(few) != secret
    # information-theoretic secrecy: for ANY other secret, the polynomial of degree t-1
    # through (0, other) and the t-1 shares is a valid sharing of it that gives these very
    # shares; its value at a fifth holder completes t shares that combine to ``other``
    other = b"\x07" * 32
    pts = {0: S._limbs(other), **{h + 1: v for h, v in few.items()}}  # x -> f(x)
    x_new = 8 + 1
    value = np.zeros(S.LIMBS, dtype=np.int64)
    for xi, yi in pts.items():
        num = den = 1
        for xj in pts:
            if xj != xi:
                num, den = num * (x_new - xj) % S.FIELD, den * (xi - xj) % S.FIELD
        lam = num * pow(den, S.FIELD - 2, S.FIELD) % S.FIELD
        value = (value + yi * lam % S.FIELD) % S.FIELD
    assert S.shamir_combine({**few, 8: value}) == other
    assert S.shamir_combine({**few, 8: shares[8]}) == secret


def test_coordinator_keeping_every_message_cannot_unmask_a_surviving_tenant():
    xs, enc = _inputs(6, seed=3)
    res = S.run_round(enc, b"r", dropout_tolerance=0.4, drop_before_input=(5,))
    tr, roster = res.transcript, res.roster
    holders = sorted(r.sender for r in tr["responses"])[: roster.threshold]
    lam = S.lagrange_at_zero(holders)
    answers = {r.sender: r for r in tr["responses"]}
    u = 2
    # everything the coordinator can strip from y_u: its self mask (b_u is reconstructed)
    # and its masks with the dropped tenant 5 (s_5 is reconstructed)
    seed = S.shamir_combine({h: answers[h].self_mask_shares[u] for h in holders}, lam)
    y = tr["masked"][u].y - S.prg(S._self_mask_key(seed, roster.round_id, u), roster.length)
    sk5 = S.X25519PrivateKey.from_private_bytes(
        S.shamir_combine({h: answers[h].mask_key_shares[5] for h in holders}, lam))
    y = y - S.prg(S.mask_key(sk5, roster.key(u).mask_pk, roster.round_id, 5, u),
                  roster.length)
    # what is left is x_u plus the masks with the other survivors: uniform-looking, far
    # from x_u (a uniform 64-bit value decodes within 1e6 of x_u with probability ~1e-7)
    left = FP.decode(y - enc[u])
    assert np.mean(np.abs(left) < 1e6) < 0.01
    # no response ever carries a share of a survivor's mask key
    for r in tr["responses"]:
        assert not set(r.mask_key_shares) & set(res.survivors)
        assert set(r.self_mask_shares) == set(res.survivors)


def test_a_late_input_of_a_tenant_declared_dropped_stays_masked():
    xs, enc = _inputs(6, seed=4)
    states, ads = {}, []
    for i in range(6):
        states[i], a = S.advertise(i, b"late")
        ads.append(a)
    roster = S.make_roster(ads, b"late", 500, 0.4)
    inboxes = S.route_shares(roster, [S.share_keys(states[i], roster) for i in range(6)])
    masked = {i: S.mask_input(states[i], inboxes[i], enc[i]) for i in range(5)}
    request = S.unmask_request(roster, tuple(range(6)), masked)
    assert request.dropped == (5,)
    responses = [S.unmask(states[i], request) for i in request.survivors]
    total = S.aggregate(roster, request, masked, responses)
    assert np.abs(FP.decode(total) - sum(xs[i] for i in range(5))).max() <= 3e-6
    late = S.mask_input(states[5], inboxes[5], enc[5])  # tenant 5's input arrives late
    holders = sorted(r.sender for r in responses)[:roster.threshold]
    lam = S.lagrange_at_zero(holders)
    sk5 = S.X25519PrivateKey.from_private_bytes(S.shamir_combine(
        {r.sender: r.mask_key_shares[5] for r in responses if r.sender in holders}, lam))
    y = late.y.copy()
    for u in request.survivors:  # the coordinator removes every pairwise mask of 5 ...
        p = S.prg(S.mask_key(sk5, roster.key(u).mask_pk, roster.round_id, 5, u), 500)
        y = y - p if S._mask_sign(5, u) > 0 else y + p
    # ... but PRG(b_5) remains: no response holds a share of b_5
    assert all(5 not in r.self_mask_shares for r in responses)
    assert np.mean(np.abs(FP.decode(y - enc[5])) < 1e6) < 0.01
    # and a survivor asked again (e.g. "5 survived after all") refuses
    again = S.UnmaskRequest(b"late", tuple(range(6)), ())
    with pytest.raises(S.SecAggError, match="already answered"):
        S.unmask(states[0], again)


def test_tenant_refuses_inconsistent_unmask_requests():
    _, enc = _inputs(5)
    states, ads = {}, []
    for i in range(5):
        states[i], a = S.advertise(i, b"x")
        ads.append(a)
    roster = S.make_roster(ads, b"x", 500, 0.4)
    inboxes = S.route_shares(roster, [S.share_keys(states[i], roster) for i in range(5)])
    for i in range(5):
        S.mask_input(states[i], inboxes[i], enc[i])
    with pytest.raises(S.SecAggError, match="split the round's participants"):
        S.unmask(states[0], S.UnmaskRequest(b"x", (0, 1, 2), (2, 3, 4)))
    with pytest.raises(S.SecAggError, match="split the round's participants"):
        S.unmask(states[0], S.UnmaskRequest(b"x", (0, 1, 2), (3,)))
    with pytest.raises(S.TooManyDropouts, match="2 survivors, fewer than the threshold 3"):
        S.unmask(states[0], S.UnmaskRequest(b"x", (0, 1), (2, 3, 4)))
    with pytest.raises(S.SecAggError, match="another round"):
        S.unmask(states[0], S.UnmaskRequest(b"y", (0, 1, 2, 3, 4), ()))
    assert not states[0].answered


def test_tampered_or_misrouted_shares_are_refused():
    _, enc = _inputs(4)
    states, ads = {}, []
    for i in range(4):
        states[i], a = S.advertise(i, b"t")
        ads.append(a)
    roster = S.make_roster(ads, b"t", 500, 0.25)
    msgs = [S.share_keys(states[i], roster) for i in range(4)]
    inboxes = S.route_shares(roster, msgs)
    box = inboxes[0]
    e = box.shares[0]
    bad = S.EncryptedShare(e.sender, 0, e.ciphertext[:-1] + bytes([e.ciphertext[-1] ^ 1]))
    tampered = S.ShareInbox(0, box.participants, (bad, *box.shares[1:]))
    S.mask_input(states[0], tampered, enc[0])
    req = S.UnmaskRequest(b"t", (0, 1, 2, 3), ())
    with pytest.raises(S.SecAggError, match="fails authentication"):
        S.unmask(states[0], req)
    with pytest.raises(S.SecAggError, match="exactly one share from every other"):
        S.mask_input(states[1], S.ShareInbox(1, box.participants, inboxes[1].shares[1:]),
                     enc[1])
    with pytest.raises(S.SecAggError, match="uint64 of length 500"):
        S.mask_input(states[2], inboxes[2], enc[2][:10])


def test_messages_round_trip_through_json():
    _, enc = _inputs(4)
    res = S.run_round(enc, b"w", dropout_tolerance=0.25, drop_before_input=(1,))
    tr = res.transcript
    for msg in [tr["adverts"][0], tr["roster"], tr["share_keys"][2], tr["inboxes"][0],
                tr["masked"][0], tr["request"], tr["responses"][0]]:
        back = S.from_wire(json.loads(json.dumps(S.to_wire(msg))))
        assert type(back) is type(msg)
        assert S.message_bytes(back) == S.message_bytes(msg)
        assert json.dumps(S.to_wire(back)) == json.dumps(S.to_wire(msg))
    with pytest.raises(S.SecAggError, match="malformed"):
        S.from_wire({"type": "MaskedInput", "sender": 1})


def test_discrete_gaussian_variance_and_ddg_tau():
    rng = np.random.default_rng(0)
    for sigma in (0.8, 3.0, 1e6):
        z = S.discrete_gaussian((200_000,), sigma, rng)
        assert z.dtype == np.int64
        # exact variance of N_Z(0, s^2): sum k^2 e^{-k^2/2s^2} / sum e^{-k^2/2s^2}
        k = np.arange(-int(20 * sigma) - 5, int(20 * sigma) + 6) if sigma < 100 else None
        if k is not None:
            w = np.exp(-k ** 2 / (2 * sigma ** 2))
            var = float((k ** 2 * w).sum() / w.sum())
        else:
            var = sigma ** 2
        assert z.var() == pytest.approx(var, rel=0.02)
        assert abs(z.mean()) < 5 * math.sqrt(var / z.size)
    assert S.ddg_tau(1e3, 1000) == 0.0
    assert S.ddg_tau(0.5, 2) == pytest.approx(10 * math.exp(-math.pi ** 2 / 4 * 1))


def test_a_tenant_restarted_mid_round_from_its_saved_state_still_cancels():
    xs, enc = _inputs(4, seed=7)
    states, ads = {}, []
    for i in range(4):
        states[i], a = S.advertise(i, b"resume")
        ads.append(a)
    roster = S.make_roster(ads, b"resume", 500, 0.25)
    inboxes = S.route_shares(roster, [S.share_keys(states[i], roster) for i in range(4)])
    saved = json.dumps(S.state_to_dict(states[2]))  # written to the tenant's disk
    states[2] = S.state_from_dict(json.loads(saved))  # ... crash, restart
    masked = {i: S.mask_input(states[i], inboxes[i], enc[i]) for i in range(4)}
    states[1] = S.state_from_dict(json.loads(json.dumps(S.state_to_dict(states[1]))))
    request = S.unmask_request(roster, tuple(range(4)), masked)
    responses = [S.unmask(states[i], request) for i in range(4)]
    total = S.aggregate(roster, request, masked, responses)
    assert np.abs(FP.decode(total) - sum(xs.values())).max() <= FP.error_bound(4)
    again = S.state_from_dict(json.loads(json.dumps(S.state_to_dict(states[1]))))
    with pytest.raises(S.SecAggError, match="already answered"):
        S.unmask(again, request)  # the answered flag survives a restart too
    with pytest.raises(S.SecAggError, match="malformed secure-aggregation state"):
        S.state_from_dict({"tenant": 1})
