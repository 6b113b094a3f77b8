"""Two rating sets with large, sparse catalogues, drawn in memory (no data file in the
repository), and the CPU time of a round of an algorithm's defaults on them.

The shapes of BENCHMARKS.md's "Rating data the defaults were never tuned on" (issue 17),
where FedMC-ADMM's defaults did not finish in 15 minutes:

* ``amazon``: 29,997 users x 11,277 items, 60,000 ratings on 1-5 stars, most of them
  5s (70%): most users rate once or twice and about half the items are rated once.
  String ids (``A...`` users, ``B00...`` items) and a timestamp column, no header, as
  Amazon review dumps come.
* ``big``: 200,000 users x 20,000 items, 1,000,000 ratings on 1-5 stars (a
  MovieLens-like histogram), integer ids, no header.

The model (the scratch generator of that section, re-written; independent of
:mod:`algorithms.synthetic`): every user and every item has at least one rating; the
remaining ratings go to users by a power law of activity and to items by a power law of
popularity, redrawn until every (user, item) pair is distinct; a rank-5 preference with
user and item biases and Gaussian noise is mapped to stars by quantiles of the set's
histogram. Everything is vectorised and seeded.

    python -m bench.sparse_sets write amazon /tmp/amazon.csv     # a CSV for fedrec simulate
    python -m bench.sparse_sets rounds --data amazon --algorithm fedmc-admm --rounds 3
        # CPU seconds per round (all threads), evaluation apart, and the peak RSS

``rounds`` runs :func:`algorithms.simulate.simulate` with the algorithm's ``run_defaults``
(clients, per round) exactly as ``fedrec simulate`` would, on ``--data`` amazon, big or a
MovieLens name, and prints one JSON line per round and a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time

import numpy as np

from algorithms.data import Ratings


@dataclasses.dataclass(frozen=True)
class Shape:
    """What :func:`generate` draws."""

    n_users: int
    n_items: int
    n_ratings: int
    histogram: tuple[float, ...]  # shares of 1..5 stars
    user_exponent: float  # power law of the extra ratings per user
    item_exponent: float  # power law of the extra ratings per item
    string_ids: bool  # Amazon-style string ids and a timestamp column in the CSV


SHAPES = {
    "amazon": Shape(29_997, 11_277, 60_000, (0.06, 0.05, 0.07, 0.12, 0.70), 1.0, 1.2, True),
    "big": Shape(200_000, 20_000, 1_000_000, (0.06, 0.11, 0.26, 0.35, 0.22), 0.9, 0.9,
                 False),
}


def _power_law(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=float) ** (-exponent)
    return rng.permutation(w / w.sum())


def _distinct_pairs(shape: Shape, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n_ratings`` distinct (user, item) pairs, every user and every item in one."""
    n_u, n_i, n = shape.n_users, shape.n_items, shape.n_ratings
    if n < max(n_u, n_i) or n > n_u * n_i:
        raise ValueError("n_ratings must be at least max(n_users, n_items) and at most "
                         "n_users * n_items")
    pu = _power_law(n_u, shape.user_exponent, rng)
    pi = _power_law(n_i, shape.item_exponent, rng)
    # one rating per user, the rest by activity, at most a tenth of the catalogue each
    per_user = 1 + rng.multinomial(n - n_u, pu)
    cap = max(1, n_i // 10)
    while np.any(per_user > cap):
        excess = int(np.maximum(per_user - cap, 0).sum())
        per_user = np.minimum(per_user, cap)
        room = np.where(per_user < cap, pu, 0.0)
        per_user += rng.multinomial(excess, room / room.sum())
    users = np.repeat(np.arange(n_u), per_user)
    # one rating per item first (to random users' slots), the rest by popularity
    items = rng.choice(n_i, n, p=pi)
    first = rng.permutation(n)[:n_i]
    items[first] = np.arange(n_i)
    later = np.ones(n, dtype=bool)  # a repeated pair keeps its item's first rating
    later[first] = False
    for _ in range(1000):
        key = users.astype(np.int64) * n_i + items
        order = np.lexsort((later, key))
        dup = np.zeros(n, dtype=bool)
        dup[order[1:]] = key[order[1:]] == key[order[:-1]]
        if not dup.any():
            return users, items
        # redraw the item of a repeated pair (its user keeps the rating), by popularity
        items[dup] = rng.choice(n_i, int(dup.sum()), p=pi)
    raise RuntimeError("could not draw distinct pairs")  # pragma: no cover


def generate(name: str, seed: int = 0, **overrides) -> Ratings:
    """The set ``name`` of :data:`SHAPES` (``overrides`` replace fields, e.g. smaller sizes
    for tests) as :class:`~algorithms.data.Ratings` with integer ids 0..n-1."""
    shape = dataclasses.replace(SHAPES[name], **overrides)
    rng = np.random.default_rng(seed)
    users, items = _distinct_pairs(shape, rng)
    rank = 5
    p = rng.standard_normal((shape.n_users, rank)) / np.sqrt(rank)
    q = rng.standard_normal((shape.n_items, rank))
    b_u = 0.5 * rng.standard_normal(shape.n_users)
    b_i = 0.7 * rng.standard_normal(shape.n_items)
    score = np.einsum("ij,ij->i", p[users], q[items]) + b_u[users] + b_i[items]
    score += 0.5 * score.std() * rng.standard_normal(score.size)
    hist = np.asarray(shape.histogram, dtype=float)
    cuts = np.quantile(score, np.cumsum(hist)[:-1] / hist.sum())
    stars = 1.0 + np.searchsorted(cuts, score).astype(float)
    order = rng.permutation(shape.n_ratings)  # file order: not grouped by user
    return Ratings(users[order].astype(np.int64), items[order].astype(np.int64), stars[order])


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


def describe(ratings: Ratings) -> dict:
    """The figures BENCHMARKS.md gives for a set: shape, per-user and per-item counts."""
    _, per_user = np.unique(ratings.users, return_counts=True)
    _, per_item = np.unique(ratings.items, return_counts=True)
    values, counts = np.unique(ratings.values, return_counts=True)
    return {"users": int(per_user.size), "items": int(per_item.size),
            "ratings": len(ratings),
            "users_with_1_or_2": round(float(np.mean(per_user <= 2)), 3),
            "items_rated_once": round(float(np.mean(per_item == 1)), 3),
            "max_per_user": int(per_user.max()), "max_per_item": int(per_item.max()),
            "histogram": {f"{v:g}": round(c / len(ratings), 3)
                          for v, c in zip(values.tolist(), counts.tolist(), strict=True)}}


def _ratings(data: str, seed: int) -> Ratings:
    if data in SHAPES:
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
    w.add_argument("name", choices=sorted(SHAPES))
    w.add_argument("path")
    w.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("describe", help="print a set's shape and counts")
    d.add_argument("name", choices=sorted(SHAPES))
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
        from algorithms import _mf_kernels

        _mf_kernels.PARALLEL_MIN_ROWS = 1 << 62
        args.workers = 1
    if args.cmd == "write":
        write_csv(generate(args.name, args.seed), args.path, SHAPES[args.name].string_ids,
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
