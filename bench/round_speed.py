"""Seconds per FedMC-ADMM round: fused numba kernels on all cores, on one core, and plain
vectorised numpy/scipy.

One round = S_k sampling, 10 client steps and the server step (evaluation excluded), on
MovieLens 1M (80/20 split seed 0, 100 tenants), rank 10, N = 10, the recommended
settings otherwise. Both implementations run the same rounds (4..8, the same sampled
tenants) from the same states in the same process, interleaved, after waiting for the
machine to be idle; one repeat is the mean over those rounds. ``numba`` is the default
kernel (parallel over rows and items on ``NUMBA_NUM_THREADS`` threads), ``numba-serial``
the same kernels on one thread (the same numbers); CPU time is the process's, all threads.

    nice -n 10 python -m bench.round_speed [--data ml-1m] [--repeats 15] [--max-wait 180]
        [--kernels numba,numba-serial,numpy]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from algorithms import _mf_kernels as K
from algorithms import fedmc_admm as F
from algorithms.data import build_federation, load_movielens
from algorithms.simulate import run_round, simulate


def wait_for_idle(threshold: float, max_wait: float) -> float:
    """Block until the 1-minute load average is below ``threshold`` (or ``max_wait`` s)."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def prepared_states(cfg, fed, warm_rounds: int):
    """States after ``warm_rounds`` rounds, so timings see trained, not initial, factors."""
    res = simulate(F.ALGORITHM, cfg, fed, rounds=warm_rounds, per_round=10, seed=0,
                   evaluate_every=0)
    return res.server_state, res.global_msg, res.local_states


SERIAL = 1 << 62
"""``_mf_kernels.PARALLEL_MIN_ROWS`` for the serial fused kernel (no block is this large)."""


def time_round(cfg, fed, states, round_: int, min_rows: int | None = None
               ) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process, all threads) of one round; CPU time is
    what the round costs when the machine is shared (it excludes time spent descheduled).
    ``min_rows`` sets ``_mf_kernels.PARALLEL_MIN_ROWS`` for the round (``SERIAL``: the
    serial fused kernel)."""
    server, glob, locs = states
    default = K.PARALLEL_MIN_ROWS
    K.PARALLEL_MIN_ROWS = default if min_rows is None else min_rows
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        run_round(F.ALGORITHM, cfg, round_, 0, 10, glob, server, locs, fed.train)
        return time.perf_counter() - w0, time.process_time() - c0
    finally:
        K.PARALLEL_MIN_ROWS = default


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="ml-1m")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds-per-repeat", type=int, default=5)
    ap.add_argument("--idle-load", type=float, default=1.0)
    ap.add_argument("--max-wait", type=float, default=180.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernels", default="numba,numba-serial,numpy",
                    help="comma-separated: numba (parallel fused kernels, the default), "
                         "numba-serial (the same kernels on one thread), numpy")
    args = ap.parse_args(argv)
    fed = build_federation(load_movielens(args.data), 100, 0)
    kernels = args.kernels.split(",")
    cfgs = {k: F.FedMCADMMConfig(rank=10, inner_steps=10, kernel=k.split("-")[0])
            for k in kernels}
    min_rows = {k: SERIAL if k == "numba-serial" else None for k in kernels}
    states = {k: prepared_states(c, fed, 3) for k, c in cfgs.items()}
    for k, c in cfgs.items():  # compile and warm caches
        time_round(c, fed, states[k], 4, min_rows[k])
    load = wait_for_idle(args.idle_load, args.max_wait)
    wall: dict[str, list[float]] = {k: [] for k in cfgs}
    cpu: dict[str, list[float]] = {k: [] for k in cfgs}
    for _rep in range(args.repeats):
        for k, c in cfgs.items():  # interleaved: both see the same machine conditions
            samples = [time_round(c, fed, states[k], r, min_rows[k])
                       for r in range(4, 4 + args.rounds_per_repeat)]
            wall[k].append(statistics.fmean(w for w, _ in samples))
            cpu[k].append(statistics.fmean(c for _, c in samples))
    load_after = os.getloadavg()[0]
    out: dict = {"load_1min_before": load, "load_1min_after": load_after,
                 "cpus": os.cpu_count(), "threads": K.threads(), "repeats": args.repeats}
    for k in cfgs:
        out[k] = {name: {"min_ms": 1e3 * min(v[k]), "median_ms": 1e3 * statistics.median(v[k])}
                  for name, v in (("wall", wall), ("cpu", cpu))}
    print(f"{args.data}: one FedMC-ADMM round (rank 10, N=10, 10 of 100 tenants), "
          f"{args.repeats} repeats, 1-min load {load:.2f} -> {load_after:.2f}")
    for name in ("wall", "cpu"):
        for k in cfgs:
            r = out[k][name]
            print(f"  {name:4s} {k:6s} min {r['min_ms']:7.2f} ms   median {r['median_ms']:7.2f} ms")
        for slow, fast in (("numpy", "numba"), ("numba-serial", "numba")):
            if slow in cfgs and fast in cfgs:
                ratio_min = out[slow][name]["min_ms"] / out[fast][name]["min_ms"]
                ratio_med = out[slow][name]["median_ms"] / out[fast][name]["median_ms"]
                out[f"ratio_{name}_{slow}"] = {"min": ratio_min, "median": ratio_med}
                print(f"  {name:4s} {slow} / {fast}: {ratio_min:.2f}x (min), "
                      f"{ratio_med:.2f}x (median)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
