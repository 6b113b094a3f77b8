"""Validation search for RFRecF's ``ours`` setting on ML-100k (never the test ratings).

For every (clients, lambda_u, alpha) of the grid and every split seed in ``--seeds``, train
RFRecF (Adam + sigmoid, the notebook's schedule, p = 0.8, lambda = 0.8 / alpha so the move
after an aggregation is a full reset) on 90% of each client's training ratings
(``bench.fedmc_admm_targets.validation_federation``) and read the RMSE on the other 10%
every 50 iterations. Prints, per grid point, the iteration with the lowest mean validation
RMSE over the seeds, that RMSE, and the RMSE at 350 iterations. The grids of BENCHMARKS.md::

    python -m bench.rfrec_validate --clients 100,200 --lam-u 0.3,0.5,1.0 --alpha 0.02,0.03
    python -m bench.rfrec_validate --clients 50,100 --lam-u 1.5,2.0,3.0 --alpha 0.02

Not an experiment itself (no ``EXPERIMENT``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from algorithms.rfrec import RFRecFConfig, run_batched
from bench import rfrec_common as C
from bench.fedmc_admm_targets import validation_federation


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def search(clients: list[int], lam_us: list[float], alphas: list[float], seeds: int,
           rounds: int, every: int = 50) -> list[dict]:
    """One row per grid point: mean validation RMSE over the seeds at every ``every``."""
    rows = []
    for n, lam_u, alpha in itertools.product(clients, lam_us, alphas):
        curves = []
        for seed in range(seeds):
            fed = validation_federation(C.federation("ml-100k", n, seed), seed=seed)
            cfg = RFRecFConfig.paper_settings(optimizer="adam", link="sigmoid", schedule="code",
                                              p=0.8, alpha=alpha, lam=0.8 / alpha, lam_u=lam_u)
            res = run_batched(cfg, fed, rounds=rounds, seed=seed, evaluate_every=every)
            curves.append({h.round: h.test_rmse for h in res.history
                           if h.test_rmse == h.test_rmse})
        mean = {k: float(np.mean([c[k] for c in curves])) for k in sorted(curves[0])}
        best = min(mean, key=mean.get)
        rows.append({"clients": n, "lam_u": lam_u, "alpha": alpha, "best_iteration": best,
                     "best_rmse": mean[best], "rmse_at_350": mean.get(350),
                     "validation_rmse": mean})
        print(f"clients {n} lambda_u {lam_u} alpha {alpha}: best iteration {best} "
              f"{mean[best]:.4f}, at 350 {mean.get(350, float('nan')):.4f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="50,100,200")
    ap.add_argument("--lam-u", default="0.3,1.0,3.0")
    ap.add_argument("--alpha", default="0.02")
    ap.add_argument("--seeds", type=int, default=3, help="split seeds 0, 1, ... to average")
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = search([int(x) for x in args.clients.split(",")], _floats(args.lam_u),
                  _floats(args.alpha), args.seeds, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
