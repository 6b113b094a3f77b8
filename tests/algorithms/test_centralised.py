"""Centralised ALS reference: each half-step is the exact ridge solve, and the fit
recovers an exactly low-rank matrix with biases."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms import centralised as C


def _direct_half_step(rows, cols, target, other, n_rows, lam, lam_bias, lam_fixed=0.0,
                      bias_rating=0.0):
    """Per row, the ridge problem as an augmented least-squares system, solved by lstsq."""
    k = other.shape[1]
    out = np.zeros((n_rows, k + 1))
    for u in range(n_rows):
        t = np.flatnonzero(rows == u)
        if t.size == 0:
            continue
        z = np.hstack([other[cols[t]], np.ones((t.size, 1))])
        penalty = np.sqrt(np.r_[np.full(k, lam * t.size + lam_fixed),
                                lam_bias + bias_rating * t.size])
        a = np.vstack([z, np.diag(penalty)])
        y = np.r_[target[t], np.zeros(k + 1)]
        out[u] = np.linalg.lstsq(a, y, rcond=None)[0]
    return out


def _observed(rng, m, n, density):
    mask = rng.random((m, n)) < density
    mask[np.arange(m), rng.integers(0, n, m)] = True  # every user rated something
    return np.nonzero(mask)


def test_half_step_equals_a_direct_least_squares_solve():
    rng = np.random.default_rng(0)
    m, n, k = 7, 9, 3
    rows, cols = _observed(rng, m, n, 0.4)
    rows[rows == 6] = 5  # row 6 has no ratings: its solution must be 0
    other = rng.normal(size=(n, k))
    target = rng.normal(size=rows.shape[0])
    got = C.half_step(rows, cols, target, other, m, lam=0.3, lam_bias=0.7)
    want = _direct_half_step(rows, cols, target, other, m, 0.3, 0.7)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert np.all(got[6] == 0.0)
    # FedMC-ADMM's ridge family: a fixed weight on the factors, one per rating on the bias
    got = C.half_step(rows, cols, target, other, m, 0.3, 0.7, lam_fixed=2.0, bias_rating=0.5)
    want = _direct_half_step(rows, cols, target, other, m, 0.3, 0.7, 2.0, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert not np.allclose(got, C.half_step(rows, cols, target, other, m, 0.3, 0.7))


def test_fit_with_ridges_is_the_fit_with_lam_when_they_say_the_same():
    rng = np.random.default_rng(5)
    users, items = _observed(rng, 20, 15, 0.3)
    values = rng.integers(1, 6, users.size).astype(float)
    kw = dict(rank=2, iterations=3)
    plain = C.fit_als(users, items, values, 20, 15, lam=0.2, lam_bias=3.0,
                      rng=np.random.default_rng(0), **kw)
    same = C.fit_als(users, items, values, 20, 15, lam=9.0, lam_bias=9.0,
                     rng=np.random.default_rng(0), ridges=((0.2, 3.0, 0.0, 0.0),) * 2, **kw)
    np.testing.assert_array_equal(plain.P, same.P)
    np.testing.assert_array_equal(plain.item_bias, same.item_bias)
    with pytest.raises(ValueError, match="non-negative"):
        C.fit_als(users, items, values, 20, 15, lam=0.2, lam_bias=3.0, rng=rng,
                  ridges=((0.2, 3.0, -1.0, 0.0), (0.2, 3.0, 0.0, 0.0)), **kw)


def test_gram_sums_chunks_agree_with_a_loop(monkeypatch):
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 5, 40)
    z = rng.normal(size=(40, 3))
    monkeypatch.setattr(C, "_CHUNK_ELEMENTS", 9 * 7)  # 7 ratings per chunk
    got = C.gram_sums(rows, z, 5)
    for u in range(5):
        np.testing.assert_allclose(got[u], z[rows == u].T @ z[rows == u], atol=1e-12)


def test_recovers_an_exactly_low_rank_matrix_with_biases():
    rng = np.random.default_rng(2)
    m, n, k = 60, 50, 3
    full = (3.0 + rng.normal(0, 0.5, (m, 1)) + rng.normal(0, 0.5, (1, n))
            + rng.normal(size=(m, k)) @ rng.normal(size=(k, n)))
    users, items = _observed(rng, m, n, 0.6)
    held = np.ones((m, n), dtype=bool)
    held[users, items] = False
    model = C.fit_als(users, items, full[users, items], m, n, rank=k, lam=1e-9,
                      lam_bias=1e-9, iterations=200, rng=np.random.default_rng(0))
    hu, hi = np.nonzero(held)
    train_rmse, _ = C.rmse(model, users, items, full[users, items])
    test_rmse, _ = C.rmse(model, hu, hi, full[hu, hi])
    assert train_rmse < 1e-6
    assert test_rmse < 1e-4 * full.std()


def test_sweeps_never_increase_the_objective():
    rng = np.random.default_rng(3)
    users, items = _observed(rng, 30, 20, 0.3)
    vals = rng.integers(1, 6, users.shape[0]).astype(float)
    objs = [C.objective(C.fit_als(users, items, vals, 30, 20, rank=4, lam=0.1, lam_bias=1.0,
                                  iterations=it, rng=np.random.default_rng(5)),
                        users, items, vals, 0.1, 1.0) for it in (1, 2, 4, 8)]
    assert all(b <= a + 1e-9 for a, b in zip(objs, objs[1:], strict=False))
    assert objs[-1] < objs[0]


def test_same_generator_seed_same_model_and_bad_settings_refused():
    rng = np.random.default_rng(4)
    users, items = _observed(rng, 10, 8, 0.5)
    vals = rng.normal(size=users.shape[0])
    a = C.fit_als(users, items, vals, 10, 8, rank=2, lam=0.1, lam_bias=0.1, iterations=3,
                  rng=np.random.default_rng(9))
    b = C.fit_als(users, items, vals, 10, 8, rank=2, lam=0.1, lam_bias=0.1, iterations=3,
                  rng=np.random.default_rng(9))
    np.testing.assert_array_equal(a.predict(users, items), b.predict(users, items))
    with pytest.raises(ValueError, match="rank and iterations"):
        C.fit_als(users, items, vals, 10, 8, rank=0, lam=0.1, lam_bias=0.1, iterations=3,
                  rng=rng)
    with pytest.raises(ValueError, match="non-negative"):
        C.fit_als(users, items, vals, 10, 8, rank=2, lam=-1, lam_bias=0.1, iterations=3,
                  rng=rng)
    assert np.all(a.predict(users, items, (0.0, 0.5)) <= 0.5)
