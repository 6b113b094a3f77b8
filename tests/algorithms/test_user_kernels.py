"""The fused user-level DP kernels (algorithms._user_kernels) against the numpy code they
replace, on blocks with unsorted entries, repeated (user, item) pairs, users without kept
ratings and every option that changes the arithmetic; and that they release the GIL."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from algorithms import RatingBlock
from algorithms import _user_grad as UG
from algorithms import _user_kernels as UK
from algorithms import dp_fedmavg as FA
from algorithms import dpals as D

pytestmark = pytest.mark.skipif(not UK.HAVE_NUMBA, reason="numba not installed")


def _block(seed: int, m: int = 40, n: int = 30) -> RatingBlock:
    rng = np.random.default_rng(seed)
    rows, cols = np.nonzero(rng.random((m, n)) < 0.4)
    order = rng.permutation(rows.size)  # entries in no particular order
    rows, cols = rows[order], cols[order]
    rows, cols = np.append(rows, rows[:4]), np.append(cols, cols[:4])  # repeated pairs
    rows[rows == m - 1] = 0  # the last user has no ratings at all
    return RatingBlock(rows, cols, rng.integers(1, 6, size=rows.size).astype(float), m, n)


def _keep(block: RatingBlock, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(block.nnz, block.nnz * 2 // 3, replace=False))
    return keep[block.rows[keep] != 3]  # user 3 has ratings, none of them kept


DPALS = [dict(rank=3), dict(rank=2, user_bias=False, lam_u_count=0.3, lam_u=0.2),
         dict(rank=3, rare_item_power=0.7, max_ratings_per_user=4, max_weight=2.5,
              rating_clip=0.5, user_factor_clip=0.3)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("options", DPALS)
def test_user_solve_and_item_sums_equal_the_numpy_code(seed, options):
    cfg = D.DPALSConfig(**options)
    block = _block(seed)
    rng = np.random.default_rng(seed + 10)
    v = rng.normal(0, 1.0, size=(cfg.d, block.n_items))
    u = D.solve_users(v, block, cfg)
    u_ref = D.solve_users_numpy(v, block, cfg)
    assert np.abs(u_ref).max() > 0.1
    np.testing.assert_allclose(u, u_ref, rtol=0, atol=1e-12)
    counts = rng.uniform(0.0, 9.0, block.n_items)
    keep = _keep(block, seed)
    a, b = D.item_sums(3 * u_ref, keep, block, cfg, counts)  # 3x: the factor clip binds
    a_ref, b_ref = D.item_sums_numpy(3 * u_ref, keep, block, cfg, counts)
    assert np.abs(a_ref).max() > 0.5
    np.testing.assert_allclose(a, a_ref, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(b, b_ref, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("options", [dict(rank=3), dict(rank=3, clip_norm=0.2),
                                     dict(rank=2, residual_clip=None, user_bias=False,
                                          user_factor_clip=0.4, curvature_weight=2.0)])
def test_clipped_sums_equal_the_numpy_code(seed, options):
    cfg = FA.DPFedMAvgConfig(**options)
    block = _block(seed)
    rng = np.random.default_rng(seed + 20)
    v = rng.normal(0, 1.0, size=(cfg.d, block.n_items))
    u = rng.normal(0, 1.0, size=(block.n_users, cfg.d))
    keep = _keep(block, seed)
    g, h = UG.clipped_sums(u, v, keep, block, cfg)
    g_ref, h_ref = UG.clipped_sums_numpy(u, v, keep, block, cfg)
    assert g.shape == g_ref.shape == (cfg.d, block.n_items) and np.abs(g_ref).max() > 0.05
    np.testing.assert_allclose(g, g_ref, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(h, h_ref, rtol=1e-13, atol=1e-12)


def test_the_kernels_release_the_gil():
    """A kernel running in one thread lets a pure-Python loop in another make progress:
    the loop's iterations while the kernel runs are most of what it does alone."""
    cfg = FA.DPFedMAvgConfig(rank=4)
    rng = np.random.default_rng(0)
    m, n, nnz = 3000, 2000, 400_000
    block = RatingBlock(rng.integers(0, m, nnz), rng.integers(0, n, nnz),
                        rng.integers(1, 6, nnz).astype(float), m, n)
    v = rng.normal(0, 1.0, size=(cfg.d, n))
    u = rng.normal(0, 1.0, size=(m, cfg.d))
    keep = np.arange(nnz)
    UG.clipped_sums(u, v, keep, block, cfg)  # compiled before timing

    def kernel_for(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            UG.clipped_sums(u, v, keep, block, cfg)

    def spin(seconds: float) -> int:
        end, count = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            count += 1
        return count

    alone = spin(0.3)
    t = threading.Thread(target=kernel_for, args=(0.6,))
    t.start()
    time.sleep(0.05)
    beside = spin(0.3)
    t.join()
    # holding the GIL would leave the loop a switch interval (5 ms) per kernel call
    assert beside > 0.3 * alone
