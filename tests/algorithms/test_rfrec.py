"""RFRec / RFRecF (algorithms/rfrec.py) against dense evaluations of the RFRec paper.

The reference computations here keep every V_(i) as a dense d x n matrix and apply
Algorithm 1 line 7 and Algorithm 2 lines 10 and 12 literally, so they also check the lazy
representation (never-rated columns carried as the common H of the global message).
"""

from __future__ import annotations

import numpy as np
import pytest

from algorithms import RatingBlock, messages_equal
from algorithms.data import Federation, build_federation, data_dir, load_movielens
from algorithms.rfrec import (
    ALGORITHMS,
    RFRecConfig,
    RFRecFConfig,
    RFRecGlobal,
    RFRecLocal,
    dense_v,
    move_rate,
    paper_dp,
    penalty,
    predict_ratings,
    relax,
    run_batched,
    step_size,
)
from algorithms.rng import SAMPLING, SERVER, derive_rng
from algorithms.simulate import initialise, run_round, simulate

RFREC, RFRECF = ALGORITHMS["rfrec"], ALGORITHMS["rfrecf"]

#: the fixed 1-5 range these hand-checked tests were written for (the paper preset
#: otherwise scales by each tenant's own range)
R15 = (1.0, 5.0)


def _test_noise_rng(seed: int, round_: int, client: int) -> np.random.Generator:
    """Seeded stand-in noise injected by these tests (the stream the removed
    ``client_noise_rng`` used, so recorded references hold); production noise is never
    seeded (:mod:`privacy.randomness`)."""
    return derive_rng(seed, round_, 3_000_000 + client)


def _paper(cls, **kw):
    """The paper preset on the fixed 1-5 range."""
    return cls.paper_settings(rating_range=R15, **kw)


def _block(m: int, n: int, density: float, seed: int, n_vals: float = 5.0) -> RatingBlock:
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    mask[np.arange(m), rng.integers(0, n, m)] = True  # every user rates something
    rows, cols = np.nonzero(mask)
    return RatingBlock(rows, cols, rng.integers(1, int(n_vals) + 1, rows.shape[0]), m, n)


def _dense(block: RatingBlock) -> tuple[np.ndarray, np.ndarray]:
    r = np.zeros(block.shape)
    mask = np.zeros(block.shape)
    r[block.rows, block.cols] = block.vals
    mask[block.rows, block.cols] = 1.0
    return r, mask


def _dense_grad_f(u, v, r, mask, cfg):
    """grad of ||mask * (R - U V)||^2 + lam_u ||U||^2 (eq. 12), written out densely."""
    lo, hi = cfg.rating_range or (0.0, 1.0)
    e = mask * (u @ v - mask * (r - lo) / (hi - lo))
    return 2 * e @ v.T + 2 * cfg.lam_u * u, 2 * u.T @ e


def _state(rng, block, d, n):
    g = RFRecGlobal(rng.normal(size=(d, n)), rng.normal(size=(d, n)), 3, 0, 0, 1.0, 4.0)
    local = RFRecLocal(rng.normal(size=(block.n_users, d)),
                       rng.normal(size=(d, block.rated_items.shape[0])))
    return g, local


def test_rfrec_client_step_matches_dense_algorithm_1():
    block, d = _block(3, 6, 0.4, 1), 2
    cfg = _paper(RFRecConfig, rank=2, alpha=0.03, lam=2.0, lam_u=0.5)
    g, local = _state(np.random.default_rng(2), block, d, 6)
    v = dense_v(g.h, local.v_rated, block.rated_items)
    g_u, g_v = _dense_grad_f(local.u, v, *_dense(block), cfg)
    new, up = RFREC.client_step(g, local, block, cfg, np.random.default_rng(0))
    np.testing.assert_allclose(new.u, local.u - 0.03 * g_u, rtol=1e-12)
    expected_v = v - 0.03 * (g_v + 2.0 * (v - g.v_bar))
    np.testing.assert_allclose(up.v, expected_v, rtol=1e-12)
    np.testing.assert_allclose(new.v_rated, expected_v[:, block.rated_items], rtol=1e-12)


def test_rfrec_server_averages_uploads_and_tracks_unrated_columns():
    rng = np.random.default_rng(3)
    cfg = _paper(RFRecConfig, rank=2, alpha=0.03, lam=2.0)
    g, _ = _state(rng, _block(2, 5, 0.5, 0), 2, 5)
    ups = {i: ALGORITHMS["rfrec"].client_step(g, RFRecLocal(rng.normal(size=(2, 2)),
                                                            rng.normal(size=(2, 1))),
                                              RatingBlock([0, 1], [i, i], [3.0, 4.0], 2, 5),
                                              cfg, rng)[1] for i in range(3)}
    new, glob = RFREC.server_step(g, ups, cfg, rng)
    np.testing.assert_allclose(new.v_bar, (ups[0].v + ups[1].v + ups[2].v) / 3, rtol=1e-12)
    np.testing.assert_allclose(new.h, g.h - 0.06 * (g.h - g.v_bar), rtol=1e-12)
    assert new.k == 4 and messages_equal(new, glob)


def test_rfrecf_main_update_and_moving_to_average_match_algorithm_2():
    block, d = _block(4, 7, 0.5, 5), 3
    cfg = _paper(RFRecFConfig, rank=3, alpha=0.02, lam=3.0, lam_u=0.2, p=0.4)
    g, local = _state(np.random.default_rng(6), block, d, 7)
    v = dense_v(g.h, local.v_rated, block.rated_items)
    g_u, g_v = _dense_grad_f(local.u, v, *_dense(block), cfg)
    main, up = RFRECF.client_step(g, local, block, cfg, np.random.default_rng(0))
    assert up is None
    np.testing.assert_allclose(main.u, local.u - 0.02 / 0.6 * g_u, rtol=1e-12)
    np.testing.assert_allclose(main.v_rated, (v - 0.02 / 0.6 * g_v)[:, block.rated_items],
                               rtol=1e-12)
    moved, up = RFRECF.client_step(g.replace(zeta_prev=1), local, block, cfg, None)
    assert up is None
    np.testing.assert_array_equal(moved.u, local.u)
    expected = (v - 0.02 / 0.4 * 3.0 * (v - g.v_bar))[:, block.rated_items]
    np.testing.assert_allclose(moved.v_rated, expected, rtol=1e-12)


def test_rfrecf_uploads_current_v_only_when_zeta_turns_to_one():
    block = _block(2, 5, 0.6, 8)
    g, local = _state(np.random.default_rng(9), block, 2, 5)
    cfg = _paper(RFRecFConfig, rank=2)
    same, up = RFRECF.client_step(g.replace(zeta=1), local, block, cfg, None)
    np.testing.assert_array_equal(up.v, dense_v(g.h, local.v_rated, block.rated_items))
    assert same.u is local.u and same.v_rated is local.v_rated  # nothing moves
    assert same.last == g.k + 1  # but the client took part in this iteration
    assert RFRECF.client_step(g.replace(zeta=1, zeta_prev=1), local, block, cfg, None)[1] is None


