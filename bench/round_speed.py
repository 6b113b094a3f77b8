"""Seconds per round: the client steps on both cores (a pool of threads over the tenants)
against the same code on one, for FedMC-ADMM and the user-level DP algorithms.

FedMC-ADMM: one round = S_k sampling, 10 client steps and the server step (evaluation
excluded), on MovieLens 1M (80/20 split seed 0, 100 tenants), rank 10, N = 10, the
recommended settings otherwise. DP-FedMAvg, DP-FedMC-ADMM and DPALS: one round of their
recommended run (every one of the 100 tenants, no privatizer: the client and server steps
only). Every variant runs the same rounds (the same sampled tenants) from the same states
in the same process, interleaved, so all see the same machine; one repeat is the mean over
``--rounds-per-repeat`` rounds. CPU time is the process's, all threads. Variants:

* ``pool``: the default, :func:`algorithms.simulate.simulate`'s ``workers=None``: the
  client steps on one thread per core, the fused kernels serial inside each;
* ``serial``: ``workers=1``, every kernel on one thread (the serial fused kernel);
* ``prange``: ``workers=1`` with the fused kernels splitting each tenant's users and items
  over numba's threads (FedMC-ADMM only);
* ``numpy``: ``workers=1``, FedMC-ADMM's plain vectorised numpy/scipy path.

    nice -n 10 python -m bench.round_speed [--data ml-1m] [--repeats 15] [--max-wait 180]
        [--algorithms fedmc-admm,dp-fedmavg,dp-fedmc-admm,dpals] [--variants pool,serial]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np

from algorithms import mf_kernels as K
from algorithms import pool, registry
from algorithms.data import build_federation, load_movielens
from algorithms.simulate import run_round, simulate

SERIAL = 1 << 62
"""``mf_kernels.PARALLEL_MIN_ROWS`` for the serial fused kernel (no block is this large)."""

VARIANTS = {  # name -> (workers, PARALLEL_MIN_ROWS or None for the default, kernel)
    "pool": (None, None, "numba"), "serial": (1, SERIAL, "numba"),
    "prange": (1, None, "numba"), "numpy": (1, SERIAL, "numpy")}
FUSED = ("fedmc-admm",)
"""Algorithms with the fused kernels (the only ones with ``prange`` and ``numpy`` variants)."""


def wait_for_idle(threshold: float, max_wait: float) -> float:
    """Block until the 1-minute load average is below ``threshold`` (or ``max_wait`` s)."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def setting(name: str, variant: str):
    """(algorithm, config, clients per round) of the timed run."""
    alg = registry.get(name)
    if name in FUSED:
        return alg, alg.config(rank=10, inner_steps=10, kernel=VARIANTS[variant][2]), 10
    return alg, alg.config(), 100


def prepared_states(alg, cfg, fed, per_round: int, warm_rounds: int):
    """States after ``warm_rounds`` rounds, so timings see trained, not initial, factors."""
    res = simulate(alg, cfg, fed, rounds=warm_rounds, per_round=per_round, seed=0,
                   evaluate_every=0, workers=1)
    return res.server_state, res.global_msg, res.local_states


class ThreadClock:
    """Per-thread CPU seconds of the pool's tasks (:mod:`algorithms.pool`), by section
    (one :func:`algorithms.pool.map_tasks` call that used the threads)."""

    def __init__(self) -> None:
        self.spent: dict[tuple[int, int], float] = {}
        self.section = 0

    def __enter__(self) -> ThreadClock:
        self._saved = pool._marked, pool._executor
        marked, executor = self._saved

        def timed(fn, item):
            t0 = time.thread_time()
            try:
                return marked(fn, item)
            finally:
                key = (self.section, threading.get_ident())
                self.spent[key] = self.spent.get(key, 0.0) + time.thread_time() - t0

        def counted(workers):
            self.section += 1
            return executor(workers)

        pool._marked, pool._executor = timed, counted
        return self

    def __exit__(self, *exc) -> None:
        pool._marked, pool._executor = self._saved

    def busiest(self) -> float:
        """Sum over sections of the busiest thread's CPU seconds in it."""
        per: dict[int, float] = {}
        for (section, _), t in self.spent.items():
            per[section] = max(per.get(section, 0.0), t)
        return sum(per.values())


def time_round(alg, cfg, fed, per_round: int, states, round_: int, variant: str
               ) -> tuple[float, float, float, object]:
    """(wall seconds, CPU seconds of the process, all threads, CPU critical path, new global
    message) of one round. CPU time is what the round costs when the machine is shared; the
    critical path is the calling thread's CPU time plus, for each part run on the pool's
    threads, the busiest thread's: the wall time the round would take with a core per
    thread (it leaves out waits for the GIL and for memory, and numba's own threads)."""
    server, glob, locs = states
    workers, min_rows, _ = VARIANTS[variant]
    default = K.PARALLEL_MIN_ROWS
    K.PARALLEL_MIN_ROWS = default if min_rows is None else min_rows
    try:
        with ThreadClock() as clock:
            w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
            new_glob, *_ = run_round(alg, cfg, round_, 0, per_round, glob, server, locs,
                                     fed.train, workers=workers)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            path = time.thread_time() - t0 + clock.busiest()
        if variant == "prange":  # numba's threads are not the pool's: not measured
            path = float("nan")
    finally:
        K.PARALLEL_MIN_ROWS = default
    return wall, cpu, path, new_glob


