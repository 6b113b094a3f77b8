"""Client steps on a pool of threads (algorithms.pool): the same numbers as one by one,
in the same order, with the kernels serial inside the pool's threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from algorithms import dp_fedmavg, dp_fedmc_admm, dpals, pool
from algorithms import fedmc_admm as F
from algorithms import mf_kernels as K
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from privacy.user_level import UserLevelPrivatizer, UserLevelSpec


def test_map_tasks_keeps_the_order_of_the_items_and_uses_several_threads():
    seen: set[int] = set()
    barrier = threading.Barrier(2, timeout=60)  # generous: a loaded host starts threads late

    def task(x: int) -> int:
        seen.add(threading.get_ident())
        if x < 2:  # the first two tasks can only both pass if they run at once
            barrier.wait()
        return x * x

    # weights put items 0 and 1 first, so two threads must hold them together
    got = pool.map_tasks(task, list(range(7)), workers=2,
                          weights=[9, 8, 1, 2, 3, 4, 5])
    assert got == [x * x for x in range(7)]
    assert len(seen) == 2 and threading.get_ident() not in seen


def test_map_tasks_runs_in_the_calling_thread_with_one_worker_or_inside_the_pool():
    caller = threading.get_ident()
    assert pool.map_tasks(lambda _: threading.get_ident(), [1, 2, 3], workers=1) \
        == [caller] * 3

    def nested(_: int) -> tuple[bool, list[int]]:
        me = threading.get_ident()
        inner = pool.map_tasks(lambda _: threading.get_ident(), [1, 2, 3], workers=2)
        return pool.in_pool(), [t == me for t in inner]

    for inside, same in pool.map_tasks(nested, [0, 1], workers=2):
        assert inside and all(same)
    assert not pool.in_pool()


def test_map_tasks_reraises_the_first_failure_and_rejects_zero_workers():
    def task(x: int) -> int:
        if x in (3, 5):
            raise KeyError(f"item {x}")
        return x

    with pytest.raises(KeyError, match="item 3"):
        pool.map_tasks(task, list(range(8)), workers=2)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        pool.map_tasks(task, [1], workers=0)


def test_using_sets_the_default_width_in_this_thread_only():
    with pool.using(1):
        assert pool.width() == 1
        assert pool.map_tasks(lambda _: threading.get_ident(), [1, 2]) \
            == [threading.get_ident()] * 2
        with pool.using(None):
            assert pool.width() == 1
    assert pool.width() == pool.cores()


@pytest.mark.parametrize("shape", [(3,), (5, 4), (300, 200, 11), (1, 3000, 400)])
def test_copy_is_an_equal_independent_array(shape):
    a = np.random.default_rng(0).normal(size=shape)
    b = pool.copy(a, workers=2)
    assert b.flags.c_contiguous and b.shape == a.shape
    np.testing.assert_array_equal(b, a)
    b.flat[0] += 1.0
    assert b.flat[0] != a.flat[0]


def test_kernels_run_serially_inside_the_pool():
    assert pool.map_tasks(lambda _: K._use_parallel(None, 10**6), [0, 1], workers=2) \
        == [False, False]
    assert K._use_parallel(None, 10**6) == (K.threads() > 1)


def _federation():
    return build_federation(generate_ratings(240, 90, 3000, rank=3, seed=4), 12, 0)


def _assert_same_states(a, b):
    for x, y in zip([a.global_msg, a.server_state, *a.local_states],
                    [b.global_msg, b.server_state, *b.local_states], strict=True):
        for name, value in vars(x).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, getattr(y, name), err_msg=name)
    assert [r.test_rmse for r in a.history] == [r.test_rmse for r in b.history]


@pytest.mark.parametrize("kernel", ["numba", "numpy"] if K.HAVE_NUMBA else ["numpy"])
def test_fedmc_admm_on_two_threads_gives_the_serial_numbers(kernel):
    fed = _federation()
    cfg = F.FedMCADMMConfig(rank=3, kernel=kernel)
    runs = [simulate(F.ALGORITHM, cfg, fed, rounds=4, per_round=5, seed=2, workers=w)
            for w in (1, 2)]
    assert runs[0].history[-1].test_rmse < runs[0].history[0].test_rmse
    _assert_same_states(*runs)


@pytest.mark.parametrize("mod", [dp_fedmavg, dp_fedmc_admm, dpals])
@pytest.mark.parametrize("placement", ["tenant", "central"])
def test_dp_algorithms_on_two_threads_give_the_serial_numbers_and_charges(mod, placement):
    """Uploads go through the privatizer in the order of the selected clients after the
    threads finish: the same ledger; the noise is fresh (issue 29), so the numbers are
    compared on the noise-free run, which threads leave bit-identical."""
    fed = _federation()
    cfg = mod.ALGORITHM.config(rank=3, **({"sweeps": 2} if mod is dpals else {"releases": 2}))
    spec = UserLevelSpec(epsilon=4, delta=1e-4, n_users=240, releases=2, placement=placement)
    runs, ledgers = [], []
    for workers in (1, 2):
        priv = UserLevelPrivatizer(spec, mod.user_bounds(cfg), 12, 1)
        simulate(mod.ALGORITHM, cfg, fed, rounds=3, per_round=12, seed=1, privatizer=priv,
                 aggregator=priv.aggregate, workers=workers, evaluate_every=0)
        ledgers.append(priv.ledger.to_dict())
        assert len(priv.ledger.rounds(0)) == 2  # two releases charged to tenant 0
        runs.append(simulate(mod.ALGORITHM, cfg, fed, rounds=3, per_round=12, seed=1,
                             workers=workers))
    _assert_same_states(*runs)
    assert ledgers[0] == ledgers[1]


@pytest.mark.parametrize("shape,count", [((5, 3706), 100), ((600, 5, 5), 30), ((7,), 3),
                                         ((), 4)])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_sum_arrays_gives_np_sum_to_the_bit(shape, count, workers):
    rng = np.random.default_rng(len(shape) + count)
    arrays = [rng.normal(size=shape) * 10.0 ** rng.uniform(-8, 8) for _ in range(count)]
    got = pool.sum_arrays(arrays, workers=workers)
    assert got.shape == shape
    np.testing.assert_array_equal(got, np.sum(arrays, axis=0))
    assert not any(np.shares_memory(got, a) for a in arrays)


def test_copy_parts_fill_an_equal_array_in_any_order():
    a = np.random.default_rng(1).normal(size=(100, 600, 11))  # over COPY_CHUNK_BYTES
    out, fill = pool.copy_parts(a, 8)
    assert len(fill) == 8
    for task in reversed(fill):
        task()
    np.testing.assert_array_equal(out, a)
    out, fill = pool.copy_parts(a[:2, :3], 8)  # small: one piece
    assert len(fill) == 1


def test_fedmc_admm_server_step_is_its_two_parts_and_leaves_its_input_alone():
    """What the engine runs (server_prepare's tasks beside the clients, then server_apply)
    is the service's server_step, and neither changes the state it was given."""
    fed = _federation()
    cfg = F.FedMCADMMConfig(rank=3)
    res = simulate(F.ALGORITHM, cfg, fed, rounds=2, per_round=5, seed=2, workers=1)
    state = res.server_state
    before = state.C.copy(), state.S.copy()
    glob = res.global_msg
    ups = {}
    for i in (1, 4, 7):
        ups[i] = F.client_step(glob, res.local_states[i], fed.train[i], cfg, None)[1]
    direct = F.server_step(state, ups, cfg, np.random.default_rng(0))
    fresh, fill = F.server_prepare(state, cfg)
    assert not np.shares_memory(fresh.C, state.C)
    pool.run_all(fill, workers=2)
    split = F.server_apply(fresh, ups, cfg, np.random.default_rng(0))
    for a, b in zip(direct, split, strict=True):
        for name, value in vars(a).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(state.C, before[0])
    np.testing.assert_array_equal(state.S, before[1])
    assert not np.array_equal(direct[0].C[4], before[0][4])  # the uploaders' rows changed
    np.testing.assert_array_equal(direct[0].C[0], before[0][0])  # the others' did not


def test_fedmc_admm_server_copies_no_row_of_a_tenant_expected_to_upload():
    """The engine tells server_prepare which tenants run this round: their rows of C are
    not copied (an upload replaces them); server_apply reads their old values in the
    previous state and copies the rows of expected tenants that sent nothing. The result
    equals the full copy's to the bit, and the previous state is left alone."""
    fed = _federation()
    cfg = F.FedMCADMMConfig(rank=3)
    res = simulate(F.ALGORITHM, cfg, fed, rounds=2, per_round=5, seed=2, workers=1)
    state, glob = res.server_state, res.global_msg
    before = state.C.copy(), state.S.copy()
    ups = {i: F.client_step(glob, res.local_states[i], fed.train[i], cfg, None)[1]
           for i in (0, 1, 4, 7)}
    fresh, fill = F.server_prepare(state, cfg)
    pool.run_all(fill, workers=2)
    want = F.server_apply(fresh, ups, cfg, np.random.default_rng(0))
    expected = [0, 1, 2, 4, 7]  # tenant 2 ran but its upload was dropped
    fresh, fill = F.server_prepare(state, cfg, 3, expected=expected)
    copied = sum(task.args[1].shape[0] for task in fill)  # np.copyto(fresh rows, old rows)
    assert copied == state.C.shape[0] - len(expected)  # only the other tenants' rows
    pool.run_all(fill, workers=2)
    got = F.server_apply(fresh, ups, cfg, np.random.default_rng(0), previous=state,
                         expected=expected)
    for a, b in zip(want, got, strict=True):
        for name, value in vars(a).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(state.C, before[0])
    np.testing.assert_array_equal(state.S, before[1])
    with pytest.raises(ValueError, match="previous state"):
        F.server_apply(fresh, ups, cfg, np.random.default_rng(0), expected=expected)


def test_dpals_item_solve_in_slices_gives_the_same_numbers_on_one_or_two_threads():
    """Each item is solved on its own: slices on two threads give one thread's numbers to
    the bit, and both agree with numpy's batched eigh and solve (an independent
    computation: LAPACK) to 1e-12."""
    rng = np.random.default_rng(3)
    n, cfg = 1500, dpals.DPALSConfig()
    x = rng.normal(size=(n, 30, cfg.d))
    a = np.einsum("nki,nkj->nij", x, x) + rng.normal(size=(n, cfg.d, cfg.d))
    a[:20] = rng.normal(size=(20, cfg.d, cfg.d))  # indefinite: the projection acts
    b = rng.normal(size=(n, cfg.d))
    counts = dpals.count_estimate(a, cfg)
    shrunk = dpals.shrink_grams(a, counts, cfg.gram_shrink)
    lam = dpals.item_ridge(0.5, cfg, counts)
    g = dpals.psd_project(shrunk) + lam[:, None, None] * np.eye(cfg.d)
    expected = np.linalg.solve(g, b[..., None])[..., 0].T
    got = []
    for workers in (1, 2):
        with pool.using(workers):
            got.append(dpals.solve_items(a, b, 0.5, cfg))
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dpals.solve_items_numpy(a, b, 0.5, cfg), expected, rtol=0,
                               atol=1e-14)