def _federation(sizes=(1, 3, 1, 4), n=9, seed=11) -> Federation:
    """Per-user clients (size 1) mixed with blocks of users."""
    train = [_block(m, n, 0.45, seed + i) for i, m in enumerate(sizes)]
    test = [_block(m, n, 0.2, seed + 50 + i) for i, m in enumerate(sizes)]
    return Federation(train, test, [np.arange(m) for m in sizes], np.arange(n), (1.0, 5.0))


def _zetas(seed, rounds, cfg, n_items):
    """zeta_0 .. zeta_{rounds-1} drawn independently of the module (same streams)."""
    rng = derive_rng(seed, 0, SERVER)
    rng.normal(size=(cfg.rank, n_items))
    z = [int(rng.random() < cfg.p)]
    z += [int(derive_rng(seed, k, SERVER).random() < cfg.p) for k in range(1, rounds)]
    return z


def test_rfrecf_communicates_only_when_zeta_changes():
    fed, cfg, seed = _federation(), _paper(RFRecFConfig, rank=2), 4
    zetas = _zetas(seed, 40, cfg, 9)
    server, glob, locs = initialise(RFRECF, cfg, fed.train, seed)
    prev = 0
    for k in range(1, 41):
        assert (glob.zeta, glob.zeta_prev) == (zetas[k - 1], prev)
        glob, server, locs, _, ups = run_round(RFRECF, cfg, k, seed, 0, glob, server, locs,
                                               fed.train)
        sending = zetas[k - 1] == 1 and prev == 0
        assert sorted(ups) == (list(range(4)) if sending else []), k
        prev = zetas[k - 1]
    assert 0 < sum(a == 1 and b == 0 for a, b in zip(zetas[1:], zetas[:-1], strict=True)) < 39


def _dense_reference(fed, cfg, rounds, seed, fast, decay=lambda k: 1.0, grow=lambda k: 1.0):
    """Algorithms 1/2 with every V_(i) dense; RFRecF zetas from the same streams; at
    iteration k (1 = the first) the step is alpha decay(k) (the move to the average keeps
    alpha) and psi's weight lambda grow(k)."""
    server, glob, locs = initialise(fast and RFRECF or RFREC, cfg, fed.train, seed)
    us = [s.u for s in locs]
    vs = [glob.v_bar.copy() for _ in locs]
    v_bar, prev = glob.v_bar, 0
    zetas = _zetas(seed, rounds, cfg, 9) if fast else [0] * rounds
    for k in range(rounds):
        grads = [_dense_grad_f(u, v, *_dense(b), cfg)
                 for u, v, b in zip(us, vs, fed.train, strict=True)]
        if not fast:
            step = cfg.alpha * decay(k + 1)
            us = [u - step * gu for u, (gu, _) in zip(us, grads, strict=True)]
            vs = [v - step * (gv + cfg.lam * grow(k + 1) * (v - v_bar))
                  for v, (_, gv) in zip(vs, grads, strict=True)]
            v_bar = sum(vs) / len(vs)
        elif zetas[k] == 0 and prev == 0:
            step = cfg.alpha * decay(k + 1) / (1 - cfg.p)
            us = [u - step * gu for u, (gu, _) in zip(us, grads, strict=True)]
            vs = [v - step * gv for v, (_, gv) in zip(vs, grads, strict=True)]
        elif zetas[k] == 0:
            vs = [v - cfg.alpha / cfg.p * cfg.lam * grow(k + 1) * (v - v_bar) for v in vs]
        elif prev == 0:
            v_bar = sum(vs) / len(vs)
        prev = zetas[k]
    return us, vs, v_bar


@pytest.mark.parametrize("fast", [False, True])
def test_lazy_representation_and_batched_path_match_dense_reference(fast):
    fed = _federation()
    cfg = (RFRecFConfig if fast else RFRecConfig).paper_settings(rating_range=R15, rank=2,
                                                                 alpha=0.01, lam=5.0)
    alg = RFRECF if fast else RFREC
    us, vs, v_bar = _dense_reference(fed, cfg, 25, 3, fast)
    generic = simulate(alg, cfg, fed, rounds=25, per_round=0, seed=3)
    batched = run_batched(cfg, fed, rounds=25, seed=3)
    for res in (generic, batched):
        np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
        for u, v, s, b in zip(us, vs, res.local_states, fed.train, strict=True):
            np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(dense_v(res.global_msg.h, s.v_rated, b.rated_items), v,
                                       rtol=1e-9, atol=1e-12)
    for a, b in zip(generic.history, batched.history, strict=True):
        assert (a.uploads, a.upload_bytes) == (b.uploads, b.upload_bytes)
        np.testing.assert_allclose([a.objective, a.test_rmse, a.test_mae],
                                   [b.objective, b.test_rmse, b.test_mae], rtol=1e-9)


@pytest.mark.parametrize("fast", [False, True])
def test_decaying_step_and_growing_penalty_follow_their_schedules_exactly(fast):
    """With lr_final < 1 the step of iteration k is alpha (f + (1 - f)(1 + cos(pi x)) / 2),
    with lam_start < 1 psi's weight is lambda s^(1 - x), x = (k - 1) / (K - 1) capped at 1
    (f = lr_final, s = lam_start); every client and H take them, and the lazy path stays
    exact."""
    fed, f, s0, big_k = _federation(), 0.2, 0.25, 12
    cls, alg = (RFRecFConfig, RFRECF) if fast else (RFRecConfig, RFREC)
    cfg = cls.paper_settings(rating_range=R15, rank=2, alpha=0.02, lam=5.0, lr_final=f,
                             lam_start=s0, iterations=big_k)

    def x_of(k):
        return min((k - 1) / (big_k - 1), 1.0)

    def decay(k):
        return f + (1 - f) * (1 + np.cos(np.pi * x_of(k))) / 2

    def grow(k):
        return s0 ** (1 - x_of(k))

    assert [step_size(cfg, k) / 0.02 for k in (1, big_k, big_k + 7)] == pytest.approx(
        [1.0, f, f])
    assert [penalty(cfg, k) for k in (1, big_k, big_k + 7)] == pytest.approx(
        [5.0 * s0, 5.0, 5.0])
    assert step_size(cfg.model_copy(update={"lr_final": 1.0}), 5) == 0.02
    assert penalty(cfg.model_copy(update={"lam_start": 1.0}), 5) == 5.0
    us, vs, v_bar = _dense_reference(fed, cfg, 20, 3, fast, decay, grow)
    for other in (_dense_reference(fed, cfg, 20, 3, fast, grow=grow),
                  _dense_reference(fed, cfg, 20, 3, fast, decay)):
        assert not np.allclose(other[2], v_bar, rtol=1e-4)  # both schedules really act
    for res in (simulate(alg, cfg, fed, rounds=20, per_round=0, seed=3),
                run_batched(cfg, fed, rounds=20, seed=3)):
        np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
        for u, v, s, b in zip(us, vs, res.local_states, fed.train, strict=True):
            np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(dense_v(res.global_msg.h, s.v_rated, b.rated_items), v,
                                       rtol=1e-9, atol=1e-12)


