"""DP-FedMAvg and DP-FedMC-ADMM: per-user clipped sums against an independent computation,
Poisson sampling, the server's view, the ADMM update against the paper's per-tenant
equations, and convergence with and without noise."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from algorithms import RatingBlock, registry
from algorithms import _user_grad as UG
from algorithms import dp_fedmavg as FA
from algorithms import dp_fedmc_admm as FC
from algorithms.data import build_federation
from algorithms.simulate import client_round, initialise, simulate
from algorithms.synthetic import generate_ratings
from privacy.user_level import UserLevelPrivatizer, plan

NAMES = ["dp-fedmavg", "dp-fedmc-admm"]


def _block(rng, m=15, n=11, density=0.6):
    mask = rng.random((m, n)) < density
    mask[:, 0] = True
    rows, cols = np.nonzero(mask)
    return RatingBlock(rows, cols, rng.integers(1, 6, size=rows.size).astype(float), m, n)


def _reference_sums(u, v, block, cfg, users):
    """Independent computation with Python loops: each user's term built entry by entry,
    its joint norm over G and H taken, clipped, added to the item sums."""
    r, d = cfg.rank, cfg.d
    g_sum, h_sum = np.zeros((d, block.n_items)), np.zeros(block.n_items)
    for user in users:
        idx = np.flatnonzero(block.rows == user)
        f = u[user, :r]
        f = f * min(1.0, cfg.user_factor_clip / max(np.linalg.norm(f), 1e-300))
        x = np.append(f, cfg.bias_coordinate)
        g_u, h_u = np.zeros((d, block.n_items)), np.zeros(block.n_items)
        for t in idx:
            j = block.cols[t]
            pred = u[user, :r] @ v[:r, j] + cfg.bias_coordinate * v[r, j] + u[user, r] + cfg.mu
            e = float(np.clip(pred - block.vals[t], -cfg.residual_clip, cfg.residual_clip))
            g_u[:, j] += e * x
            h_u[j] += cfg.curvature_weight * (x @ x)
        norm = math.sqrt(np.sum(g_u ** 2) + np.sum(h_u ** 2))
        factor = min(1.0, cfg.clip_norm / norm) if norm > 0 else 1.0
        g_sum += factor * g_u
        h_sum += factor * h_u
    return g_sum, h_sum


@pytest.mark.parametrize("clip", [0.3, 50.0])  # binding for every user / never binding
def test_clipped_sums_match_an_independent_per_user_computation(clip):
    rng = np.random.default_rng(0)
    cfg = FA.DPFedMAvgConfig(rank=3, clip_norm=clip, max_ratings_per_user=100,
                             user_factor_clip=0.8)
    block = _block(rng)
    v = rng.normal(0, 1.0, size=(cfg.d, block.n_items))
    u = UG.solve_users(v, block, cfg)
    g, h = UG.clipped_sums(u, v, np.arange(block.nnz), block, cfg)
    g_ref, h_ref = _reference_sums(u, v, block, cfg, range(block.n_users))
    np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("settings", [
    {"residual_clip": 2.0},                      # the defaults: clips rarely bind
    {"residual_clip": 0.05, "clip_norm": 0.3},   # every residual and every user clipped
    {"residual_clip": 5.0, "user_factor_clip": 20.0, "bias_coordinate": 0.1,
     "curvature_weight": 3.0},                   # ||x|| far above c
])
def test_honest_sums_keep_their_declared_item_ratio_and_a_scaled_gradient_does_not(settings):
    """What the coordinator checks an agent's upload against (``item_ratio``,
    :func:`privacy.user_level.bound_problem`): ||G_j|| <= R H_j / (kappa c) for every
    item of honest sums, whatever the factors; G scaled up past it is named."""
    from privacy.user_level import bound_problem

    rng = np.random.default_rng(3)
    cfg = FA.DPFedMAvgConfig(rank=3, max_ratings_per_user=100, **settings)
    bounds = UG.user_bounds(cfg)
    num, den, ratio = bounds.item_ratio
    assert (num, den) == ("G", "H")
    block = _block(rng, m=40, n=9)
    v = rng.normal(0, 3.0, size=(cfg.d, block.n_items))
    u = UG.solve_users(v, block, cfg) * rng.uniform(0.1, 10.0, size=(block.n_users, 1))
    g, h = UG.clipped_sums(u, v, np.arange(block.nnz), block, cfg)
    assert np.all(np.linalg.norm(g, axis=0) <= ratio * h * (1 + 1e-12))
    stds = {"G": 0.0, "H": 0.0}
    assert bound_problem(UG.Upload(G=g, H=h), bounds, stds) is None
    worst = int(np.argmax(np.linalg.norm(g, axis=0) / h))
    tight = np.linalg.norm(g[:, worst]) / (ratio * h[worst])
    bad = UG.Upload(G=g * (1.01 / tight), H=h)
    assert f"G[:, {worst}] has norm" in bound_problem(bad, bounds, stds)
    assert "G[:, " in bound_problem(UG.Upload(G=g * np.nan, H=h), bounds, stds)


def test_without_a_residual_clip_no_item_ratio_is_declared():
    """The gradient is then not bounded by the curvature: nothing to check it against."""
    assert UG.user_bounds(FA.DPFedMAvgConfig(residual_clip=None)).item_ratio is None


def _without_user(block, user):
    """The neighbouring block: ``user`` removed (rows renumbered)."""
    keep = block.rows != user
    rows = block.rows[keep]
    rows = rows - (rows > user)
    return RatingBlock(rows, block.cols[keep], block.vals[keep], block.n_users - 1,
                       block.n_items)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("clip", [0.5, 4.0])
def test_removing_one_user_moves_the_upload_by_at_most_c(name, clip):
    """Neighbouring data sets (a user's ratings removed from the tenant), the same public
    V: the L2 change of (G, H) together is at most C; with C = 0.5 every user is clipped,
    so some removal moves the upload by C exactly (the bound is tight)."""
    alg = registry.get(name)
    rng = np.random.default_rng(1)
    cfg = alg.config(rank=3, clip_norm=clip, max_ratings_per_user=100)
    block = _block(rng, m=12)
    v = rng.normal(0, 0.5, size=(cfg.d, block.n_items))
    glob = UG.GlobalModel(V=v, round=0, n_clients=1)

    def upload(b):
        st = alg.init_client(b, glob, cfg, np.random.default_rng(0))
        return alg.client_step(glob, st, b, cfg, np.random.default_rng(0))[1]

    full = upload(block)
    changes = []
    for user in range(block.n_users):
        other = upload(_without_user(block, user))
        changes.append(math.sqrt(np.sum((full.G - other.G) ** 2)
                                 + np.sum((full.H - other.H) ** 2)))
    assert max(changes) <= clip * (1 + 1e-12)
    assert alg is not None and registry.user_bounds(name, cfg).clip_norm == clip
    if clip == 0.5:
        assert max(changes) == pytest.approx(clip, rel=1e-9)


def test_poisson_sampling_rate_is_q_seeded_without_privacy_keyed_with_it():
    from privacy.randomness import UserPRF, new_key

    block = RatingBlock(np.arange(1000), np.zeros(1000), np.ones(1000), 1000, 1)
    a = UG.sample_users(block, 0.3, 1, np.random.default_rng(4))
    b = UG.sample_users(block, 0.3, 1, np.random.default_rng(4))
    np.testing.assert_array_equal(a, b)  # no draws attached: the seeded stream
    draws = np.concatenate([UG.sample_users(block, 0.3, 1, np.random.default_rng(s))
                            for s in range(200)])
    # 200,000 Bernoulli(0.3) draws: standard error 0.001
    assert abs(draws.mean() - 0.3) < 0.005
    assert UG.sample_users(block, 1.0, 1, np.random.default_rng(0)).all()
    keyed = block.with_user_draws(UserPRF(new_key(), 0, np.arange(1000)))
    bits = np.concatenate([UG.sample_users(keyed, 0.3, k, np.random.default_rng(4))
                           for k in range(200)])
    assert abs(bits.mean() - 0.3) < 0.005  # the keyed draws have rate q too
    assert not np.array_equal(bits[:1000], a)  # and are not the seeded ones


def test_the_upload_sums_exactly_the_users_drawn_from_the_tenants_client_stream():
    from algorithms.rng import client_rng

    rng = np.random.default_rng(2)
    cfg = FC.DPFedMCADMMConfig(rank=2, user_sample_rate=0.4, clip_norm=1.0)
    block = _block(rng, m=40)
    _, glob = FC.init_server(block.n_items, 1, cfg, np.random.default_rng(0))
    st = FC.ALGORITHM.init_client(block, glob, cfg, np.random.default_rng(0))
    _, up = client_round(FC.ALGORITHM, cfg, 3, 9, 0, glob, st, block)
    drawn = UG.sample_users(block, 0.4, glob.round, client_rng(9, 3, 0))
    assert 0 < drawn.sum() < block.n_users
    u = UG.solve_users(glob.V, block, cfg)
    g_ref, h_ref = _reference_sums(u, glob.V, block, cfg, np.flatnonzero(drawn))
    np.testing.assert_allclose(up.G, g_ref, atol=1e-12)
    np.testing.assert_allclose(up.H, h_ref, atol=1e-12)
    _, again = client_round(FC.ALGORITHM, cfg, 3, 9, 0, glob, st, block)
    np.testing.assert_array_equal(again.G, up.G)  # same seed, round and client: same draw
    _, other = client_round(FC.ALGORITHM, cfg, 4, 9, 0, glob, st, block)
    assert not np.array_equal(other.G, up.G)
    # with the tenant's secret per-user draws: exactly the users they draw, whatever the seed
    from privacy.randomness import UserPRF, new_key

    keyed = block.with_user_draws(UserPRF(new_key(), 0, np.arange(block.n_users)))
    _, up = client_round(FC.ALGORITHM, cfg, 3, 9, 0, glob, st, keyed)
    drawn = keyed.user_draws.user_uniforms("sample", glob.round, block.n_users) < 0.4
    g_ref, _ = _reference_sums(u, glob.V, block, cfg, np.flatnonzero(drawn))
    np.testing.assert_allclose(up.G, g_ref, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_the_server_receives_no_per_user_quantity(name):
    """What leaves a tenant is indexed by items only, whatever its number of users; its
    scalars are the noise levels (0 before the privacy layer), not counts; and under
    central placement the server step receives only the one noisy sum."""
    alg = registry.get(name)
    rng = np.random.default_rng(3)
    cfg = alg.config(rank=2)
    shapes = []
    for users in (11, 23):  # neither equals rank + 1 or the 13 items
        rows = np.repeat(np.arange(users), 4)
        cols = rng.integers(0, 13, rows.size)
        keep = np.unique(rows * 13 + cols, return_index=True)[1]
        block = RatingBlock(rows[keep], cols[keep], rng.integers(1, 6, keep.size) * 1.0,
                            users, 13)
        _, glob, locs = initialise(alg, cfg, [block], 0)
        _, up = client_round(alg, cfg, 1, 0, 0, glob, locs[0], block)
        arrays = up.arrays()
        assert set(arrays) == {"G", "H", "m"}
        assert all(users not in a.shape for a in arrays.values())
        assert arrays["G"].shape == (cfg.d, 13) and arrays["H"].shape == (13,)
        assert arrays["m"].shape == (2,)  # the centre sums: one total over the users
        scalars = {f.name: getattr(up, f.name) for f in dataclasses.fields(up)
                   if f.name not in arrays}
        assert scalars == {"grad_noise": 0.0, "curv_noise": 0.0, "centre_noise": 0.0}
        shapes.append({k: a.shape for k, a in arrays.items()})
        bounds = registry.user_bounds(name, cfg)
        spec = plan({"epsilon": 8.0, "delta": 1e-3}, bounds, 500, cfg.releases)
        priv = UserLevelPrivatizer(spec, bounds, 1, 0)
        received = priv.aggregate({0: priv(up, 0, 1)}, 1)
        assert list(received) == [-1]  # the aggregate, not tenant 0's upload
        assert received[-1].grad_noise > 0 and received[-1].curv_noise > 0
        assert received[-1].centre_noise > 0
    assert shapes[0] == shapes[1]


def test_admm_on_sums_equals_the_papers_per_tenant_equations():
    """With every tenant's gradient at V^k and one curvature shared by all, eqs. (67),
    (13), (68) run per tenant give the same V as the server's update on the sums."""
    rng = np.random.default_rng(5)
    cfg = FC.DPFedMCADMMConfig(rank=2, beta=0.05, gamma=0.3)
    p, d, n = 4, cfg.d, 6
    v = rng.normal(size=(d, n))
    ws = [v + rng.normal(scale=0.1, size=(d, n)) for _ in range(p)]
    ys = [rng.normal(scale=0.1, size=(d, n)) for _ in range(p)]
    grads = [rng.normal(size=(d, n)) for _ in range(p)]
    big_l = rng.uniform(1, 5, size=n)  # L_j of every tenant
    new_w, new_y = [], []
    for w, y, g in zip(ws, ys, grads, strict=True):
        a = big_l / p
        w2 = (a * w + cfg.beta * v - g / p - y) / (a + cfg.beta)  # eq. (67)
        new_w.append(w2)
        new_y.append(y + cfg.beta * (w2 - v))  # eq. (13)
    v_paper = sum(cfg.beta * w + y for w, y in zip(new_w, new_y, strict=True)) / (
        p * cfg.beta + cfg.gamma)  # eq. (68)
    v2, w2, y2 = FC.admm_update(v, sum(ws) / p, sum(ys) / p, sum(grads), big_l * p, p, cfg)
    np.testing.assert_allclose(v2, v_paper, rtol=1e-12)
    np.testing.assert_allclose(w2, sum(new_w) / p, rtol=1e-12)
    np.testing.assert_allclose(y2, sum(new_y) / p, rtol=1e-12)


def test_fedmavg_server_step_is_a_preconditioned_momentum_step():
    cfg = FA.DPFedMAvgConfig(rank=1, lr=0.7, momentum=0.5, gamma=2.0, d_factor=1.5,
                             user_sample_rate=0.5, curvature_weight=0.25, noise_reg=0.0)
    rng = np.random.default_rng(6)
    v, m = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    state = FA.ServerState(V=v, M=m, round=2, n_clients=2)
    ups = {i: UG.Upload(G=rng.normal(size=(2, 3)), H=rng.uniform(1, 2, 3)) for i in (0, 1)}
    g = (ups[0].G + ups[1].G) / 0.5
    curv = (ups[0].H + ups[1].H) / (0.25 * 0.5)
    step = (g + 2.0 * v) / (1.5 * curv + 2.0)
    new, glob = FA.server_step(state, ups, cfg, rng)
    np.testing.assert_allclose(new.M, 0.5 * m + step)
    np.testing.assert_allclose(glob.V, v - 0.7 * (0.5 * m + step))
    assert glob.round == 3 and new.round == 3


def _federation():
    r = generate_ratings(2000, 150, 40000, rank=3, noise=0.3, seed=3, scale="stars")
    return build_federation(r, 10, seed=0)


def _mean_rmse(fed):
    mu = np.concatenate([b.vals for b in fed.train]).mean()
    test = np.concatenate([b.vals for b in fed.test])
    return float(np.sqrt(np.mean((test - mu) ** 2)))


@pytest.mark.parametrize("name", NAMES)
def test_noise_free_beats_the_global_mean_and_epsilon_8_stays_reasonable(name):
    alg = registry.get(name)
    fed = _federation()
    cfg = alg.config()
    rounds = cfg.releases + 1
    free = simulate(alg, cfg, fed, rounds=rounds, per_round=fed.n_clients, seed=0,
                    evaluate_every=rounds).final.test_rmse
    bounds = registry.user_bounds(name, cfg)
    spec = plan({"epsilon": 8.0, "delta": 1e-6}, bounds, sum(b.n_users for b in fed.train),
                cfg.releases)
    priv = UserLevelPrivatizer(spec, bounds, fed.n_clients, 0)
    noisy = simulate(alg, cfg, fed, rounds=rounds, per_round=fed.n_clients, seed=0,
                     privatizer=priv, aggregator=priv.aggregate, evaluate_every=rounds)
    base = _mean_rmse(fed)
    assert free < 0.7 * base, (free, base)
    assert np.isfinite(noisy.final.test_rmse) and noisy.final.test_rmse < 0.85 * base, (
        noisy.final.test_rmse, base)
    assert priv.report()["epsilon_max"] == pytest.approx(8.0, rel=1e-5)
