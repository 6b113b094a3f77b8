"""Distributed DP over secure aggregation (privacy/distributed.py): quantisation paid in
the sensitivity, the sum's noise, the same accounting as central placement (checked with
dp-accounting), and simulate giving central's numbers up to the noise placement."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest
from pydantic import ValidationError

from algorithms import dpals as D
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from app.cli import main
from privacy import secagg as S
from privacy.accountant import spend
from privacy.distributed import (
    SecureAggregationPrivatizer,
    SecureSum,
    integer_sensitivity,
    integer_stds,
    pack,
    unpack,
)
from privacy.user_level import (
    AGGREGATE,
    UserLevelPrivatizer,
    UserLevelSpec,
    gram_sensitivity,
    release_report,
    rhs_sensitivity,
    sum_uploads,
)

CFG = D.DPALSConfig(rank=2, max_ratings_per_user=5)
BOUNDS = D.user_bounds(CFG)


def _upload(rng, n_items=40, d=3):
    x = rng.normal(size=(n_items, 6, d))
    return D.Upload(A=np.einsum("nki,nkj->nij", x, x), b=rng.normal(size=(n_items, d)),
                    m=np.array([rng.uniform(-6, 6), 6.0]))  # the centre sums of 6 users


def _spec(**kw):
    base = dict(epsilon=4.0, delta=1e-5, n_users=1000, releases=2, placement="tenant",
                secure_aggregation=True)
    return UserLevelSpec(**{**base, **kw})


def test_pack_keeps_upper_triangles_and_unpack_mirrors_them():
    up = _upload(np.random.default_rng(0))
    v = pack(up, BOUNDS)
    assert v.size == 40 * 6 + 40 * 3 + 2
    back = unpack(v, up, BOUNDS)
    assert np.array_equal(back.A, up.A) and np.array_equal(back.b, up.b)
    assert np.array_equal(back.m, up.m)
    assert np.array_equal(unpack(pack(up), up).A, up.A)  # without bounds: in full
    with pytest.raises(ValueError, match="does not fit"):
        unpack(v[:-1], up, BOUNDS)


@pytest.mark.parametrize("seed", range(5))
def test_quantised_change_of_one_user_is_within_the_integer_sensitivity(seed):
    """One user's term (k items, norms at the bounds) added to a tenant sum; with 2
    fractional bits the rounding is as large as it gets relative to the signal."""
    rng = np.random.default_rng(seed)
    fp = S.FixedPoint(2)
    up = _upload(rng)
    k = BOUNDS.max_ratings
    items = rng.choice(40, size=k, replace=False)
    x = rng.normal(size=3)
    x *= BOUNDS.x_norm / np.linalg.norm(x)
    s = rng.choice([-1.0, 1.0], size=k) * BOUNDS.rating_bound
    a, b = up.A.copy(), up.b.copy()
    a[items] += np.outer(x, x)
    b[items] += s[:, None] * x
    with_user = up.replace(A=a, b=b, m=up.m + [rng.choice([-1.0, 1.0]), 1.0])
    sens = integer_sensitivity(BOUNDS, up, fp)
    iu = np.triu_indices(3)
    for name, diff in (("A", (fp.quantise(with_user.A, 1) - fp.quantise(up.A, 1))
                        [:, iu[0], iu[1]]),
                       ("b", fp.quantise(with_user.b, 1) - fp.quantise(up.b, 1)),
                       ("m", fp.quantise(with_user.m, 1) - fp.quantise(up.m, 1))):
        assert np.linalg.norm(diff) <= sens[name]
    assert sens["A"] == pytest.approx(4 * gram_sensitivity(BOUNDS) + math.sqrt(k * 6))
    assert sens["b"] == pytest.approx(4 * rhs_sensitivity(BOUNDS) + math.sqrt(k * 3))
    assert sens["m"] == pytest.approx(4 * math.sqrt(2) + math.sqrt(2))


@pytest.mark.parametrize("n,drop", [(12, ()), (12, (3,))])
def test_decoded_sum_carries_the_planned_noise_variance(n, drop):
    """Zero uploads from n tenants: the decoded sum is pure noise whose variance is
    sigma_int^2 T' / 2^2f, i.e. the central sigma^2 (times T'/t >= 1, and the tiny rounding
    inflation); the upload's noise fields say so."""
    spec = _spec(n_users=10_000, dropout_tolerance=0.2)
    priv = SecureAggregationPrivatizer(spec, BOUNDS, n, seed=0, drop=drop)
    zero = D.Upload(A=np.zeros((400, 3, 3)), b=np.zeros((400, 3)), m=np.zeros(2))
    for c in range(n):
        assert priv(zero, c, 1) is zero
    out = priv.aggregate({c: zero for c in range(n)}, 1)[AGGREGATE]
    t = S.threshold_for(n, 0.2)
    survivors = n - len(drop)
    central = priv.stds(0)  # central placement's sigma of release 0 (real units)
    fp = S.FixedPoint()
    sens = integer_sensitivity(BOUNDS, zero, fp)
    for name, field, real in (("A", "gram_noise", gram_sensitivity(BOUNDS)),
                              ("b", "rhs_noise", rhs_sensitivity(BOUNDS)),
                              ("m", "centre_noise", math.sqrt(2))):
        want = central[name] * (sens[name] / fp.scale / real) * math.sqrt(survivors / t)
        assert getattr(out, field) == pytest.approx(want, rel=1e-12)
        assert getattr(out, field) >= central[name]
    iu = np.triu_indices(3)
    # the noise is fresh on every run: five standard errors of a sample variance of
    # 2,400 and 1,200 draws (sqrt(2 / n) each), so a correct run fails about once in 10^6
    assert np.var(out.A[:, iu[0], iu[1]]) == pytest.approx(out.gram_noise ** 2, rel=0.15)
    assert np.var(out.b) == pytest.approx(out.rhs_noise ** 2, rel=0.21)
    assert np.array_equal(out.A, np.swapaxes(out.A, 1, 2))
    rel = priv.releases[-1]
    assert rel["threshold"] == t and rel["dropped"] == list(drop)
    assert rel["tenants"] == survivors and rel["ddg_tau"] == 0.0
    assert rel["noise_multiplier_present"] == pytest.approx(
        priv.event(0).noise_multiplier * math.sqrt(survivors / t))


