"""Effect of the l1 weight lambda on FedMC-ADMM: objective, test RMSE and the share of
non-zero entries of U and V against training time (FedMC-ADMM paper Sec. 5.4, Fig. 4).

The paper's setting: l1 regularisers (eq. 69), lambda in {1e-6, 1e-5, ..., 1e-1} and
gamma = 10 lambda beta, eqs. (70)-(73), N = 10; everything else as
``FedMCADMMConfig.paper_settings()`` (rank 5, beta 1e4, Uniform(0, 2e-4) init, tenant-mean
centring), 100 tenants, 10 per round, 100 rounds, 80/20 split seed 0. The paper ran
Netflix, which fedrec does not have: this runs MovieLens 1M (``--quick``: ML-100k,
lambda in {1e-6, 1e-1}, 10 rounds). "Non-zero" counts the entries of U = [U_1; ...; U_p]
and V that are exactly 0 after the soft-thresholding of eqs. (71) and (73). Seeds vary the
initialisation and the sampling.

    nice -n 10 python -m bench fedmc_l1
"""

from __future__ import annotations

import sys

from algorithms import fedmc_admm as F
from algorithms.data import build_federation, load_movielens
from bench import _experiment as E
from bench._fedmc_trace import plot_against_time, sweep

EXPERIMENT = "FedMC-ADMM paper Sec. 5.4, Fig. 4: l1 weight lambda in 1e-6..1e-1, RMSE and sparsity"
NEEDS_DATA = True
LAMBDAS, QUICK_LAMBDAS = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], [1e-6, 1e-1]
NOTE = ("paper: figure only, Netflix (lambda <= 1e-3 comparable, 1e-3 best balance, 1e-1 "
        "makes U and V all zero); fedrec: ML-1M")


def configs(lambdas: list[float]) -> dict[str, F.FedMCADMMConfig]:
    beta = F.FedMCADMMConfig.paper_settings().beta
    return {f"lambda = {lam:g}": F.FedMCADMMConfig.paper_settings(
        regulariser="l1", lam=lam, gamma=10 * lam * beta, inner_steps=10) for lam in lambdas}


def comparisons(results: dict, data: str, rounds: int) -> list[dict]:
    """Final test RMSE and non-zero share of U and V per lambda."""
    rows = []
    for label, res in results.items():
        finals = [run[-1] for run in res["runs"]]
        what = f"{data}, {label}, gamma = 10 lambda beta, round {rounds}"
        rows.append(E.comparison(what, "test RMSE", None, [f["test_rmse"] for f in finals],
                                 NOTE))
        rows.append(E.comparison(what, "non-zero share of U and V", None,
                                 [f["nnz_uv"] for f in finals], NOTE, lower_is_better=False))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = E.parser("fedmc_l1", __doc__).parse_args(argv)
    data, lambdas, rounds, every = (("ml-100k", QUICK_LAMBDAS, 10, 5) if args.quick
                                    else ("ml-1m", LAMBDAS, 100, 5))
    fed = build_federation(load_movielens(data), 100, 0)
    results = sweep(F.ALGORITHM, configs(lambdas), fed, rounds=rounds, every=every,
                    seeds=args.seeds, sparsity=True, tag=data)
    rows = comparisons(results, data, rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_against_time(results, [("objective", "objective F (problem 1, l1)", True),
                                ("test_rmse", "test RMSE", False),
                                ("nnz_uv", "non-zero share of U and V", False)],
                      f"FedMC-ADMM, l1 weight lambda, gamma = 10 lambda beta ({data}; "
                      "FedMC-ADMM paper Fig. 4)", args.out / "fedmc_l1.png")
    E.write_result(args.out, "fedmc_l1", argv, args.quick,
                   {"data": data, "rounds": rounds, "results": results, "comparisons": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