def test_batched_path_reproduces_generic_driver_with_clip_and_noise():
    fed, cfg, seed = _federation(), _paper(RFRecConfig, rank=2, alpha=0.01), 5

    def noise(round_, client, shape):
        return _test_noise_rng(seed, round_, client).laplace(0.0, 0.04, size=shape)

    def privatizer(up, client, round_):
        return up.replace(v=np.clip(up.v, -0.2, 0.2) + noise(round_, client, up.v.shape))

    generic = simulate(RFREC, cfg, fed, rounds=6, per_round=0, seed=seed, privatizer=privatizer)
    batched = run_batched(cfg, fed, rounds=6, seed=seed, clip=0.2, noise=noise)
    np.testing.assert_allclose(batched.global_msg.v_bar, generic.global_msg.v_bar, rtol=1e-9)
    assert np.abs(generic.global_msg.v_bar).max() > 0.2 / 4  # the noise really went in


def test_per_user_clients_equal_one_user_blocks_of_a_bigger_federation():
    ratings_block = _block(5, 8, 0.5, 21)
    per_user = [ratings_block.subset(ratings_block.rows == t) for t in range(5)]
    per_user = [RatingBlock(np.zeros(b.nnz), b.cols, b.vals, 1, 8) for b in per_user]
    fed = Federation(per_user, per_user, [np.arange(1)] * 5, np.arange(8), (1.0, 5.0))
    one = run_batched(_paper(RFRecConfig, rank=2, alpha=0.01), fed, rounds=5, seed=1)
    ref = _dense_reference(fed, _paper(RFRecConfig, rank=2,
                                                           alpha=0.01), 5, 1, False)
    np.testing.assert_allclose(one.global_msg.v_bar, ref[2], rtol=1e-9, atol=1e-12)


def test_objective_matches_dense_evaluation_of_eq_5():
    block, cfg = _block(3, 6, 0.5, 31), _paper(RFRecConfig, rank=2, lam=4.0, lam_u=0.3)
    g, local = _state(np.random.default_rng(32), block, 2, 6)
    r, mask = _dense(block)
    v = dense_v(g.h, local.v_rated, block.rated_items)
    resid = mask * (local.u @ v - mask * (r - 1.0) / 4.0)
    expected = (resid**2).sum() + 0.3 * (local.u**2).sum() + 2.0 * ((v - g.v_bar) ** 2).sum()
    assert RFREC.objective(g, local, block, cfg) == pytest.approx(expected, rel=1e-12)


def test_factors_predict_on_the_rating_scale():
    block = _block(2, 4, 0.5, 41)
    g, local = _state(np.random.default_rng(42), block, 2, 4)
    a, b = RFREC.factors(g, local)
    np.testing.assert_allclose(a @ b, 1.0 + 4.0 * local.u @ g.v_bar, rtol=1e-12)


def test_config_defaults_are_validated_and_the_paper_preset_is_the_papers():
    c, f = RFRecConfig.paper_settings(), RFRecFConfig.paper_settings()
    assert (c.rank, c.alpha, c.lam, c.lam_u, c.init_std, c.iterations) == (
        20, 0.05, 10.0, 0.1, 0.01, 100)
    assert (c.optimizer, c.link, c.rating_range) == ("gd", "identity", "tenant")
    assert (f.alpha, f.p, f.schedule, f.optimizer) == (0.025, 0.5, "paper", "gd")
    # the defaults: the authors' Adam + sigmoid with bias terms and the weighted ridge
    # (BENCHMARKS.md, "RFRec and RFRecF with bias terms and a weighted-lambda ridge")
    d, e = RFRecConfig(), RFRecFConfig()
    assert (d.optimizer, d.link, d.rating_range, d.rank, d.alpha, d.lam, d.lam_u,
            d.iterations) == ("adam", "sigmoid", "tenant", 10, 0.1, 2.0, 0.3, 200)
    assert (d.lam_u_rating, d.lam_v_rating, e.lam_u_rating, e.lam_v_rating) == (
        0.002, 0.002, 0.001, 0.001)
    # RFRec's schedules and Adam memory (BENCHMARKS.md, "RFRec: defaults chosen on the
    # validation carve-out"); RFRecF keeps a constant lambda (its move stays a reset)
    assert (d.adam_betas, d.lam_start, d.lr_final) == ((0.9, 0.9), 0.125, 1.0)
    assert (e.adam_betas, e.lam_start, e.lr_final) == ((0.9, 0.999), 1.0, 1.0)
    assert move_rate(e, 1) == move_rate(e) == 1.0
    assert (c.adam_betas, c.lam_start, c.lr_final) == ((0.9, 0.999), 1.0, 1.0)
    assert (f.adam_betas, f.lam_start, f.lr_final) == ((0.9, 0.999), 1.0, 1.0)
    assert (e.schedule, e.p, e.alpha, e.lam, e.lam_u, e.iterations) == (
        "code", 0.8, 0.04, 40.0, 0.3, 400)
    # the paper's model: no bias terms, no weighted ridge (its eq. 5 omits lambda_v)
    assert (c.bias, c.lam_u_rating, c.lam_v_rating) == (False, 0.0, 0.0)
    assert (f.bias, f.lam_u_rating, f.lam_v_rating) == (False, 0.0, 0.0)
    assert d.bias and e.bias
    assert paper_dp("rfrec") == (0.2, 0.04) and paper_dp("rfrecf") == (0.2, 0.06)
    with pytest.raises(ValueError, match=r"rating_range must be \(lo, hi\) with hi > lo"):
        RFRecConfig(rating_range=(5.0, 1.0))
    with pytest.raises(ValueError, match="less than 1"):
        RFRecFConfig(p=1.0)
    with pytest.raises(ValueError, match="link='sigmoid' needs rating_range"):
        RFRecConfig(link="sigmoid", rating_range=None)
    with pytest.raises(KeyError, match="no paper DP setting for 'fedmavg'"):
        paper_dp("fedmavg")


def _sigmoid_loss_grads(u, v, v_bar, r, mask, lam_u):
    """Loss ((m (sigmoid(UV) - y))^2).sum() + lam_u |U|^2 + |V - V_bar|^2 and its gradients,
    by hand (y = (r - 1) / 4): the reference the client step's Adam is held to."""
    pred = 1.0 / (1.0 + np.exp(-(u @ v)))
    e = mask * (pred - (r - 1.0) / 4.0)
    loss = (e ** 2).sum() + lam_u * (u ** 2).sum() + ((v - v_bar) ** 2).sum()
    g = 2.0 * e * mask * pred * (1.0 - pred)
    return loss, g @ v.T + 2.0 * lam_u * u, u.T @ g + 2.0 * (v - v_bar)


