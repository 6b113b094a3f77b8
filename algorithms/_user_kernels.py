"""Fused ``nogil`` kernels of the user-level DP client steps (DPALS, DP-FedMAvg,
DP-FedMC-ADMM): one compiled pass over a tenant's ratings instead of a few dozen numpy and
scipy calls on small arrays.

Those calls hold the GIL between their (short) array loops, so two tenants' client steps on
the pool of :mod:`algorithms.pool` waited for each other; these kernels release it for
the whole step. Each computes the same quantity as the numpy code it replaces
(:func:`algorithms.dpals.solve_users`, :func:`algorithms.dpals.item_sums`,
:func:`algorithms._user_grad.clipped_sums`), summing in another order, so the results
agree to ~1e-13 (tested against the numpy code and against independent loops). Used when
numba is installed (``HAVE_NUMBA``); the numpy code runs otherwise.
"""

from __future__ import annotations

import numpy as np

from algorithms.mf_kernels import HAVE_NUMBA

if HAVE_NUMBA:
    import numba


def _x_row(x, u, t, r, clip, c):
    """x_u = [u_u[:r] * clip / max(||u_u[:r]||, clip), c] into ``x`` (length r + 1)."""
    norm = 0.0
    for a in range(r):
        norm += u[t, a] * u[t, a]
    scale = clip / max(np.sqrt(norm), clip)
    for a in range(r):
        x[a] = u[t, a] * scale
    x[r] = c


def _solve_into(out, a, b, n):
    """x with a[:n, :n] x = b[:n] into ``out`` by Gaussian elimination with partial
    pivoting (LAPACK's gesv, as numpy's solve; the system is small and in cache, so this
    avoids a library call per user). ``a`` and ``b`` are overwritten. Raises on a
    singular matrix, as numpy does."""
    for k in range(n):
        p = k
        for i in range(k + 1, n):
            if abs(a[i, k]) > abs(a[p, k]):
                p = i
        if a[p, k] == 0.0:
            raise np.linalg.LinAlgError("Singular matrix")
        if p != k:
            for j in range(n):
                a[k, j], a[p, j] = a[p, j], a[k, j]
            b[k], b[p] = b[p], b[k]
        for i in range(k + 1, n):
            f = a[i, k] / a[k, k]
            for j in range(k + 1, n):
                a[i, j] -= f * a[k, j]
            b[i] -= f * b[k]
    for k in range(n - 1, -1, -1):
        x = b[k]
        for j in range(k + 1, n):
            x -= a[k, j] * out[j]
        out[k] = x / a[k, k]


def _solve_users_loops(rows, cols, vals, v, n_users, r, user_bias, mu, c, lam_u,
                       lam_u_count, lam_bias):
    """Every user's ridge solution [u_u, b_u] against V (r+1 x n): per rating
    y_j = [v_j, 1] (the 1 only with a user bias) and target r_uj - mu - c beta_j; ridge
    lam_u + lam_u_count n_u on the factor, lam_bias + lam_u_count n_u on the bias."""
    q = r + 1 if user_bias else r
    gram = np.zeros((n_users, q, q))
    rhs = np.zeros((n_users, q))
    count = np.zeros(n_users)
    y = np.empty(q)
    for k in range(rows.shape[0]):
        t, j = rows[k], cols[k]
        for a in range(r):
            y[a] = v[a, j]
        if user_bias:
            y[r] = 1.0
        target = vals[k] - mu - c * v[r, j]
        for a in range(q):
            rhs[t, a] += target * y[a]
            for b in range(q):
                gram[t, a, b] += y[a] * y[b]
        count[t] += 1.0
    out = np.zeros((n_users, r + 1))
    for t in range(n_users):
        for a in range(q):
            gram[t, a, a] += (lam_bias if a == r else lam_u) + lam_u_count * count[t]
        _solve_into(out[t], gram[t], rhs[t], q)
    return out


