"""Client steps on a pool of threads (algorithms._pool): the same numbers as one by one,
in the same order, with the kernels serial inside the pool's threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from algorithms import _mf_kernels as K
from algorithms import _pool, dp_fedmavg, dp_fedmc_admm, dpals
from algorithms import fedmc_admm as F
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from privacy.user_level import UserLevelPrivatizer, UserLevelSpec


def test_map_tasks_keeps_the_order_of_the_items_and_uses_several_threads():
    seen: set[int] = set()
    barrier = threading.Barrier(2, timeout=10)

    def task(x: int) -> int:
        seen.add(threading.get_ident())
        if x < 2:  # the first two tasks can only both pass if they run at once
            barrier.wait()
        return x * x

    # weights put items 0 and 1 first, so two threads must hold them together
    got = _pool.map_tasks(task, list(range(7)), workers=2,
                          weights=[9, 8, 1, 2, 3, 4, 5])
    assert got == [x * x for x in range(7)]
    assert len(seen) == 2 and threading.get_ident() not in seen


def test_map_tasks_runs_in_the_calling_thread_with_one_worker_or_inside_the_pool():
    caller = threading.get_ident()
    assert _pool.map_tasks(lambda _: threading.get_ident(), [1, 2, 3], workers=1) \
        == [caller] * 3

    def nested(_: int) -> tuple[bool, list[int]]:
        me = threading.get_ident()
        inner = _pool.map_tasks(lambda _: threading.get_ident(), [1, 2, 3], workers=2)
        return _pool.in_pool(), [t == me for t in inner]

    for inside, same in _pool.map_tasks(nested, [0, 1], workers=2):
        assert inside and all(same)
    assert not _pool.in_pool()


def test_map_tasks_reraises_the_first_failure_and_rejects_zero_workers():
    def task(x: int) -> int:
        if x in (3, 5):
            raise KeyError(f"item {x}")
        return x

    with pytest.raises(KeyError, match="item 3"):
        _pool.map_tasks(task, list(range(8)), workers=2)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        _pool.map_tasks(task, [1], workers=0)


def test_using_sets_the_default_width_in_this_thread_only():
    with _pool.using(1):
        assert _pool.width() == 1
        assert _pool.map_tasks(lambda _: threading.get_ident(), [1, 2]) \
            == [threading.get_ident()] * 2
        with _pool.using(None):
            assert _pool.width() == 1
    assert _pool.width() == _pool.cores()


@pytest.mark.parametrize("shape", [(3,), (5, 4), (300, 200, 11), (1, 3000, 400)])
def test_copy_is_an_equal_independent_array(shape):
    a = np.random.default_rng(0).normal(size=shape)
    b = _pool.copy(a, workers=2)
    assert b.flags.c_contiguous and b.shape == a.shape
    np.testing.assert_array_equal(b, a)
    b.flat[0] += 1.0
    assert b.flat[0] != a.flat[0]


def test_kernels_run_serially_inside_the_pool():
    assert _pool.map_tasks(lambda _: K._use_parallel(None, 10**6), [0, 1], workers=2) \
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
    threads finish: the same noise, the same ledger."""
    fed = _federation()
    cfg = mod.ALGORITHM.config(rank=3, **({"sweeps": 2} if mod is dpals else {"releases": 2}))
    spec = UserLevelSpec(epsilon=4, delta=1e-4, n_users=240, releases=2, placement=placement)
    runs, ledgers = [], []
    for workers in (1, 2):
        priv = UserLevelPrivatizer(spec, mod.user_bounds(cfg), 12, 1)
        runs.append(simulate(mod.ALGORITHM, cfg, fed, rounds=3, per_round=12, seed=1,
                             privatizer=priv, aggregator=priv.aggregate, workers=workers))
        ledgers.append(priv.ledger.to_dict())
        assert len(priv.ledger.rounds(0)) == 2  # two releases charged to tenant 0
    _assert_same_states(*runs)
    assert ledgers[0] == ledgers[1]
