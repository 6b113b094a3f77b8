"""Non-IID tenant partitions (issue 17, part 5): how each algorithm's default degrades, in
RMSE and in ranking metrics, when tenants differ in activity, in what they rate or in size.

Every run is the algorithm's default (``alg.config()``, ``alg.run_defaults``) on the 80/20
split of seed 0, which is the same under every partition (:mod:`algorithms.partition`);
only the grouping of users into tenants changes. Ranking metrics are
:mod:`algorithms.ranking`'s (k = 10, held-out ratings >= 3.5 relevant, training items
excluded); the skew columns are :func:`algorithms.partition.skew`.

    nice -n 10 python -m bench.partitions --data ml-100k      # bench/results/partitions.jsonl
    nice -n 10 python -m bench.partitions --data ml-1m --algorithms fedmc-admm \\
        --partitions random,dirichlet:0.1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from algorithms import registry
from algorithms.data import build_federation
from algorithms.partition import skew
from algorithms.ranking import ranking_report
from algorithms.rfrec import run_batched
from algorithms.simulate import simulate
from bench.scale_defaults import ratings

PARTITIONS = ["random", "by-activity", "by-item-cluster", "dirichlet:1", "dirichlet:0.1",
              "sizes:0.3"]
ALGORITHMS = ["fedmc-admm", "fedmavg", "rfrec", "rfrecf"]


def run(name: str, r, partition: str) -> dict:
    alg = registry.get(name)
    d = alg.run_defaults
    fed = build_federation(r, d["clients"], 0, partition=partition)
    per_round = d["per_round"] or fed.n_clients
    t0 = time.perf_counter()
    if name in ("rfrec", "rfrecf"):
        res = run_batched(alg.config(), fed, rounds=d["rounds"], seed=0,
                          evaluate_every=d["rounds"], per_round=d["per_round"])
    else:
        res = simulate(alg, alg.config(), fed, rounds=d["rounds"], per_round=per_round,
                       seed=0, evaluate_every=d["rounds"])
    seconds = time.perf_counter() - t0
    rank = ranking_report(alg, res.global_msg, res.local_states, fed.train, fed.test,
                          fed.scale, k=10)
    return {"algorithm": name, "partition": partition, "test_rmse": res.final.test_rmse,
            **rank.as_dict(), **skew(fed.train), "seconds": seconds, **d}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="ml-100k")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--partitions", default=",".join(PARTITIONS))
    ap.add_argument("--out", type=Path, default=Path("bench/results/partitions.jsonl"))
    args = ap.parse_args(argv)
    r = ratings(args.data)
    for name in args.algorithms.split(","):
        for partition in args.partitions.split(","):
            row = {"data": args.data, **run(name, r, partition)}
            print(json.dumps(row), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