def _by_user(rows, keep, n_users):
    """(start, order): the kept entries of user t are ``order[start[t]:start[t + 1]]``
    (indices into the block's entries), in the order of ``keep`` (a stable counting
    sort)."""
    start = np.zeros(n_users + 1, dtype=np.int64)
    for p in range(keep.shape[0]):
        start[rows[keep[p]] + 1] += 1
    for t in range(n_users):
        start[t + 1] += start[t]
    fill = start[:-1].copy()
    order = np.empty(keep.shape[0], dtype=np.int64)
    for p in range(keep.shape[0]):
        k = keep[p]
        order[fill[rows[k]]] = k
        fill[rows[k]] += 1
    return start, order


def _clipped_sums_loops(rows, cols, vals, keep, u, v, n_users, n_items, r, user_bias, mu, c,
                        residual_clip, kappa, factor_clip, clip):
    """(G (r+1 x n), H (n)): per item, the sums of the users' terms, each user's whole term
    (entries of a repeated (user, item) pair summed first) scaled to L2 norm <= ``clip``.
    Kept rating (t, j) (``keep``: indices into the block's entries): g = clip(pred - r,
    +-residual_clip) x_t, h = kappa ||x_t||^2."""
    d = r + 1
    g_out = np.zeros((d, n_items))
    h_out = np.zeros(n_items)
    start, order = _by_user(rows, keep, n_users)
    slot = np.full(n_items, -1, dtype=np.int64)  # item -> its merged entry of this user
    items = np.empty(keep.shape[0], dtype=np.int64)
    mg = np.zeros((keep.shape[0], d))
    mh = np.zeros(keep.shape[0])
    x = np.empty(d)
    for t in range(n_users):
        lo, hi = start[t], start[t + 1]
        if lo == hi:
            continue
        _x_row(x, u, t, r, factor_clip, c)
        xx = 0.0
        for a in range(d):
            xx += x[a] * x[a]
        ub = u[t, r] if user_bias else 0.0
        n_m = 0
        for p in range(lo, hi):
            k = order[p]
            j = cols[k]
            pred = c * v[r, j] + ub + mu
            for a in range(r):
                pred += u[t, a] * v[a, j]
            e = min(max(pred - vals[k], -residual_clip), residual_clip)
            s = slot[j]
            if s < 0:
                s = n_m
                slot[j] = s
                items[s] = j
                mh[s] = 0.0
                for a in range(d):
                    mg[s, a] = 0.0
                n_m += 1
            for a in range(d):
                mg[s, a] += e * x[a]
            mh[s] += kappa * xx
        sq_g = 0.0
        sq_h = 0.0
        for s in range(n_m):
            row = 0.0
            for a in range(d):
                row += mg[s, a] * mg[s, a]
            sq_g += row
            sq_h += mh[s] * mh[s]
        factor = clip / max(np.sqrt(max(sq_g + sq_h, 0.0)), clip)
        for s in range(n_m):
            j = items[s]
            slot[j] = -1
            for a in range(d):
                g_out[a, j] += mg[s, a] * factor
            h_out[j] += mh[s] * factor
    return g_out, h_out


def _item_sums_loops(rows, cols, vals, keep, u, counts, n_users, n_items, r, user_bias, mu, c,
                     factor_clip, r_clip, k_budget, rare_power, max_weight):
    """DPALS's (A (n x d x d), b (n x d)): per item, sum_u w x_u x_u^T and sum_u w s x_u over
    the kept ratings (``keep``: indices into the block's entries), with
    s = clip(r - mu - b_u, +-r_clip) and the weights of
    :func:`algorithms.dpals.rating_weights` (base count_j^-eta or 1, scaled per user to the
    budget k, capped at ``max_weight``)."""
    d = r + 1
    nnz = keep.shape[0]
    base = np.ones(nnz)
    if rare_power > 0:
        for p in range(nnz):
            base[p] = max(counts[cols[keep[p]]], 1.0) ** -rare_power
    spent = np.zeros(n_users)
    for p in range(nnz):
        spent[rows[keep[p]]] += base[p] * base[p]
    a_out = np.zeros((n_items, d, d))
    b_out = np.zeros((n_items, d))
    xs = np.empty((n_users, d))
    x = np.empty(d)
    for t in range(n_users):
        _x_row(x, u, t, r, factor_clip, c)
        for a in range(d):
            xs[t, a] = x[a]
    for p in range(nnz):
        k = keep[p]
        t, j = rows[k], cols[k]
        w = min(base[p] * np.sqrt(k_budget / max(spent[t], 1e-300)), max_weight)
        s = vals[k] - mu - (u[t, r] if user_bias else 0.0)
        s = min(max(s, -r_clip), r_clip)
        for a in range(d):
            wa = w * xs[t, a]
            b_out[j, a] += wa * s
            for b in range(d):
                a_out[j, a, b] += wa * xs[t, b]
    return a_out, b_out


