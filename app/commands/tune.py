"""``fedrec tune``: choose an algorithm's hyper-parameters for new rating data.

The data are split exactly as ``fedrec simulate`` splits them (same --seed,
--test-fraction, --clients and --partition), and the search reads the *training* ratings
only: 10% of each tenant's training ratings are carved out for validation, and the test
ratings are never used (:mod:`algorithms.tuning`). The search varies the run
length too (successive halving with rounds as the resource: the longest runs are the last
rungs) and fits --time-budget. The best config and its run length are printed as a
ready-to-paste ``fedrec simulate`` command line and written with --json as
``{"algorithm", "config", "rounds", "clients", "per_round", ...}``: ``fedrec simulate
--config FILE`` runs it (its rounds, clients and tenants per round too, unless given on
the command line) and a job body's ``config`` takes the ``config`` object as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from algorithms import registry
from algorithms.data import build_federation, check_rating_values, default_clients
from algorithms.tuning import METRICS, Trial, metric_value, search_space, tune
from app.commands.evaluation import add_partition_argument
from app.commands.output import json_output
from app.commands.simulate import flag_of, format_value, load_data

#: default trials and wall budget of ``fedrec tune`` (fit ML-1M in 10 minutes with room)
TRIALS, BUDGET = 18, 540.0
TUNABLE = [n for n in registry.names() if getattr(registry.get(n).config, "search_space", None)]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="choose hyper-parameters on a validation carve-out of "
                                    "the training ratings", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="ratings file, as for simulate (default: ml-100k/u.data under "
                        "$FEDREC_DATA_DIR, else synthetic)")
    p.add_argument("--algorithm", default="fedmc-admm", choices=TUNABLE,
                   help="the algorithm to tune (default: fedmc-admm)")
    p.add_argument("--clients", type=int, default=None, metavar="P",
                   help="tenants (default: the algorithm's recommended run)")
    p.add_argument("--per-round", type=int, default=None, metavar="K",
                   help="tenants per round, 0: all (default: the algorithm's)")
    p.add_argument("--rounds", type=int, default=None, metavar="T",
                   help="the longest run the search may choose: the last rung's rounds "
                        "(default: eta x the algorithm's recommended rounds, or RFRec's "
                        "iterations); the chosen run length is one of the rungs")
    p.add_argument("--trials", type=int, default=TRIALS, metavar="N",
                   help=f"configs drawn, the default included (default: {TRIALS})")
    p.add_argument("--eta", type=int, default=3,
                   help="successive halving: keep 1/eta per rung, eta x the rounds "
                        "(default: 3)")
    p.add_argument("--time-budget", "--budget-seconds", dest="budget_seconds", type=float,
                   default=BUDGET, metavar="S",
                   help="wall seconds the search plans for: a rung that would not fit is "
                        "shortened, no run starts after S; the output says what was cut "
                        f"(default: {BUDGET:g})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the split, carve-out, search and runs (default: 0)")
    p.add_argument("--test-fraction", type=float, default=0.2,
                   help="share of ratings held out for testing, never read (default: 0.2)")
    add_partition_argument(p)
    p.add_argument("--json", type=Path, metavar="FILE", nargs="?", const="-",
                   help="write the chosen config and every trial to FILE; alone or '-': to "
                        "stdout, "
                        "the other lines going to stderr")
    p.add_argument("--quiet", action="store_true", help="no line per trial")
    p.add_argument("--metric", choices=METRICS, default=None,
                   help="what configs and run lengths are chosen by: rmse (validation RMSE, "
                        "rating models) or ndcg (validation NDCG@10, ranking models); "
                        "default: ndcg for a ranking model, else rmse")
    p.set_defaults(func=run)


def _run_rounds(alg, args: argparse.Namespace) -> dict[str, int]:
    """clients, per_round and the longest run (rounds) of the search."""
    d = dict(alg.run_defaults)
    cfg = alg.config()
    if "iterations" in type(cfg).model_fields:
        d["rounds"] = cfg.iterations  # RFRec's schedule is set by K: the run is K rounds
    else:
        d["rounds"] = args.eta * d["rounds"]
    for k in ("clients", "per_round", "rounds"):
        if getattr(args, k) is not None:
            d[k] = getattr(args, k)
    return d


def command_line(args: argparse.Namespace, alg, run: dict[str, int],
                 params: dict[str, Any], data: str | None = None) -> str:
    """``fedrec simulate`` with the data (``data``: its label, the path under
    $FEDREC_DATA_DIR for a file there, which ``--data`` resolves), split, run and the
    chosen fields."""
    parts = ["fedrec", "simulate"]
    if args.data is not None:
        parts += ["--data", data if data is not None else str(args.data)]
    parts += ["--algorithm", alg.name, "--clients", str(run["clients"]), "--per-round",
              str(run["per_round"]), "--rounds", str(run["rounds"]), "--seed", str(args.seed)]
    if args.test_fraction != 0.2:
        parts += ["--test-fraction", format_value(args.test_fraction)]
    if args.partition != "random":
        parts += ["--partition", args.partition]
    for field, value in params.items():
        parts += [flag_of(field), format_value(value)]
    return shlex.join(parts)


def _finite(obj: Any) -> Any:
    """The report with non-finite numbers (a diverged trial) as null (valid JSON)."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def run(args: argparse.Namespace) -> int:
    with json_output(args.json) as write_json:
        return _run(args, write_json)


