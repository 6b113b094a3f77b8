"""The CPU time of a round of an algorithm's defaults on two rating sets with large,
sparse catalogues, drawn in memory by :mod:`algorithms.synthetic` (no data file):

* ``amazon``: :func:`~algorithms.synthetic.generate_skewed_ratings` (29,997 users x 11,277
  items, 60,000 ratings, 70% 5s; most users rate once or twice, about half the items are
  rated once), written with Amazon-style string ids and a timestamp column, no header, as
  Amazon review dumps come;
* ``big``: :func:`~algorithms.synthetic.generate_sparse_ratings` (200,000 users x 20,000
  items, 1,000,000 ratings, a MovieLens-like histogram), integer ids, no header.

    python -m bench.sparse_sets write amazon /tmp/amazon.csv     # a CSV for fedrec simulate
    python -m bench.sparse_sets rounds --data amazon --algorithm fedmc-admm --rounds 3
        # CPU seconds per round (all threads), evaluation apart, and the peak RSS

``rounds`` runs :func:`algorithms.simulate.simulate` with the algorithm's ``run_defaults``
(clients, per round) exactly as ``fedrec simulate`` would, on ``--data`` amazon, big or a
MovieLens name, and prints one JSON line per round and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

from algorithms.data import Ratings
from algorithms.synthetic import describe, generate_skewed_ratings, generate_sparse_ratings

#: the sets by name: the generator and whether the CSV gets Amazon-style string ids
SETS = {"amazon": (generate_skewed_ratings, True), "big": (generate_sparse_ratings, False)}


def generate(name: str, seed: int = 0) -> Ratings:
    """The set ``name`` of :data:`SETS`, with integer ids 0..n-1."""
    return SETS[name][0](seed=seed)


def write_csv(ratings: Ratings, path: str, string_ids: bool, seed: int = 0) -> None:
    """``ratings`` as ``user,item,rating`` lines (no header); with ``string_ids`` Amazon-
    style ids (``A`` + 13 base-36 characters, ``B00`` + 7 digits) and a timestamp."""
    if string_ids:
        rng = np.random.default_rng(seed + 1)
        alphabet = np.array(list("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
        n_u = int(ratings.users.max()) + 1
        codes = alphabet[rng.integers(0, 36, size=(n_u, 13))]
        names = np.array(["A" + "".join(c) + f"{u:x}" for u, c in enumerate(codes)])
        user = names[ratings.users]
        item = np.char.add("B00", np.char.zfill(ratings.items.astype(str), 7))
        stamp = rng.integers(1_300_000_000, 1_500_000_000, size=len(ratings))
        lines = [f"{u},{i},{v:.1f},{t}" for u, i, v, t in
                 zip(user.tolist(), item.tolist(), ratings.values.tolist(), stamp.tolist(),
                     strict=True)]
    else:
        lines = [f"{u},{i},{v:g}" for u, i, v in
                 zip(ratings.users.tolist(), ratings.items.tolist(), ratings.values.tolist(),
                     strict=True)]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def _ratings(data: str, seed: int) -> Ratings:
    if data in SETS:
        return generate(data, seed)
    from algorithms.data import load_movielens

    return load_movielens(data)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rounds(data: str, algorithm: str, n_rounds: int, seed: int = 0, every: int = 0,
           workers: int | None = None, profile: str | None = None) -> dict:
    """CPU seconds (the process's, all threads) of each of ``n_rounds`` rounds of
    ``algorithm``'s defaults on ``data``, evaluation excluded (``every``: evaluate every
    so many rounds and at the last, 0: only at the last), and the peak RSS."""
    from algorithms import registry
    from algorithms.data import build_federation, default_clients
    from algorithms.simulate import RoundState, initialise, simulate

    t0, c0 = time.perf_counter(), _cpu()
    ratings = _ratings(data, seed)
    alg = registry.get(algorithm)
    cfg = alg.config()
    clients = default_clients(alg.run_defaults["clients"], ratings)
    fed = build_federation(ratings, clients, seed)
    per_round = alg.run_defaults.get("per_round") or fed.n_clients
    server, glob, locs = initialise(alg, cfg, fed.train, seed)
    setup = {"wall": round(time.perf_counter() - t0, 2), "cpu": round(_cpu() - c0, 2)}

    per: list[dict] = []
    marks = {"cpu": _cpu(), "wall": time.perf_counter()}

    def on_round(rec) -> None:
        now, wall = _cpu(), time.perf_counter()
        row = {"round": rec.round, "cpu_s": round(now - marks["cpu"], 3),
               "wall_s": round(wall - marks["wall"], 3), "load1": os.getloadavg()[0],
               "test_rmse": rec.test_rmse}
        per.append(row)
        print(json.dumps(row), flush=True)
        marks["cpu"], marks["wall"] = _cpu(), time.perf_counter()

    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile(time.process_time)
        prof.enable()
    result = simulate(alg, cfg, fed, rounds=n_rounds, per_round=per_round, seed=seed,
                      evaluate_every=every or n_rounds, on_round=on_round,
                      start=RoundState(0, glob, server, locs), workers=workers)
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    out = {"data": data, "algorithm": algorithm, "rounds": n_rounds, "clients": clients,
           "per_round": per_round, "n_items": fed.n_items, "ratings": len(ratings),
           "setup": setup, "per_round_cpu_s": [r["cpu_s"] for r in per],
           "final_test_rmse": result.final.test_rmse,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write a set as CSV")
    w.add_argument("name", choices=sorted(SETS))
    w.add_argument("path")
    w.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("describe", help="print a set's shape and counts")
    d.add_argument("name", choices=sorted(SETS))
    d.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("rounds", help="CPU seconds per round of an algorithm's defaults")
    r.add_argument("--data", required=True, help="amazon, big, or ml-100k / ml-1m")
    r.add_argument("--algorithm", required=True)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--every", type=int, default=0,
                   help="evaluate every so many rounds (0: at the last only)")
    r.add_argument("--workers", type=int, default=None, help="client threads (1: serial)")
    r.add_argument("--serial", action="store_true",
                   help="one thread for everything: workers 1 and the serial fused kernels "
                   "(what a profile of the calling thread sees whole)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--profile", help="write a cProfile (process CPU clock) of the rounds")
    args = parser.parse_args(argv)
    if getattr(args, "serial", False):
        from algorithms import mf_kernels

        mf_kernels.PARALLEL_MIN_ROWS = 1 << 62
        args.workers = 1
    if args.cmd == "write":
        write_csv(generate(args.name, args.seed), args.path, SETS[args.name][1],
                  args.seed)
        return 0
    if args.cmd == "describe":
        print(json.dumps(describe(generate(args.name, args.seed))))
        return 0
    print(json.dumps(rounds(args.data, args.algorithm, args.rounds, args.seed, args.every,
                            args.workers, args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
