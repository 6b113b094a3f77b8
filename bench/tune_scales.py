"""``fedrec tune`` against the defaults on the sets where the defaults miss (issue 17,
parts 1 and 4): synthetic 1-5, 0.5-5, -10..10 and 0/1 (and MovieLens).

For each set and algorithm: the default's test RMSE, then :func:`algorithms.tuning.tune`
on the validation carve-out of the same split (the test ratings are never read by the
search), then the chosen config's test RMSE at the run length the search chose (up to
``eta`` x the recommended rounds, as ``fedrec tune`` does), against the default with the
algorithm's recommended run (``alg.run_defaults``, split seed 0) and with the same rounds
as the choice. Wall and CPU seconds of the search and the load average are recorded. The
ALS ceiling is ``bench.scale_defaults``'s.

    nice -n 10 python -m bench.tune_scales --data stars,continuous --algorithms fedmc-admm
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from algorithms import registry
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.tuning import tune
from app.commands.tune import BUDGET, TRIALS
from bench.scale_defaults import ratings


def test_rmse(alg, cfg, fed, d, rounds: int | None = None) -> float:
    per_round = d["per_round"] or fed.n_clients
    rounds = rounds or d["rounds"]
    return simulate(alg, cfg, fed, rounds=rounds, per_round=per_round, seed=0,
                    evaluate_every=rounds).final.test_rmse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="stars,half-stars,continuous,binary")
    ap.add_argument("--algorithms", default="fedmc-admm,fedmavg")
    ap.add_argument("--trials", type=int, default=TRIALS)
    ap.add_argument("--eta", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=BUDGET)
    ap.add_argument("--out", type=Path, default=Path("bench/results/tune_scales.jsonl"))
    args = ap.parse_args(argv)
    for data in args.data.split(","):
        r = ratings(data)
        for name in args.algorithms.split(","):
            alg = registry.get(name)
            d = dict(alg.run_defaults)
            fed = build_federation(r, d["clients"], 0)
            default = test_rmse(alg, alg.config(), fed, d)
            longest = d["rounds"] if "iterations" in alg.config.model_fields \
                else args.eta * d["rounds"]
            load = os.getloadavg()[0]
            res = tune(alg, fed, rounds=longest, per_round=d["per_round"] or fed.n_clients,
                       seed=0, trials=args.trials, eta=args.eta,
                       budget_seconds=args.time_budget)
            tuned = test_rmse(alg, res.config(alg), fed, d, res.rounds)
            default_same = (default if res.rounds == d["rounds"]
                            else test_rmse(alg, alg.config(), fed, d, res.rounds))
            row = {"data": data, "algorithm": name, "default_test_rmse": default,
                   "tuned_test_rmse": tuned, "tuned_rounds": res.rounds,
                   "default_test_rmse_same_rounds": default_same,
                   "chosen": res.best.params, "validation_rmse": res.rmse,
                   "default_validation_rmse": dict(res.default.history).get(res.rounds),
                   "tune_seconds": res.seconds, "tune_cpu_seconds": res.cpu_seconds,
                   "load_before": load, "load_after": os.getloadavg()[0],
                   "cuts": res.cuts, "rungs": res.rungs,
                   "budget_exhausted": res.budget_exhausted, "trials": args.trials, **d}
            print(json.dumps(row), flush=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
