"""FedMC-ADMM's update rules against a direct dense evaluation of the paper's equations.

The reference below is written from the FedMC-ADMM paper Sec. 5 with dense matrices and an
explicit 0/1 mask, independently of algorithms/mf_kernels.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from algorithms import RatingBlock
from algorithms import fedmc_admm as F
from algorithms import mf_kernels as K
from algorithms.data import build_federation, data_dir, load_movielens
from algorithms.simulate import initialise, run_round, simulate

KERNELS = ["numpy", "numba"] if K.HAVE_NUMBA else ["numpy"]
M_USERS, N_ITEMS, RANK = 4, 6, 2


def _blocks() -> list[RatingBlock]:
    """Two tenants of 4 users x 6 items; tenant 1 leaves item 5 unrated."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(2):
        mask = rng.random((M_USERS, N_ITEMS)) < 0.6
        mask[:, 5] = i == 0
        rows, cols = np.nonzero(mask)
        vals = rng.uniform(1.0, 5.0, size=rows.shape[0])
        # a declared 1-5 scale: the reference scale, so the equations apply to raw ratings
        out.append(RatingBlock(rows, cols, vals, M_USERS, N_ITEMS, (1.0, 5.0)))
    return out


def _dense(block: RatingBlock) -> tuple[np.ndarray, np.ndarray]:
    m = np.zeros(block.shape)
    omega = np.zeros(block.shape)
    m[block.rows, block.cols] = block.vals
    omega[block.rows, block.cols] = 1.0
    return m, omega


def _soft(q, tau):
    return np.where(q > tau, q - tau, np.where(q < -tau, q + tau, 0.0))


def _dense_client(u, w, y, v, block, cfg, p):
    """Algorithm 1 step 4 for one tenant: eqs. (66)/(71), (67), (13), dense.

    The U-step holds W_i^k fixed (eq. 14), or V^k when ``cfg.u_anchor == 'global'``."""
    m, omega = _dense(block)
    # weighted lambda: ridge lam_rating n_t on user row t, gamma_rating n_j on item column j
    # (the tenant's counts), both times the tenant's rating variance over 1.1257^2
    ridge = (np.var(block.vals) / 1.1257**2) ** (block.nnz / (block.nnz + 200))  # shrunk
    lam = cfg.lam + cfg.lam_rating * ridge * omega.sum(axis=1, keepdims=True)
    mu = cfg.gamma_rating * ridge * omega.sum(axis=0, keepdims=True)
    wu = w if cfg.u_anchor == "local" else v
    lw = max(np.linalg.norm(wu @ wu.T), cfg.lipschitz_floor)
    for _ in range(cfg.inner_steps):
        g = (omega * (u @ wu - m)) @ wu.T
        u = _soft(u - g / lw, lam / lw) if cfg.regulariser == "l1" else (
            (lw * u - g) / (lw + lam))
    lu = max(np.linalg.norm(u.T @ u), cfg.lipschitz_floor) + mu
    w_new = w
    for _ in range(cfg.inner_steps):
        grad = u.T @ (omega * (u @ w_new - m)) + mu * w_new
        w_new = (lu / p * w_new + cfg.beta * v - grad / p - y) / (lu / p + cfg.beta)
    return u, w_new, y + cfg.beta * (w_new - v)


def _dense_server(ws, ys, cfg):
    """Eq. (68) (l2) or eq. (73) (l1) over every tenant's last (W_i, Y_i)."""
    p = len(ws)
    if cfg.regulariser == "l1":
        return _soft(sum(w + y / cfg.beta for w, y in zip(ws, ys, strict=True)) / p,
                     cfg.gamma / (p * cfg.beta))
    return sum(cfg.beta * w + y for w, y in zip(ws, ys, strict=True)) / (p * cfg.beta + cfg.gamma)


def _plain_cfg(kernel, regulariser="l2", anchor="local", lam_rating=0.0, gamma_rating=0.0):
    """The paper's equations exactly: no bias, no centring, global Lipschitz constants
    (plus the weighted-lambda ridges when given)."""
    return F.FedMCADMMConfig(rank=RANK, regulariser=regulariser, lam=0.3, gamma=0.2, beta=0.7,
                             lam_rating=lam_rating, gamma_rating=gamma_rating,
                             inner_steps=3, init="uniform", init_scale=1.0, lipschitz="global",
                             user_bias=False, item_bias=False, centre="none", kernel=kernel,
                             u_anchor=anchor)


