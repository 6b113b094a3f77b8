"""``fedrec tune`` against the defaults on the sets where the defaults miss (issue 17,
parts 1 and 4): synthetic 1-5, 0.5-5, -10..10 and 0/1 (and MovieLens).

For each set and algorithm: the default's test RMSE, then :func:`algorithms.tuning.tune`
on the validation carve-out of the same split (the test ratings are never read by the
search), then the chosen config's test RMSE, both with the algorithm's default run
(``alg.run_defaults``, split seed 0). The ALS ceiling is ``bench.scale_defaults``'s.

    nice -n 10 python -m bench.tune_scales --data stars,continuous --algorithms fedmc-admm
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from algorithms import registry
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.tuning import tune
from bench.scale_defaults import ratings


def test_rmse(alg, cfg, fed, d) -> float:
    per_round = d["per_round"] or fed.n_clients
    return simulate(alg, cfg, fed, rounds=d["rounds"], per_round=per_round, seed=0,
                    evaluate_every=d["rounds"]).final.test_rmse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="stars,half-stars,continuous,binary")
    ap.add_argument("--algorithms", default="fedmc-admm,fedmavg")
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--out", type=Path, default=Path("bench/results/tune_scales.jsonl"))
    args = ap.parse_args(argv)
    for data in args.data.split(","):
        r = ratings(data)
        for name in args.algorithms.split(","):
            alg = registry.get(name)
            d = dict(alg.run_defaults)
            fed = build_federation(r, d["clients"], 0)
            default = test_rmse(alg, alg.config(), fed, d)
            t0 = time.perf_counter()
            res = tune(alg, fed, rounds=d["rounds"], per_round=d["per_round"] or fed.n_clients,
                       seed=0, trials=args.trials, budget_seconds=600)
            tune_s = time.perf_counter() - t0
            tuned = test_rmse(alg, res.config(alg), fed, d)
            row = {"data": data, "algorithm": name, "default_test_rmse": default,
                   "tuned_test_rmse": tuned, "chosen": res.best.params,
                   "validation_rmse": res.best.rmse,
                   "default_validation_rmse": res.default.rmse, "tune_seconds": tune_s,
                   "budget_exhausted": res.budget_exhausted, "trials": args.trials, **d}
            print(json.dumps(row), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
