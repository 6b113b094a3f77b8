"""Felb / Felb-MU (the Felb paper, eqs. 3, 6-10) and the binary metrics.

The update rules are checked against independent dense evaluations: brute-force
minimisation on a fine grid for the proximal operators, central finite differences for the
gradients, eigenvalues for the Lipschitz constants.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from algorithms import Message, RatingBlock, felb, registry
from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.binary_metrics import (
    binarise,
    boolean_confusion,
    boolean_quality,
    f1_and_rmsd,
    ranking_quality,
    reconstruction_quality,
)
from algorithms.data import Federation, build_federation, data_dir, load_movielens
from algorithms.felb import (
    FelbConfig,
    FelbGlobal,
    FelbLocal,
    FelbServer,
    FelbUpload,
    boolean,
    boolean_factors,
    boolean_product,
    elb_prox,
    elb_regulariser,
    factors,
    local_steps,
    objective,
    prox_grad_step,
    proximity_prox,
    server_step,
)
from algorithms.simulate import simulate

GRID = np.linspace(0.0, 1.0, 100_001)  # step 1e-5 on the box [0, 1]


def _grid_prox(x: float, kappa: float, lam: float, weight: float = 1.0) -> float:
    """argmin over the grid of weight/2 (x - y)^2 + R(y): the definition of eq. 5-6."""
    f = 0.5 * weight * (x - GRID) ** 2 + elb_regulariser(GRID, kappa, lam)
    return float(GRID[np.argmin(f)])


# ------------------------------------------------------------------- proximal operators

@pytest.mark.parametrize("kappa,lam", [(0.001, 0.1), (0.05, 0.3), (0.2, 2.0), (0.0, 0.0)])
def test_elb_prox_is_the_brute_force_minimiser(kappa, lam):
    xs = np.linspace(-0.6, 1.6, 45)
    got = elb_prox(xs, kappa, lam)
    want = np.array([_grid_prox(x, kappa, lam) for x in xs])
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_elb_regulariser_hand_values():
    kappa, lam = 0.1, 0.4
    np.testing.assert_allclose(elb_regulariser(np.array([0.0, 1.0, 0.5, 0.25, 2.0]), kappa, lam),
                               [0.0, 0.0, 0.05 + 0.05, 0.025 + 0.0125, 0.1 + 0.2])


def test_proximity_prox_is_the_brute_force_minimiser():
    v, v_hat, w = np.array([0.1, 0.9, 0.4]), np.array([1.0, 0.0, 0.4]), 0.7
    want = [GRID[np.argmin(0.5 * (a - GRID) ** 2 + 0.5 * w * (GRID - b) ** 2)]
            for a, b in zip(v, v_hat, strict=True)]
    np.testing.assert_allclose(proximity_prox(v, v_hat, w), want, atol=2e-5)


# -------------------------------------------------------------------- local updates

def _numeric_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def _hand_example(seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.random((4, 5)) < 0.5).astype(float)
    return a, rng.uniform(0, 1, (4, 2)), rng.uniform(0, 1, (4, 2)), rng.uniform(0, 1, (2, 5))


def test_felb_local_step_matches_dense_evaluation_of_eq8():
    a, u, u_prev, v = _hand_example()
    v_hat = np.random.default_rng(1).uniform(0, 1, v.shape)
    kappa, lam, beta, gamma = 0.02, 0.3, 0.2, 0.5
    # U step at the extrapolated point, Lipschitz step 1 / lambda_max(V V^T)
    y = u + beta * (u - u_prev)
    g = _numeric_grad(lambda x: 0.5 * np.sum((a - x @ v) ** 2), y)
    lu = np.linalg.eigvalsh(v @ v.T).max()
    u_want = np.vectorize(lambda x: _grid_prox(x, kappa, lam, lu))(y - g / lu)
    # V step from the new U (no extrapolation on the first step), then the proximity prox
    gv = _numeric_grad(lambda x: 0.5 * np.sum((a - u_want @ x) ** 2), v)
    lv = np.linalg.eigvalsh(u_want.T @ u_want).max()
    v_mid = np.vectorize(lambda x: _grid_prox(x, kappa, lam, lv))(v - gv / lv)
    v_want = (v_mid + gamma / lv * v_hat) / (1 + gamma / lv)
    u_got, u_prev_got, v_got = local_steps(sp.csr_array(a), u, u_prev, v, v_hat, 1, kappa,
                                           lam, beta, gamma, mu=False)
    np.testing.assert_allclose(u_got, u_want, atol=1e-4)
    np.testing.assert_array_equal(u_prev_got, u)
    np.testing.assert_allclose(v_got, v_want, atol=1e-4)


def test_curvature_proximity_is_gamma_times_the_v_curvature():
    """proximity_scale='curvature': gamma = rho ||U^T U||_2 at each V step, so Felb's
    proximity weight eta gamma is exactly rho (whatever the number of rows: doubling the
    rows doubles ||U^T U||), and the step equals the absolute one with that gamma."""
    a, u, u_prev, v = _hand_example()
    v_hat = np.random.default_rng(1).uniform(0, 1, v.shape)
    rho = 0.3
    args = (0.02, 0.3, 0.0)
    u1, _, v_abs0 = local_steps(sp.csr_array(a), u, u_prev, v, v_hat, 1, *args, 0.0, mu=False)
    lv = np.linalg.norm(u1.T @ u1, 2)
    _, _, v_cur = local_steps(sp.csr_array(a), u, u_prev, v, v_hat, 1, *args, rho, mu=False,
                              curvature=True)
    np.testing.assert_allclose(v_cur, (v_abs0 + rho * v_hat) / (1 + rho), atol=1e-12)
    for mu in (False, True):
        u1, _, _ = local_steps(sp.csr_array(a), u, u_prev, v, v_hat, 1, *args, 0.0, mu=mu)
        lv = np.linalg.norm(u1.T @ u1, 2)  # the V step's curvature after this U step
        _, _, want = local_steps(sp.csr_array(a), u, u_prev, v, v_hat, 1, *args, rho * lv,
                                 mu=mu)
        _, _, got = local_steps(sp.csr_array(a), u, u_prev, v, v_hat, 1, *args, rho, mu=mu,
                                curvature=True)
        np.testing.assert_allclose(got, want, atol=1e-12)
    cfg = FelbConfig(rank=2, proximity=rho, proximity_scale="curvature")
    assert cfg.proximity_scale == "curvature" and FelbConfig().proximity_scale == "absolute"


def _reference_local_steps(a, u, u_prev, v, v_hat, steps, kappa, lam, inertia, gamma, mu):
    """Eq. 8 composed from the one-step functions on dense arrays, whole matrices at once."""
    vt, vt_prev = v.T, v.T
    for _ in range(steps):
        u_new, _ = prox_grad_step(u, u_prev, vt.T @ vt, a @ vt, kappa, lam, inertia, mu)
        u, u_prev = u_new, u
        vt_new, eta = prox_grad_step(vt, vt_prev, u.T @ u, a.T @ u, kappa, lam, inertia, mu)
        if gamma:
            vt_new = proximity_prox(vt_new, v_hat.T, eta * gamma)
        vt, vt_prev = vt_new, vt
    return u, u_prev, vt.T


@pytest.mark.parametrize("mu", [False, True])
@pytest.mark.parametrize("gamma", [0.0, 0.7])
def test_blocked_sparse_local_steps_equal_the_dense_composition(monkeypatch, mu, gamma):
    """local_steps (sparse A, in-place row blocks of 7 so blocks end mid-matrix) against
    prox_grad_step / proximity_prox on the dense matrix, over 6 steps with inertia."""
    rng = np.random.default_rng(11)
    a = (rng.random((23, 41)) < 0.2).astype(float)
    u, u_prev = rng.uniform(0, 1, (23, 4)), rng.uniform(0, 1, (23, 4))
    v, v_hat = rng.uniform(0, 1, (4, 41)), rng.uniform(0, 1, (4, 41))
    args = (u, u_prev, v, v_hat, 6, 0.02, 0.3, 0.1, gamma, mu)
    want = _reference_local_steps(a, *args)
    monkeypatch.setattr(felb, "_ROWS", 7)
    got = local_steps(sp.csr_array(a), *args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)
    assert not np.allclose(got[2], v, atol=1e-3)  # the steps moved V


def test_mu_step_without_regulariser_is_lee_seung():
    a, u, _, v = _hand_example(2)
    got, eta = prox_grad_step(u, u, v @ v.T, a @ v.T, 0.0, 0.0, 0.0, mu=True)
    np.testing.assert_allclose(got, np.clip(u * (a @ v.T) / (u @ v @ v.T), 0, 1), rtol=1e-12)
    np.testing.assert_allclose(eta, u / (u @ v @ v.T), rtol=1e-12)


def test_mu_step_applies_the_prox_with_element_wise_steps():
    a, u, _, v = _hand_example(3)
    kappa, lam = 0.05, 0.5
    eta = u / (u @ v @ v.T)
    x = u - eta * (u @ v @ v.T - a @ v.T)
    want = np.array([[_grid_prox(x[i, j], kappa, lam, 1 / eta[i, j]) for j in range(2)]
                     for i in range(4)])
    got, _ = prox_grad_step(u, u, v @ v.T, a @ v.T, kappa, lam, 0.0, mu=True)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_server_step_solves_eq10_at_lambda_t():
    rng = np.random.default_rng(4)
    vs = {i: FelbUpload(rng.uniform(-0.2, 1.2, (2, 3))) for i in (0, 3, 5)}
    cfg, t = FelbConfig(rank=2, kappa=0.05, lam=0.2, server_prox="eq10"), 6
    state, glob = server_step(FelbServer(np.zeros((2, 3)), t), vs, cfg, rng)
    lam_t = 0.2 * 1.05**t
    stack = np.stack([u.v for u in vs.values()])
    want = np.array([[GRID[np.argmin(
        0.5 * ((stack[:, i, j, None] - GRID) ** 2).sum(0)
        + elb_regulariser(GRID, 0.05, lam_t))] for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(glob.v_hat, want, atol=2e-5)
    assert glob.round == state.round == t + 1


def test_server_prox_alg1_is_line_16_as_printed():
    """server_prox='alg1' (the default): prox_{kappa, lambda_t} of the mean (Algorithm 1,
    line 16), the brute-force minimiser of 1/2 (mean - y)^2 + R(y); the same Boolean
    rounding as eq10's 1/C prox, and the same V_hat as it for one upload."""
    rng = np.random.default_rng(5)
    vs = {i: FelbUpload(rng.uniform(-0.2, 1.2, (2, 3))) for i in (0, 3, 5)}
    t = 6
    cfg = FelbConfig(rank=2, kappa=0.05, lam=0.2, server_prox="alg1")
    _, glob = server_step(FelbServer(np.zeros((2, 3)), t), vs, cfg, rng)
    lam_t = 0.2 * 1.05**t
    mean = np.mean([u.v for u in vs.values()], axis=0)
    want = np.array([[GRID[np.argmin(0.5 * (mean[i, j] - GRID) ** 2
                                     + elb_regulariser(GRID, 0.05, lam_t))]
                      for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(glob.v_hat, want, atol=2e-5)
    _, default = server_step(FelbServer(np.zeros((2, 3)), t), vs,
                             FelbConfig(rank=2, kappa=0.05, lam=0.2, server_prox="eq10"), rng)
    assert np.abs(glob.v_hat - default.v_hat).max() > 0.01
    np.testing.assert_array_equal(glob.v_hat >= 0.5, default.v_hat >= 0.5)
    one = {3: vs[3]}
    _, a = server_step(FelbServer(np.zeros((2, 3)), t), one, cfg, rng)
    _, b = server_step(FelbServer(np.zeros((2, 3)), t), one,
                       FelbConfig(rank=2, kappa=0.05, lam=0.2, server_prox="eq10"), rng)
    np.testing.assert_array_equal(a.v_hat, b.v_hat)
    assert FelbConfig().server_prox == FelbConfig.paper_settings().server_prox == "alg1"


def test_server_keeps_v_hat_without_uploads():
    v = np.full((2, 3), 0.3)
    state, glob = server_step(FelbServer(v, 2), {}, FelbConfig(rank=2), None)
    np.testing.assert_array_equal(glob.v_hat, v)
    assert glob.round == 3


def test_objective_is_the_dense_squared_error():
    a, u, _, v = _hand_example(5)
    r, c = np.nonzero(a)
    block = RatingBlock(r, c, a[r, c], 4, 5)
    got = objective(FelbGlobal(v, 0), FelbLocal(u, u), block, FelbConfig(rank=2))
    assert got == pytest.approx(0.5 * np.sum((a - u @ v) ** 2), rel=1e-12)


# ------------------------------------------------------------------- Boolean factors

def test_boolean_product_is_or_of_ands():
    rng = np.random.default_rng(6)
    u, v = rng.random((5, 3)) < 0.4, rng.random((3, 7)) < 0.4
    want = np.array([[any(u[i, l] and v[l, j] for l in range(3)) for j in range(7)]
                     for i in range(5)])
    np.testing.assert_array_equal(boolean_product(u, v), want)


def test_factors_threshold_to_the_boolean_product():
    rng = np.random.default_rng(7)
    u, v = rng.uniform(0, 1, (6, 4)), rng.uniform(0, 1, (4, 9))
    a, b = factors(FelbGlobal(v, 3), FelbLocal(u, u))
    scores = a @ b
    bp = boolean_product(boolean(u), boolean(v))
    assert scores[bp].min() >= 1.0 and scores[~bp].max() < 0.25


# ---------------------------------------------------------- planted tiles (part 5)

def _tiles_federation(seed: int) -> tuple[np.ndarray, Federation]:
    """Three overlapping dense tiles in a 90 x 60 Boolean matrix, rows shuffled over 3
    tenants; returns the matrix in tenant row order and the federation."""
    a = np.zeros((90, 60), dtype=bool)
    a[0:40, 0:20] = a[30:70, 15:40] = a[60:90, 35:60] = True
    a = a[np.random.default_rng(seed).permutation(90)]
    train, test, uids = [], [], []
    for rows in np.array_split(np.arange(90), 3):
        r, c = np.nonzero(a[rows])
        train.append(RatingBlock(r, c, np.ones(r.size), rows.size, 60))
        test.append(RatingBlock(r[:0], c[:0], np.ones(0), rows.size, 60))
        uids.append(rows)
    return a, Federation(train, test, uids, np.arange(60), (0.0, 1.0))


@pytest.mark.parametrize("name", ["felb", "felb-mu"])
@pytest.mark.parametrize("seed", [0, 1])
def test_recovers_planted_tiles(name, seed):
    a, fed = _tiles_federation(seed)
    alg = registry.get(name)
    res = simulate(alg, alg.config(rank=4), fed, rounds=50, per_round=3, seed=seed,
                   evaluate_every=50)
    rec = np.vstack([boolean_product(boolean(s.u), boolean(res.global_msg.v_hat))
                     for s in res.local_states])
    f1, _ = f1_and_rmsd(int((rec & a).sum()), int((rec & ~a).sum()), int((~rec & a).sum()),
                        a.size)
    assert f1 >= 0.98
    f1_metric, rmsd = reconstruction_quality(alg, res.global_msg, res.local_states, fed.train)
    assert f1_metric == pytest.approx(f1)
    assert rmsd == pytest.approx(np.sqrt((rec != a).mean()))


# ------------------------------------------------------------- the start (a deviation)

def test_scaled_start_is_the_uniform_start_shrunk_by_root_n():
    """start='scaled' draws V_hat^0 on [0, 1/sqrt(n)] from the same stream as the paper's
    [0, 1]; ||V_hat^0 V_hat^0^T||_2 is then about k/4 + 1/12 whatever n (the uniform start's
    grows as n k / 4)."""
    k = 8
    for n in (500, 20_000):
        _, uni = felb.init_server(n, 3, FelbConfig(rank=k, start="uniform"),
                                  np.random.default_rng(3))
        _, sca = felb.init_server(n, 3, FelbConfig(rank=k, start="scaled"),
                                  np.random.default_rng(3))
        np.testing.assert_allclose(sca.v_hat, uni.v_hat / np.sqrt(n), rtol=1e-15)
        assert uni.v_hat.min() >= 0 and uni.v_hat.max() <= 1 and uni.v_hat.max() > 0.99
        norm = np.linalg.norm(sca.v_hat @ sca.v_hat.T, 2)
        assert norm == pytest.approx(k / 4 + 1 / 12, rel=0.05)
        assert np.linalg.norm(uni.v_hat @ uni.v_hat.T, 2) == pytest.approx(
            n * (k / 4 + 1 / 12), rel=0.05)


def test_default_and_paper_preset_keep_algorithm_1s_uniform_start():
    for name in ("felb", "felb-mu"):
        cls = registry.get(name).config
        assert cls().start == cls.paper_settings().start == "uniform"
    _, glob = felb.init_server(50, 2, FelbConfig(rank=3), np.random.default_rng(0))
    np.testing.assert_array_equal(
        glob.v_hat, np.random.default_rng(0).uniform(0.0, 1.0, size=(3, 50)))


def _wide_tiles_federation(seed: int, cols: int = 4000) -> Federation:
    """Three dense 50 x 40 tiles plus 0.2% noise in a 150 x ``cols`` matrix (density about
    1%, as sparse as binarised MovieLens), rows shuffled over 3 tenants."""
    rng = np.random.default_rng(seed)
    a = np.zeros((150, cols), dtype=bool)
    for r0, c0 in ((0, 0), (50, 30), (100, 60)):
        a[r0:r0 + 50, c0:c0 + 40] = rng.random((50, 40)) < 0.9
    a |= rng.random(a.shape) < 0.002
    a = a[rng.permutation(150)]
    train, test, uids = [], [], []
    for rows in np.array_split(np.arange(150), 3):
        r, c = np.nonzero(a[rows])
        train.append(RatingBlock(r, c, np.ones(r.size), rows.size, cols))
        test.append(RatingBlock(r[:0], c[:0], np.ones(0), rows.size, cols))
        uids.append(rows)
    return Federation(train, test, uids, np.arange(cols), (0.0, 1.0))


@pytest.mark.parametrize("name", ["felb", "felb-mu"])
def test_scaled_start_finds_tiles_among_many_items_where_the_uniform_start_does_not(name):
    """With 4,000 items the paper's uniform start has ||V V^T|| about 4,000: the first U
    steps shrink U_i below 1/2 and nothing is found in 20 rounds (F1 0); the scaled start
    recovers the tiles."""
    alg = registry.get(name)
    f1 = {}
    for start in ("uniform", "scaled"):
        fed = _wide_tiles_federation(0)
        res = simulate(alg, alg.config(rank=4, start=start), fed, rounds=20, per_round=3,
                       seed=0, evaluate_every=0)
        f1[start], _ = boolean_quality(
            [boolean_factors(res.global_msg, s) for s in res.local_states], fed.train)
    assert f1["uniform"] < 0.05 and f1["scaled"] > 0.7, f1


def test_registry_names_map_to_the_two_step_rules():
    assert registry.get("felb").config().step == "lipschitz"
    assert registry.get("felb-mu").config().step == "mu"
    assert registry.get("felb-mu").data_kind == "binary"


def test_config_rejects_impossible_values():
    with pytest.raises(ValueError, match="inertia\n  Input should be less than 1"):
        FelbConfig(inertia=1.0)
    with pytest.raises(ValueError, match="step\n  Input should be 'lipschitz' or 'mu'"):
        FelbConfig(step="adam")


# ------------------------------------------------------------------- binary metrics

@dataclasses.dataclass(frozen=True)
class _Fixed(Message):
    a: np.ndarray
    b: np.ndarray


def _stub() -> Algorithm:
    def none(*args):
        raise AssertionError("not used")
    return Algorithm("stub", AlgorithmConfig, none, none, none, none,
                     factors=lambda g, s: (s.a, s.b), objective=none)


def test_f1_and_rmsd_hand_computed():
    f1, rmsd = f1_and_rmsd(3, 1, 2, 20)
    assert f1 == pytest.approx(6 / 9) and rmsd == pytest.approx(np.sqrt(3 / 20))
    assert f1_and_rmsd(0, 0, 0, 5) == (1.0, 0.0)
    with pytest.raises(ValueError, match="n_entries must be positive"):
        f1_and_rmsd(0, 0, 0, 0)


def test_reconstruction_quality_counts_every_entry():
    truth = np.array([[1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0]], dtype=bool)
    scores = np.array([[0.9, 0.6, 0.1, 0.0], [0.0, 0.2, 0.5, 0.4], [1.0, 1.0, 0.0, 0.7]])
    r, c = np.nonzero(truth)
    block = RatingBlock(r, c, np.ones(r.size), 3, 4)
    f1, rmsd = reconstruction_quality(_stub(), None, [_Fixed(scores, np.eye(4))], [block])
    # predicted (>= 0.5): (0,0) (0,1) (1,2) (2,0) (2,1) (2,3): tp 4, fp 2, fn 2
    assert f1 == pytest.approx(8 / 12) and rmsd == pytest.approx(np.sqrt(4 / 12))


@pytest.mark.parametrize("k", [3, 70])  # 70 components: two 64-bit words per mask
def test_boolean_quality_equals_the_dense_reconstruction(k):
    """F1 / RMSD from component bit masks against reconstruction_quality, which forms the
    dense m x n scores of Felb's factors; TP / FP / FN against the dense Boolean product."""
    rng = np.random.default_rng(12)
    glob = FelbGlobal(rng.uniform(0, 1, (k, 30)) ** (3 if k > 3 else 1), 0)
    states, blocks = [], []
    for m in (9, 14):
        u = rng.uniform(0, 1, (m, k)) ** (8 if k > 3 else 1)  # few 1s: some empty rows
        truth = rng.random((m, 30)) < 0.3
        r, c = np.nonzero(truth)
        blocks.append(RatingBlock(r, c, np.ones(r.size), m, 30))
        states.append(FelbLocal(u, u))
        pred = boolean_product(*boolean_factors(glob, states[-1]))
        tp = int((pred & truth).sum())
        want = (tp, int(pred.sum()) - tp, int(truth.sum()) - tp)
        assert boolean_confusion(*boolean_factors(glob, states[-1]), blocks[-1]) == want
        assert 0 < tp and want[1] > 0 and want[2] > 0
    alg = registry.get("felb")
    assert boolean_quality([boolean_factors(glob, s) for s in states], blocks) == \
        reconstruction_quality(alg, glob, states, blocks)


def test_ranking_quality_hand_computed():
    scores = np.array([[5.0, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]])
    seen = RatingBlock([0, 1], [0, 5], [1.0, 1.0], 2, 6)
    test = RatingBlock([0, 0, 1], [2, 5, 1], [1.0, 1.0, 1.0], 2, 6)
    p, r, n = ranking_quality(_stub(), None, [_Fixed(scores, np.eye(6))], [test], [seen], k=2)
    # user 0 top 2 unseen: items 1, 2 -> 1 hit of 2; user 1: items 4, 3 -> 0 hits of 1
    assert (p, r, n) == (pytest.approx(0.25), pytest.approx(0.25), 2)


def test_binarise_keeps_split_and_users():
    train = RatingBlock([0, 0, 1], [0, 1, 2], [4.0, 3.0, 3.5], 2, 3)
    test = RatingBlock([1, 0], [0, 2], [5.0, 1.0], 2, 3)
    fed = Federation([train], [test], [np.array([10, 11])], np.arange(3), (1.0, 5.0))
    out = binarise(fed, 3.5)
    assert out.train[0].rows.tolist() == [0, 1] and out.train[0].cols.tolist() == [0, 2]
    assert out.test[0].cols.tolist() == [0] and out.train[0].vals.tolist() == [1.0, 1.0]
    assert out.scale == (0.0, 1.0) and out.train[0].shape == (2, 3)


@pytest.mark.data
def test_binarised_movielens_100k_counts_ratings_of_4_and_5():
    if data_dir() is None:
        pytest.skip("MovieLens not found: set FEDREC_DATA_DIR to the data folder")
    fed = binarise(build_federation(load_movielens("ml-100k"), 10, seed=0))
    n = sum(b.nnz for b in fed.train) + sum(b.nnz for b in fed.test)
    assert n == 34_174 + 21_201  # data/README.md: ratings 4 and 5


@pytest.mark.parametrize("name", ["felb", "felb-mu"])
def test_same_seed_same_bits_with_held_out_entries(name):
    """The shared contract's determinism check with every fourth entry held out: its own
    binary federation observes every entry, so the test RMSEs it compares are all NaN."""
    from tests.algorithms import test_contract as contract

    fed = contract._low_rank_federation(True)
    hold = [np.arange(b.nnz) % 4 == 0 for b in fed.train]
    fed = Federation([b.subset(~h) for b, h in zip(fed.train, hold, strict=True)],
                     [b.subset(h) for b, h in zip(fed.train, hold, strict=True)],
                     fed.user_ids, fed.item_ids, fed.scale)
    alg = registry.get(name)
    contract.test_same_seed_same_bits_other_seed_other_bits((alg, contract._config(alg), fed))
