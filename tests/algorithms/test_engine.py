"""The one round engine (algorithms.simulate.drive): its variants give the numbers the
loops they replaced gave, and its hooks see and steer the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from algorithms import clustering as cl
from algorithms import fedmc_admm as F
from algorithms.data import build_federation
from algorithms.rfrec import RFRecConfig, RFRecFConfig, run_batched
from algorithms.rng import derive_rng
from algorithms.simulate import RoundState, run_round, simulate
from algorithms.synthetic import generate_ratings
from tests.algorithms.test_rfrec import R15, _federation

#: outputs of run_batched and clustering.run computed by their own round loops, before
#: they were moved onto the engine (same federation, seeds and settings as below)
REFERENCE = np.load(Path(__file__).parent / "data" / "engine_reference.npz")


def _test_noise_rng(seed: int, round_: int, client: int) -> np.random.Generator:
    """Seeded stand-in noise injected by these tests (the stream the removed
    ``client_noise_rng`` used, so recorded references hold); production noise is never
    seeded (:mod:`privacy.randomness`)."""
    return derive_rng(seed, round_, 3_000_000 + client)


def _noise(round_, client, shape):
    return _test_noise_rng(5, round_, client).laplace(0.0, 0.04, size=shape)


#: the defaults the reference was recorded with (before bias terms and the weighted ridge,
#: and before RFRec's Adam betas (0.9, 0.9) and growing lambda)
_BEFORE = {"bias": False, "lam_u_rating": 0.0, "lam_v_rating": 0.0}
_RFREC_BEFORE = {**_BEFORE, "lam": 20.0, "adam_betas": (0.9, 0.999), "lam_start": 1.0}
_RFRECF_BEFORE = {**_BEFORE, "alpha": 0.02, "lam_u": 3.0}

CASES = {
    "rfrec_dp": (RFRecConfig(rating_range=R15, rank=3, **_RFREC_BEFORE),
                 {"clip": 0.2, "noise": _noise, "per_round": 4}),
    "rfrec_drop": (RFRecConfig(rating_range=R15, rank=3, **_RFREC_BEFORE), {"per_round": 3}),
    "rfrecf": (RFRecFConfig(rating_range=R15, rank=3, **_RFRECF_BEFORE), {"per_round": 3}),
    "rfrecf_paper": (RFRecFConfig.paper_settings(rating_range=R15, rank=2, alpha=0.01),
                     {"clip": 0.2, "noise": _noise}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batched_rfrec_on_the_engine_gives_the_previous_loop_factors(name):
    cfg, kw = CASES[name]
    fed = _federation(sizes=(1, 3, 1, 4, 2, 2), n=9, seed=11)
    res = run_batched(cfg, fed, rounds=17, seed=5, evaluate_every=4, **kw)
    ref = {k.split("__")[1]: REFERENCE[k] for k in REFERENCE.files if k.startswith(name + "__")}
    np.testing.assert_allclose(res.global_msg.v_bar, ref["v_bar"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.global_msg.h, ref["h"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([s.u for s in res.local_states]), ref["u"],
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([s.v_rated for s in res.local_states], axis=1),
                               ref["v_rated"], rtol=0, atol=1e-12)
    np.testing.assert_allclose([r.test_rmse for r in res.history], ref["rmse"], atol=1e-12)
    assert [r.uploads for r in res.history] == ref["uploads"].tolist()


def test_clustering_on_the_engine_gives_the_previous_loop_and_stops_early():
    x, labels = cl.synthetic(30, 240, 3, 6.0, np.random.default_rng(0), outliers=0.0)
    parts = cl.partition(x, 6, "noniid", np.random.default_rng(1))
    # the step factors the reference was recorded with (before the paper's 0.51 / 0.501)
    cfg = cl.ClusterConfig(method="fedmgs", k=3, per_round=3, rounds=60, rho0=1e-4,
                           stop_tol=1e-3, c_factor=1.0, d_factor=1.0)
    res = cl.run([x[:, p] for p in parts], cfg, seed=3, labels=[labels[p] for p in parts])
    assert len(res.history) == REFERENCE["cluster__objective"].shape[0] < 60
    np.testing.assert_allclose([h.objective for h in res.history],
                               REFERENCE["cluster__objective"], rtol=1e-12)
    np.testing.assert_allclose(res.w, REFERENCE["cluster__w"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(res.labels, REFERENCE["cluster__labels"])


def _small_fed():
    r = generate_ratings(40, 30, 500, seed=2)
    return build_federation(r, 5, 0)


def test_engine_hooks_see_each_state_can_stop_and_a_run_continues_from_a_state():
    fed, cfg = _small_fed(), F.FedMCADMMConfig(rank=3)
    full = simulate(F.ALGORITHM, cfg, fed, rounds=6, per_round=3, seed=1)
    seen: list[RoundState] = []
    head = simulate(F.ALGORITHM, cfg, fed, rounds=6, per_round=3, seed=1, evaluate_every=0,
                    on_state=lambda st: seen.append(st) or st.round == 3)
    assert [st.round for st in seen] == [1, 2, 3] and len(head.history) == 3
    assert np.isnan(head.history[-1].test_rmse)  # evaluate_every=0: never evaluated
    assert seen[1].previous_global is seen[0].global_msg
    assert sorted(seen[2].uploads) == sorted(int(i) for i in seen[2].selected)
    tail = simulate(F.ALGORITHM, cfg, fed, rounds=6, per_round=3, seed=1, start=seen[-1])
    assert [r.round for r in tail.history] == [4, 5, 6]
    np.testing.assert_array_equal(tail.global_msg.V, full.global_msg.V)
    assert tail.final.test_rmse == full.final.test_rmse
    # run_round is one step of the same engine
    g, srv, locs, sel, ups = run_round(F.ALGORITHM, cfg, 4, 1, 3, seen[-1].global_msg,
                                       seen[-1].server_state, seen[-1].local_states, fed.train)
    st4 = simulate(F.ALGORITHM, cfg, fed, rounds=4, per_round=3, seed=1, start=seen[-1])
    np.testing.assert_array_equal(g.V, st4.global_msg.V)


def test_engine_refuses_negative_cadence():
    fed = _small_fed()
    with pytest.raises(ValueError, match="evaluate_every"):
        simulate(F.ALGORITHM, F.FedMCADMMConfig(rank=2), fed, rounds=2, per_round=2, seed=0,
                 evaluate_every=-1)


def test_batched_rfrec_noise_through_the_privacy_layer_is_the_stand_in_and_is_charged():
    """RFRec's batched path draws each upload's noise through DPPrivatizer.noise: the
    privacy layer's Laplace(0, s) noise (exact discrete Laplace on a grid,
    privacy.laplace.laplace_noise; fresh, secret numbers: issue 29), every transmission
    charged."""
    import math

    from privacy.ledger import Budget, Ledger
    from privacy.wrapper import DPPrivatizer, DPSpec

    cfg, kw = CASES["rfrec_dp"]
    fed = _federation(sizes=(1, 3, 1, 4, 2, 2), n=9, seed=11)
    spec = DPSpec(mechanism="laplace", norm="value", clip=0.2, noise_scale=0.04)
    priv = DPPrivatizer(spec, Ledger.open({i: Budget(math.inf, 1e-5) for i in range(6)}), 5)
    res = run_batched(cfg, fed, rounds=17, seed=5, evaluate_every=4, clip=0.2,
                      noise=priv.noise, per_round=4)
    assert np.all(np.isfinite(res.global_msg.v_bar))
    assert not np.allclose(res.global_msg.v_bar, REFERENCE["rfrec_dp__v_bar"])  # not seeded
    other = DPPrivatizer(spec, Ledger.open({0: Budget(math.inf, 1e-5)}), 5)
    a, b = other.noise(1, 0, (20_000,)), other.noise(1, 0, (20_000,))
    assert not np.array_equal(a, b)
    assert np.mean(np.abs(a)) == pytest.approx(0.04, rel=0.05)  # Laplace(0, s): E|x| = s
    sent = sum(len(priv.ledger.rounds(i)) for i in range(6))
    assert sent == sum(r.uploads for r in res.history) == 17 * 4
    # a budget that runs out stops the run instead of sending an uncharged upload
    tight = DPPrivatizer(spec, Ledger.open({i: Budget(5.0, 1e-5) for i in range(6)}), 5)
    from privacy.ledger import BudgetExceeded
    with pytest.raises(BudgetExceeded):
        run_batched(cfg, fed, rounds=17, seed=5, clip=0.2, noise=tight.noise, per_round=4)


def test_a_rounds_uploads_are_freed_before_the_next_rounds_are_made():
    """Two rounds' uploads are never held at once (DPALS's per-item Grams of 100 tenants on
    an 11,000-item catalogue are 270 MB): while round 2's clients upload, round 1's
    uploads are gone; the returned state keeps the last round's."""
    import gc
    import weakref

    from algorithms import registry
    from algorithms.data import build_federation
    from algorithms.synthetic import generate_ratings

    alg = registry.get("dpals")
    fed = build_federation(generate_ratings(60, 20, 600, seed=0), 3, 0)
    refs: dict[int, list] = {}
    alive_in_round_2: list[int] = []

    def privatizer(upload, client, round_):
        if round_ == 2 and client == 0:
            gc.collect()
            alive_in_round_2.append(sum(r() is not None for r in refs[1]))
        refs.setdefault(round_, []).append(weakref.ref(upload))
        return upload

    res = simulate(alg, alg.config(rank=2, sweeps=3), fed, rounds=3, per_round=3, seed=0,
                   privatizer=privatizer)
    assert len(refs[1]) == 3 and alive_in_round_2 == [0]
    assert res.final.round == 3


