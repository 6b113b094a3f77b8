"""bench._felb_synth, the fits shared by the Felb experiments: felb_table1's --server-prox
path trains with the chosen server prox."""

from __future__ import annotations

import numpy as np


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
