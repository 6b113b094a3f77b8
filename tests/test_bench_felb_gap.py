"""The Felb gap probe's tiling reference (bench._felb_gap_probe): the best F1 of 'user
group x item set' tilings, checked against an exhaustive search on small matrices."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from bench._felb_gap_probe import tiling_f1


def _f1(a: np.ndarray, pred: np.ndarray) -> float:
    tp = int((a & pred).sum())
    return 2 * tp / (int(a.sum()) + int(pred.sum()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiling_f1_is_the_best_of_every_cell_subset(seed):
    rng = np.random.default_rng(seed)
    a = rng.random((9, 5)) < rng.uniform(0.1, 0.6, size=5)  # columns of varied density
    groups = rng.integers(0, 2, size=9)
    groups[:2] = [0, 1]  # both groups non-empty
    cells = [(g, j) for g in range(2) for j in range(5)]
    best = best_half = 0.0
    for mask in itertools.product([False, True], repeat=len(cells)):
        pred = np.zeros_like(a)
        for (g, j), on in zip(cells, mask, strict=True):
            if on:
                pred[groups == g, j] = True
        f1 = _f1(a, pred)
        best = max(best, f1)
        dens_ok = all(a[groups == g, j].mean() > 0.5
                      for (g, j), on in zip(cells, mask, strict=True) if on)
        # the densest-first set of cells above 1/2: every such cell covered
        if dens_ok and all(on or a[groups == g, j].mean() <= 0.5
                           for (g, j), on in zip(cells, mask, strict=True)):
            best_half = f1
    r = tiling_f1(sp.csr_matrix(a.astype(float)), groups)
    assert r["f1"] == pytest.approx(best, abs=1e-12)
    assert r["f1_half"] == pytest.approx(best_half, abs=1e-12)


def test_one_tile_of_everyone_covers_the_columns_above_the_threshold():
    a = np.zeros((4, 3), bool)
    a[:, 0] = True  # density 1
    a[:2, 1] = True  # density 1/2
    groups = np.zeros(4, np.int64)
    r = tiling_f1(sp.csr_matrix(a.astype(float)), groups)
    # covering column 0 only: F1 2*4/(6+4) = 0.8; both: 2*6/(6+8) = 0.857
    assert r["f1"] == pytest.approx(12 / 14) and r["cells"] == 2
    assert r["f1_half"] == pytest.approx(0.8) and r["cells_half"] == 1


def test_felb_bench_fit_passes_the_server_prox_on():
    """bench._felb_synth.fit (the felb_table1 --server-prox path) trains with the chosen
    server prox: the same V_hat as a direct simulate of that config, another than eq10's."""
    from algorithms import felb
    from algorithms.simulate import simulate
    from bench import _felb_synth as S

    rng = np.random.default_rng(0)
    data, signal = S.tiles(60, 40, 3, 0.05, rng)
    fed = S.federation(data, signal, 3, rng)
    _, alg1, _ = S.fit("felb", fed, 3, 4, 0, 0, server_prox="alg1")
    _, eq10, _ = S.fit("felb", fed, 3, 4, 0, 0)
    cfg = felb.ALGORITHM.config(rank=3, local_steps=10, server_prox="alg1")
    direct = simulate(felb.ALGORITHM, cfg, fed, rounds=4, per_round=3, seed=0,
                      evaluate_every=4)
    np.testing.assert_array_equal(alg1.global_msg.v_hat, direct.global_msg.v_hat)
    assert np.abs(alg1.global_msg.v_hat - eq10.global_msg.v_hat).max() > 1e-3