def _jacobi_into(s, vec, n):
    """Eigen-decomposition of the symmetric s[:n, :n] by cyclic Jacobi rotations: on return
    s is diagonal (the eigenvalues) and the columns of ``vec`` the eigenvectors."""
    for i in range(n):
        for k in range(n):
            vec[i, k] = 1.0 if i == k else 0.0
    for sweep in range(60):
        off = 0.0
        for p in range(n):
            for q in range(p + 1, n):
                off += abs(s[p, q])
        if off == 0.0:
            return
        for p in range(n - 1):
            for q in range(p + 1, n):
                small = 100.0 * abs(s[p, q])
                if sweep > 3 and abs(s[p, p]) + small == abs(s[p, p]) \
                        and abs(s[q, q]) + small == abs(s[q, q]):
                    s[p, q] = 0.0  # below the diagonal's precision (Numerical Recipes)
                    s[q, p] = 0.0
                    continue
                if s[p, q] == 0.0:
                    continue
                theta = (s[q, q] - s[p, p]) / (2.0 * s[p, q])
                if abs(theta) > 1e150:
                    t = 0.5 / theta
                else:
                    t = 1.0 / (abs(theta) + np.sqrt(theta * theta + 1.0))
                    if theta < 0.0:
                        t = -t
                c = 1.0 / np.sqrt(t * t + 1.0)
                sn = t * c
                for k in range(n):  # columns p, q
                    skp, skq = s[k, p], s[k, q]
                    s[k, p] = c * skp - sn * skq
                    s[k, q] = sn * skp + c * skq
                for k in range(n):  # rows p, q
                    spk, sqk = s[p, k], s[q, k]
                    s[p, k] = c * spk - sn * sqk
                    s[q, k] = sn * spk + c * sqk
                s[p, q] = 0.0
                s[q, p] = 0.0
                for k in range(n):
                    vkp, vkq = vec[k, p], vec[k, q]
                    vec[k, p] = c * vkp - sn * vkq
                    vec[k, q] = sn * vkp + c * vkq


def _solve_items_loops(out, lo, hi, a, b, counts, avg, alpha, lam):
    """DPALS's item solve (:func:`algorithms.dpals.solve_items`) for items ``lo .. hi - 1``
    into ``out`` (n x d): A_j shrunk toward count_j avg (``alpha`` > 0), symmetrised,
    projected onto the PSD cone (eigenvalues clipped at 0), ``lam[j]`` added to the
    diagonal, then solved against b_j."""
    d = a.shape[1]
    m = np.empty((d, d))
    s = np.empty((d, d))
    vec = np.empty((d, d))
    g = np.empty((d, d))
    rhs = np.empty(d)
    w = np.empty(d)
    for j in range(lo, hi):
        for i in range(d):
            for k in range(d):
                if alpha > 0.0:
                    m[i, k] = (1.0 - alpha) * a[j, i, k] + alpha * counts[j] * avg[i, k]
                else:
                    m[i, k] = a[j, i, k]
        for i in range(d):
            for k in range(d):
                s[i, k] = (m[i, k] + m[k, i]) / 2
        _jacobi_into(s, vec, d)
        for i in range(d):
            w[i] = max(s[i, i], 0.0)
        for i in range(d):
            for k in range(d):
                total = 0.0
                for e in range(d):
                    total += vec[i, e] * w[e] * vec[k, e]
                g[i, k] = total + (lam[j] if i == k else 0.0)
            rhs[i] = b[j, i]
        _solve_into(out[j], g, rhs, d)



