"""FedMAvg and FedMGS beside FedMC-ADMM on MovieLens (issue 3's FedMAvg target).

100 tenants, 10 per round, 100 rounds, 80/20 split seed 0, no DP. Variants:

* ``fedmavg``: fedrec's recommended FedMAvg (:class:`algorithms.fedmavg.FedMAvgConfig` defaults);
* ``fedmavg-paper``: :func:`algorithms.fedmavg.paper_settings` (FedMC-ADMM paper Sec. 5.2, rank 5);
* ``fedmgs``: FedMGS defaults (not privacy-preserving; for comparison);
* ``fedmc-admm`` / ``fedmc-admm-paper``: FedMC-ADMM's defaults / its ``paper_settings()``
  (module function or config class method), when that module is present.

Usage: ``nice -n 10 python -m bench.fedmavg_targets --datasets ml-100k ml-1m --json out.json``
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from algorithms import registry
from algorithms.data import build_federation, load_movielens
from algorithms.simulate import simulate

VARIANTS = ("fedmavg", "fedmavg-paper", "fedmgs", "fedmc-admm", "fedmc-admm-paper")


def variant(name: str):
    """(Algorithm, config) of a variant, or None when its module is absent."""
    base = name.removesuffix("-paper")
    if base not in registry.names():
        return None
    alg = registry.get(base)
    if name.endswith("-paper"):
        module = importlib.import_module(alg.init_server.__module__)
        paper = getattr(module, "paper_settings", None) or getattr(alg.config,
                                                                   "paper_settings", None)
        return None if paper is None else (alg, paper())
    return alg, alg.config()


def run(name: str, fed, rounds: int, per_round: int, seed: int) -> dict | None:
    found = variant(name)
    if found is None:
        return None
    alg, cfg = found
    t0 = time.perf_counter()
    res = simulate(alg, cfg, fed, rounds=rounds, per_round=per_round, seed=seed,
                   evaluate_every=10)
    wall = time.perf_counter() - t0
    secs = [h.seconds for h in res.history]
    curve = [(h.round, h.test_rmse) for h in res.history if np.isfinite(h.test_rmse)]
    return {"variant": name, "config": cfg.model_dump(), "test_rmse": res.final.test_rmse,
            "test_mae": res.final.test_mae, "objective": res.final.objective,
            "best_rmse": min(r for _, r in curve), "rmse_every_10": curve,
            "round_seconds_median": float(np.median(secs)),
            "round_seconds_min": float(np.min(secs)), "wall_seconds": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-1m"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out = []
    for ds in args.datasets:
        fed = build_federation(load_movielens(ds), args.clients, args.seed)
        for name in args.variants:
            row = run(name, fed, args.rounds, args.per_round, args.seed)
            if row is None:
                print(f"{ds:8s} {name:17s} (module or paper_settings absent)", flush=True)
                continue
            row["dataset"] = ds
            out.append(row)
            print(f"{ds:8s} {name:17s} RMSE {row['test_rmse']:.4f}  MAE {row['test_mae']:.4f}  "
                  f"best {row['best_rmse']:.4f}  round {1e3 * row['round_seconds_median']:.0f} ms "
                  f"(median)  wall {row['wall_seconds']:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
