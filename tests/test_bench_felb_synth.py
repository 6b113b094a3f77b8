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
    _, alg1, _ = S.fit("felb", fed, 3, 4, 0, 0)
    _, eq10, _ = S.fit("felb", fed, 3, 4, 0, 0, server_prox="eq10")
    cfg = felb.ALGORITHM.config(rank=3, local_steps=10)
    assert cfg.server_prox == "alg1"  # the default
    direct = simulate(felb.ALGORITHM, cfg, fed, rounds=4, per_round=3, seed=0,
                      evaluate_every=4)
    np.testing.assert_array_equal(alg1.global_msg.v_hat, direct.global_msg.v_hat)
    assert np.abs(alg1.global_msg.v_hat - eq10.global_msg.v_hat).max() > 1e-3


def test_oracle_quality_is_the_dense_threshold_rule():
    """felb_table1.oracle_quality (candidate pairs by popularity prefix, a few users at a
    time) equals the dense rule 'P(1) >= cut' over every pair of every tenant, scored by
    f1_and_rmsd; at the cut 1/2 it has no more wrong cells than predicting no 1."""
    from algorithms.binary_metrics import f1_and_rmsd
    from algorithms.block import RatingBlock
    from algorithms.synthetic import generate_tenant_ratings
    from bench import felb_table1 as B

    tr = generate_tenant_ratings(700, 300, 40_000, 3, rank=4, seed=1)
    blocks = [RatingBlock(b.rows[b.vals >= 4], b.cols[b.vals >= 4],
                          np.ones(int((b.vals >= 4).sum())), b.n_users, b.n_items)
              for b in tr.blocks]
    cuts = np.round(np.arange(0.05, 0.96, 0.05), 2)
    got = B.oracle_quality(tr.model, blocks, cuts)
    tp = np.zeros(cuts.size)
    pred = np.zeros(cuts.size)
    for t, b in enumerate(blocks):
        users, items = np.arange(b.n_users), np.arange(b.n_items)
        p = (tr.model.observed(t, users, items, tr.model.draws(t))
             * tr.model.star_at_least(4, t, users, items))
        at_ones = p[b.rows, b.cols]
        tp += [(at_ones >= c).sum() for c in cuts]
        pred += [(p >= c).sum() for c in cuts]
    ones, cells = sum(b.nnz for b in blocks), 700 * 300
    want = [f1_and_rmsd(int(a), int(q - a), ones - int(a), cells) for a, q in zip(tp, pred)]
    half = int(np.flatnonzero(cuts == 0.5)[0])
    assert got["f1"] == want[half][0] and got["rmsd"] == want[half][1]
    assert got["f1_best"] == max(f for f, _ in want)
    ok = [f for (f, _), a, q in zip(want, tp, pred) if q <= 2 * a]
    assert got["f1_accepted"] == max(ok)
    assert got["f1_best"] >= got["f1_accepted"] >= got["f1"] > 0.1
    assert pred[half] <= 2 * tp[half]  # FP <= TP at the squared-loss cut