def test_adam_sigmoid_step_matches_autograd_free_adam():
    """Three Adam steps of RFRec's sigmoid client step equal Kingma and Ba's Adam (torch's
    defaults: betas (0.9, 0.999), eps 1e-8, bias-corrected) on the hand-derived
    gradients, which a central-difference check pins first."""
    block = _block(3, 6, 0.5, 51)
    cfg = _paper(RFRecConfig, rank=2, alpha=0.1, lam=2.0, lam_u=0.3, optimizer="adam",
                 link="sigmoid")
    g, local = _state(np.random.default_rng(52), block, 2, 6)
    g = g.replace(link="sigmoid", h_m1=np.zeros((2, 6)), h_m2=np.zeros((2, 6)), k=0)
    zeros = [np.zeros_like(local.u), np.zeros_like(local.u),
             np.zeros_like(local.v_rated), np.zeros_like(local.v_rated)]
    local = RFRecLocal(local.u, local.v_rated, *zeros)
    r, mask = _dense(block)
    u = local.u.copy()
    v = dense_v(g.h, local.v_rated, block.rated_items).copy()
    v_bar = np.asarray(g.v_bar, dtype=np.float64)
    # the hand-derived gradients against central differences at the start
    _, gu, gv = _sigmoid_loss_grads(u, v, v_bar, r, mask, 0.3)
    h = 1e-6
    for x, grad in ((u, gu), (v, gv)):
        for idx in np.ndindex(x.shape):
            keep = x[idx]
            x[idx] = keep + h
            up_ = _sigmoid_loss_grads(u, v, v_bar, r, mask, 0.3)[0]
            x[idx] = keep - h
            down = _sigmoid_loss_grads(u, v, v_bar, r, mask, 0.3)[0]
            x[idx] = keep
            assert abs((up_ - down) / (2 * h) - grad[idx]) < 1e-6
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    m1 = [np.zeros_like(u), np.zeros_like(v)]
    m2 = [np.zeros_like(u), np.zeros_like(v)]
    state, v_new = local, None
    for k in range(3):  # three steps with V_bar fixed: the moments and bias correction matter
        _, gu, gv = _sigmoid_loss_grads(u, v, v_bar, r, mask, 0.3)
        t = k + 1
        for i, (x, grad) in enumerate(((u, gu), (v, gv))):
            m1[i] = b1 * m1[i] + (1 - b1) * grad
            m2[i] = b2 * m2[i] + (1 - b2) * grad ** 2
            denom = np.sqrt(m2[i]) / np.sqrt(1 - b2 ** t) + eps
            x -= lr / (1 - b1 ** t) * m1[i] / denom
        state, up = RFREC.client_step(g, state, block, cfg, None)
        g = g.replace(k=k + 1, h=up.v, h_m1=_moment(g, cfg, 1), h_m2=_moment(g, cfg, 2))
        v_new = up.v
    np.testing.assert_allclose(state.u, u, rtol=1e-9)
    np.testing.assert_allclose(v_new, v, rtol=1e-9, atol=1e-12)

def _moment(g, cfg, which):
    """H's Adam moments after one more step (what the server would broadcast)."""
    from algorithms.rfrec import _step_h
    return _step_h(g, cfg)[1][which - 1]


def test_adam_batched_path_matches_generic_driver():
    fed = _federation()
    cfg = _paper(RFRecConfig, rank=2, alpha=0.05, optimizer="adam")
    generic = simulate(RFREC, cfg, fed, rounds=8, per_round=0, seed=2)
    batched = run_batched(cfg, fed, rounds=8, seed=2)
    np.testing.assert_allclose(batched.global_msg.v_bar, generic.global_msg.v_bar, rtol=1e-9)
    np.testing.assert_allclose(batched.global_msg.h_m2, generic.global_msg.h_m2, rtol=1e-9)
    for a, b in zip(generic.local_states, batched.local_states, strict=True):
        np.testing.assert_allclose(b.v_m1, a.v_m1, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(b.u, a.u, rtol=1e-9)
    assert generic.history[-1].test_rmse == pytest.approx(batched.history[-1].test_rmse)


def test_rfrecf_adam_batched_path_matches_generic_and_moving_keeps_moments():
    fed = _federation()
    cfg = _paper(RFRecFConfig, rank=2, alpha=0.05, optimizer="adam", link="sigmoid")
    server, glob, locs = initialise(RFRECF, cfg, fed.train, 6)
    for k in range(1, 13):  # generic driver (simulate's evaluation needs a linear link)
        glob, server, locs, _, _ = run_round(RFRECF, cfg, k, 6, 0, glob, server, locs,
                                             fed.train)
    mains = sum(a == 0 and b == 0 for a, b in zip(_zetas(6, 12, cfg, 9), [0, *_zetas(
        6, 12, cfg, 9)[:-1]], strict=True))
    batched = run_batched(cfg, fed, rounds=12, seed=6)
    assert batched.global_msg.steps == glob.steps == mains > 0
    np.testing.assert_allclose(batched.global_msg.v_bar, glob.v_bar, rtol=1e-9)
    for a, b in zip(locs, batched.local_states, strict=True):
        np.testing.assert_allclose(b.u, a.u, rtol=1e-9)
        np.testing.assert_allclose(b.v_m2, a.v_m2, rtol=1e-9, atol=1e-18)
    block = fed.train[1]
    moved, _ = RFRECF.client_step(glob.replace(zeta=0, zeta_prev=1), locs[1], block, cfg, None)
    assert moved.u_m1 is locs[1].u_m1 and moved.v_m2 is locs[1].v_m2


def test_sigmoid_link_serves_raw_factors_through_its_link():
    """factors() gives the raw (U_i, V_bar) and serving_link (offset, spread): together they
    are exactly predict_ratings on every entry (the ranking of A @ B is the served one)."""
    cfg = _paper(RFRecConfig, rank=2, link="sigmoid")
    fed = _federation()
    _, glob, locs = initialise(RFREC, cfg, fed.train, 0)
    a, b = RFREC.factors(glob, locs[0])
    offset, spread = RFREC.serving_link(glob, locs[0])
    rows, cols = np.divmod(np.arange(a.shape[0] * b.shape[1]), b.shape[1])
    served = offset + spread / (1 + np.exp(-(a @ b)))
    np.testing.assert_allclose(served[rows, cols],
                               predict_ratings(glob, locs[0], rows, cols), rtol=1e-12)
    assert RFREC.serving_link(glob.replace(link="identity"), locs[0]) is None


def _ml100k(n_clients: int) -> Federation:
    if data_dir() is None:
        pytest.skip("MovieLens not found: set FEDREC_DATA_DIR to the shared data folder")
    return build_federation(load_movielens("ml-100k"), n_clients, 0)


@pytest.mark.data
def test_ml100k_papers_gd_form_diverges_at_the_papers_settings():
    """BENCHMARKS.md: per-user RFRec at alpha = 0.05 overflows by round 20 (best RMSE 2.69)."""
    with np.errstate(all="ignore"):
        res = run_batched(_paper(RFRecConfig), _ml100k(943), rounds=20, seed=0, evaluate_every=10)
    assert 2.5 < res.history[9].test_rmse < 2.8
    assert not np.isfinite(res.final.objective)


@pytest.mark.data
def test_ml100k_authors_adam_sigmoid_variant_learns():
    """BENCHMARKS.md: 200 clients, Adam 0.1, lambda 20 reach 0.9721 at round 60, 0.9404 at 100."""
    cfg = _paper(RFRecConfig, alpha=0.1, lam=20.0, optimizer="adam", link="sigmoid")
    res = run_batched(cfg, _ml100k(200), rounds=60, seed=0, evaluate_every=60)
    assert res.final.test_rmse < 0.985


# --------------------------------------------------------------- dropped clients, schedules


def _chosen(seed, k, n_clients, per_round):
    """The clients of iteration k, drawn like sample_clients from the sampling stream."""
    rng = derive_rng(seed, k, SAMPLING)
    return sorted(int(i) for i in rng.choice(n_clients, size=per_round, replace=False))


def _dense_sampled_rfrec(fed, cfg, rounds, seed, per_round, latest=False):
    """Algorithm 1 with only the chosen clients stepping and uploading (Sec. 3.3): V_bar is
    the mean of their dense V_(i) (``latest``: of every client's latest upload); an absent
    client keeps U_i and V_(i), and on return its never-rated columns are the common track
    H (h <- h - alpha lambda (h - V_bar))."""
    _, glob, locs = initialise(RFREC, cfg, fed.train, seed)
    us = [s.u for s in locs]
    vs = [glob.v_bar.copy() for _ in locs]
    ups = [glob.v_bar.copy() for _ in locs]
    v_bar, h = glob.v_bar, glob.h
    chosen_log = []
    for k in range(1, rounds + 1):
        chosen = _chosen(seed, k, len(vs), per_round)
        chosen_log.append(chosen)
        for i in chosen:
            unrated = np.setdiff1d(np.arange(v_bar.shape[1]), fed.train[i].rated_items)
            vs[i][:, unrated] = h[:, unrated]
            gu, gv = _dense_grad_f(us[i], vs[i], *_dense(fed.train[i]), cfg)
            us[i] = us[i] - cfg.alpha * gu
            vs[i] = vs[i] - cfg.alpha * (gv + cfg.lam * (vs[i] - v_bar))
        h = h - cfg.alpha * cfg.lam * (h - v_bar)
        for i in chosen:
            ups[i] = vs[i].copy()
        v_bar = (sum(ups) / len(ups) if latest else sum(vs[i] for i in chosen) / len(chosen))
    return us, vs, v_bar, chosen_log


def test_dropped_clients_neither_step_nor_upload_and_server_averages_the_rest():
    fed, seed = _federation(), 8
    cfg = _paper(RFRecConfig, rank=2, alpha=0.01, lam=5.0)
    us, vs, v_bar, chosen = _dense_sampled_rfrec(fed, cfg, 12, seed, 2)
    assert {len(c) for c in chosen} == {2} and len({tuple(c) for c in chosen}) > 1
    generic = simulate(RFREC, cfg, fed, rounds=12, per_round=2, seed=seed)
    batched = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2)
    last = chosen[-1]
    for res in (generic, batched):
        np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
        assert [r.uploads for r in res.history] == [2] * 12
        for i, (u, s) in enumerate(zip(us, res.local_states, strict=True)):
            np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
            if i in last:  # a client's dense V_(i) is exact right after it stepped
                np.testing.assert_allclose(
                    dense_v(res.global_msg.h, s.v_rated, fed.train[i].rated_items), vs[i],
                    rtol=1e-9, atol=1e-12)