@pytest.mark.parametrize("name", ["fedmc-admm", "dpals", "fedmavg"])
def test_a_round_staged_elsewhere_runs_the_simulators_server_side_bit_for_bit(name):
    """The service's aggregate task runs :func:`algorithms.simulate.step` over
    :class:`~algorithms.simulate.Staged` (uploads staged by other processes): the same
    aggregation and server step as the in-process round, number for number."""
    from algorithms import registry
    from algorithms.simulate import PerClient, Staged, initialise, step

    alg = registry.get(name)
    cfg = alg.config()
    fed = build_federation(generate_ratings(80, 40, 1600, rank=3, seed=2), 4, 7)
    server, glob, locals_ = initialise(alg, cfg, fed.train, 7)
    seen = []

    def total(uploads, k):  # an aggregator: what the server step receives is its output
        seen.append((k, sorted(uploads)))
        return dict(uploads)

    state = RoundState(0, glob, server, locals_)
    for k in (1, 2):
        here = step(PerClient(alg, cfg, 7, 3, fed.train, workers=1), state, k, total)
        staged = step(Staged(alg, cfg, 7, here.selected, here.uploads), state, k, total)
        assert np.array_equal(staged.selected, here.selected)
        for a, b in ((staged.global_msg, here.global_msg),
                     (staged.server_state, here.server_state)):
            assert a.arrays().keys() == b.arrays().keys()
            for key, arr in a.arrays().items():
                assert np.array_equal(arr, b.arrays()[key]), (name, k, key)
        state = here
    assert [k for k, _ in seen] == [1, 1, 2, 2] and seen[0][1] == seen[1][1]
