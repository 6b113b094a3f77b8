"""Every rating algorithm's *default* against a tuned centralised ALS, on several scales.

Data: MovieLens 100k and synthetic sets (``generate_ratings``, 2000 users x 1500 items,
120,000 ratings, seed 0) on the 1-5, 0.5-5 half-star, -10..10 continuous and 0/1 scales.
Every federated run uses ``alg.config()`` and ``alg.run_defaults`` (clients, clients per
round, rounds) with split seed 0 (80/20; the test ratings do not depend on the number of
clients). The ceiling is :mod:`algorithms.centralised`'s ALS with biases, tuned on the
validation carve-out of ``bench/centralised.py`` (10% of each tenant's training ratings,
100 tenants) over its grid; as the federated algorithms, it is fitted on the ratings
divided by the scale's unit (spread / 4) and its predictions are scaled back, so its
grid means the same on every scale. RMSE is over all test ratings, predictions clipped to
the scale.

    nice -n 10 python -m bench.scale_defaults [--data ml-100k,stars,...] [--algorithms ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from algorithms import registry
from algorithms.data import Federation, build_federation, load_movielens
from algorithms.rfrec import run_batched
from algorithms.simulate import simulate
from algorithms.synthetic import SCALES, generate_ratings
from bench import centralised as CB

DATA = ["ml-100k", *SCALES]
ALGORITHMS = ["fedmc-admm", "fedmavg", "rfrec", "rfrecf"]


def ratings(name: str):
    if name.startswith("ml-"):
        return load_movielens(name)
    return generate_ratings(seed=0, scale=name)


def unit_scaled(fed: Federation, unit: float) -> Federation:
    """The federation with every rating (and the scale) divided by ``unit``."""
    def div(blocks):
        return [b.with_values(b.vals / unit).with_scale(None) for b in blocks]
    lo, hi = fed.scale
    return Federation(div(fed.train), div(fed.test), fed.user_ids, fed.item_ids,
                      (lo / unit, hi / unit))


def als_ceiling(r) -> dict:
    fed = build_federation(r, 100, 0)
    unit = (fed.scale[1] - fed.scale[0]) / 4.0
    scaled = unit_scaled(fed, unit)
    rows = CB.tune(scaled, CB.GRID, CB.SWEEPS)
    best = min(rows, key=lambda x: x["rmse"])
    chosen = {k: best[k] for k in CB.GRID}
    test = CB.fit_and_score(scaled, chosen, CB.SWEEPS, 0)
    return {"chosen": chosen, "test_rmse": test["rmse"] * unit}


def federated(name: str, r) -> dict:
    alg = registry.get(name)
    d = alg.run_defaults
    fed = build_federation(r, min(d["clients"], len(set(r.users.tolist()))), 0)
    t0 = time.perf_counter()
    if name in ("rfrec", "rfrecf"):
        res = run_batched(alg.config(), fed, rounds=d["rounds"], seed=0,
                          evaluate_every=max(1, d["rounds"] // 4), per_round=d["per_round"])
    else:
        res = simulate(alg, alg.config(), fed, rounds=d["rounds"], per_round=d["per_round"],
                       seed=0, evaluate_every=max(1, d["rounds"] // 4))
    curve = [round(h.test_rmse, 4) for h in res.history if h.test_rmse == h.test_rmse]
    return {"test_rmse": res.final.test_rmse, "curve": curve,
            "seconds": time.perf_counter() - t0, **d}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=",".join(DATA))
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--out", type=Path, default=Path("bench/results/scale_defaults.jsonl"))
    args = ap.parse_args(argv)
    for data in args.data.split(","):
        r = ratings(data)
        row = {"data": data, "als": als_ceiling(r)}
        print(json.dumps(row), flush=True)
        for name in args.algorithms.split(","):
            out = federated(name, r)
            out["ratio"] = out["test_rmse"] / row["als"]["test_rmse"]
            row[name] = out
            print(json.dumps({"data": data, name: out}), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