def _dense_local_rfrec(fed, cfg, rounds, seed, per_round):
    """Algorithm 1 where an absent client keeps stepping (Sec. 3.3, "each client can
    continue local updates even without connection"), pulled to the last V_bar it
    received, and uploads nothing; on reconnection its never-rated columns are H."""
    _, glob, locs = initialise(RFREC, cfg, fed.train, seed)
    us = [s.u for s in locs]
    vs = [glob.v_bar.copy() for _ in locs]
    anchors = [glob.v_bar.copy() for _ in locs]
    v_bar, h = glob.v_bar, glob.h
    for k in range(1, rounds + 1):
        chosen = _chosen(seed, k, len(vs), per_round)
        for i in range(len(vs)):
            if i in chosen:
                unrated = np.setdiff1d(np.arange(v_bar.shape[1]), fed.train[i].rated_items)
                vs[i][:, unrated] = h[:, unrated]
                anchors[i] = v_bar
            gu, gv = _dense_grad_f(us[i], vs[i], *_dense(fed.train[i]), cfg)
            us[i] = us[i] - cfg.alpha * gu
            vs[i] = vs[i] - cfg.alpha * (gv + cfg.lam * (vs[i] - anchors[i]))
        h = h - cfg.alpha * cfg.lam * (h - v_bar)
        v_bar = sum(vs[i] for i in chosen) / len(chosen)
    return us, vs, v_bar


def test_absent_clients_that_step_locally_pull_to_their_last_v_bar_and_upload_nothing():
    fed, seed = _federation(), 8
    cfg = _paper(RFRecConfig, rank=2, alpha=0.01, lam=5.0)
    us, vs, v_bar = _dense_local_rfrec(fed, cfg, 12, seed, 2)
    res = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2, absent="local")
    np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
    assert [r.uploads for r in res.history] == [2] * 12
    for i, (u, s) in enumerate(zip(us, res.local_states, strict=True)):
        np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s.v_rated, vs[i][:, fed.train[i].rated_items],
                                   rtol=1e-9, atol=1e-12)
    idle = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2)
    assert not np.allclose(idle.local_states[0].u, res.local_states[0].u)
    everybody = [run_batched(cfg, fed, rounds=5, seed=seed, absent=a) for a in ("idle", "local")]
    np.testing.assert_array_equal(everybody[0].global_msg.v_bar, everybody[1].global_msg.v_bar)
    with pytest.raises(ValueError, match="absent must be"):
        run_batched(cfg, fed, rounds=2, seed=seed, absent="sleep")


def _dense_lost_rfrec(fed, cfg, rounds, seed, per_round, latest=False):
    """Algorithm 1 where every client steps from the broadcast V_bar but only the chosen
    clients' uploads arrive: V_bar is the mean of their dense V_(i) (``latest``: of every
    client's latest upload)."""
    _, glob, locs = initialise(RFREC, cfg, fed.train, seed)
    us = [s.u for s in locs]
    vs = [glob.v_bar.copy() for _ in locs]
    ups = [glob.v_bar.copy() for _ in locs]
    v_bar = glob.v_bar
    for k in range(1, rounds + 1):
        chosen = _chosen(seed, k, len(vs), per_round)
        for i in range(len(vs)):
            gu, gv = _dense_grad_f(us[i], vs[i], *_dense(fed.train[i]), cfg)
            us[i] = us[i] - cfg.alpha * gu
            vs[i] = vs[i] - cfg.alpha * (gv + cfg.lam * (vs[i] - v_bar))
        for i in chosen:
            ups[i] = vs[i].copy()
        v_bar = (sum(ups) / len(ups) if latest else sum(vs[i] for i in chosen) / len(chosen))
    return us, vs, v_bar


@pytest.mark.parametrize("absent", ["idle", "lost"])
def test_server_averaging_every_clients_latest_upload(absent):
    """aggregate='latest' (MIFA): V_bar is the mean over all clients of the last upload the
    server received from each, the initial V_bar^0 for one that never uploaded."""
    fed, seed = _federation(), 8
    cfg = _paper(RFRecConfig, rank=2, alpha=0.01, lam=5.0)
    dense = _dense_lost_rfrec if absent == "lost" else _dense_sampled_rfrec
    us, _, v_bar, *_ = dense(fed, cfg, 12, seed, 2, latest=True)
    res = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2, absent=absent,
                      aggregate="latest")
    np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
    assert [r.uploads for r in res.history] == [2] * 12
    for u, s in zip(us, res.local_states, strict=True):
        np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
    received = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2, absent=absent)
    assert not np.allclose(received.global_msg.v_bar, res.global_msg.v_bar)
    # with everybody uploading, the latest uploads are this iteration's: the same run
    every = [run_batched(cfg, fed, rounds=5, seed=seed, aggregate=a)
             for a in ("received", "latest")]
    np.testing.assert_allclose(every[1].global_msg.v_bar, every[0].global_msg.v_bar,
                               rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="aggregate must be"):
        run_batched(cfg, fed, rounds=2, seed=seed, aggregate="all")
    with pytest.raises(ValueError, match="no clip or noise"):
        run_batched(cfg, fed, rounds=2, seed=seed, aggregate="latest", clip=0.5)