def _run(args: argparse.Namespace, write_json) -> int:
    alg = registry.get(args.algorithm)
    search_space(alg)  # refuses an algorithm without one
    run_cfg = _run_rounds(alg, args)
    ratings, data = load_data(args.data, args.seed)
    check_rating_values(ratings)
    if args.clients is None:
        run_cfg["clients"] = default_clients(run_cfg["clients"], ratings)
    fed = build_federation(ratings, run_cfg["clients"], args.seed, args.test_fraction,
                           partition=args.partition)
    fed = type(fed)(fed.train, [], fed.user_ids, fed.item_ids, fed.scale)  # no test set
    per_round = run_cfg["per_round"] or fed.n_clients
    metric = args.metric or ("ndcg" if registry.model_kind(alg.name) == "ranking" else "rmse")
    label = {"rmse": "RMSE", "ndcg": "NDCG@10"}[metric]

    def show(t: Trial) -> None:
        if not args.quiet:
            print(f"  {t.rounds:>5} rounds  validation {label} "
                  f"{metric_value(metric, t.rmse):.4f}  {t.params or '(default)'}",
                  flush=True)

    print(f"tuning {alg.name} on {data}: {args.trials} trials, runs of up to "
          f"{run_cfg['rounds']} rounds, budget {args.budget_seconds:g} s, validation = 10% "
          "of each tenant's training ratings")
    res = tune(alg, fed, rounds=run_cfg["rounds"], per_round=per_round, seed=args.seed,
               trials=args.trials, eta=args.eta, budget_seconds=args.budget_seconds,
               on_trial=show, metric=metric)
    cfg = res.config(alg)
    chosen_run = {**run_cfg, "rounds": res.rounds}
    cmd = command_line(args, alg, chosen_run, res.best.params, data)
    default_at = dict(res.default.history)
    print(f"best: validation {label} {res.value:.4f} at {res.rounds} rounds; the default's "
          + ", ".join(f"{metric_value(metric, v):.4f} at {r}" for r, v in res.default.history)
          + f" rounds; {res.seconds:.1f} s wall, {res.cpu_seconds:.1f} s CPU")
    if res.cuts:
        print("cut to fit the time budget: " + "; ".join(res.cuts))
    print(cmd)
    out = {"algorithm": alg.name, "config": cfg.model_dump(mode="json"),
           "changed": res.best.params, "command": cmd, "data": data, "seed": args.seed,
           "test_fraction": args.test_fraction, "partition": args.partition, **chosen_run,
           "max_rounds": run_cfg["rounds"], "rungs": res.rungs,
           "metric": metric, f"validation_{metric}": res.value,
           f"default_validation_{metric}": metric_value(
               metric, default_at.get(res.rounds, res.default.best[1])),
           "default_history": [(r, metric_value(metric, v)) for r, v in res.default.history],
           "budget_seconds": args.budget_seconds, "budget_exhausted": res.budget_exhausted,
           "cuts": res.cuts, "seconds": res.seconds, "cpu_seconds": res.cpu_seconds,
           "load_average": list(os.getloadavg()),
           "trials": [{"params": t.params, "finalist": t in res.finalists,
                       "history": [(r, metric_value(metric, v)) for r, v in t.history]}
                      for t in res.trials]}
    if args.json:
        write_json(_finite(out))
    else:
        print(json.dumps({"algorithm": alg.name, "rounds": res.rounds,
                          "config": out["config"]}), file=sys.stdout)
    return 0
