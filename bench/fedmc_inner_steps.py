"""Effect of the number of inner steps N on FedMC-ADMM: objective and test RMSE against
training time (FedMC-ADMM paper Sec. 5.3, Fig. 3).

The paper's setting: l1 regularisers (eq. 69) with lambda = gamma = 1e-6, eqs. (70)-(73),
N in {5, 10, 15, 20, 25, 30}; everything else as ``FedMCADMMConfig.paper_settings()``
(rank 5, beta 1e4, Uniform(0, 2e-4) init, tenant-mean centring), 100 tenants, 10 per round,
100 rounds, 80/20 split seed 0. The paper ran Netflix, which fedrec does not have: this runs
MovieLens 1M (``--quick``: ML-100k, N in {5, 30}, 10 rounds). Training time is the
client + server work of the in-process simulation (evaluation excluded) on a shared
machine, so absolute seconds depend on its load (recorded in the JSON). Seeds vary the
initialisation and the sampling.

    nice -n 10 python -m bench fedmc_inner_steps
"""

from __future__ import annotations

import sys

from algorithms import fedmc_admm as F
from algorithms.data import build_federation, load_movielens
from bench import _experiment as E
from bench._fedmc_trace import plot_against_time, sweep

EXPERIMENT = "FedMC-ADMM paper Sec. 5.3, Fig. 3: inner steps N in 5..30 vs training time (l1)"
NEEDS_DATA = True
STEPS, QUICK_STEPS = [5, 10, 15, 20, 25, 30], [5, 30]
NOTE = ("paper: figure only, Netflix (smaller N converges faster in time); fedrec: ML-1M, "
        "time on a shared 2-core machine")


def configs(steps: list[int]) -> dict[str, F.FedMCADMMConfig]:
    return {f"N = {n}": F.FedMCADMMConfig.paper_settings(regulariser="l1", lam=1e-6,
                                                         gamma=1e-6, inner_steps=n)
            for n in steps}


def comparisons(results: dict, data: str, rounds: int) -> list[dict]:
    """Final test RMSE per N (training time and objective are in the JSON and the plot)."""
    return [E.comparison(f"{data}, l1, {label}, round {rounds}", "test RMSE", None,
                         [run[-1]["test_rmse"] for run in res["runs"]], NOTE)
            for label, res in results.items()]


def main(argv: list[str] | None = None) -> int:
    args = E.parser("fedmc_inner_steps", __doc__).parse_args(argv)
    data, steps, rounds, every = (("ml-100k", QUICK_STEPS, 10, 5) if args.quick
                                  else ("ml-1m", STEPS, 100, 5))
    fed = build_federation(load_movielens(data), 100, 0)
    results = sweep(F.ALGORITHM, configs(steps), fed, rounds=rounds, every=every,
                    seeds=args.seeds, tag=data)
    rows = comparisons(results, data, rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_against_time(results, [("objective", "objective F (problem 1, l1)", True),
                                ("test_rmse", "test RMSE", False)],
                      f"FedMC-ADMM, inner steps N ({data}, l1, lambda = gamma = 1e-6; "
                      "FedMC-ADMM paper Fig. 3)", args.out / "fedmc_inner_steps.png")
    E.write_result(args.out, "fedmc_inner_steps", argv, args.quick,
                   {"data": data, "rounds": rounds, "results": results, "comparisons": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