def _fed(clients=5, seed=0):
    r = generate_ratings(150, 60, 3000, rank=3, seed=seed)
    return build_federation(r, clients, 0, 0.2)


def test_accounting_of_secure_aggregation_equals_central_and_meets_dp_accounting():
    fed = _fed()
    spec_c = UserLevelSpec(epsilon=3.0, delta=1e-5, n_users=150, releases=CFG.sweeps)
    spec_s = spec_c.model_copy(update={"placement": "tenant", "secure_aggregation": True})
    runs = {}
    for name, cls, spec in (("central", UserLevelPrivatizer, spec_c),
                            ("secagg", SecureAggregationPrivatizer, spec_s)):
        priv = cls(spec, BOUNDS, fed.n_clients, 0)
        simulate(D.ALGORITHM, CFG, fed, rounds=CFG.sweeps + 1, per_round=fed.n_clients,
                 seed=0, privatizer=priv, aggregator=priv.aggregate)
        runs[name] = priv
    c, s = runs["central"].ledger, runs["secagg"].ledger
    for t in range(fed.n_clients):
        assert s.history(t) == c.history(t)
        assert spend(s.history(t), 1e-5).epsilon == spend(c.history(t), 1e-5).epsilon
    eps = spend(s.history(0), 1e-5).epsilon
    assert 2.99 < eps <= 3.0
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    for ev in s.history(0):
        for _ in range(ev.count):
            pld.compose(dpa.GaussianDpEvent(ev.noise_multiplier))
    assert pld.get_epsilon(1e-5) <= eps
    rdp = dpa.rdp.RdpAccountant()
    for ev in s.history(0):
        rdp.compose(dpa.GaussianDpEvent(ev.noise_multiplier), ev.count)
    assert rdp.get_epsilon(1e-5) == pytest.approx(eps, rel=0.02)
    rep = runs["secagg"].report()
    assert rep["secure_aggregation"] is True and rep["placement"] == "tenant"
    assert "learns only the noisy sum" in rep["adversary"]
    assert "c < t tenants" in rep["adversary"]
    assert all(r["threshold"] == 5 and r["dropped"] == [] for r in rep["releases"])
    assert release_report(spec_s, s, [])["secure_aggregation"] is True


