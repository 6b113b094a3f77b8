"""Sparse matrix-factorisation kernels over the observed entries of a rating block.

Shared by the matrix-completion algorithms. Conventions: a tenant's prediction of entry
(t, j) is ``A[t] @ Bt[j]`` with A of shape (m, q) (left factor, e.g. U_i) and ``Bt`` of
shape (n, q) (the right factor transposed, e.g. W_i^T, so that an item's column is a
contiguous row). ``target`` holds, per observed entry, the value the bilinear term must
fit (the rating minus any fixed offset such as a bias or mean). No dense m x n matrix is
ever formed.

Two implementations of the FedMC-ADMM inner loops are provided and agree to ~1e-12:

* ``*_numpy``: plain vectorised numpy/scipy (gather, row-wise dot, sparse products),
  evaluating the update equations literally over every item at every inner step;
* ``*_numba``: fused compiled loops: one pass per user row / rated item column builds its
  Gram matrix, from which come its Lipschitz bound and all N gradients (items with fewer
  than q/2 ratings use their ratings directly), and the closed form of the N-step affine
  recursion for the items a tenant did not rate. Available when numba is installed
  (``HAVE_NUMBA``), and several times faster than the numpy path.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import scipy.sparse as sp

from algorithms.pool import in_pool

try:  # numba is optional: the numpy path is always available
    import numba
    from numba import prange

    HAVE_NUMBA = True
    if "NUMBA_THREADING_LAYER" not in os.environ:
        # workqueue's threads sleep between kernels, where OpenMP's spin: on a shared
        # 2-core machine (load 8) a round took 1.8x less wall time than serially with
        # workqueue, 1.15x with OpenMP. It must never run two kernels at once, which
        # _run_parallel's lock guarantees.
        numba.config.THREADING_LAYER = "workqueue"
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None
    prange = range
    HAVE_NUMBA = False

PARALLEL_MIN_ROWS = 256
"""Fewer rows (or items) than this run the serial kernel: thread start-up would cost more."""


def threads() -> int:
    """Threads the parallel fused kernels use (numba's, ``NUMBA_NUM_THREADS``: the cores)."""
    return numba.get_num_threads() if HAVE_NUMBA else 1


_PARALLEL_OK = [True]
"""Set to False when numba has no usable threading layer: then the serial kernels run."""


def _use_parallel(parallel: bool | None, size: int) -> bool:
    if parallel is None:  # a pool thread runs one of several client steps at once: serial
        parallel = size >= PARALLEL_MIN_ROWS and not in_pool()
    return bool(parallel) and _PARALLEL_OK[0] and threads() > 1


_LAUNCH = threading.Lock()
"""Held while a parallel kernel runs: one at a time per process (the workqueue threading
layer aborts the process on concurrent launches); a thread finding it busy runs the serial
kernel, which gives the same numbers."""


def _run_parallel(kernel, serial, *args):
    """``kernel(*args, threads())``, or ``serial(*args)`` when another thread is running a
    parallel kernel or no threading layer loads."""
    if not _LAUNCH.acquire(blocking=False):
        return serial(*args)
    try:
        return kernel(*args, threads())
    except (ValueError, ImportError, RuntimeError) as exc:  # no threading layer
        if "threading layer" not in str(exc):
            raise
        _PARALLEL_OK[0] = False
        return serial(*args)
    finally:
        _LAUNCH.release()


def observed_residual(a: np.ndarray, bt: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                      target: np.ndarray) -> np.ndarray:
    """Residual ``(A Bt^T)[rows, cols] - target`` on the observed entries only (nnz x q work)."""
    return np.einsum("ij,ij->i", a[rows], bt[cols]) - target


def sparse_left(e: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                shape: tuple[int, int]) -> sp.csr_array:
    """P_Omega(E) as a CSR array with the block's CSR structure and values ``e``."""
    return sp.csr_array((e, indices, indptr), shape=shape)


def grad_left(e: np.ndarray, indptr: np.ndarray, indices: np.ndarray, bt: np.ndarray,
              shape: tuple[int, int]) -> np.ndarray:
    """Gradient in the left factor, ``P_Omega(E) B^T`` of shape (m, q)."""
    return np.asarray(sparse_left(e, indptr, indices, shape) @ bt)


def grad_right_t(e: np.ndarray, indptr: np.ndarray, indices: np.ndarray, a: np.ndarray,
                 shape: tuple[int, int]) -> np.ndarray:
    """Gradient in the right factor, transposed: ``(A^T P_Omega(E))^T`` of shape (n, q)."""
    return np.asarray(sparse_left(e, indptr, indices, shape).T @ a)


def gram_fro(x: np.ndarray, floor: float) -> float:
    """``max(||X^T X||_F, floor)``: the Lipschitz bound of Remark 4.1 / eq. (12)."""
    return max(float(np.linalg.norm(x.T @ x)), floor)


def block_gram(indptr: np.ndarray, indices: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per compressed row t: the q x q Gram ``sum_{k in row t} x_{indices[k]} x^T``.

    With a CSR structure and ``x = B^T`` this is the Hessian of user t's part of the
    U-step; with a CSC structure and ``x = A`` that of item j's part of the W-step.
    Returns (n_rows, q, q); empty rows give zeros.
    """
    xs = x[indices]
    outer = (xs[:, :, None] * xs[:, None, :]).reshape(len(indices), -1)
    ind = sp.csr_array((np.ones(len(indices)), np.arange(len(indices)), indptr),
                       shape=(len(indptr) - 1, len(indices)))
    return np.asarray(ind @ outer).reshape(len(indptr) - 1, x.shape[1], x.shape[1])


def block_lipschitz(indptr: np.ndarray, indices: np.ndarray, x: np.ndarray, floor: float,
                    diagonal: bool) -> np.ndarray:
    """Per-row curvature bounds, (n_rows, q), each at least ``floor``.

    ``diagonal=False``: ``||G_t||_F`` in every coordinate (the blockwise analogue of eq. 12);
    ``diagonal=True``: the absolute row sums of G_t (Gershgorin: ``diag(sum_d |G_cd|)``
    dominates G_t), a per-coordinate majoriser that keeps eqs. (66)/(71)/(67) separable.
    """
    g = block_gram(indptr, indices, x)
    if diagonal:
        return np.maximum(np.abs(g).sum(axis=2), floor)
    fro = np.sqrt(np.sum(g * g, axis=(1, 2)))
    return np.repeat(np.maximum(fro, floor)[:, None], x.shape[1], axis=1)


def soft_threshold(q: np.ndarray, tau: float) -> np.ndarray:
    """S(Q, tau) = sign(Q) max(|Q| - tau, 0), eq. (72) of the FedMC-ADMM paper."""
    return np.sign(q) * np.maximum(np.abs(q) - tau, 0.0)


# ---------------------------------------------------------------- plain numpy/scipy path
def u_prox_steps_numpy(indptr: np.ndarray, indices: np.ndarray, target: np.ndarray,
                       u: np.ndarray, bt: np.ndarray, lip: np.ndarray, lam: float, l1: bool,
                       n_steps: int, lam_rating: float = 0.0) -> np.ndarray:
    """N proximal-gradient steps on U with B fixed: eq. (66) (l2) or eq. (71) (l1).

    ``G = P_Omega(U B - target) B^T``; l2: ``U <- (L U - G) / (L + lam)``;
    l1: ``U <- S(U - G / L, lam / L)``. ``lip`` (m x q) holds L per row and coordinate (all
    equal for the paper's global ``||W W^T||_F``). Row t's weight is
    ``lam + lam_rating n_t`` with n_t its ratings (weighted-lambda; ``lam_rating`` 0: the
    paper's). Returns a new array.
    """
    rows = np.repeat(np.arange(u.shape[0], dtype=np.int32), np.diff(indptr))
    shape = (u.shape[0], bt.shape[0])
    lam = lam + lam_rating * np.diff(indptr).astype(float)[:, None] if lam_rating else lam
    for _ in range(n_steps):
        g = grad_left(observed_residual(u, bt, rows, indices, target), indptr, indices, bt,
                      shape)
        u = soft_threshold(u - g / lip, lam / lip) if l1 else (lip * u - g) / (lip + lam)
    return u


def w_linearised_steps_numpy(indptr: np.ndarray, indices: np.ndarray, target: np.ndarray,
                             a: np.ndarray, wt: np.ndarray, vt: np.ndarray, yt: np.ndarray,
                             lip: np.ndarray, beta: float, p: int, n_steps: int,
                             mu_rating: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """N linearised steps on W (eq. 67) then the dual step (eq. 13), all transposed (n x q).

    ``W <- ((L/p) W + beta V - A^T P_Omega(A W - target)/p - Y) / (L/p + beta)`` evaluated
    over every item at every step; then ``Y <- Y + beta (W - V)``. ``lip`` (n x q) holds L per item
    and coordinate (all equal for the paper's global ``||U^T U||_F``). ``mu_rating`` > 0
    adds ``(mu_rating / 2) n_j ||w_j||^2`` to f_i for each item j with n_j of the tenant's
    ratings (its share of a weighted-lambda ridge on V; L grows by mu_rating n_j).
    Returns (W^T, Y^T).
    """
    rows = np.repeat(np.arange(a.shape[0], dtype=np.int32), np.diff(indptr))
    shape = (a.shape[0], wt.shape[0])
    mu = mu_rating * np.bincount(indices, minlength=wt.shape[0]).astype(float)[:, None] \
        if mu_rating else 0.0
    ap = (lip + mu) / p
    for _ in range(n_steps):
        gt = grad_right_t(observed_residual(a, wt, rows, indices, target), indptr, indices, a,
                          shape) + mu * wt
        wt = (ap * wt + beta * vt - gt / p - yt) / (ap + beta)
    return wt, yt + beta * (wt - vt)


# ---------------------------------------------------------------- fused compiled path
# Lipschitz modes of the fused kernels: the bound is computed in the same pass as the Gram
# matrix of each user row / item column, so it costs no extra sweep over the ratings.
LIP_GIVEN, LIP_BLOCK_FRO, LIP_BLOCK_DIAG = 0, 1, 2


def _gram_into(gram, h, idx, target, x, lo, hi):
    """Gram matrix sum_k x_k x_k^T and h = sum_k target_k x_k over k in [lo, hi)."""
    q = x.shape[1]
    gram[:, :] = 0.0
    h[:] = 0.0
    for k in range(lo, hi):
        j = idx[k]
        for c in range(q):
            xc = x[j, c]
            h[c] += target[k] * xc
            for d in range(q):  # the full square vectorises better than the triangle
                gram[c, d] += xc * x[j, d]


def _bound_into(lip, gram, mode, given, floor):
    """Per-coordinate curvature bound of one row from its Gram matrix (see LIP_*)."""
    q = gram.shape[0]
    if mode == LIP_GIVEN:
        lip[:] = given
    elif mode == LIP_BLOCK_FRO:
        total = 0.0
        for c in range(q):
            for d in range(q):
                total += gram[c, d] * gram[c, d]
        lip[:] = max(np.sqrt(total), floor)
    else:
        for c in range(q):
            total = 0.0
            for d in range(q):
                total += abs(gram[c, d])
            lip[c] = max(total, floor)


def _u_rows(out, lo, hi, indptr, indices, target, bt, mode, given, floor, lam, lam_rating,
            l1, n_steps):
    """N steps of eq. (66) / (71) on user rows ``lo .. hi - 1`` of ``out``, in place, with
    their own scratch arrays: the one body of the serial and the parallel U kernels."""
    q = out.shape[1]
    gram, h, g, lip = np.empty((q, q)), np.empty(q), np.empty(q), np.empty(q)
    for t in range(lo, hi):
        _gram_into(gram, h, indices, target, bt, indptr[t], indptr[t + 1])
        _bound_into(lip, gram, mode, given, floor)
        lam_t = lam + lam_rating * (indptr[t + 1] - indptr[t])
        row = out[t]
        for _ in range(n_steps):
            for c in range(q):  # G_t = (P(U B - T) B^T)_t = gram u_t - h
                g[c] = -h[c]
                for d in range(q):
                    g[c] += gram[c, d] * row[d]
            for c in range(q):
                if l1:
                    z = row[c] - g[c] / lip[c]
                    row[c] = np.sign(z) * max(abs(z) - lam_t / lip[c], 0.0)
                else:
                    row[c] = (lip[c] * row[c] - g[c]) / (lip[c] + lam_t)


def _u_prox_steps_loops(indptr, indices, target, u, bt, mode, given, floor, lam, lam_rating,
                        l1, n_steps):
    out = u.copy()
    _u_rows(out, 0, u.shape[0], indptr, indices, target, bt, mode, given, floor, lam,
            lam_rating, l1, n_steps)
    return out


def _pairwise_fro(a, rowidx, lo, hi):
    """||sum_k a_k a_k^T||_F = sqrt(sum_{k,l} (a_k . a_l)^2), for columns with few ratings."""
    q = a.shape[1]
    total = 0.0
    for k in range(lo, hi):
        for l in range(lo, hi):
            dot = 0.0
            for c in range(q):
                dot += a[rowidx[k], c] * a[rowidx[l], c]
            total += dot * dot
    return np.sqrt(total)


def _w_column_steps(j, col, grad, gram, h, k0, k1, k2, lip, a, rowidx, target, lo, hi,
                    vt, yt, mode, given, floor, beta, mu_rating, p, n_steps):
    """N steps of eq. (67) on rated item column j, written as ``w <- k1 w + k0 - k2 grad``
    with per-coordinate constants; the gradient from the item's Gram matrix when it has
    more ratings than q / 2, else directly from its ratings. The ridge ``mu_rating`` per
    rating adds mu w to the gradient and mu to the bound, mu = mu_rating (hi - lo)."""
    q = col.shape[0]
    use_gram = 2 * (hi - lo) > q
    if use_gram or mode == LIP_BLOCK_DIAG:
        _gram_into(gram, h, rowidx, target, a, lo, hi)
        _bound_into(lip, gram, mode, given, floor)
    elif mode == LIP_BLOCK_FRO:
        lip[:] = max(_pairwise_fro(a, rowidx, lo, hi), floor)
    else:
        lip[:] = given
    mu = mu_rating * (hi - lo)
    for c in range(q):
        lip[c] += mu
    inv = 0.0
    for c in range(q):
        if c == 0 or lip[c] != lip[c - 1]:  # one division per distinct bound
            inv = 1.0 / (lip[c] / p + beta)
        k1[c] = (lip[c] / p) * inv
        k2[c] = inv / p
        k0[c] = (beta * vt[j, c] - yt[j, c]) * inv
    for _ in range(n_steps):
        if use_gram:
            for c in range(q):
                grad[c] = -h[c]
                for d in range(q):
                    grad[c] += gram[c, d] * col[d]
        else:
            grad[:] = 0.0
            for k in range(lo, hi):
                t = rowidx[k]
                e = -target[k]
                for c in range(q):
                    e += a[t, c] * col[c]
                for c in range(q):
                    grad[c] += e * a[t, c]
        for c in range(q):
            col[c] = k1[c] * col[c] + k0[c] - k2[c] * (grad[c] + mu * col[c])


def _free_steps(mode, given, floor, beta, p, n_steps):
    """(c^N, 1 + c + ... + c^(N-1), 1 / den) of the affine recursion ``w <- c w + d`` an
    unrated item follows (no data term): ``den = L/p + beta``, ``c = (L/p) / den``."""
    l_free = given if mode == LIP_GIVEN else floor
    den = l_free / p + beta
    c_pow, c_sum, cc = 1.0, 0.0, (l_free / p) / den
    for _ in range(n_steps):
        c_sum += c_pow
        c_pow *= cc
    return c_pow, c_sum, 1.0 / den


def _w_items(w_out, y_out, lo, hi, colptr, rowidx, target, a, wt, vt, yt, mode, given, floor,
             beta, mu_rating, p, n_steps):
    """N steps of eq. (67) and the dual step on item columns ``lo .. hi - 1`` into
    ``w_out``, ``y_out``, with their own scratch arrays: the one body of the serial and the
    parallel W kernels."""
    q = wt.shape[1]
    gram, h, grad, lip = np.empty((q, q)), np.empty(q), np.empty(q), np.empty(q)
    k0, k1, k2 = np.empty(q), np.empty(q), np.empty(q)
    c_pow, c_sum, inv_den = _free_steps(mode, given, floor, beta, p, n_steps)
    for j in range(lo, hi):
        c_lo, c_hi = colptr[j], colptr[j + 1]
        col = w_out[j]
        if c_lo == c_hi:  # unrated: the closed form of the N-step affine recursion
            for c in range(q):
                col[c] = c_pow * wt[j, c] + c_sum * (beta * vt[j, c] - yt[j, c]) * inv_den
        else:
            for c in range(q):
                col[c] = wt[j, c]
            _w_column_steps(j, col, grad, gram, h, k0, k1, k2, lip, a, rowidx, target, c_lo,
                            c_hi, vt, yt, mode, given, floor, beta, mu_rating, p, n_steps)
        for c in range(q):
            y_out[j, c] = yt[j, c] + beta * (col[c] - vt[j, c])


def _w_linearised_steps_loops(colptr, rowidx, target, a, wt, vt, yt, mode, given, floor, beta,
                              mu_rating, p, n_steps):
    w_out = np.empty_like(wt)
    y_out = np.empty_like(yt)
    _w_items(w_out, y_out, 0, wt.shape[0], colptr, rowidx, target, a, wt, vt, yt, mode, given,
             floor, beta, mu_rating, p, n_steps)
    return w_out, y_out


def _work_bounds(ptr, parts, fixed):
    """Bounds of ``parts`` contiguous chunks of the compressed rows of ``ptr`` with about
    equal work, counting each row's entries plus ``fixed`` per row."""
    n = ptr.shape[0] - 1
    work = ptr[1:] + np.arange(1, n + 1) * fixed
    total = work[-1] if n else 0
    bounds = np.empty(parts + 1, dtype=np.int64)
    bounds[0] = 0
    for part in range(1, parts):
        bounds[part] = np.searchsorted(work, total * part // parts, side="right")
    bounds[parts] = n
    return bounds


def _u_prox_steps_par_loops(indptr, indices, target, u, bt, mode, given, floor, lam, lam_rating,
                            l1, n_steps, parts):
    """:func:`_u_prox_steps_loops` with the rows split into ``parts`` chunks of about equal
    work run in parallel (``prange``): every row is computed by the same code (:func:`_u_rows`),
    so the result is identical."""
    out = u.copy()
    bounds = _work_bounds(indptr, parts, n_steps)
    for part in prange(parts):
        _u_rows(out, bounds[part], bounds[part + 1], indptr, indices, target, bt, mode, given,
                floor, lam, lam_rating, l1, n_steps)
    return out


def _w_linearised_steps_par_loops(colptr, rowidx, target, a, wt, vt, yt, mode, given, floor,
                                  beta, mu_rating, p, n_steps, parts):
    """:func:`_w_linearised_steps_loops` with the items split into ``parts`` chunks of
    about equal work (ratings plus a fixed cost per item), run in parallel: the same
    numbers (:func:`_w_items`)."""
    w_out = np.empty_like(wt)
    y_out = np.empty_like(yt)
    bounds = _work_bounds(colptr, parts, 2 * wt.shape[1])
    for part in prange(parts):
        _w_items(w_out, y_out, bounds[part], bounds[part + 1], colptr, rowidx, target, a, wt,
                 vt, yt, mode, given, floor, beta, mu_rating, p, n_steps)
    return w_out, y_out


if HAVE_NUMBA:
    # reassociation lets LLVM vectorise the short dot products; results stay within
    # ~1e-13 of the numpy path (tested) and are deterministic on a given machine
    _FAST = {"reassoc", "contract"}
    # nogil: a pool of threads can run several tenants' client steps at once
    _jit = numba.njit(cache=True, fastmath=_FAST, nogil=True)
    # helpers are inlined: no call or array refcount overhead per item column
    _inline = numba.njit(inline="always", fastmath=_FAST)
    _gram_into = _inline(_gram_into)
    _bound_into = _inline(_bound_into)
    _pairwise_fro = _inline(_pairwise_fro)
    _w_column_steps = _inline(_w_column_steps)
    _free_steps = _inline(_free_steps)
    _u_rows = _inline(_u_rows)
    _w_items = _inline(_w_items)
    _work_bounds = _inline(_work_bounds)
    _u_prox_steps_jit = _jit(_u_prox_steps_loops)
    _w_linearised_steps_jit = _jit(_w_linearised_steps_loops)
    _par = numba.njit(cache=True, fastmath=_FAST, parallel=True, nogil=True)
    _u_prox_steps_par = _par(_u_prox_steps_par_loops)
    _w_linearised_steps_par = _par(_w_linearised_steps_par_loops)


def u_prox_steps_numba(indptr: np.ndarray, indices: np.ndarray, target: np.ndarray,
                       u: np.ndarray, bt: np.ndarray, mode: int, given: float, floor: float,
                       lam: float, l1: bool, n_steps: int, parallel: bool | None = None,
                       lam_rating: float = 0.0) -> np.ndarray:
    """Same as :func:`u_prox_steps_numpy`, fused per user row (rows are independent).

    One pass per row builds its Gram matrix G_t and h_t = sum target b_j, from which the
    gradient of every inner step is ``G_t u_t - h_t`` and the Lipschitz bound (``mode``:
    ``LIP_GIVEN`` uses ``given``; ``LIP_BLOCK_FRO`` / ``LIP_BLOCK_DIAG`` as in
    :func:`block_lipschitz`, at least ``floor``).

    ``parallel`` (default: when there are at least :data:`PARALLEL_MIN_ROWS` rows) splits
    the rows over :func:`threads` threads; each row is computed exactly as serially, so
    the result is the same to the bit.
    """
    args = (indptr, indices, target, np.ascontiguousarray(u), np.ascontiguousarray(bt),
            int(mode), float(given), float(floor), float(lam), float(lam_rating), bool(l1),
            int(n_steps))
    if _use_parallel(parallel, u.shape[0]):
        return _run_parallel(_u_prox_steps_par, _u_prox_steps_jit, *args)
    return _u_prox_steps_jit(*args)


def w_linearised_steps_numba(colptr: np.ndarray, rowidx: np.ndarray, target: np.ndarray,
                             a: np.ndarray, wt: np.ndarray, vt: np.ndarray, yt: np.ndarray,
                             mode: int, given: float, floor: float, beta: float, p: int,
                             n_steps: int, parallel: bool | None = None,
                             mu_rating: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Same as :func:`w_linearised_steps_numpy` (transposed, n x q), fused per item.

    Takes the block's CSC structure (``colptr``, ``rowidx``, ``target`` in CSC order) and
    the Lipschitz ``mode`` as in :func:`u_prox_steps_numba`. Items are independent given
    U, so each rated item runs its N steps in cache; an unrated item has zero gradient and
    takes the closed form ``c^N w + (1 + c + ... + c^(N-1)) d`` with
    ``c = (L/p) / (L/p + beta)``, ``d = (beta v - y) / (L/p + beta)``. Returns (W^T, Y^T).
    ``parallel`` as in :func:`u_prox_steps_numba`, over items in chunks of about equal
    numbers of ratings; the same numbers as serially.
    """
    args = (colptr, rowidx, target, np.ascontiguousarray(a), np.ascontiguousarray(wt),
            np.ascontiguousarray(vt), np.ascontiguousarray(yt), int(mode), float(given),
            float(floor), float(beta), float(mu_rating), int(p), int(n_steps))
    if _use_parallel(parallel, wt.shape[0]):
        return _run_parallel(_w_linearised_steps_par, _w_linearised_steps_jit, *args)
    return _w_linearised_steps_jit(*args)