def test_a_deferred_client_stream_draws_what_the_stream_draws_and_only_derives_on_use():
    from algorithms.rng import Deferred, client_rng, deferred_client_rng

    calls = []
    lazy = Deferred(lambda: calls.append(1) or client_rng(3, 4, 5))
    assert calls == []
    np.testing.assert_array_equal(lazy.random(5), client_rng(3, 4, 5).random(5))
    lazy.normal(size=2)
    assert calls == [1]
    np.testing.assert_array_equal(deferred_client_rng(3, 4, 5).integers(0, 9, 6),
                                  client_rng(3, 4, 5).integers(0, 9, 6))
    with pytest.raises(ValueError, match="non-negative"):
        deferred_client_rng(3, -1, 5)


@pytest.mark.parametrize("workers,expected", [(1, 1), (2, 2)])
def test_the_engine_keeps_the_server_step_on_its_workers(workers, expected, monkeypatch):
    """``workers=1`` is the serial baseline: no part of the round, the server step's
    slices included, may use the pool's threads."""
    seen: set[int] = set()
    real = pool._marked

    def marked(fn, item):
        seen.add(threading.get_ident())
        return real(fn, item)

    monkeypatch.setattr(pool, "_marked", marked)
    fed = build_federation(generate_ratings(240, 1200, 3000, rank=3, seed=4), 12, 0)
    simulate(F.ALGORITHM, F.FedMCADMMConfig(rank=3), fed, rounds=2, per_round=5, seed=2,
             workers=workers)
    assert len(seen) == (0 if expected == 1 else 2)
