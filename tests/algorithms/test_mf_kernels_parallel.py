"""The parallel fused FedMC-ADMM kernels give the serial kernels' numbers (to 1e-12)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from algorithms import mf_kernels as K

pytestmark = pytest.mark.skipif(not K.HAVE_NUMBA, reason="numba not installed")
MODES = [(K.LIP_GIVEN, 3.0), (K.LIP_BLOCK_FRO, 0.0), (K.LIP_BLOCK_DIAG, 0.0)]


def _block(m: int, n: int, q: int, seed: int):
    rng = np.random.default_rng(seed)
    # skewed activity and popularity, some items unrated, some with fewer than q/2 ratings
    dense = rng.random((m, n)) < np.outer(rng.random(m) ** 2, rng.random(n) ** 3) * 0.6
    dense[:, : n // 10] = False
    csr = sp.csr_array(np.where(dense, rng.normal(3.5, 1.0, (m, n)), 0.0))
    csr.sort_indices()
    csc = csr.tocsc()
    csc.sort_indices()
    factors = [rng.normal(0, 0.3, shape) for shape in ((m, q), (n, q), (n, q), (n, q), (n, q))]
    return csr, csc, factors


@pytest.mark.parametrize("mode,given", MODES)
@pytest.mark.parametrize("l1", [False, True])
@pytest.mark.parametrize("parts", [1, 3, 8])
def test_parallel_u_step_equals_serial(mode, given, l1, parts):
    csr, _, (u, bt, *_rest) = _block(700, 400, 10, seed=parts)
    args = (csr.indptr.astype(np.int32), csr.indices.astype(np.int32), csr.data, u, bt,
            mode, given, 0.01, 0.05, 0.02, l1, 10)
    serial = K._u_prox_steps_jit(*args)
    assert np.abs(serial - u).max() > 1e-3  # the steps moved the factors
    np.testing.assert_allclose(K._u_prox_steps_par(*args, parts), serial, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode,given", MODES)
@pytest.mark.parametrize("parts", [1, 3, 8])
def test_parallel_w_step_equals_serial(mode, given, parts):
    _, csc, (a, wt, vt, yt, _) = _block(500, 900, 10, seed=10 + parts)
    args = (csc.indptr.astype(np.int32), csc.indices.astype(np.int32), csc.data, a, wt, vt,
            yt, mode, given, 0.01, 0.006, 0.03, 100, 10)
    w_serial, y_serial = K._w_linearised_steps_jit(*args)
    assert np.abs(w_serial - wt).max() > 1e-3
    w_par, y_par = K._w_linearised_steps_par(*args, parts)
    np.testing.assert_allclose(w_par, w_serial, rtol=0, atol=1e-12)
    np.testing.assert_allclose(y_par, y_serial, rtol=0, atol=1e-12)


def test_public_kernels_choose_parallel_by_size_and_agree():
    csr, csc, (u, bt, vt, yt, _) = _block(600, 500, 10, seed=5)
    u_args = (csr.indptr, csr.indices, csr.data, u, bt, K.LIP_BLOCK_FRO, 0.0, 0.01, 0.05,
              False, 10)
    assert K._use_parallel(None, 600) == (K.threads() > 1)
    assert not K._use_parallel(None, K.PARALLEL_MIN_ROWS - 1)
    assert not K._use_parallel(False, 10**6)
    np.testing.assert_allclose(K.u_prox_steps_numba(*u_args, parallel=True),
                               K.u_prox_steps_numba(*u_args, parallel=False), rtol=0,
                               atol=1e-12)
    w_args = (csc.indptr, csc.indices, csc.data, u, bt, vt, yt, K.LIP_BLOCK_DIAG, 0.0, 0.01,
              0.006, 100, 10)
    for got, want in zip(K.w_linearised_steps_numba(*w_args, parallel=True),
                         K.w_linearised_steps_numba(*w_args, parallel=False), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_concurrent_calls_from_threads_are_safe_and_equal():
    """Only one parallel kernel runs at a time per process (the workqueue layer would abort
    on concurrent launches); the other threads run the serial kernel: the same numbers."""
    from concurrent.futures import ThreadPoolExecutor

    csr, _, (u, bt, *_rest) = _block(800, 300, 10, seed=7)
    args = (csr.indptr, csr.indices, csr.data, u, bt, K.LIP_BLOCK_DIAG, 0.0, 0.01, 0.05,
            True, 10)
    want = K.u_prox_steps_numba(*args, parallel=False)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: K.u_prox_steps_numba(*args, parallel=True), range(16)))
    for result in got:
        np.testing.assert_allclose(result, want, rtol=0, atol=1e-12)