def test_without_noise_secure_sum_matches_plain_aggregation_to_the_quantisation_bound():
    fed = _fed()
    ups = {}

    class Keep:
        def __call__(self, uploads, round_):
            ups[round_] = dict(uploads)
            return uploads
    plain = simulate(D.ALGORITHM, CFG, fed, rounds=3, per_round=fed.n_clients, seed=0,
                     aggregator=Keep())
    sec = SecureSum(0)
    secure = simulate(D.ALGORITHM, CFG, fed, rounds=3, per_round=fed.n_clients, seed=0,
                      aggregator=sec)
    assert [r["tenants"] for r in sec.rounds] == [5, 5, 5]
    # the first round's sum (same V^0 in both runs) is within the fixed-point bound
    got = sec(ups[1], 1)[AGGREGATE]
    want = sum_uploads([ups[1][i] for i in sorted(ups[1])], BOUNDS)
    bound = S.FixedPoint().error_bound(5)
    assert np.abs(got.A - want.A).max() <= bound and np.abs(got.b - want.b).max() <= bound
    assert np.abs(got.A - want.A).max() > 0  # really quantised, not a pass-through
    assert np.allclose(secure.global_msg.V, plain.global_msg.V, rtol=0, atol=1e-5)
    assert abs(secure.final.test_rmse - plain.final.test_rmse) < 1e-6


def test_secure_aggregation_gives_central_accuracy_tenant_placement_does_not():
    fed = _fed(clients=10, seed=1)
    cfg = D.DPALSConfig(rank=2, sweeps=2)
    bounds = D.user_bounds(cfg)
    rmse = {}
    for name in ("central", "tenant", "secagg"):
        spec = UserLevelSpec(epsilon=2.0, delta=1e-5, n_users=150, releases=cfg.sweeps,
                             placement="central" if name == "central" else "tenant",
                             secure_aggregation=name == "secagg")
        cls = SecureAggregationPrivatizer if name == "secagg" else UserLevelPrivatizer
        vals = []
        for seed in range(8):  # fresh noise every run (issue 29): average it out
            priv = cls(spec, bounds, fed.n_clients, seed)
            res = simulate(D.ALGORITHM, cfg, fed, rounds=cfg.sweeps + 1,
                           per_round=fed.n_clients, seed=seed, privatizer=priv,
                           aggregator=priv.aggregate)
            vals.append(res.final.test_rmse)
        rmse[name] = float(np.mean(vals))
    assert abs(rmse["secagg"] - rmse["central"]) < abs(rmse["tenant"] - rmse["central"])


def test_spec_and_cli_refuse_secure_aggregation_where_it_does_not_apply(tmp_path, capsys):
    with pytest.raises(ValidationError, match="secure_aggregation needs placement 'tenant'"):
        UserLevelSpec(epsilon=1, delta=1e-5, n_users=10, releases=1, secure_aggregation=True)
    with pytest.raises(ValidationError, match="sample_rate 1 only"):
        _spec(sample_rate=0.5)
    with pytest.raises(ValidationError, match="dropout_tolerance"):
        _spec(dropout_tolerance=0.5)
    with pytest.raises(ValueError, match="needs secure_aggregation=True"):
        SecureAggregationPrivatizer(_spec(secure_aggregation=False), BOUNDS, 3, 0)
    from algorithms import registry

    grad = registry.user_bounds("dp-fedmc-admm", registry.get("dp-fedmc-admm").config())
    with pytest.raises(ValueError, match="releases clipped gradient sums"):
        SecureAggregationPrivatizer(_spec(), grad, 3, 0)
    with pytest.raises(ValueError, match="below 9"):
        integer_stds(_spec(), BOUNDS, _upload(np.random.default_rng(0)), 0, 10,
                     S.FixedPoint(0))
    r = generate_ratings(120, 60, 2400, rank=3, seed=4)
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "\n".join(
        f"{u},{i},{v:g}" for u, i, v in zip(r.users, r.items, r.values, strict=True)))
    for argv, msg in (
            (["--privacy", "user", "--secure-aggregation"], "needs --placement tenant"),
            (["--privacy", "tenant", "--secure-aggregation"], "applies to --privacy user"),
            (["--privacy", "none", "--dropout-tolerance", "0.2"],
             "--dropout-tolerance applies to --secure-aggregation only")):
        assert main(["simulate", "--data", str(path), "--algorithm", "dpals", "--clients",
                     "4", "--quiet", *argv]) != 0
        assert msg in capsys.readouterr().err
    out = tmp_path / "s.json"
    assert main(["simulate", "--data", str(path), "--algorithm", "dpals", "--clients", "4",
                 "--rank", "3", "--privacy", "user", "--placement", "tenant",
                 "--secure-aggregation", "--dropout-tolerance", "0.25", "--epsilon", "4",
                 "--delta", "1e-4", "--json", str(out), "--quiet"]) == 0
    priv = json.loads(out.read_text())["privacy"]
    assert priv["secure_aggregation"] is True and priv["dropout_tolerance"] == 0.25
    assert 3.99 < priv["epsilon_max"] <= 4.0
    assert all(r["threshold"] == 3 and r["tenants"] == 4 for r in priv["releases"])
    assert "placement tenant with secure aggregation" in capsys.readouterr().out
