"""Orthogonal-NMF clustering by FedMAvg / FedMGS (algorithms/clustering.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from algorithms import clustering as cl
from algorithms.messages import Message, messages_equal


def _small(seed: int = 0):
    rng = np.random.default_rng(seed)
    x, w, h = rng.random((6, 9)), rng.random((6, 3)), rng.random((3, 9))
    return x, w, h


def test_h_gradient_matches_finite_differences_of_the_objective():
    x, w, h = _small()
    rho, nu, n = 0.3, 0.05, 20
    grad = cl.h_gradient(w, h, x, rho, nu, n)
    eps = 1e-6
    for i, j in [(0, 0), (2, 5), (1, 8)]:
        e = np.zeros_like(h)
        e[i, j] = eps
        fd = (cl.objective(w, [h + e], [x], rho, nu, n)
              - cl.objective(w, [h - e], [x], rho, nu, n)) / (2 * eps)
        assert grad[i, j] == pytest.approx(fd, rel=1e-6)


def test_objective_from_statistics_is_the_objective():
    x, w, h = _small(3)
    parts = [(x[:, :4], h[:, :4]), (x[:, 4:], h[:, 4:])]
    hh = sum(hp @ hp.T for _, hp in parts)
    xh = sum(xp @ hp.T for xp, hp in parts)
    got = cl.objective_from_statistics(w, hh, xh, float(np.sum(x * x)),
                                       [hp for _, hp in parts], 0.3, 0.05, 20)
    want = cl.objective(w, [hp for _, hp in parts], [xp for xp, _ in parts], 0.3, 0.05, 20)
    assert got == pytest.approx(want, rel=1e-12)


def test_h_steps_are_projected_gradient_steps():
    x, w, h = _small(1)
    rho, nu, n = 0.2, 0.01, 9
    lip = 2 / n * np.linalg.eigvalsh(w.T @ w).max() + rho * 2 + nu
    expected = h
    for _ in range(3):
        expected = np.maximum(expected - cl.h_gradient(w, expected, x, rho, nu, n) / lip, 0.0)
    got = cl.h_steps(w, h, x, rho, nu, n, 3, 1.0)
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert got.min() >= 0.0


def test_w_local_and_server_steps():
    x, w, h = _small(2)
    top = np.linalg.eigvalsh(h @ h.T).max()
    expected = w
    for _ in range(2):  # the 2/N_p of the gradient and of L_W cancel
        expected = expected - (expected @ h - x) @ h.T / (5.0 * top)
    np.testing.assert_allclose(cl.w_local_steps(w, h, x, 2, 5.0), expected, atol=1e-12)
    # with the federation's L_W (here 0.7): steps 1 / (5 L_W) on the gradient (2/N_p)(...)
    expected = w
    for _ in range(3):
        expected = expected - (2 / 9) * (expected @ h - x) @ h.T / (5.0 * 0.7)
    np.testing.assert_allclose(cl.w_local_steps(w, h, x, 3, 5.0, 0.7), expected, atol=1e-12)
    assert cl.w_lipschitz(h @ h.T, 40) == pytest.approx(2 / 40 * np.linalg.norm(h, 2) ** 2)
    expected = w
    for _ in range(2):
        expected = np.clip(expected - (expected @ h - x) @ h.T / top, 0.1, 0.6)
    got = cl.w_server_steps(w, h @ h.T, x @ h.T, 0.1, 0.6, 2, 1.0)
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_sncp_schedule():
    assert cl.sncp_rho(2.0, 100.0, 100.0005, 1e-5, 1.5) == 3.0
    assert cl.sncp_rho(2.0, 100.0, 100.01, 1e-5, 1.5) == 2.0
    assert cl.sncp_rho(2.0, float("nan"), 100.0, 1e-5, 1.5) == 2.0
    assert cl.ClusterConfig(method="fedmavg").sncp_tol == 1e-5
    assert cl.ClusterConfig(method="fedmgs").sncp_tol == 5e-5


def test_default_step_factors_are_the_papers():
    """Sec. V-A: c = 1/2 lambda_max for H (0.51 in the authors' code), d = 5 lambda_max for
    FedMAvg's local W steps and 1/2 lambda_max for FedMGS's server (0.501 in their code)."""
    mavg, mgs = cl.ClusterConfig(method="fedmavg"), cl.ClusterConfig(method="fedmgs")
    assert mavg.c_factor == mgs.c_factor == 0.51
    assert (mavg.w_step_factor, mgs.w_step_factor) == (5.0, 0.501)
    assert cl.ClusterConfig(method="fedmgs", d_factor=2.0).w_step_factor == 2.0


def test_accuracy_uses_the_best_matching():
    truth = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    assert cl.accuracy(truth, np.array([2, 2, 2, 0, 0, 1, 1, 1])) == 1.0
    # best matching 0->5, 1->7, 2->6 gets 2 + 1 + 2 of 8 (vs 3 of 8 for the identity)
    assert cl.accuracy(truth, np.array([5, 5, 7, 7, 6, 6, 6, 5])) == pytest.approx(5 / 8)
    with pytest.raises(ValueError, match="truth and pred must have the same shape"):
        cl.accuracy(truth, truth[:3])


def test_synthetic_hits_the_snr_and_keeps_every_cluster():
    rng = np.random.default_rng(3)
    x, labels = cl.synthetic(40, 500, 5, -3.0, rng, outliers=0.0)
    assert x.shape == (40, 500) and labels.shape == (500,)
    assert set(np.unique(labels)) == set(range(5))
    # independent re-derivation of the signal from the same stream: W is drawn first
    w = np.random.default_rng(3).uniform(0.0, 1.0, size=(40, 5))
    signal = w[:, labels]
    snr_db = 10 * np.log10(np.sum(signal ** 2) / np.sum((x - signal) ** 2))
    assert snr_db == pytest.approx(-3.0, abs=1e-6)
    assert x.min() > -1e-6 * np.abs(x).max()


def test_partitions_cover_every_sample_once():
    rng = np.random.default_rng(4)
    x, _ = cl.synthetic(10, 300, 3, 5.0, rng)
    for kind in ("iid", "noniid"):
        parts = cl.partition(x, 7, kind, np.random.default_rng(5))
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    sizes = [p.size for p in cl.partition(x, 7, "iid", np.random.default_rng(5))]
    assert max(sizes) - min(sizes) <= 1


def _planted(seed: int = 0):
    rng = np.random.default_rng(seed)
    x, labels = cl.synthetic(30, 240, 3, 6.0, rng, outliers=0.0)
    parts = cl.partition(x, 6, "noniid", np.random.default_rng(seed + 1))
    return x, labels, [x[:, p] for p in parts], [labels[p] for p in parts]


def test_kmeans_finds_well_separated_clusters():
    x, labels, _, _ = _planted()
    assert cl.accuracy(labels, cl.kmeans(x, 3, np.random.default_rng(0))) == 1.0


@pytest.mark.parametrize("method,options", [
    ("fedmavg", {"q_hat": None, "q2": 1, "d_factor": 2.0}),
    ("fedmgs", {}),
])
def test_federated_onmf_recovers_planted_clusters(method, options):
    """Six non-iid clients, three of them communicating per round (k-means reaches 100%)."""
    _, _, xs, ls = _planted()
    cfg = cl.ClusterConfig(method=method, k=3, per_round=3, rounds=200, rho0=1e-4, **options)
    result = cl.run(xs, cfg, seed=0, labels=ls)
    assert result.accuracy >= 0.95
    assert result.history[0].accuracy < 0.8  # it was not solved by the initial point


def test_fedmgs_server_sums_are_the_statistics_of_every_current_h():
    _, _, xs, _ = _planted(2)
    cfg = cl.ClusterConfig(method="fedmgs", k=3, per_round=2)
    server, glob = cl.init_server(xs, cfg, np.random.default_rng(0))
    locs = [cl.init_client(x, glob, cfg, np.random.default_rng(p)) for p, x in enumerate(xs)]
    for k, active in enumerate([range(len(xs)), [0, 3], [3, 5]]):
        ups = {}
        for p in active:
            locs[p], ups[p] = cl.client_step(glob, locs[p], xs[p], cfg,
                                             np.random.default_rng(k), 1.0)
        server, glob = cl.server_step(server, ups, cfg, np.random.default_rng(k))
        np.testing.assert_allclose(server.hh, sum(lc.h @ lc.h.T for lc in locs), atol=1e-9)
        np.testing.assert_allclose(server.xh, sum(x @ lc.h.T for x, lc in
                                                  zip(xs, locs, strict=True)), atol=1e-9)
        assert glob.w.min() >= server.low and glob.w.max() <= server.high


@pytest.mark.parametrize("per_round,full", [(2, False), (6, True), (6, False)])
def test_fedmavg_round_uses_the_federation_step(per_round, full):
    """A FedMAvg round against an independent computation: every client takes its H steps,
    L_W is that of the whole new H (the paper's d^s), each sender's W_p takes Q2^k steps
    of 1/(5 L_W); with m = P and full_communication every client sends with weight N_p."""
    _, _, xs, _ = _planted(4)
    cfg = cl.ClusterConfig(method="fedmavg", k=3, per_round=per_round, rounds=3, rho0=1e-4,
                           full_communication=full)
    steps = cl.ClusterSteps(xs, cfg, seed=7)
    state = steps.start()
    for k in (1, 2):
        selected = steps.select(k, state)
        senders = dict(steps._senders)
        locs, uploads = steps.clients(k, state, selected)
        glob = state.global_msg
        nu = cfg.nu0 * glob.x_scale
        hs = [cl.h_steps(glob.w, lc.h, x, glob.rho, nu, glob.n_total, cfg.q1, 0.51)
              for lc, x in zip(state.local_states, xs, strict=True)]
        lip = 2 / glob.n_total * np.linalg.eigvalsh(sum(h @ h.T for h in hs))[-1]
        for p, h in enumerate(hs):
            np.testing.assert_allclose(locs[p].h, h, atol=1e-12)
        assert sorted(uploads) == sorted(senders)
        if k > 1:
            full_weights = {p: float(x.shape[1]) for p, x in enumerate(xs)}
            assert (senders == full_weights) == full
            assert sum(senders.values()) == (sum(full_weights.values()) if full else per_round)
        for p, up in uploads.items():
            w = glob.w
            for _ in range(cfg.q_hat // k + 1):
                w = w - 2 / xs[p].shape[1] * (w @ hs[p] - xs[p]) @ hs[p].T / (5 * lip)
            np.testing.assert_allclose(up.w, w, atol=1e-10)
            assert up.weight == senders[p]
        server, glob = steps.server(k, state.server_state, uploads)
        state = dataclasses.replace(state, round=k, global_msg=glob, server_state=server,
                                    local_states=locs)


def test_messages_round_trip_and_runs_are_deterministic():
    _, _, xs, ls = _planted(3)
    cfg = cl.ClusterConfig(method="fedmavg", k=3, per_round=2, rounds=5)
    server, glob = cl.init_server(xs, cfg, np.random.default_rng(0))
    local = cl.init_client(xs[0], glob, cfg, np.random.default_rng(1))
    local2, up = cl.client_step(glob, local, xs[0], cfg, np.random.default_rng(2), 2.0, 0.5)
    with pytest.raises(ValueError, match="needs the federation's w_lip"):
        cl.client_step(glob, local, xs[0], cfg, np.random.default_rng(2), 2.0)
    for msg in (server, glob, local, local2, up):
        assert messages_equal(Message.from_bytes(msg.to_bytes()), msg)
    a, b = cl.run(xs, cfg, 4, ls), cl.run(xs, cfg, 4, ls)
    np.testing.assert_array_equal(a.w, b.w)
    assert [r.objective for r in a.history] == [r.objective for r in b.history]


def _cluster_command(argv):
    import argparse

    from app.commands import cluster

    parser = argparse.ArgumentParser()
    cluster.register(parser.add_subparsers())
    args = parser.parse_args(["cluster", *argv])
    return args.func(args)


def test_fedrec_cluster_command_writes_a_json_report(tmp_path, capsys):
    import json

    out = tmp_path / "report.json"
    argv = ["--algorithm", "fedmgs", "--clients", "4", "--per-round", "2", "--M", "20",
            "--N", "120", "--K", "3", "--snr-db", "6", "--rounds", "30", "--every", "10",
            "--json", str(out)]
    assert _cluster_command(argv) == 0
    report = json.loads(out.read_text())
    assert report["clients"] == 4 and report["rounds"] == len(report["history"]) <= 30
    assert 0.0 <= report["accuracy"] <= 1.0
    assert report["accuracy"] == report["history"][-1]["accuracy"]
    assert "fedmgs accuracy" in capsys.readouterr().out
    with pytest.raises(ValueError, match="^--K must be positive$"):
        _cluster_command(["--K", "0"])