def test_absent_clients_whose_uploads_are_lost_step_from_the_broadcast():
    fed, seed = _federation(), 8
    cfg = _paper(RFRecConfig, rank=2, alpha=0.01, lam=5.0)
    us, vs, v_bar = _dense_lost_rfrec(fed, cfg, 12, seed, 2)
    res = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2, absent="lost")
    np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
    assert [r.uploads for r in res.history] == [2] * 12
    for i, (u, s) in enumerate(zip(us, res.local_states, strict=True)):
        np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(dense_v(res.global_msg.h, s.v_rated,
                                           fed.train[i].rated_items), vs[i],
                                   rtol=1e-9, atol=1e-12)
        assert s.last == 12
    local = run_batched(cfg, fed, rounds=12, seed=seed, per_round=2, absent="local")
    assert not np.allclose(local.global_msg.v_bar, res.global_msg.v_bar)


def _move_iteration(cfg, fed, seed, per_round):
    """The first iteration k + 1 that moves to the average (zeta_k = 0 after zeta_{k-1} =
    1), as k."""
    return next(k for k in range(1, 40)
                if (g := run_batched(cfg, fed, rounds=k, seed=seed, per_round=per_round,
                                     absent="lost").global_msg).zeta == 0
                and g.zeta_prev == 1)


def test_rfrecf_clients_whose_uploads_are_lost_also_move_to_the_average():
    """Algorithm 2's schedule: an iteration after an aggregation only moves to the average
    (line 12); with absent='lost' every client takes it toward the broadcast V_bar."""
    fed, seed, per_round = _federation(), 4, 3
    cfg = RFRecFConfig(rating_range=R15, rank=2, schedule="paper", p=0.5, lam=5.0)
    rate = move_rate(cfg)
    assert 0.0 < rate < 1.0
    k = _move_iteration(cfg, fed, seed, per_round)
    before = run_batched(cfg, fed, rounds=k, seed=seed, per_round=per_round, absent="lost")
    after = run_batched(cfg, fed, rounds=k + 1, seed=seed, per_round=per_round,
                        absent="lost")
    v_bar = before.global_msg.v_bar
    for s0, s1, b in zip(before.local_states, after.local_states, fed.train, strict=True):
        np.testing.assert_allclose(s1.v_rated, relax(s0.v_rated, v_bar[:, b.rated_items],
                                                     rate), rtol=1e-12, atol=1e-15)


def test_rfrecf_absent_clients_move_to_the_last_v_bar_they_received():
    """Sec. 3.3 (a dropped device "can continue local updates"): in Algorithm 2 both the
    main update and the move to the average (line 12) are local updates of the zeta = 0
    branch, so with absent='local' a client left out of the move iteration still moves,
    toward the V_bar of the last iteration it took part in (the initial V_bar if none),
    and the chosen clients toward the broadcast."""
    fed, seed, per_round = _federation(), 4, 2
    cfg = RFRecFConfig(rating_range=R15, rank=2, schedule="paper", p=0.5, lam=5.0)
    rate = move_rate(cfg)
    k = _move_iteration(cfg, fed, seed, per_round)
    # the broadcast at the start of iteration j is the global message after j - 1 rounds
    v_bars = [run_batched(cfg, fed, rounds=j, seed=seed, per_round=per_round,
                          absent="local").global_msg.v_bar for j in range(k + 1)]
    before = run_batched(cfg, fed, rounds=k, seed=seed, per_round=per_round, absent="local")
    after = run_batched(cfg, fed, rounds=k + 1, seed=seed, per_round=per_round,
                        absent="local")
    took_part = [_chosen(seed, j, len(fed.train), per_round) for j in range(1, k + 2)]
    stale = 0
    for i, (s0, s1, b) in enumerate(zip(before.local_states, after.local_states, fed.train,
                                        strict=True)):
        last = max((j for j in range(1, k + 2) if i in took_part[j - 1]), default=1)
        stale += last <= k and not np.allclose(v_bars[last - 1], v_bars[k])
        np.testing.assert_allclose(
            s1.v_rated, relax(s0.v_rated, v_bars[last - 1][:, b.rated_items], rate),
            rtol=1e-12, atol=1e-15)
    assert stale > 0  # some client moved toward a V_bar other than the broadcast


def test_rfrecf_absent_clients_take_the_main_updates():
    fed, seed = _federation(), 4
    cfg = RFRecFConfig(rating_range=R15, rank=2)
    res = run_batched(cfg, fed, rounds=20, seed=seed, per_round=3, absent="local")
    idle = run_batched(cfg, fed, rounds=20, seed=seed, per_round=3)
    assert [r.uploads for r in res.history] == [r.uploads for r in idle.history]
    # every client took every main update: U of a client absent throughout differs from
    # its initial value only through them, so no client is left at its init
    _, _, locs = initialise(RFRECF, cfg, fed.train, seed)
    for s, s0 in zip(res.local_states, locs, strict=True):
        assert not np.allclose(s.u, s0.u)


def _adam_state(rng, block, d, n, last):
    g, local = _state(rng, block, d, n)
    g = g.replace(h_m1=np.zeros((d, n)), h_m2=np.zeros((d, n)))
    moments = [rng.normal(size=x.shape) ** 2 for x in (local.u, local.u, local.v_rated,
                                                       local.v_rated)]
    return g, local.replace(u_m1=moments[0] - 0.5, u_m2=moments[1], v_m1=moments[2] - 0.5,
                            v_m2=moments[3], last=last)