def _ials_users_loops(rows, cols, w, vt, f_mat, f_beta, n_users, r, c, w0, lam, nu,
                      n_items):
    """iALS's user solve (:func:`algorithms.ials.solve_users`): per user
    ``(sum w v v^T + w0 F + lam (f + w0 n)^nu I) u = sum w (1 - c beta) v - w0 c F_beta``
    over its ratings (``vt``: V transposed, n x r + 1, the bias last; f the summed w)."""
    gram = np.zeros((n_users, r, r))
    rhs = np.zeros((n_users, r))
    freq = np.zeros(n_users)
    for k in range(rows.shape[0]):
        t, j, wk = rows[k], cols[k], w[k]
        s = wk * (1.0 - c * vt[j, r])
        freq[t] += wk
        for a in range(r):
            wa = wk * vt[j, a]
            rhs[t, a] += s * vt[j, a]
            for b in range(a, r):
                gram[t, a, b] += wa * vt[j, b]
    out = np.zeros((n_users, r))
    for t in range(n_users):
        ridge = lam * (freq[t] + w0 * n_items) ** nu
        for a in range(r):
            rhs[t, a] -= w0 * c * f_beta[a]
            for b in range(a, r):
                gram[t, a, b] += w0 * f_mat[a, b]
                gram[t, b, a] = gram[t, a, b]
            gram[t, a, a] += ridge
        _solve_into(out[t], gram[t], rhs[t], r)
    return out


def _ials_item_sums_loops(rows, cols, w, x, n_items):
    """iALS's (A (n + 1 x d x d), b (n x d)) (:func:`algorithms.ials.item_sums`): per item
    sum w x x^T and sum w x, and the Gramian sum_u x x^T of every user as row n."""
    n_users, d = x.shape
    a_out = np.zeros((n_items + 1, d, d))
    b_out = np.zeros((n_items, d))
    for k in range(rows.shape[0]):
        t, j, wk = rows[k], cols[k], w[k]
        for a in range(d):
            wa = wk * x[t, a]
            b_out[j, a] += wa
            for b in range(a, d):
                a_out[j, a, b] += wa * x[t, b]
    for t in range(n_users):
        for a in range(d):
            for b in range(a, d):
                a_out[n_items, a, b] += x[t, a] * x[t, b]
    for j in range(n_items + 1):
        for a in range(d):
            for b in range(a + 1, d):
                a_out[j, b, a] = a_out[j, a, b]
    return a_out, b_out


if HAVE_NUMBA:
    _inline = numba.njit(inline="always")
    _x_row = _inline(_x_row)
    _solve_into = _inline(_solve_into)
    _jacobi_into = _inline(_jacobi_into)
    _by_user = _inline(_by_user)
    _kernel = numba.njit(cache=True, nogil=True)
    _solve_users_jit = _kernel(_solve_users_loops)
    _clipped_sums_jit = _kernel(_clipped_sums_loops)
    _item_sums_jit = _kernel(_item_sums_loops)
    _solve_items_jit = _kernel(_solve_items_loops)
    _ials_users_jit = _kernel(_ials_users_loops)
    _ials_item_sums_jit = _kernel(_ials_item_sums_loops)


def solve_users(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, v: np.ndarray,
                n_users: int, rank: int, user_bias: bool, mu: float, c: float, lam_u: float,
                lam_u_count: float, lam_bias: float | None = None) -> np.ndarray:
    """:func:`algorithms.dpals.solve_users`'s result (m x r+1), fused (one pass over the
    ratings, then one q x q solve per user)."""
    return _solve_users_jit(rows, cols, vals, np.ascontiguousarray(v), int(n_users),
                            int(rank), bool(user_bias), float(mu), float(c), float(lam_u),
                            float(lam_u_count),
                            float(lam_u if lam_bias is None else lam_bias))


