"""FedMGS (algorithms/fedmgs.py): statistics, the server's gradient and the privacy leak."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from algorithms import RatingBlock
from algorithms import fedmgs as fg
from algorithms.data import Federation
from algorithms.fedmavg import penalties
from algorithms.simulate import initialise, run_round


def _block(seed: int, m: int = 4, n: int = 7, density: float = 0.6) -> RatingBlock:
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < density
    rows, cols = np.nonzero(mask)
    vals = rng.integers(1, 6, size=rows.size).astype(float)
    return RatingBlock(rows, cols, vals, m, n)


def _dense(block: RatingBlock) -> tuple[np.ndarray, np.ndarray]:
    m, mask = np.zeros(block.shape), np.zeros(block.shape)
    m[block.rows, block.cols] = block.vals
    mask[block.rows, block.cols] = 1.0
    return m, mask


def test_item_statistics_match_dense_sums():
    block = _block(0)
    m, mask = _dense(block)
    u = np.random.default_rng(1).normal(size=(4, 3))
    extra = np.arange(7.0)
    gram, cross = fg.item_statistics(u, block, offset=0.5, gamma_cols=extra)
    for j in range(7):
        g = sum(mask[t, j] * np.outer(u[t], u[t]) for t in range(4)) + extra[j] * np.eye(3)
        b = sum(mask[t, j] * u[t] * (m[t, j] - 0.5) for t in range(4))
        np.testing.assert_allclose(gram[j], g, atol=1e-12)
        np.testing.assert_allclose(cross[j], b, atol=1e-12)


def test_full_statistics_are_eq_31():
    rng = np.random.default_rng(2)
    x, h = rng.normal(size=(5, 8)), rng.random((3, 8))
    hh, xh = fg.full_statistics(x, h)
    np.testing.assert_allclose(hh, sum(np.outer(h[:, j], h[:, j]) for j in range(8)))
    np.testing.assert_allclose(xh, sum(np.outer(x[:, j], h[:, j]) for j in range(8)))


@pytest.mark.parametrize("reg", ["plain", "per_rating"])
def test_server_gradient_equals_centralised_gradient_of_pooled_data(reg):
    """Summed uploads give the server exactly grad_V of F on the stacked matrix."""
    blocks = [_block(s, m=3 + s) for s in range(3)]
    means = [1.0, 2.5, -0.5]
    cfg = fg.FedMGSConfig(rank=2, lam=0.2, gamma=0.3, reg=reg)
    rng = np.random.default_rng(3)
    us = [rng.normal(size=(b.n_users, 2)) for b in blocks]
    v = rng.normal(size=(2, 7))
    gram, cross = np.zeros((7, 2, 2)), np.zeros((7, 2))
    for u, b, mu in zip(us, blocks, means, strict=True):
        folded = penalties(b, cfg)[1] if reg == "per_rating" else None
        g, c = fg.item_statistics(u, b, mu, folded)
        gram, cross = gram + g, cross + c
    server_gamma = 0.3 if reg == "plain" else 0.0
    got = fg.grad_v(v, gram, cross, server_gamma)
    u_all = np.vstack(us)
    dense = [_dense(b) for b in blocks]
    m_all = np.vstack([m - mu for (m, _), mu in zip(dense, means, strict=True)])
    mask_all = np.vstack([mask for _, mask in dense])
    expected = u_all.T @ (mask_all * (u_all @ v - m_all))
    # per_rating: each tenant's item counts times its ridge scale (rating variance over
    # MovieLens' 1.1257^2)
    weights = sum((np.var(b.vals) / 1.1257**2) ** (b.nnz / (b.nnz + 200)) * mask.sum(0)
                  for b, (_, mask) in zip(blocks, dense, strict=True))
    expected += 0.3 * v * (weights if reg == "per_rating" else 1.0)
    np.testing.assert_allclose(got, expected, atol=1e-10)


def test_server_gd_step_and_exact_solve():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(5, 3, 3))
    gram = a @ a.transpose(0, 2, 1)
    cross, v = rng.normal(size=(5, 3)), rng.normal(size=(3, 5))
    d = 2.0 * (max(np.linalg.eigvalsh(g).max() for g in gram) + 0.1)
    one = fg.server_gd(v, gram, cross, 0.1, 1, 2.0)
    np.testing.assert_allclose(one, v - fg.grad_v(v, gram, cross, 0.1) / d, atol=1e-12)
    exact = fg.server_exact(v, gram, cross, 0.1)
    np.testing.assert_allclose(fg.grad_v(exact, gram, cross, 0.1), 0.0, atol=1e-10)
    many = fg.server_gd(v, gram, cross, 0.1, 3000, 1.0)
    np.testing.assert_allclose(many, exact, atol=1e-6)


def _federation(n_clients: int = 4) -> Federation:
    blocks = [_block(20 + i, m=3, n=7, density=0.7) for i in range(n_clients)]
    return Federation(blocks, blocks, [np.arange(3)] * n_clients, np.arange(7), (1.0, 5.0))


def test_server_sums_track_every_clients_current_statistics():
    """Algorithm 2's G^s = G^{s-1} + sum (new - old) over sampled clients, round after round."""
    cfg = fg.FedMGSConfig(rank=2)
    fed = _federation()
    server, glob, locs = initialise(fg.ALGORITHM, cfg, fed.train, 0)
    for k in range(1, 5):
        glob, server, locs, selected, _ = run_round(fg.ALGORITHM, cfg, k, 0, 2, glob, server,
                                                    locs, fed.train)
        assert len(selected) == (4 if k == 1 else 2)
        gram, cross = np.zeros((7, 2, 2)), np.zeros((7, 2))
        for loc, b in zip(locs, fed.train, strict=True):
            g, c = fg.item_statistics(loc.u, b, loc.mean, penalties(b, cfg)[1])
            gram, cross = gram + g, cross + c
        np.testing.assert_allclose(server.gram, gram, atol=1e-10)
        np.testing.assert_allclose(server.cross, cross, atol=1e-10)


def test_marked_not_privacy_preserving():
    assert fg.ALGORITHM.privacy_preserving is False
    assert fg.FedMGSConfig().privacy_preserving is False
    with pytest.raises(ValidationError, match="Input should be False"):
        fg.FedMGSConfig(privacy_preserving=True)


def test_an_upload_reveals_rated_items_and_a_lone_rating():
    """The audit case: a server reads the rated items and a lone rater's rating."""
    block = RatingBlock(np.array([0, 0, 1]), np.array([1, 3, 3]), np.array([4.0, 2.0, 5.0]),
                        2, 5, (1.0, 5.0))
    cfg = fg.FedMGSConfig(rank=2, reg="plain", center=False)
    server, glob = fg.init_server(5, 1, cfg, np.random.default_rng(0))
    local = fg.init_client(block, glob, cfg, np.random.default_rng(1))
    _, up = fg.client_step(glob, local, block, cfg, np.random.default_rng(2))
    rated = np.flatnonzero(np.abs(up.gram).sum(axis=(1, 2)) > 0)
    np.testing.assert_array_equal(rated, [1, 3])
    w, vecs = np.linalg.eigh(up.gram[1])  # rank one: u_t u_t^T
    u_t = vecs[:, -1] * np.sqrt(w[-1])
    assert u_t @ up.cross[1] / (u_t @ u_t) == pytest.approx(4.0, rel=1e-9)