@pytest.mark.parametrize("alg,cls", [(RFREC, RFRecConfig), (RFRECF, RFRecFConfig)])
def test_a_client_that_missed_an_iteration_restarts_its_first_moments_only_if_asked(alg, cls):
    block = _block(3, 6, 0.5, 31)
    g, local = _adam_state(np.random.default_rng(32), block, 2, 6, last=1)  # g.k = 3
    zeroed = local.replace(u_m1=np.zeros_like(local.u_m1), v_m1=np.zeros_like(local.v_m1))
    for policy in ("restart", "keep"):
        cfg = _paper(cls, rank=2, optimizer="adam", momentum_on_return=policy)
        back, _ = alg.client_step(g, local, block, cfg, None)
        fresh, _ = alg.client_step(g, zeroed.replace(last=g.k), block, cfg, None)
        stale, _ = alg.client_step(g, local.replace(last=g.k), block, cfg, None)
        assert back.last == fresh.last == g.k + 1
        same, other = (fresh, stale) if policy == "restart" else (stale, fresh)
        for name in ("u", "v_rated", "u_m1", "v_m1", "u_m2", "v_m2"):
            np.testing.assert_array_equal(getattr(back, name), getattr(same, name))
        assert not np.allclose(back.u, other.u)
    # 'decay' ages both moments by the two iterations missed (last = 1, g.k = 3)
    cfg = _paper(cls, rank=2, optimizer="adam", momentum_on_return="decay")
    b1, b2 = cfg.adam_betas
    aged = local.replace(u_m1=b1**2 * local.u_m1, v_m1=b1**2 * local.v_m1,
                         u_m2=b2**2 * local.u_m2, v_m2=b2**2 * local.v_m2, last=g.k)
    back, _ = alg.client_step(g, local, block, cfg, None)
    want, _ = alg.client_step(g, aged, block, cfg, None)
    for name in ("u", "v_rated", "u_m1", "v_m1", "u_m2", "v_m2"):
        np.testing.assert_allclose(getattr(back, name), getattr(want, name), rtol=1e-14)
    assert not np.allclose(back.u, stale.u) and not np.allclose(back.u, fresh.u)
    # the first moment after a restart is (1 - beta1) times the gradient, as in Adam's step 1
    cfg = _paper(RFRecConfig, rank=2, optimizer="adam")
    back, _ = RFREC.client_step(g, local, block, cfg, None)
    v = dense_v(g.h, local.v_rated, block.rated_items)
    g_u, _ = _dense_grad_f(local.u, v, *_dense(block), cfg)
    np.testing.assert_allclose(back.u_m1, 0.1 * g_u, rtol=1e-12)


@pytest.mark.parametrize("policy", ["restart", "keep", "decay"])
def test_batched_path_restarts_moments_of_returning_clients_like_the_generic_driver(policy):
    fed, seed = _federation(), 4
    cfg = _paper(RFRecConfig, rank=2, alpha=0.05, lam=5.0, optimizer="adam",
                 momentum_on_return=policy)
    generic = simulate(RFREC, cfg, fed, rounds=15, per_round=2, seed=seed)
    batched = run_batched(cfg, fed, rounds=15, seed=seed, per_round=2)
    np.testing.assert_allclose(batched.global_msg.v_bar, generic.global_msg.v_bar,
                               rtol=1e-9, atol=1e-12)
    for a, b in zip(generic.local_states, batched.local_states, strict=True):
        assert a.last == b.last > 0
        for name in ("u", "v_rated", "u_m1", "v_m1", "u_m2", "v_m2"):
            np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9,
                                       atol=1e-12)
    every = run_batched(cfg, fed, rounds=15, seed=seed)  # nobody misses: policy irrelevant
    other = cfg.model_copy(update={"momentum_on_return": "keep" if policy == "restart"
                                   else "restart"})
    np.testing.assert_array_equal(run_batched(other, fed, rounds=15, seed=seed).global_msg.v_bar,
                                  every.global_msg.v_bar)


def test_select_takes_everybody_at_zero_or_full_and_a_uniform_sample_otherwise():
    rng = np.random.default_rng(0)
    assert list(RFREC.select(None, 5, 0, rng)) == [0, 1, 2, 3, 4]
    assert list(RFREC.select(None, 5, 9, rng)) == [0, 1, 2, 3, 4]
    picks = [tuple(RFRECF.select(None, 5, 2, np.random.default_rng(s))) for s in range(200)]
    assert all(len(set(p)) == 2 and list(p) == sorted(p) for p in picks)
    counts = np.bincount(np.concatenate(picks), minlength=5)
    assert counts.sum() == 400 and counts.min() > 55  # each client ~80 times


def _dense_code_schedule(fed, cfg, rounds, seed):
    """RFRecF with the authors' notebook schedule, every V_(i) dense: every zeta = 0
    iteration is a main update (step alpha/(1-p)), preceded after an aggregation by
    V_(i) <- V_(i) - min(1, alpha lambda / p) (V_(i) - V_bar)."""
    _, glob, locs = initialise(RFRECF, cfg, fed.train, seed)
    us = [s.u for s in locs]
    vs = [glob.v_bar.copy() for _ in locs]
    v_bar, prev = glob.v_bar, 0
    rate = min(1.0, cfg.alpha * cfg.lam / cfg.p)
    for z in _zetas(seed, rounds, cfg, 9):
        if z == 0:
            if prev == 1:
                vs = [v - rate * (v - v_bar) for v in vs]
            grads = [_dense_grad_f(u, v, *_dense(b), cfg)
                     for u, v, b in zip(us, vs, fed.train, strict=True)]
            step = cfg.alpha / (1 - cfg.p)
            us = [u - step * gu for u, (gu, _) in zip(us, grads, strict=True)]
            vs = [v - step * gv for v, (_, gv) in zip(vs, grads, strict=True)]
        elif prev == 0:
            v_bar = sum(vs) / len(vs)
        prev = z
    return us, vs, v_bar