def clipped_sums(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, keep: np.ndarray,
                 u: np.ndarray, v: np.ndarray, n_users: int, n_items: int, rank: int,
                 user_bias: bool, mu: float, c: float, residual_clip: float | None, kappa: float,
                 factor_clip: float, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`algorithms._user_grad.clipped_sums`'s (G, H), fused: one pass per user builds
    its term, its norm and its clipped contribution to the item sums."""
    return _clipped_sums_jit(rows, cols, vals, np.asarray(keep, dtype=np.int64),
                             np.ascontiguousarray(u), np.ascontiguousarray(v), int(n_users),
                             int(n_items), int(rank), bool(user_bias), float(mu), float(c),
                             np.inf if residual_clip is None else float(residual_clip),
                             float(kappa), float(factor_clip), float(clip))


def item_sums(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, keep: np.ndarray,
              u: np.ndarray, counts: np.ndarray, n_users: int, n_items: int, rank: int,
              user_bias: bool, mu: float, c: float, factor_clip: float, r_clip: float,
              k_budget: int, rare_power: float, max_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`algorithms.dpals.item_sums`'s (A, b), fused: one pass over the ratings."""
    power = float(rare_power) if rare_power > 0 and np.any(counts > 0) else 0.0
    return _item_sums_jit(rows, cols, vals, np.asarray(keep, dtype=np.int64),
                          np.ascontiguousarray(u),
                          np.ascontiguousarray(counts, dtype=np.float64), int(n_users),
                          int(n_items), int(rank), bool(user_bias), float(mu), float(c),
                          float(factor_clip), float(r_clip), float(k_budget), power,
                          float(max_weight))


def solve_items_into(out: np.ndarray, lo: int, hi: int, a: np.ndarray, b: np.ndarray,
                     counts: np.ndarray, avg: np.ndarray | None, alpha: float,
                     lam: np.ndarray) -> None:
    """Items ``lo .. hi - 1`` of :func:`algorithms.dpals.solve_items` (before its final
    transpose) into ``out``, fused per item (a Jacobi eigen-decomposition of the d x d
    block in place of LAPACK's, ~1e-15 apart)."""
    d = a.shape[1]
    _solve_items_jit(out, int(lo), int(hi), np.ascontiguousarray(a), np.ascontiguousarray(b),
                     np.ascontiguousarray(counts, dtype=np.float64),
                     np.zeros((d, d)) if avg is None else np.ascontiguousarray(avg),
                     float(alpha) if avg is not None else 0.0,
                     np.ascontiguousarray(lam, dtype=np.float64))


def ials_users(rows: np.ndarray, cols: np.ndarray, w: np.ndarray, v: np.ndarray,
               n_users: int, rank: int, c: float, w0: float, lam: float, nu: float
               ) -> np.ndarray:
    """:func:`algorithms.ials.solve_users`'s result (m x r), fused: one pass over the
    ratings, then one r x r solve per user."""
    vr = v[:rank]
    f_mat, f_beta = vr @ vr.T, vr @ v[rank]
    return _ials_users_jit(rows, cols, np.ascontiguousarray(w, dtype=np.float64),
                           np.ascontiguousarray(v.T), f_mat, f_beta, int(n_users),
                           int(rank), float(c), float(w0), float(lam), float(nu),
                           int(v.shape[1]))


def ials_item_sums(rows: np.ndarray, cols: np.ndarray, w: np.ndarray, x: np.ndarray,
                   n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`algorithms.ials.item_sums`'s (A, b), fused: one pass over the ratings."""
    return _ials_item_sums_jit(rows, cols, np.ascontiguousarray(w, dtype=np.float64),
                               np.ascontiguousarray(x), int(n_items))
