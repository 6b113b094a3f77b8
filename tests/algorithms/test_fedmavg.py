"""FedMAvg (algorithms/fedmavg.py) against direct dense evaluations of its update rules."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from algorithms import RatingBlock, messages_equal
from algorithms import fedmavg as fm
from algorithms.data import Federation
from algorithms.simulate import initialise, run_round, simulate


def _block(seed: int = 0, m: int = 4, n: int = 6, density: float = 0.6) -> RatingBlock:
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    mask[0, 0] = True
    rows, cols = np.nonzero(mask)
    vals = rng.integers(1, 6, size=rows.size).astype(float)
    return RatingBlock(rows, cols, vals, m, n)


def _dense(block: RatingBlock) -> tuple[np.ndarray, np.ndarray]:
    m = np.zeros(block.shape)
    mask = np.zeros(block.shape)
    m[block.rows, block.cols] = block.vals
    mask[block.rows, block.cols] = 1.0
    return m, mask


def _dense_u_step(u, v, m, mask, lam_rows, offset):
    c = np.linalg.eigvalsh(v @ v.T).max() + lam_rows[:, None]  # a step per user row
    return u - ((mask * (u @ v + offset - m)) @ v.T + lam_rows[:, None] * u) / c


def _dense_w_step(u, w, m, mask, gamma_cols, d_factor, scale, offset):
    d = d_factor * np.linalg.eigvalsh(u.T @ u).max() + gamma_cols[None, :]  # per item
    return w - (scale * u.T @ (mask * (u @ w + offset - m)) + w * gamma_cols[None, :]) / d


@pytest.mark.parametrize("steps", [1, 3])
def test_u_steps_match_dense_gradient_steps(steps):
    block = _block()
    m, mask = _dense(block)
    rng = np.random.default_rng(1)
    u, v = rng.normal(size=(4, 2)), rng.normal(size=(2, 6))
    lam_rows = np.array([0.1, 0.4, 0.2, 0.3])
    expected = u
    for _ in range(steps):
        expected = _dense_u_step(expected, v, m, mask, lam_rows, 0.5)
    got = fm.u_steps(u, v, block, steps, lam_rows, 1.0, offset=0.5)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_w_steps_restart_from_v_and_match_dense_steps():
    block = _block(2)
    m, mask = _dense(block)
    rng = np.random.default_rng(3)
    u, v = rng.normal(size=(4, 2)), rng.normal(size=(2, 6))
    gamma_cols = np.linspace(0.0, 0.5, 6)
    expected = v
    for _ in range(4):
        expected = _dense_w_step(u, expected, m, mask, gamma_cols, 5.0, 0.25, -0.3)
    got = fm.w_steps(u, v, block, 4, gamma_cols, 5.0, 0.25, offset=-0.3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_penalties_per_rating_are_local_counts_times_weights():
    block = _block(4)
    _, mask = _dense(block)
    cfg = fm.FedMAvgConfig(lam=0.5, gamma=0.25, reg="per_rating")
    lam_rows, gamma_cols = fm.penalties(block, cfg)
    # the tenant's rating variance over MovieLens', shrunk toward 1 by a prior worth 200
    # ratings (algorithms.scale.ridge_scale_of)
    ridge = (np.var(block.vals) / 1.1257**2) ** (block.nnz / (block.nnz + 200))
    np.testing.assert_allclose(lam_rows, ridge * 0.5 * mask.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(gamma_cols, ridge * 0.25 * mask.sum(axis=0), rtol=1e-12)
    plain = fm.penalties(block, cfg.model_copy(update={"reg": "plain"}))
    np.testing.assert_array_equal(plain[0], np.full(4, 0.5))
    np.testing.assert_array_equal(plain[1], np.full(6, 0.25))


@pytest.mark.parametrize("reg", ["plain", "per_rating"])
def test_objective_share_matches_dense_evaluation(reg):
    block = _block(5)
    m, mask = _dense(block)
    rng = np.random.default_rng(6)
    u, v = rng.normal(size=(4, 3)), rng.normal(size=(3, 6))
    cfg = fm.FedMAvgConfig(rank=3, lam=0.3, gamma=0.7, reg=reg)
    loss = 0.5 * np.sum((mask * (u @ v + 3.0 - m)) ** 2)
    if reg == "plain":
        expected = loss + 0.15 * np.sum(u * u) + 0.35 * np.sum(v * v) / 5
    else:
        ridge = (np.var(block.vals) / 1.1257**2) ** (block.nnz / (block.nnz + 200))
        expected = loss + ridge * (0.15 * mask.sum(1) @ np.sum(u * u, 1)
                                   + 0.35 * mask.sum(0) @ np.sum(v * v, 0))
    got = fm.local_objective(u, v, block, cfg, n_clients=5, offset=3.0)
    assert got == pytest.approx(expected, rel=1e-12)


def test_diminishing_q2_schedule():
    cfg = fm.FedMAvgConfig(q_hat=10)
    assert [fm.q2_schedule(k, cfg) for k in (1, 2, 3, 5, 10, 11, 50)] == [11, 6, 4, 3, 2, 1, 1]
    assert fm.q2_schedule(7, fm.FedMAvgConfig(q2=4)) == 4


def _federation(n_clients: int = 5) -> Federation:
    blocks = [_block(10 + i, m=3 + i % 2, n=6, density=0.7) for i in range(n_clients)]
    return Federation(blocks, blocks, [np.arange(b.n_users) for b in blocks], np.arange(6),
                      (1.0, 5.0))


def test_client_step_is_q1_u_steps_then_q2_w_steps_from_v():
    """Upload of one client = dense Q1 U-steps against V^k, then dense Q2 W-steps from V^k."""
    cfg = fm.paper_settings(rank=2).model_copy(update={"q1": 3, "q2": 2})
    fed = _federation()
    server, glob, locs = initialise(fm.ALGORITHM, cfg, fed.train, 0)
    block = fed.train[1]
    m, mask = _dense(block)
    lam_rows, gamma_cols = fm.penalties(block, cfg)
    u = locs[1].u
    for _ in range(3):
        u = _dense_u_step(u, glob.v, m, mask, lam_rows, 0.0)
    w = glob.v
    for _ in range(2):
        w = _dense_w_step(u, w, m, mask, gamma_cols, 5.0, 1.0 / 5, 0.0)  # W grad / p
    new_local, up = fm.client_step(glob, locs[1], block, cfg, np.random.default_rng(0))
    np.testing.assert_allclose(new_local.u, u, rtol=1e-10)
    np.testing.assert_allclose(up.w, w, rtol=1e-10)
    assert up.ticket == locs[1].ticket


def test_server_averages_uploads_and_pcc_has_exactly_m_uploaders():
    cfg = fm.FedMAvgConfig(rank=2, participation="pcc", uploads_per_round=2, aggregate="mean")
    fed = _federation(5)
    server, glob, locs = initialise(fm.ALGORITHM, cfg, fed.train, 0)
    glob, server, new_locs, selected, uploads = run_round(fm.ALGORITHM, cfg, 1, 0, 2, glob,
                                                          server, locs, fed.train)
    assert len(selected) == 5 and sorted(uploads) == [0, 1, 2, 3, 4]  # A^0: everybody
    np.testing.assert_allclose(glob.v, np.mean([u.w for u in uploads.values()], axis=0))
    assert glob.upload_tickets.size == 2
    locs = new_locs
    for k in range(2, 5):
        glob, server, new_locs, selected, uploads = run_round(fm.ALGORITHM, cfg, k, 0, 2, glob,
                                                              server, locs, fed.train)
        assert len(selected) == 5 and len(uploads) == 2
        # every tenant updated U_i (partial communication, not partial participation)
        assert all(not np.array_equal(a.u, b.u) for a, b in zip(locs, new_locs, strict=True))
        np.testing.assert_allclose(glob.v, np.mean([u.w for u in uploads.values()], axis=0))
        locs = new_locs


def test_pcp_runs_only_the_sampled_clients():
    cfg = fm.FedMAvgConfig(rank=2, participation="pcp")
    fed = _federation(5)
    server, glob, locs = initialise(fm.ALGORITHM, cfg, fed.train, 0)
    glob, server, new_locs, selected, uploads = run_round(fm.ALGORITHM, cfg, 1, 0, 2, glob,
                                                          server, locs, fed.train)
    assert len(selected) == 2 and sorted(uploads) == sorted(int(i) for i in selected)
    untouched = [i for i in range(5) if i not in uploads]
    assert all(messages_equal(locs[i], new_locs[i]) for i in untouched)


def test_row_curvature_is_lambda_max_of_each_rows_own_gram():
    block = _block(4, m=5, n=7)
    _, mask = _dense(block)
    v = np.random.default_rng(5).normal(size=(3, 7))
    got = fm.row_curvature(v, block.rows, block.cols, block.n_users)
    for t in range(5):
        rated = v[:, mask[t] > 0]
        assert got[t] == pytest.approx(np.linalg.eigvalsh(rated @ rated.T).max(), rel=1e-10)


def test_row_curvature_decomposes_only_the_rows_with_ratings(monkeypatch):
    """A tenant that rated 3 items of a 5,000-item catalogue: at most 3 small
    decompositions per step, not 5,000 (each client step cost the catalogue's size), and
    the same values as decomposing every row (a row without ratings has curvature 0).
    Item 7 has 3 ratings (q = 3: its 3 x 3 Gram matrix); 4021 has 2 and 999 one (a closed
    form each, no decomposition)."""
    rng = np.random.default_rng(2)
    n, items = 5000, np.array([7, 4021, 7, 999, 4021, 7])
    u = rng.normal(size=(3, 6))
    calls = []
    eigvalsh = np.linalg.eigvalsh
    monkeypatch.setattr(np.linalg, "eigvalsh", lambda a: calls.append(a.shape) or eigvalsh(a))
    got = fm.row_curvature(u, items, np.arange(6), n)
    assert calls == [(1, 3, 3)]
    want = np.zeros(n)
    for j in (7, 999, 4021):
        x = u[:, items == j]
        want[j] = eigvalsh(x @ x.T)[-1]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.count_nonzero(got) == 3


def test_local_curvature_steps_with_bias_columns_match_dense_steps():
    block = _block(6)
    m, mask = _dense(block)
    rng = np.random.default_rng(7)
    u = np.hstack([rng.normal(size=(4, 2)), rng.normal(size=(4, 1)), np.ones((4, 1))])
    v = np.vstack([rng.normal(size=(2, 6)), np.ones((1, 6)), rng.normal(size=(1, 6))])
    cfg = fm.FedMAvgConfig(rank=2)
    u_free, v_free = fm.bias_masks(cfg)
    lam_rows, gamma_cols = np.full(4, 0.3), np.full(6, 0.2)
    # dense: row t's step bound is lambda_max over the items it rated of the rows of V
    # paired with U's free columns (b_u pairs with the ones row of V)
    vf = v * u_free[:, None]
    c = np.array([np.linalg.eigvalsh((vf * mask[t]) @ (vf * mask[t]).T).max()
                  for t in range(4)]) + lam_rows
    exp_u = u - u_free * ((mask * (u @ v + 0.5 - m)) @ v.T + lam_rows[:, None] * u) / c[:, None]
    got_u = fm.u_steps(u, v, block, 1, lam_rows, 1.0, 0.5, u_free, local=True)
    np.testing.assert_allclose(got_u, exp_u, rtol=1e-10)
    assert np.all(got_u[:, -1] == 1.0)  # the ones paired with the item biases stay put
    uf = got_u * v_free[None, :]
    d = 0.5 * np.array([np.linalg.eigvalsh((uf.T * mask[:, j]) @ (uf.T * mask[:, j]).T).max()
                        for j in range(6)]) + gamma_cols
    exp_w = v - v_free[:, None] * (got_u.T @ (mask * (got_u @ v + 0.5 - m))
                                   + v * gamma_cols) / d[None, :]
    got_w = fm.w_steps(got_u, v, block, 1, gamma_cols, 0.5, 1.0, 0.5, v_free, local=True)
    np.testing.assert_allclose(got_w, exp_w, rtol=1e-10)
    assert np.all(got_w[2] == 1.0)  # the ones paired with the user biases stay put


def test_item_bias_ridge_adds_a_fixed_weight_to_the_bias_of_rated_items_only():
    """The client's W step with ``item_bias_ridge`` w: the item-bias row (the last) gets
    gamma n_j + w on every item the tenant rated (0 + 0 on an unrated item, whose column
    must not move), in the gradient and in that entry's step bound; dense reference."""
    block = _block(6)
    block = RatingBlock(block.rows[block.cols != 5], block.cols[block.cols != 5],
                        block.vals[block.cols != 5], 4, 6)  # item 5 unrated
    m, mask = _dense(block)
    rng = np.random.default_rng(7)
    u = np.hstack([rng.normal(size=(4, 2)), rng.normal(size=(4, 1)), np.ones((4, 1))])
    v = np.vstack([rng.normal(size=(2, 6)), np.ones((1, 6)), rng.normal(size=(1, 6))])
    cfg = fm.FedMAvgConfig(rank=2, item_bias_ridge=3.0)
    _, v_free = fm.bias_masks(cfg)
    gamma_cols = 0.2 * mask.sum(axis=0)
    pen = fm.item_penalties(block, cfg, gamma_cols, 4)
    rated = mask.sum(axis=0) > 0
    np.testing.assert_array_equal(pen[:3], np.repeat(gamma_cols[None], 3, axis=0))
    np.testing.assert_array_equal(pen[3], gamma_cols + 3.0 * rated)
    assert pen[3, 5] == 0.0
    uf = u * v_free[None, :]
    lmax = np.array([np.linalg.eigvalsh((uf.T * mask[:, j]) @ (uf.T * mask[:, j]).T).max()
                     for j in range(6)])
    gam = np.repeat(gamma_cols[None], 4, axis=0)
    gam[3] += 3.0 * rated
    d = 0.5 * lmax[None, :] + gam
    d = np.where(d > 0, d, 1.0)
    exp_w = v - v_free[:, None] * (u.T @ (mask * (u @ v + 0.5 - m)) + v * gam) / d
    got_w = fm.w_steps(u, v, block, 1, pen, 0.5, 1.0, 0.5, v_free, local=True)
    np.testing.assert_allclose(got_w, exp_w, rtol=1e-10)
    np.testing.assert_array_equal(got_w[:, 5], v[:, 5])  # unrated: unchanged
    # and the tenant's objective carries w/2 c_j^2 for each rated item j
    plain = cfg.model_copy(update={"item_bias_ridge": 0.0})
    diff = fm.local_objective(u, v, block, cfg, 3, 0.5) - \
        fm.local_objective(u, v, block, plain, 3, 0.5)
    assert diff == pytest.approx(0.5 * 3.0 * np.sum(v[3, rated] ** 2), rel=1e-12)


def test_default_predictions_are_mean_plus_biases_plus_factors():
    fed = _federation(3)
    cfg = fm.FedMAvgConfig(rank=2)
    res = simulate(fm.ALGORITHM, cfg, fed, rounds=3, per_round=3, seed=0, evaluate_every=3)
    glob, local = res.global_msg, res.local_states[0]
    assert glob.v.shape == (4, fed.train[0].n_items) and np.all(glob.v[2] == 1.0)
    u, b_u = local.u[:, :2], local.u[:, 2]
    v, b_i = glob.v[:2], glob.v[3]
    assert np.any(b_u != 0) and np.any(b_i != 0)
    a, b = fm.factors(glob, local)
    np.testing.assert_allclose(a @ b, local.mean + u @ v + b_u[:, None] + b_i[None, :],
                               rtol=1e-12)


def test_rater_average_takes_each_item_from_the_tenants_that_moved_it():
    v = np.arange(6.0).reshape(2, 3)
    w1, w2 = v.copy(), v.copy()
    w1[:, 0] += 1.0            # item 0 moved by tenant 1 only
    w1[:, 1] += 2.0
    w2[:, 1] += 4.0            # item 1 by both; item 2 by nobody
    got = fm.average_raters([w1, w2], v)
    np.testing.assert_allclose(got[:, 0], v[:, 0] + 1.0)
    np.testing.assert_allclose(got[:, 1], v[:, 1] + 3.0)
    np.testing.assert_allclose(got[:, 2], v[:, 2])
    np.testing.assert_allclose(fm.average([w1, w2])[:, 0], v[:, 0] + 0.5)  # eq. 9's mean


def test_fedmavg_fits_a_low_rank_federation():
    rng = np.random.default_rng(0)
    full = rng.uniform(0.5, 1.5, (30, 2)) @ rng.uniform(0.5, 1.5, (2, 12))
    blocks, tests = [], []
    for t in range(3):
        obs = rng.random((10, 12)) < 0.7
        r, c = np.nonzero(obs)
        blocks.append(RatingBlock(r, c, full[10 * t:10 * t + 10][r, c], 10, 12))
        r, c = np.nonzero(~obs)
        tests.append(RatingBlock(r, c, full[10 * t:10 * t + 10][r, c], 10, 12))
    fed = Federation(blocks, tests, [np.arange(10)] * 3, np.arange(12), (0.0, 10.0))
    cfg = fm.FedMAvgConfig(rank=2, lam=1e-4, gamma=1e-4, center=False, d_factor=1.0)
    res = simulate(fm.ALGORITHM, cfg, fed, rounds=120, per_round=3, seed=0,
                   evaluate_every=120)
    assert res.final.test_rmse < 0.05 * full.std()


def test_config_rejects_impossible_values():
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        fm.FedMAvgConfig(q1=0)
    with pytest.raises(ValidationError, match="Input should be 'pcc' or 'pcp'"):
        fm.FedMAvgConfig(participation="all")


def test_lambda_max_names_divergence_instead_of_a_linalg_error():
    import numpy as np
    import pytest

    from algorithms.fedmavg import lambda_max

    assert lambda_max(np.array([[3.0, 0.0], [0.0, 4.0]])) == pytest.approx(16.0)
    with pytest.raises(ValueError, match="training diverged"):
        lambda_max(np.array([[np.inf, 0.0], [0.0, 1.0]]))


def _curvature_by_gram(other, rows, cols, n_rows):
    """The previous formula: every rated row's q x q Gram matrix, decomposed."""
    from algorithms.centralised import gram_sums

    present, local = np.unique(rows, return_inverse=True)
    gram = gram_sums(local, np.ascontiguousarray(other[:, cols].T), present.size)
    out = np.zeros(n_rows)
    out[present] = np.linalg.eigvalsh(gram)[:, -1]
    return out


@pytest.mark.parametrize("q", [2, 3, 5, 12])
def test_row_curvature_by_rating_count_equals_the_gram_decomposition(q):
    """Rows with 1, 2, 3 .. q - 1 ratings take ||o||^2, a 2 x 2 root or a k x k
    decomposition of their ratings' inner products, rows with q or more their q x q Gram
    matrix: lambda_max to 1e-12 of the decomposition of every row's Gram matrix, also with
    a masked (zero) coordinate, entries of very different sizes and unrated rows."""
    rng = np.random.default_rng(q)
    n_rows, n_other = 400, 300
    other = rng.normal(size=(q, n_other)) * rng.choice([1e-3, 1.0, 40.0], size=(1, n_other))
    other[-1] = 0.0  # a fixed column, as the bias masks make
    counts = np.r_[np.arange(0, 2 * q + 2), rng.integers(0, 4, n_rows - 2 * q - 2)]
    rows = rng.permutation(np.repeat(np.arange(n_rows), counts))
    cols = rng.integers(0, n_other, rows.size)
    got = fm.row_curvature(other, rows, cols, n_rows)
    want = _curvature_by_gram(other, rows, cols, n_rows)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.all(got[counts == 0] == 0) and np.all(got[counts > 0] > 0)


def test_rater_average_equals_the_stacked_sum_to_the_bit():
    """Uploads added one by one (moved columns only) equal the former formula, a sum over
    the stacked uploads, bit for bit."""
    rng = np.random.default_rng(8)
    v = rng.normal(size=(4, 300))
    ws = []
    for _ in range(7):
        w = v.copy()
        moved = rng.random(300) < 0.3
        w[:, moved] += rng.normal(size=(4, int(moved.sum()))) * 1e3 ** rng.random()
        ws.append(w)
    stack = np.stack(ws)
    moved = np.any(stack != v[None], axis=1)
    count = moved.sum(axis=0)
    want = np.where(count > 0, np.einsum("ikn,in->kn", stack, moved) / np.maximum(count, 1), v)
    np.testing.assert_array_equal(fm.average_raters(ws, v), want)


@pytest.mark.parametrize("item_bias_ridge", [0.0, 2.0])
def test_client_step_on_rated_items_equals_steps_over_the_catalogue(item_bias_ridge):
    """The default client step runs its steps on the tenant's rated items only; the same
    steps over the whole catalogue (unrated columns stay at V^k) give the same U_i and W_i
    to the bit. A sparse tenant: 5 users, 12 ratings of a 400-item catalogue."""
    cfg = fm.FedMAvgConfig(rank=3, q1=4, item_bias_ridge=item_bias_ridge)
    rng = np.random.default_rng(11)
    rows = np.r_[np.arange(5), rng.integers(0, 5, 7)]
    cols = np.r_[rng.choice(400, 5, replace=False), rng.choice(400, 7, replace=False)]
    keep = np.unique(rows * 400 + cols, return_index=True)[1]
    block = RatingBlock(rows[keep], cols[keep], rng.integers(1, 6, keep.size).astype(float),
                        5, 400, (1.0, 5.0))
    server, glob, locs = initialise(fm.ALGORITHM, cfg, [block], 0)
    glob = glob.replace(v=glob.v + 0.1 * rng.normal(size=glob.v.shape))
    new_local, up = fm.client_step(glob, locs[0], block, cfg, np.random.default_rng(0))
    lam_rows, gamma_cols = fm.penalties(block, cfg)
    u_free, v_free = fm.bias_masks(cfg)
    u = fm.u_steps(locs[0].u, glob.v, block, 4, lam_rows, cfg.c_factor, locs[0].mean, u_free,
                   True)
    gamma_w = fm.item_penalties(block, cfg, gamma_cols, glob.v.shape[0])
    w = fm.w_steps(u, glob.v, block, 1, gamma_w, cfg.d_factor, 1.0, locs[0].mean, v_free, True)
    np.testing.assert_array_equal(new_local.u, u)
    np.testing.assert_array_equal(up.w, w)
    unrated = np.setdiff1d(np.arange(400), block.cols)
    np.testing.assert_array_equal(up.w[:, unrated], glob.v[:, unrated])


@pytest.mark.parametrize("reg", ["per_rating", "plain"])
@pytest.mark.parametrize("n", [300, 10])
def test_entry_predictions_and_objective_equal_the_catalogue_formulas(reg, n):
    """Predictions from the entries' rows and columns (n = 300; with more entries than
    items, n = 10, from the full factors) equal the product of the gathered full factors
    to the bit; the per-rating objective, evaluated on the rated items only, equals the
    catalogue formula to 1e-12 (bias ridge on: its term too)."""
    from algorithms.base import predict

    cfg = fm.FedMAvgConfig(rank=3, reg=reg, item_bias_ridge=1.5)
    rng = np.random.default_rng(12)
    rows, cols = rng.integers(0, 6, 40), rng.integers(0, n, 40)
    keep = np.unique(rows * n + cols, return_index=True)[1]
    block = RatingBlock(rows[keep], cols[keep], rng.uniform(-10, 10, keep.size), 6, n,
                        (-10.0, 10.0))
    server, glob, locs = initialise(fm.ALGORITHM, cfg, [block], 0)
    glob = glob.replace(v=glob.v + rng.normal(size=glob.v.shape))
    local = locs[0].replace(u=locs[0].u + rng.normal(size=locs[0].u.shape))
    a, b = fm.factors(glob, local)
    np.testing.assert_array_equal(predict(fm.ALGORITHM, glob, local, block.rows, block.cols),
                                  np.einsum("ij,ji->i", a[block.rows], b[:, block.cols]))
    nb = block.with_values(block.vals / local.scale_unit)
    u, v = local.u, glob.v
    res = fm.residual_matrix(u, v, nb, local.mean).data
    lam_rows, gamma_cols = fm.penalties(nb, cfg)
    u_free, v_free = fm.bias_masks(cfg)
    u, v = u * u_free[None, :], v * v_free[:, None]
    r_b = np.sum(fm.item_penalties(nb, cfg, np.zeros(n), v.shape[0]) * v * v)
    v_sq = np.sum(v * v, axis=0)
    r_v = cfg.gamma * v_sq.sum() / 1 if reg == "plain" else gamma_cols @ v_sq
    want = 0.5 * res @ res + 0.5 * lam_rows @ np.sum(u * u, axis=1) + 0.5 * (r_v + r_b)
    assert fm.objective(glob, local, block, cfg) == pytest.approx(want, rel=1e-12)