def max_difference(a, b) -> float:
    """Largest absolute difference between the arrays of two messages."""
    return max((float(np.abs(x - getattr(b, k)).max()) for k, x in vars(a).items()
                if isinstance(x, np.ndarray)), default=0.0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="ml-1m")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds-per-repeat", type=int, default=5)
    ap.add_argument("--idle-load", type=float, default=1.0)
    ap.add_argument("--max-wait", type=float, default=180.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--algorithms", default="fedmc-admm,dp-fedmavg,dp-fedmc-admm,dpals",
                    help="comma-separated registry names")
    ap.add_argument("--variants", default="pool,serial,prange",
                    help="comma-separated, of " + ", ".join(VARIANTS) + " (prange and numpy "
                         "apply to FedMC-ADMM only)")
    args = ap.parse_args(argv)
    fed = build_federation(load_movielens(args.data), 100, 0)
    runs = {}  # (algorithm, variant) -> (alg, cfg, per_round, states)
    for name in args.algorithms.split(","):
        for variant in args.variants.split(","):
            if variant not in VARIANTS:
                ap.error(f"--variants: unknown variant {variant!r}")
            if variant in ("prange", "numpy") and name not in FUSED:
                continue
            alg, cfg, per_round = setting(name, variant)
            runs[name, variant] = (alg, cfg, per_round,
                                   prepared_states(alg, cfg, fed, per_round, 3))
    rounds = range(4, 4 + args.rounds_per_repeat)
    results = {}
    for key, (alg, cfg, per_round, states) in runs.items():  # compile, warm caches
        results[key] = time_round(alg, cfg, fed, per_round, states, 4, key[1])[3]
    load = wait_for_idle(args.idle_load, args.max_wait)
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    path = {k: [] for k in runs}
    for _rep in range(args.repeats):
        for key, (alg, cfg, per_round, states) in runs.items():  # interleaved
            samples = [time_round(alg, cfg, fed, per_round, states, r, key[1])[:3]
                       for r in rounds]
            for store, t in ((wall, 0), (cpu, 1), (path, 2)):
                store[key].append(statistics.fmean(s[t] for s in samples))
    load_after = os.getloadavg()[0]
    out: dict = {"load_1min_before": load, "load_1min_after": load_after,
                 "cpus": os.cpu_count(), "threads": K.threads(), "repeats": args.repeats}
    print(f"{args.data}: seconds per round, {args.repeats} repeats of {len(rounds)} rounds, "
          f"1-min load {load:.2f} -> {load_after:.2f}")
    for name in dict.fromkeys(n for n, _ in runs):
        res = out.setdefault(name, {})
        for (n, variant) in runs:
            if n != name:
                continue
            res[variant] = {kind: {"min_ms": 1e3 * min(v[n, variant]),
                                   "median_ms": 1e3 * statistics.median(v[n, variant])}
                            for kind, v in (("wall", wall), ("cpu", cpu),
                                            ("cpu_critical_path", path))}
            diff = max_difference(results[n, variant], results[n, "serial"]) \
                if (n, "serial") in results else float("nan")
            res[variant]["max_abs_difference_from_serial"] = diff
            r = res[variant]
            print(f"  {name:13s} {variant:6s} wall {r['wall']['min_ms']:8.2f} / "
                  f"{r['wall']['median_ms']:8.2f} ms | cpu {r['cpu']['min_ms']:8.2f} / "
                  f"{r['cpu']['median_ms']:8.2f} ms | cpu critical path "
                  f"{r['cpu_critical_path']['min_ms']:8.2f} / "
                  f"{r['cpu_critical_path']['median_ms']:8.2f} ms (min / median) | "
                  f"max |diff| vs serial {diff:.1e}")
        if "serial" in res:
            for variant in res:
                if variant == "serial" or not isinstance(res[variant], dict):
                    continue
                for kind in ("wall", "cpu_critical_path"):
                    slow, fast = ("numpy", "serial") if variant == "numpy" else ("serial",
                                                                                variant)
                    ratio = {s: res[slow][kind][s] / res[fast][kind][s]
                             for s in ("min_ms", "median_ms")}
                    res[variant][f"ratio_{kind}"] = ratio
                    print(f"  {name:13s} {slow} / {fast}, {kind}: "
                          f"{ratio['min_ms']:.2f}x (min), {ratio['median_ms']:.2f}x (median)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
