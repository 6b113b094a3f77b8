"""DPALS update rules against an independent dense computation, and its per-user bounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from algorithms import Message, RatingBlock, messages_equal
from algorithms import dpals as D
from algorithms._centre import with_centre

M, N = 7, 5


def _block(seed: int = 0, density: float = 0.7) -> tuple[RatingBlock, np.ndarray, np.ndarray]:
    """A tiny block with ratings on a 1..5 scale; returns (block, dense ratings, mask)."""
    rng = np.random.default_rng(seed)
    full = rng.uniform(1.0, 5.0, size=(M, N))
    mask = rng.random((M, N)) < density
    mask[np.arange(M), np.arange(M) % N] = True  # every user rates something
    rows, cols = np.nonzero(mask)
    return RatingBlock(rows, cols, full[rows, cols], M, N), full, mask


# no cap, no clip active: the step is exact ALS
EXACT = dict(rank=2, max_ratings_per_user=10_000, user_factor_clip=1e6, rating_clip=1e6,
             lam_u=0.3, lam_v=0.7, noise_reg=0.0, bias_coordinate=1.3, max_weight=1.0,
             gram_shrink=0.0, lam_v_count=0.0)


def _dense_user_solve(v, full, mask, cfg):
    """Loop over users: ridge on [v_j, 1] with target r - mu - c beta_j (ridge lam_u on
    the factor, lam_bias on the bias); a user with fewer than ``factor_min_ratings``
    ratings: the bias alone."""
    out = np.zeros((M, cfg.rank + 1))
    for u in range(M):
        js = np.nonzero(mask[u])[0]
        y = np.hstack([v[: cfg.rank, js].T, np.ones((len(js), 1))])
        t = full[u, js] - cfg.mu - cfg.bias_coordinate * v[cfg.rank, js]
        ridge = np.diag([cfg.lam_u] * cfg.rank + [cfg.lam_bias])
        if len(js) < cfg.factor_min_ratings:
            out[u, cfg.rank] = t.sum() / (len(js) + cfg.lam_bias)
        else:
            out[u] = np.linalg.solve(y.T @ y + ridge, y.T @ t)
    return out


def _dense_item_solve(u, full, mask, cfg):
    """Loop over items: ridge on x_u = [u_u, c] with target r - mu - b_u."""
    v = np.zeros((cfg.d, N))
    x = np.hstack([u[:, : cfg.rank], np.full((M, 1), cfg.bias_coordinate)])
    for j in range(N):
        us = np.nonzero(mask[:, j])[0]
        t = full[us, j] - cfg.mu - u[us, cfg.rank]
        v[:, j] = np.linalg.solve(x[us].T @ x[us] + cfg.lam_v * np.eye(cfg.d), x[us].T @ t)
    return v


def test_one_sweep_is_the_exact_als_update_of_a_dense_computation():
    cfg = D.DPALSConfig(**EXACT)
    block, full, mask = _block()
    server, glob = D.init_server(N, 1, cfg, np.random.default_rng(1))
    state = D.init_client(block, glob, cfg, np.random.default_rng(2))
    state, up = D.client_step(glob, state, block, cfg, np.random.default_rng(3))
    u_ref = _dense_user_solve(glob.V, full, mask, cfg)
    np.testing.assert_allclose(state.U, u_ref, rtol=1e-10, atol=1e-12)
    _, glob2 = D.server_step(server, {0: up}, cfg, np.random.default_rng(4))
    np.testing.assert_allclose(glob2.V, _dense_item_solve(u_ref, full, mask, cfg),
                               rtol=1e-10, atol=1e-12)
    assert glob2.sweep == 1


def test_uploads_of_two_tenants_sum_to_the_upload_of_their_union():
    cfg = D.DPALSConfig(**EXACT)
    block, full, mask = _block()
    half = block.rows < 3
    parts = [RatingBlock(block.rows[h] - (0 if k == 0 else 3), block.cols[h], block.vals[h],
                         3 if k == 0 else M - 3, N) for k, h in enumerate([half, ~half])]
    _, glob = D.init_server(N, 2, cfg, np.random.default_rng(1))
    whole = D.client_step(glob, D.init_client(block, glob, cfg, np.random.default_rng(0)),
                          block, cfg, np.random.default_rng(0))[1]
    ups = [D.client_step(glob, D.init_client(p, glob, cfg, np.random.default_rng(0)), p, cfg,
                         np.random.default_rng(0))[1] for p in parts]
    np.testing.assert_allclose(ups[0].A + ups[1].A, whole.A, atol=1e-12)
    np.testing.assert_allclose(ups[0].b + ups[1].b, whole.b, atol=1e-12)
    # the bias coordinate's square counts the raters of each item
    np.testing.assert_allclose(whole.A[:, -1, -1], cfg.bias_coordinate ** 2 * mask.sum(0))


def test_cap_keeps_at_most_k_ratings_per_user_at_random():
    rows = np.repeat(np.arange(4), [1, 5, 9, 3]).astype(np.int32)
    keep = D.cap_per_user(rows, 4, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(np.bincount(rows[keep], minlength=4), [1, 3, 3, 3])
    other = D.cap_per_user(rows, 4, 3, np.random.default_rng(1))
    assert not np.array_equal(keep, other)
    np.testing.assert_array_equal(keep, D.cap_per_user(rows, 4, 3, np.random.default_rng(0)))


def test_bounds_hold_in_every_upload_term():
    cfg = D.DPALSConfig(rank=3, max_ratings_per_user=2, user_factor_clip=0.5, rating_clip=0.8,
                        lam_u=1e-3)
    block, _, _ = _block(5, density=0.9)
    _, glob = D.init_server(N, 1, cfg, np.random.default_rng(0))
    state = D.init_client(block, glob, cfg, np.random.default_rng(0))
    u = D.solve_users(glob.V, block, cfg)
    x = D.user_vectors(u * 100, cfg)  # scaled up so that every factor is clipped
    assert np.all(np.linalg.norm(x, axis=1) <= cfg.x_norm + 1e-12)
    a, b = D.item_sums(u * 100, state.keep, block, cfg)
    assert a[:, -1, -1].sum() == pytest.approx(cfg.bias_coordinate ** 2 * min(2, N) * M)
    # |b_j| <= (number of raters of j) * rating_clip * x_norm
    raters = a[:, -1, -1] / cfg.bias_coordinate ** 2
    assert np.all(np.linalg.norm(b, axis=1) <= raters * cfg.r_clip * cfg.x_norm + 1e-9)


def test_psd_projection_clips_negative_eigenvalues_only():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    a = q @ np.diag([2.0, 1.0, -0.5, -3.0]) @ q.T
    out = D.psd_project(a[None])[0]
    np.testing.assert_allclose(np.linalg.eigvalsh(out), [0, 0, 1, 2], atol=1e-12)
    np.testing.assert_allclose(out, q @ np.diag([2.0, 1.0, 0, 0]) @ q.T, atol=1e-12)


def test_final_round_refreshes_users_without_uploading():
    cfg = D.DPALSConfig(**{**EXACT, "sweeps": 1})
    block, full, mask = _block()
    server, glob = D.init_server(N, 1, cfg, np.random.default_rng(1))
    state = D.init_client(block, glob, cfg, np.random.default_rng(2))
    state, up = D.client_step(glob, state, block, cfg, np.random.default_rng(3))
    server, glob = D.server_step(server, {0: up}, cfg, np.random.default_rng(4))
    state, up = D.client_step(glob, state, block, cfg, np.random.default_rng(3))
    assert up is None
    # the users are re-solved around the centre released with the sweep
    assert glob.centre is not None and state.mu == glob.centre
    np.testing.assert_allclose(state.U, _dense_user_solve(
        glob.V, full, mask, with_centre(cfg, glob.centre)), atol=1e-12)
    server2, glob2 = D.server_step(server, {}, cfg, np.random.default_rng(4))
    assert messages_equal(glob2, glob) and glob2.sweep == 1


def test_factors_reproduce_the_model_prediction():
    cfg = D.DPALSConfig(**EXACT)
    block, _, _ = _block()
    _, glob = D.init_server(N, 1, cfg, np.random.default_rng(1))
    state = D.client_step(glob, D.init_client(block, glob, cfg, np.random.default_rng(2)),
                          block, cfg, np.random.default_rng(3))[0]
    a, b = D.factors(glob, state)
    u, v, c = state.U, glob.V, cfg.bias_coordinate
    expect = u[:, :2] @ v[:2] + c * v[2][None] + u[:, 2:3] + cfg.mu
    np.testing.assert_allclose(a @ b, expect, atol=1e-12)


def test_messages_round_trip_and_steps_are_deterministic():
    cfg = D.DPALSConfig(rank=2)
    block, _, _ = _block()
    server, glob = D.init_server(N, 1, cfg, np.random.default_rng(1))
    state = D.init_client(block, glob, cfg, np.random.default_rng(2))
    s1, up1 = D.client_step(glob, state, block, cfg, np.random.default_rng(3))
    s2, up2 = D.client_step(glob, state, block, cfg, np.random.default_rng(9))
    assert messages_equal(s1, s2) and messages_equal(up1, up2)
    noisy = up1.replace(gram_noise=0.25, rhs_noise=0.5)
    for msg in (server, glob, state, s1, noisy):
        assert messages_equal(Message.from_bytes(msg.to_bytes()), msg)


@pytest.mark.parametrize("field,value,match", [
    ("rank", 0, "rank must be at least 1"),
    ("sweeps", 0, "sweeps must be at least 1"),
    ("max_ratings_per_user", 0, "max_ratings_per_user must be at least 1"),
    ("user_factor_clip", 0.0, "user_factor_clip must be positive"),
    ("rating_clip", -1.0, "rating_clip must be positive"),
    ("scale_max", 1.0, "scale_max must exceed scale_min"),
    ("lam_u", -1.0, "lam_u, lam_v, lam_u_count, lam_v_count and noise_reg must be"),
])
def test_config_rejects_bad_values_naming_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        D.DPALSConfig(**{field: value})


def test_noise_widens_the_item_ridge():
    cfg = D.DPALSConfig(rank=3, lam_v=0.5, noise_reg=2.0)
    assert D.item_ridge(0.0, cfg) == 0.5
    assert D.item_ridge(0.1, cfg) == pytest.approx(0.5 + 2.0 * 2 * 0.1 * 2.0)


@pytest.mark.parametrize("max_weight,power", [(1.0, 0.0), (10.0, 0.0), (10.0, 0.7), (2.0, 1.0)])
def test_weights_spend_at_most_the_budget_k_per_user(max_weight, power):
    rng = np.random.default_rng(0)
    rows = np.repeat(np.arange(5), [1, 3, 6, 10, 12]).astype(np.int32)
    cols = rng.integers(0, 20, size=rows.size)
    cfg = D.DPALSConfig(max_ratings_per_user=8, max_weight=max_weight, rare_item_power=power)
    counts = rng.uniform(0, 50, size=20)
    w = D.rating_weights(rows, cols, 5, counts, cfg)
    spent = np.bincount(rows, weights=w ** 2, minlength=5)
    assert np.all(spent <= 8 * (1 + 1e-12)) and np.all(w <= max_weight) and np.all(w > 0)
    if power == 0:
        # light users scale up to the budget (or the cap), heavy ones keep weight <= 1
        expect = np.minimum(np.sqrt(8 / np.array([1, 3, 6, 10, 12])), max_weight)
        np.testing.assert_allclose(w, expect[rows])


def test_count_estimate_is_exact_without_noise_when_factors_share_a_norm():
    cfg = D.DPALSConfig(rank=2, bias_coordinate=0.3, max_weight=1.0)
    block, _, mask = _block()
    u = np.zeros((M, 3))
    u[:, 0] = 5.0  # every factor clipped to the same norm
    a, _ = D.item_sums(u, np.arange(block.nnz), block, cfg)
    np.testing.assert_allclose(D.count_estimate(a, cfg), mask.sum(0))


def test_gram_shrinkage_interpolates_toward_count_times_the_average():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3, 3))
    a = x @ np.swapaxes(x, 1, 2)
    counts = rng.uniform(1, 5, size=6)
    np.testing.assert_allclose(D.shrink_grams(a, counts, 0.0), a)
    avg = a.sum(0) / counts.sum()
    np.testing.assert_allclose(D.shrink_grams(a, counts, 1.0), counts[:, None, None] * avg)
    np.testing.assert_allclose(D.shrink_grams(a, counts, 1.0).sum(0), a.sum(0))


def test_count_estimate_stays_finite_when_the_noise_swamps_the_totals():
    cfg = D.DPALSConfig(rank=2, bias_coordinate=0.2)
    a = np.zeros((4, 3, 3))
    a[:, 0, 0] = [-5.0, 1.0, 2.0, 1.0]  # total trace -1, total bias entry 0
    counts = D.count_estimate(a, cfg)
    assert np.all(np.isfinite(counts)) and np.all(counts >= 0)
    np.testing.assert_allclose(counts, np.maximum(a[:, 0, 0], 0) / cfg.x_norm ** 2)


def test_the_server_receives_no_per_user_quantity():
    """What leaves a tenant is indexed by items only: the upload's arrays have the same
    shapes whatever the tenant's number of users, none of their axes is the user axis, and
    its scalars are the noise levels, not counts of users or ratings."""
    from algorithms.simulate import client_round, initialise

    rng = np.random.default_rng(3)
    cfg = D.DPALSConfig(rank=2)
    shapes = []
    for users in (11, 23):  # neither equals the rank + 1 or the 13 items
        rows = np.repeat(np.arange(users), 4)
        cols = rng.integers(0, 13, rows.size)
        keep = np.unique(rows * 13 + cols, return_index=True)[1]
        block = RatingBlock(rows[keep], cols[keep], rng.integers(1, 6, keep.size) * 1.0,
                            users, 13)
        _, glob, locs = initialise(D.ALGORITHM, cfg, [block], 0)
        _, up = client_round(D.ALGORITHM, cfg, 1, 0, 0, glob, locs[0], block)
        arrays = up.arrays()
        assert all(users not in a.shape for a in arrays.values()), \
            {k: a.shape for k, a in arrays.items()}
        scalars = {f.name: getattr(up, f.name) for f in dataclasses.fields(up)
                   if f.name not in arrays}
        assert all(v == 0.0 for v in scalars.values()), scalars  # noise levels, none yet
        shapes.append({k: a.shape for k, a in arrays.items()})
    assert shapes[0] == shapes[1]


def test_a_block_that_lost_a_user_gets_a_fresh_cap_not_stale_indices():
    """After a user is forgotten the block loses entries: the stored ``keep`` indices point
    into the old block, so the step redraws the cap on the new one (the per-user bound
    must hold whatever happened to the block)."""
    rng = np.random.default_rng(3)
    rows = np.repeat(np.arange(6), 40)
    cols = np.concatenate([rng.choice(50, 40, replace=False) for _ in range(6)])
    block = RatingBlock(rows, cols, rng.uniform(1, 5, rows.size), 6, 50)
    cfg = D.DPALSConfig(rank=2, max_ratings_per_user=15, sweeps=3)
    server, glob = D.init_server(50, 1, cfg, np.random.default_rng(0))
    state = D.init_client(block, glob, cfg, np.random.default_rng(1))
    assert state.kept_of == block.nnz and state.keep.size == 6 * 15
    smaller = block.subset(block.rows != 0)  # user 0 forgotten: 40 entries gone
    new, up = D.client_step(glob, state, smaller, cfg, np.random.default_rng(2))
    assert new.kept_of == smaller.nnz and new.keep.max() < smaller.nnz
    np.testing.assert_array_equal(np.bincount(smaller.rows[new.keep], minlength=6),
                                  [0, 15, 15, 15, 15, 15])
    # the old indices, used as they were, would have broken the cap (or run off the end)
    stale = state.keep[state.keep < smaller.nnz]
    assert np.bincount(smaller.rows[stale], minlength=6).max() > 15 or \
        state.keep.max() >= smaller.nnz
    # an unchanged block keeps its draw
    same, _ = D.client_step(glob, new, smaller, cfg, np.random.default_rng(4))
    np.testing.assert_array_equal(same.keep, new.keep)
    # a state stored before ``kept_of`` existed is checked on its own indices
    old = new.replace(kept_of=-1)
    again, _ = D.client_step(glob, old, smaller, cfg, np.random.default_rng(4))
    np.testing.assert_array_equal(again.keep, new.keep)
    broken = state.replace(kept_of=-1)
    fixed, _ = D.client_step(glob, broken, smaller, cfg, np.random.default_rng(5))
    assert np.bincount(smaller.rows[fixed.keep], minlength=6).max() <= 15


def test_forget_rows_zeroes_only_the_user_rows_of_a_local_state():
    block, _, _ = _block()
    cfg = D.DPALSConfig(rank=2)
    _, glob = D.init_server(N, 1, cfg, np.random.default_rng(0))
    state = D.init_client(block, glob, cfg, np.random.default_rng(1))
    state, _ = D.client_step(glob, state, block, cfg, np.random.default_rng(2))
    assert np.all(np.abs(state.U).sum(axis=1) > 0)
    gone = state.forget_rows(np.array([1, 4]))
    assert not gone.U[[1, 4]].any()
    np.testing.assert_array_equal(np.delete(gone.U, [1, 4], axis=0),
                                  np.delete(state.U, [1, 4], axis=0))
    np.testing.assert_array_equal(gone.keep, state.keep)  # per-entry, not per-user
    assert not state.U[[1, 4]].sum() == 0  # the original is untouched
