"""Several tenants' client steps at once, on a pool of threads: both cores for a round.

A round's client steps are independent (each reads the broadcast and its own tenant's state
and block, and returns new values), so :func:`map_tasks` runs them on up to :func:`cores`
threads. The heavy work releases the GIL (the fused numba kernels are compiled ``nogil``;
numpy and scipy release it in their large array loops), so the threads run in parallel,
and each step is computed by the same code as serially: the numbers are the same to the
bit. Tasks go to whichever thread is free, largest first, so tenants of different sizes
balance across the threads, and a thread the machine's scheduler holds back simply takes
fewer of them.

Inside a pool thread the kernels must not start numba's own threads as well
(:func:`in_pool`; :mod:`algorithms.mf_kernels` runs its serial kernels there).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

_LOCAL = threading.local()
_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without affinity masks
        return os.cpu_count() or 1


def width() -> int:
    """Threads :func:`map_tasks` and :func:`copy` use when not told: the innermost
    :func:`using`'s, else :func:`cores`."""
    return getattr(_LOCAL, "width", None) or cores()


@contextlib.contextmanager
def using(workers: int | None) -> Iterator[None]:
    """Within the block, :func:`width` is ``workers`` (None: unchanged) in this thread."""
    saved = getattr(_LOCAL, "width", None)
    _LOCAL.width = saved if workers is None else int(workers)
    try:
        yield
    finally:
        _LOCAL.width = saved


def in_pool() -> bool:
    """Whether the calling thread is running a task of :func:`map_tasks`' pool."""
    return getattr(_LOCAL, "active", False)


def _executor(workers: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` threads (kept across rounds: starting threads
    every round would cost more than a small client step)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="fedrec-client")
        return _POOLS[workers]


def _marked(fn: Callable[[Any], Any], item: Any) -> Any:
    _LOCAL.active = True
    try:
        return fn(item)
    finally:
        _LOCAL.active = False


def map_tasks(fn: Callable[[Any], Any], items: Sequence[Any], workers: int | None = None,
              weights: Sequence[float] | None = None) -> list[Any]:
    """``[fn(item) for item in items]``, on up to ``workers`` threads (None: :func:`width`).

    One worker, one item, or a call from inside a pool thread runs in the calling thread,
    in order. Otherwise each of ``workers`` pool threads takes the next item in decreasing
    ``weights`` (their expected work; stable) until none is left: one hand-off per thread
    per call, not per item, and whichever thread is free takes the next item, so items of
    different sizes balance. Results come back in the order of ``items``. Every item is
    run; the first exception raised by ``fn`` (in the order of ``items``) is re-raised.
    """
    workers = width() if workers is None else int(workers)
    if workers < 1:
        raise ValueError("workers must be at least 1")
    workers = min(workers, len(items))
    if workers <= 1 or in_pool():
        return [fn(item) for item in items]
    order = list(range(len(items))) if weights is None else sorted(
        range(len(items)), key=lambda t: -weights[t])
    results: list[Any] = [None] * len(items)
    errors: dict[int, BaseException] = {}
    taken = itertools.count()  # next() on it is atomic: each position is taken once

    def drain() -> None:
        for position in taken:
            if position >= len(order):
                return
            t = order[position]
            try:
                results[t] = _marked(fn, items[t])
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                errors[t] = exc

    pool = _executor(workers)
    for future in [pool.submit(drain) for _ in range(workers)]:
        future.result()
    if errors:
        raise errors[min(errors)]
    return results


COPY_CHUNK_BYTES = 1 << 22
"""Arrays smaller than this are copied in one piece."""


def copy_parts(a: np.ndarray, parts: int) -> tuple[np.ndarray, list[Callable[[], None]]]:
    """A fresh C-contiguous array of ``a``'s shape and the tasks that fill it with ``a``:
    ``parts`` slices of its leading axis (one piece for a small array), each a
    zero-argument callable, independent of the others (any order, any thread; numpy
    releases the GIL while it copies)."""
    out = np.empty(a.shape, dtype=a.dtype)
    if a.nbytes < COPY_CHUNK_BYTES or a.ndim == 0 or a.shape[0] < 2:
        parts = 1
    bounds = np.linspace(0, a.shape[0] if a.ndim else 1,
                         max(1, min(parts, a.shape[0] if a.ndim else 1)) + 1).astype(int)
    if len(bounds) == 2:
        return out, [functools.partial(np.copyto, out, a)]
    return out, [functools.partial(np.copyto, out[lo:hi], a[lo:hi])
                 for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def run_all(tasks: Sequence[Callable[[], Any]], workers: int | None = None,
            weights: Sequence[float] | None = None) -> list[Any]:
    """Every zero-argument task, on up to ``workers`` threads (:func:`map_tasks`)."""
    return map_tasks(_call, tasks, workers, weights)


def _call(task: Callable[[], Any]) -> Any:
    return task()


def copy(a: np.ndarray, workers: int | None = None) -> np.ndarray:
    """A C-contiguous copy of ``a``, its leading axis split over up to ``workers`` threads
    (None: :func:`width`).

    For the large server states (FedMC-ADMM keeps one contribution per tenant, 31 MiB on
    MovieLens 1M): a fresh array of that size is new memory, and filling it (page faults
    and writes) costs more than the arithmetic of a server step; numpy releases the GIL
    while it copies, so the threads fill their parts at once.
    """
    workers = width() if workers is None else workers
    out, fill = copy_parts(a, workers)
    run_all(fill, workers)
    return out


def sum_arrays(arrays: Sequence[np.ndarray], workers: int | None = None) -> np.ndarray:
    """``arrays[0] + arrays[1] + ...``, added in that order: the same numbers as
    ``np.sum(arrays, axis=0)`` without stacking them into one new array first. Large sums
    are split into slices of the flat index range, one per thread (up to ``workers``,
    None: :func:`width`), each element still summed in the same order."""
    if not arrays:
        raise ValueError("nothing to sum")
    flats = [np.ravel(a) for a in arrays]
    out = np.array(arrays[0], dtype=np.result_type(*arrays), order="C", copy=True)
    flat = out.reshape(-1)
    workers = width() if workers is None else workers
    parts = 1 if out.nbytes * len(arrays) < COPY_CHUNK_BYTES else max(1, workers)
    bounds = np.linspace(0, flat.size, min(parts, max(flat.size, 1)) + 1).astype(int)

    def part(t: int) -> None:
        lo, hi = bounds[t], bounds[t + 1]
        view = flat[lo:hi]
        for a in flats[1:]:
            np.add(view, a[lo:hi], out=view)

    map_tasks(part, range(len(bounds) - 1), workers)
    return out