@pytest.mark.parametrize("weighted", [(0.0, 0.0), (0.04, 0.07)])
@pytest.mark.parametrize("anchor", ["local", "global"])
@pytest.mark.parametrize("regulariser", ["l2", "l1"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_two_rounds_match_dense_equations(kernel, regulariser, anchor, weighted):
    cfg = _plain_cfg(kernel, regulariser, anchor, *weighted)
    blocks = _blocks()
    server, glob, locs = initialise(F.ALGORITHM, cfg, blocks, seed=3)
    ref = [(s.U, s.W, s.Y) for s in locs]
    v = glob.V
    for k in (1, 2):  # round 2 starts from W_i != V and Y_i != 0
        glob, server, locs, _, _ = run_round(F.ALGORITHM, cfg, k, 3, 2, glob, server, locs,
                                             blocks)
        ref = [_dense_client(u, w, y, v, b, cfg, 2) for (u, w, y), b in zip(ref, blocks,
                                                                           strict=True)]
        v = _dense_server([r[1] for r in ref], [r[2] for r in ref], cfg)
        np.testing.assert_allclose(glob.V, v, rtol=1e-12, atol=1e-12)
        for s, (u, w, y) in zip(locs, ref, strict=True):
            np.testing.assert_allclose(s.U, u, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(s.W, w, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(s.Y, y, rtol=1e-12, atol=1e-12)


def test_server_keeps_the_contribution_of_tenants_not_sampled():
    cfg = _plain_cfg("numpy")
    rng = np.random.default_rng(0)
    blocks = [b for _ in range(3) for b in _blocks()]  # six tenants
    server, glob, locs = initialise(F.ALGORITHM, cfg, blocks, seed=1)
    for k in range(1, 5):
        glob, server, locs, selected, _ = run_round(F.ALGORITHM, cfg, k, 1, 2, glob, server,
                                                    locs, blocks)
        assert len(selected) == 2
    # a tenant's local (W_i, Y_i) is its last upload, or (V^0, 0) if it never uploaded
    expected = _dense_server([s.W for s in locs], [s.Y for s in locs], cfg)
    np.testing.assert_allclose(glob.V, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(server.S, server.C.sum(axis=0), rtol=1e-12, atol=1e-9)
    assert rng is not None


def test_server_step_replaces_only_uploaders_and_leaves_state_untouched():
    cfg = _plain_cfg("numpy")
    state, glob = F.init_server(N_ITEMS, 3, cfg, np.random.default_rng(0))
    before = state.C.copy()
    w, y = np.full((RANK, N_ITEMS), 2.0), np.full((RANK, N_ITEMS), -0.5)
    new, glob2 = F.server_step(state, {1: F.Upload(W=w, Y=y)}, cfg, np.random.default_rng(0))
    np.testing.assert_array_equal(state.C, before)
    np.testing.assert_array_equal(new.C[0], before[0])
    np.testing.assert_array_equal(new.C[1], (cfg.beta * w + y).T)
    expected = (before[0] + before[2]).T + cfg.beta * w + y
    expected /= 3 * cfg.beta + cfg.gamma
    np.testing.assert_allclose(glob2.V, expected, rtol=1e-14)


@pytest.mark.parametrize("regulariser", ["l2", "l1"])
def test_item_bias_ridge_minimises_the_consensus_objective_on_the_bias_row(regulariser):
    """V from eq. (68) / (73) with the item-bias ridge w minimises, over V,
    sum_i [<Y_i, W_i - V> + beta/2 ||W_i - V||^2] + R(V) with R(V) = gamma ||V||_1 (l1) or
    gamma/2 ||V||^2 (l2), plus (w / 2p) ||c||^2 on the item-bias row c: checked by
    minimising that objective numerically, entry by entry (it is separable)."""
    from scipy.optimize import minimize_scalar

    rank, n, p, beta, gamma, w = 2, 5, 3, 0.4, 0.3, 6.0
    cfg = F.FedMCADMMConfig(rank=rank, regulariser=regulariser, beta=beta, gamma=gamma,
                            item_bias_ridge=w)
    rng = np.random.default_rng(4)
    ws, ys = rng.normal(size=(p, rank + 1, n)), rng.normal(size=(p, rank + 1, n))
    state, _ = F.init_server(n, p, cfg, rng)
    uploads = {i: F.Upload(W=ws[i], Y=ys[i]) for i in range(p)}
    _, glob = F.server_step(state, uploads, cfg, rng)
    for row in range(rank + 1):
        ridge = w / p if row == rank else 0.0
        for j in range(n):
            def f(x, row=row, j=j, ridge=ridge):
                pen = gamma * abs(x) if regulariser == "l1" else 0.5 * gamma * x * x
                return float(np.sum(ys[:, row, j] * (ws[:, row, j] - x))
                             + 0.5 * beta * np.sum((ws[:, row, j] - x) ** 2)
                             + pen + 0.5 * ridge * x * x)
            best = minimize_scalar(f, bounds=(-50, 50), method="bounded",
                                   options={"xatol": 1e-10}).x
            assert glob.V[row, j] == pytest.approx(best, abs=1e-6), (row, j)
    # the ridge shrinks the bias row only, towards 0
    _, plain = F.server_step(state, uploads, cfg.model_copy(update={"item_bias_ridge": 0.0}),
                             rng)
    np.testing.assert_array_equal(glob.V[:rank], plain.V[:rank])
    moved = plain.V[rank] != 0  # (l1 may have thresholded some to 0 already)
    assert moved.sum() >= 3
    assert np.all(np.abs(glob.V[rank][moved]) < np.abs(plain.V[rank][moved]))


def test_item_bias_ridge_is_part_of_the_objective():
    """The tenants' objectives sum to the federation's with (w / 2p) ||c||^2 in R(V)."""
    cfg = F.FedMCADMMConfig(rank=RANK, item_bias_ridge=0.0)
    blocks = _blocks()
    _, glob, locs = initialise(F.ALGORITHM, cfg, blocks, seed=3)
    glob = F.GlobalModel(V=glob.V + 0.5, n_clients=glob.n_clients)  # a non-zero bias row
    with_w = cfg.model_copy(update={"item_bias_ridge": 4.0})
    diff = sum(F.objective(glob, s, b, with_w) - F.objective(glob, s, b, cfg)
               for s, b in zip(locs, blocks, strict=True))
    assert diff == pytest.approx(0.5 * 4.0 / 2 * np.sum(glob.V[RANK] ** 2), rel=1e-12)


def test_soft_threshold_values():
    q = np.array([[-2.0, -0.5, 0.0], [0.25, 0.5, 3.0]])
    np.testing.assert_array_equal(K.soft_threshold(q, 0.5),
                                  [[-1.5, 0.0, 0.0], [0.0, 0.0, 2.5]])


def test_l1_server_step_sets_small_entries_to_zero():
    cfg = _plain_cfg("numpy", "l1").model_copy(update={"gamma": 1.0, "beta": 1.0})
    state, _ = F.init_server(2, 1, cfg, np.random.default_rng(0))
    w = np.array([[0.5, 3.0], [-2.0, 0.1]])
    _, glob = F.server_step(state, {0: F.Upload(W=w, Y=np.zeros_like(w))}, cfg,
                            np.random.default_rng(0))
    np.testing.assert_allclose(glob.V, [[0.0, 2.0], [-1.0, 0.0]])


def _random_block(rng, m=30, n=50, density=0.2):
    mask = rng.random((m, n)) < density
    mask[:, -3:] = False  # some unrated items
    rows, cols = np.nonzero(mask)
    return RatingBlock(rows, cols, rng.integers(1, 6, rows.shape[0]).astype(float), m, n)


@pytest.mark.skipif(not K.HAVE_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("regulariser", ["l2", "l1"])
@pytest.mark.parametrize("lipschitz", ["global", "blockwise", "diagonal"])
def test_fused_kernel_equals_plain_kernel(regulariser, lipschitz):
    rng = np.random.default_rng(11)
    block = _random_block(rng)
    out = []
    for kernel in ("numpy", "numba"):
        cfg = F.FedMCADMMConfig(rank=4, regulariser=regulariser, lam=0.5, gamma=0.1, beta=0.2,
                                lam_rating=0.03, gamma_rating=0.05, lipschitz=lipschitz,
                                kernel=kernel)
        glob = F.GlobalModel(V=rng.normal(size=(cfg.q_w, 50)) if not out else out[0][0],
                             n_clients=7)
        state = F.init_client(block, glob, cfg, np.random.default_rng(2))
        state = state.replace(Y=np.random.default_rng(3).normal(size=state.W.shape))
        s1, _ = F.client_step(glob, state, block, cfg, np.random.default_rng(0))
        s2, up = F.client_step(glob, s1, block, cfg, np.random.default_rng(0))
        out.append((glob.V, s2.U, up.W, up.Y))
    for a, b in zip(out[0][1:], out[1][1:], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("diagonal", [False, True])
def test_blockwise_lipschitz_against_dense_gram(diagonal):
    rng = np.random.default_rng(4)
    block = _random_block(rng, m=6, n=9, density=0.4)
    x = rng.normal(size=(9, 3))
    csr = block.csr
    _, omega = _dense(block)
    grams = [(x * omega[t][:, None]).T @ x for t in range(6)]
    if diagonal:  # Gershgorin: absolute row sums
        want = np.array([np.maximum(np.abs(g).sum(axis=1), 1e-4) for g in grams])
    else:
        want = np.array([[max(np.linalg.norm(g), 1e-4)] * 3 for g in grams])
    assert np.all(want[omega.sum(axis=1) == 0] == 1e-4)
    np.testing.assert_allclose(K.block_lipschitz(csr.indptr, csr.indices, x, 1e-4, diagonal),
                               want, rtol=1e-13)


def test_diagonal_bound_dominates_the_gram_matrix():
    """diag(L) - G must be positive semi-definite for the U-step to be a majoriser."""
    rng = np.random.default_rng(9)
    block = _random_block(rng, m=8, n=20, density=0.5)
    x = rng.normal(size=(20, 4)) + 0.5
    csr = block.csr
    lip = K.block_lipschitz(csr.indptr, csr.indices, x, 1e-4, True)
    for t, g in enumerate(K.block_gram(csr.indptr, csr.indices, x)):
        assert np.linalg.eigvalsh(np.diag(lip[t]) - g).min() > -1e-10


def test_factors_fold_in_biases_and_mean():
    rng = np.random.default_rng(6)
    cfg = F.FedMCADMMConfig(rank=3)
    u, v = rng.normal(size=(5, 4)), rng.normal(size=(4, 7))
    state = F.LocalState(U=u, W=v, Y=v, mean=3.5, rank=3)
    a, b = F.factors(F.GlobalModel(V=v, n_clients=2), state)
    want = u[:, :3] @ v[:3] + u[:, 3:4] + v[3:4] + 3.5
    np.testing.assert_allclose(a @ b, want, rtol=1e-13)
    assert cfg.q_u == cfg.q_w == 4


def test_user_bias_alone_learns_row_offsets():
    """Rank-1 data plus user offsets: the user-bias column must absorb them."""
    cfg = F.FedMCADMMConfig(rank=1, item_bias=False, centre="none", lam=1e-3, gamma=1e-3,
                            lam_rating=0.0, gamma_rating=0.0, beta=0.5)
    rng = np.random.default_rng(8)
    off = np.array([-1.0, 0.0, 2.0])
    full = np.outer(rng.uniform(1, 2, 3), rng.uniform(1, 2, 8)) + off[:, None]
    rows, cols = np.nonzero(np.ones((3, 8)))
    block = RatingBlock(rows, cols, full[rows, cols], 3, 8)
    res = simulate(F.ALGORITHM, cfg, _fed([block]), rounds=200, per_round=1, seed=0)
    a, b = F.factors(res.global_msg, res.local_states[0])
    np.testing.assert_allclose(a @ b, full, atol=0.05)


def _fed(blocks):
    from algorithms.data import Federation

    return Federation(blocks, blocks, [np.arange(b.n_users) for b in blocks],
                      np.arange(blocks[0].n_items), (1.0, 5.0))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("rank", 0, "rank must be at least 1"),
    ("inner_steps", 0, "inner_steps must be at least 1"),
    ("lam", -1.0, "lam, gamma, lam_rating, gamma_rating and item_bias_ridge must be"),
    ("item_bias_ridge", -0.1, "lam, gamma, lam_rating, gamma_rating and item_bias_ridge"),
    ("beta", 0.0, "beta, init_scale and lipschitz_floor must be positive"),
    ("lipschitz_floor", 0.0, "beta, init_scale and lipschitz_floor must be positive"),
])
def test_config_rejects_impossible_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        F.FedMCADMMConfig(**{field: value})


def test_paper_settings():
    cfg = F.FedMCADMMConfig.paper_settings()
    assert (cfg.rank, cfg.lam, cfg.gamma, cfg.inner_steps, cfg.beta) == (5, 1e-6, 1e-6, 10, 1e4)
    assert (cfg.init, cfg.init_scale, cfg.lipschitz) == ("uniform", 2e-4, "global")
    assert not cfg.user_bias and not cfg.item_bias and cfg.item_bias_ridge == 0.0
    assert F.FedMCADMMConfig.paper_settings(rank=50).rank == 50


@pytest.mark.data
def test_ml100k_short_run_reaches_bound():
    if data_dir() is None:
        pytest.skip("MovieLens data not found: set FEDREC_DATA_DIR to the shared data folder")
    fed = build_federation(load_movielens("ml-100k"), 100, 0)
    res = simulate(F.ALGORITHM, F.FedMCADMMConfig(), fed, rounds=30, per_round=10, seed=0,
                   evaluate_every=30)
    assert res.final.test_rmse < 0.965  # measured 0.9530 at round 30 (BENCHMARKS.md)


def test_without_numba_auto_falls_back_to_numpy(monkeypatch):
    monkeypatch.setattr(K, "HAVE_NUMBA", False)
    assert not F.FedMCADMMConfig().use_numba()
    with pytest.raises(ValueError, match="kernel='numba' needs numba installed"):
        F.FedMCADMMConfig(kernel="numba")


def test_client_step_refuses_a_block_that_does_not_match_its_state():
    import numpy as np
    import pytest

    from algorithms import RatingBlock, registry
    from algorithms.simulate import initialise

    alg = registry.get("fedmc-admm")
    cfg = alg.config(rank=2)
    block = RatingBlock([0, 1, 2], [0, 1, 2], [1.0, 2.0, 3.0], 3, 4)
    _, glob, (state,) = initialise(alg, cfg, [block], 0)
    other = RatingBlock([0, 4], [0, 1], [1.0, 2.0], 5, 4)
    with pytest.raises(ValueError, match=r"block of shape \(5, 4\) does not match U with 3"):
        alg.client_step(glob, state, other, cfg, np.random.default_rng(0))


@pytest.mark.skipif(not K.HAVE_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("lipschitz", ["blockwise", "diagonal"])
def test_u_step_on_rated_items_equals_the_catalogue_design(lipschitz):
    """The fused U-step reads W only on the tenant's rated items (a design of its rated
    columns, renumbered); the design over the whole catalogue gives the same U to the bit."""
    rng = np.random.default_rng(21)
    m, n = 7, 600
    rows = np.r_[np.arange(m), rng.integers(0, m, 25)]
    cols = rng.integers(0, n, rows.size)
    keep = np.unique(rows * n + cols, return_index=True)[1]
    block = RatingBlock(rows[keep], cols[keep], rng.integers(1, 6, keep.size).astype(float),
                        m, n, (1.0, 5.0))
    cfg = F.FedMCADMMConfig(rank=3, lipschitz=lipschitz)
    glob = F.GlobalModel(V=rng.normal(size=(cfg.q_w, n)), n_clients=5)
    state = F.init_client(block, glob, cfg, np.random.default_rng(2))
    got = F.u_update(state, block, cfg)
    csr = block.csr
    bt = F.u_design_t(state.W, cfg)
    mode, given = F._fused_lipschitz(bt, cfg)
    want = K.u_prox_steps_numba(csr.indptr, csr.indices,
                                F.u_target(csr.data, csr.indices, state.W, state.mean, cfg),
                                state.U, bt, mode, given, cfg.lipschitz_floor, cfg.lam, False,
                                cfg.inner_steps, lam_rating=cfg.lam_rating * state.ridge_scale)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [500, 12])
def test_entry_predictions_and_objective_equal_the_catalogue_factors(n):
    """Predictions gathered from the entries' rows and columns (fewer entries than items,
    n = 500; else from the full factors, n = 12) equal the product of the full factors to
    the bit; the objective equals the former formula (residuals from the full factors,
    item counts over the catalogue) to 1e-12, on another rating scale too."""
    from algorithms.base import predict

    rng = np.random.default_rng(22)
    m = 9
    rows, cols = rng.integers(0, m, 60), rng.integers(0, n, 60)
    keep = np.unique(rows * n + cols, return_index=True)[1]
    for scale in [(1.0, 5.0), (-10.0, 10.0)]:
        vals = rng.uniform(*scale, keep.size)
        block = RatingBlock(rows[keep], cols[keep], vals, m, n, scale)
        cfg = F.FedMCADMMConfig(rank=4)
        glob = F.GlobalModel(V=rng.normal(size=(cfg.q_w, n)), n_clients=3)
        state = F.init_client(block, glob, cfg, np.random.default_rng(1))
        state = state.replace(U=rng.normal(size=state.U.shape))
        a, b = F.factors(glob, state)
        np.testing.assert_array_equal(predict(F.ALGORITHM, glob, state, block.rows, block.cols),
                                      np.einsum("ij,ji->i", a[block.rows], b[:, block.cols]))
        nb = block.with_values(block.vals / state.scale_unit)
        a1, b1 = F.factors(glob, state.replace(scale_unit=1.0))
        e = K.observed_residual(a1, b1.T, nb.rows, nb.cols, nb.vals)
        n_u = np.bincount(nb.rows, minlength=m).astype(float)
        n_j = np.bincount(nb.cols, minlength=n).astype(float)
        ridge = 0.5 * state.ridge_scale
        reg = ridge * cfg.lam_rating * (n_u @ np.sum(state.U**2, axis=1))
        reg += ridge * cfg.gamma_rating * (n_j @ np.sum(glob.V**2, axis=0))
        want = (0.5 * e @ e + reg) / 3
        assert F.objective(glob, state, block, cfg) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n", [500, 12])
def test_objective_in_chunks_is_the_one_pass_objective_to_the_bit(n, monkeypatch):
    """The objective gathers factors ENTRY_CHUNK entries at a time (bounded memory on a
    large block): each entry's residual, and so the objective, is the same float as from
    one pass over all entries, on both gathering paths (entries < items, n = 500; else the
    full factors, n = 12)."""
    rng = np.random.default_rng(23)
    m = 9
    rows, cols = rng.integers(0, m, 60), rng.integers(0, n, 60)
    keep = np.unique(rows * n + cols, return_index=True)[1]
    block = RatingBlock(rows[keep], cols[keep], rng.uniform(1, 5, keep.size), m, n)
    cfg = F.FedMCADMMConfig(rank=4)
    glob = F.GlobalModel(V=rng.normal(size=(cfg.q_w, n)), n_clients=3)
    state = F.init_client(block, glob, cfg, np.random.default_rng(1))
    state = state.replace(U=rng.normal(size=state.U.shape))
    whole = F._entry_errors(glob, state, block)
    one_pass = F.objective(glob, state, block, cfg)
    monkeypatch.setattr(F, "ENTRY_CHUNK", 7)
    np.testing.assert_array_equal(F._entry_errors(glob, state, block), whole)
    assert F.objective(glob, state, block, cfg) == one_pass
    a, b = F._entry_factors(glob, state, block.rows, block.cols)
    np.testing.assert_array_equal(whole, np.einsum("ij,ji->i", a, b) - block.vals)