@pytest.mark.parametrize("lam", [3.0, 40.0])  # move rate 0.12 and capped at 1 (a reset)
def test_rfrecf_code_schedule_matches_dense_reference(lam):
    fed = _federation()
    cfg = _paper(RFRecFConfig, rank=2, alpha=0.01, lam=lam, p=0.25, schedule="code")
    us, vs, v_bar = _dense_code_schedule(fed, cfg, 30, 5)
    generic = simulate(RFRECF, cfg, fed, rounds=30, per_round=0, seed=5)
    batched = run_batched(cfg, fed, rounds=30, seed=5)
    paper = run_batched(cfg.model_copy(update={"schedule": "paper"}), fed, rounds=30, seed=5)
    assert not np.allclose(paper.global_msg.v_bar, v_bar)  # the schedules really differ
    for res in (generic, batched):
        np.testing.assert_allclose(res.global_msg.v_bar, v_bar, rtol=1e-9, atol=1e-12)
        for u, v, s, b in zip(us, vs, res.local_states, fed.train, strict=True):
            np.testing.assert_allclose(s.u, u, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(dense_v(res.global_msg.h, s.v_rated, b.rated_items), v,
                                       rtol=1e-9, atol=1e-12)


def test_batched_adam_code_schedule_with_dropped_clients_matches_generic_driver():
    fed = _federation()
    cfg = _paper(RFRecFConfig, rank=2, alpha=0.02, lam=10.0, p=0.4, optimizer="adam",
                 schedule="code")
    generic = simulate(RFRECF, cfg, fed, rounds=20, per_round=3, seed=4)
    batched = run_batched(cfg, fed, rounds=20, seed=4, per_round=3)
    np.testing.assert_allclose(batched.global_msg.v_bar, generic.global_msg.v_bar, rtol=1e-9)
    assert batched.global_msg.steps == generic.global_msg.steps > 0
    for a, b in zip(generic.local_states, batched.local_states, strict=True):
        np.testing.assert_allclose(b.u, a.u, rtol=1e-9)
        np.testing.assert_allclose(b.v_m2, a.v_m2, rtol=1e-9, atol=1e-18)
    assert [r.uploads for r in batched.history] == [r.uploads for r in generic.history]
    assert {r.participants for r in batched.history} == {3}


# ------------------------------------------------- bias terms and the weighted-lambda ridge


def _dense_f(u, v, block, cfg, link):
    """f_i of the default model written out densely from the definitions: the tenant's
    targets (r - lo) / (hi - lo) on its own range, its centre c = link^-1(mean target),
    U = [U0 | b_u | 1], V = [V0 ; 1 ; b_v], prediction link(c + U V), lambda_u on the free
    entries, and the weighted ridge n_t s lam_u_rating ||u_t||^2 + n_j s lam_v_rating
    ||v_j||^2 with s = (std of the ratings in units of range / 4, over 1.1257)^(2 n / (n + 200))
    for the block's n ratings."""
    r, mask = _dense(block)
    lo, hi = block.vals.min(), block.vals.max()
    y = (r - lo) / (hi - lo)
    mean = (block.vals.mean() - lo) / (hi - lo)
    c = np.log(mean / (1 - mean)) if link == "sigmoid" else mean
    z = c + u @ v
    pred = 1 / (1 + np.exp(-z)) if link == "sigmoid" else z
    # the spread's factor shrunk toward 1 by a prior worth 200 ratings (n / (n + 200))
    weight = block.nnz / (block.nnz + 200.0)
    s = min(8.0, max(0.125, (np.std(block.vals) / ((hi - lo) / 4) / 1.1257) ** (2 * weight)))
    d = cfg.rank
    u0 = np.hstack([u[:, :d + 1], np.zeros((u.shape[0], 1))])  # without the ones column
    v0 = np.vstack([v[:d], np.zeros((1, v.shape[1])), v[d + 1:]])  # without the ones row
    n_t, n_j = mask.sum(axis=1), mask.sum(axis=0)
    return (((mask * (pred - y)) ** 2).sum() + cfg.lam_u * (u0**2).sum()
            + s * cfg.lam_u_rating * n_t @ (u0**2).sum(axis=1)
            + s * cfg.lam_v_rating * n_j @ (v0**2).sum(axis=0))


@pytest.mark.parametrize("link", ["identity", "sigmoid"])
def test_bias_terms_and_weighted_ridge_gradient_and_objective_match_a_dense_evaluation(link):
    from algorithms.rfrec import grad_f
    block = _block(4, 7, 0.5, 61)
    cfg = RFRecConfig(rank=2, link=link, lam=3.0, lam_u=0.2, lam_u_rating=0.3,
                      lam_v_rating=0.7)
    fed = Federation([block], [block], [np.arange(4)], np.arange(7), (1.0, 5.0))
    _, g, (local,) = initialise(RFREC, cfg, fed.train, 0)
    rng = np.random.default_rng(62)  # move away from the initialisation, ones kept
    assert np.all(local.u[:, 3] == 1) and np.all(g.v_bar[2] == 1)
    u = local.u + np.hstack([rng.normal(size=(4, 3)), np.zeros((4, 1))])
    v_full = g.h + np.vstack([rng.normal(size=(2, 7)), np.zeros((1, 7)),
                              rng.normal(size=(1, 7))])
    v = v_full[:, block.rated_items]
    local = local.replace(u=u, v_rated=v)
    g_u, g_v = grad_f(u, v, block, cfg, local.centre)
    v_dense = dense_v(g.h, v, block.rated_items)
    eps = 1e-6
    for idx in np.ndindex(*u.shape):
        du = np.zeros_like(u)
        du[idx] = eps
        num = (_dense_f(u + du, v_dense, block, cfg, link)
               - _dense_f(u - du, v_dense, block, cfg, link)) / (2 * eps)
        expected = 0.0 if idx[1] == 3 else num  # the ones column does not move
        assert g_u[idx] == pytest.approx(expected, rel=1e-5, abs=1e-7), idx
    for a, j in np.ndindex(*v.shape):
        dv = np.zeros_like(v_dense)
        dv[a, block.rated_items[j]] = eps
        num = (_dense_f(u, v_dense + dv, block, cfg, link)
               - _dense_f(u, v_dense - dv, block, cfg, link)) / (2 * eps)
        assert g_v[a, j] == pytest.approx(0.0 if a == 2 else num, rel=1e-5, abs=1e-7)
    psi = 0.5 * 3.0 * ((v_dense - g.v_bar) ** 2).sum()
    assert RFREC.objective(g, local, block, cfg) == pytest.approx(
        _dense_f(u, v_dense, block, cfg, link) + psi, rel=1e-10)


@pytest.mark.parametrize("alg,cls", [(RFREC, RFRecConfig), (RFRECF, RFRecFConfig)])
def test_default_model_batched_path_matches_generic_driver_with_dropped_clients(alg, cls):
    fed, cfg = _federation(), cls(rank=2, iterations=10, lam_u_rating=0.2, lam_v_rating=0.1)
    assert cfg.bias
    generic = simulate(alg, cfg, fed, rounds=10, per_round=3, seed=4)
    batched = run_batched(cfg, fed, rounds=10, seed=4, per_round=3)
    np.testing.assert_allclose(batched.global_msg.v_bar, generic.global_msg.v_bar, rtol=1e-9)
    for a, b in zip(generic.local_states, batched.local_states, strict=True):
        np.testing.assert_allclose(b.u, a.u, rtol=1e-9, atol=1e-15)
        assert b.centre == pytest.approx(a.centre, rel=1e-12)
    for a, b in zip(generic.history, batched.history, strict=True):
        np.testing.assert_allclose([a.objective, a.test_rmse], [b.objective, b.test_rmse],
                                   rtol=1e-9)
    assert generic.local_states[0].u.shape == (1, 4) and generic.global_msg.v_bar.shape[0] == 4


def test_the_ones_row_of_v_bar_stays_exactly_one_under_clipping_and_noise():
    fed, seed = _federation(), 5
    cfg = RFRecConfig(rank=2)

    def noise(round_, client, shape):
        return _test_noise_rng(seed, round_, client).laplace(0.0, 0.04, size=shape)

    def privatizer(up, client, round_):
        return up.replace(v=np.clip(up.v, -0.2, 0.2) + noise(round_, client, up.v.shape))

    generic = simulate(RFREC, cfg, fed, rounds=6, per_round=0, seed=seed,
                       privatizer=privatizer)
    batched = run_batched(cfg, fed, rounds=6, seed=seed, clip=0.2, noise=noise)
    for res in (generic, batched):
        assert np.all(res.global_msg.v_bar[2] == 1.0) and np.all(res.global_msg.h[2] == 1.0)
        assert all(np.all(s.u[:, 3] == 1.0) for s in res.local_states)
    np.testing.assert_allclose(batched.global_msg.v_bar, generic.global_msg.v_bar, rtol=1e-9)


@pytest.mark.parametrize("link", ["identity", "sigmoid"])
def test_served_factors_with_the_centre_equal_predict_ratings(link):
    cfg = RFRecConfig(rank=2, link=link)
    fed = _federation()
    res = simulate(RFREC, cfg, fed, rounds=3, per_round=0, seed=0)
    glob, local = res.global_msg, res.local_states[1]
    assert local.centre is not None and local.centre != 0
    a, b = RFREC.factors(glob, local)
    rows, cols = np.divmod(np.arange(a.shape[0] * b.shape[1]), b.shape[1])
    link_ = RFREC.serving_link(glob, local)
    served = a @ b if link_ is None else link_[0] + link_[1] / (1 + np.exp(-(a @ b)))
    np.testing.assert_allclose(served[rows, cols], predict_ratings(glob, local, rows, cols),
                               rtol=1e-12)
