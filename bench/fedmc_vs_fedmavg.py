"""FedMC-ADMM against FedMAvg: training objective and test RMSE by round (FedMC-ADMM paper
Sec. 5.2, Fig. 2) on MovieLens 100k and 1M.

Paper settings unless stated: 80/20 split seed 0, 100 tenants, 10 per round, 100 rounds,
N = Q1 = Q2 = 10, lambda = gamma = 1e-6, rank 5 (the paper's ML-1M rank, used for both
data sets). Both are ``fedrec simulate --preset paper`` (:mod:`algorithms.presets`, one
definition of config and run): FedMC-ADMM = ``FedMCADMMConfig.paper_settings()`` (the
authors' beta 1e4 and Uniform(0, 2e-4) init, tenant-mean centring); FedMAvg =
``FedMAvgConfig.paper_settings()``
(Sec. 5.2 as written: all tenants update U_i each round, 10 upload, W gradient / p,
Uniform(0, 1) init, no centring). For reference the plot and the JSON also carry
FedMC-ADMM at fedrec's recommended defaults (rank 10, biases, tuned on validation).
Seeds vary the initialisation and the tenant sampling, never the split. The centralised
ALS ceiling (``python -m bench centralised``) is drawn when its result file exists.

The objective plotted is the data term of F, (1/p) 1/2 sum_i ||P_Omega_i(M_i - M_hat_i)||^2
on the training ratings, computed identically for both methods (with lambda = gamma =
1e-6 the regularisers are negligible; each method's own objective is in the JSON).

    nice -n 10 python -m bench fedmc_vs_fedmavg            # both data sets, 3 seeds
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from algorithms import fedmavg
from algorithms import fedmc_admm as F
from algorithms.data import build_federation, load_movielens
from algorithms.presets import PAPER_RUNS, paper_config
from bench import _experiment as E
from bench._fedmc_trace import mean_curve, trace

EXPERIMENT = "FedMC-ADMM paper Sec. 5.2, Fig. 2: FedMC-ADMM vs FedMAvg, objective and RMSE by round"
NEEDS_DATA = True
VARIANTS = {
    "FedMC-ADMM (paper)": (F.ALGORITHM, lambda: paper_config("fedmc-admm")),
    "FedMAvg (paper)": (fedmavg.ALGORITHM, lambda: paper_config("fedmavg")),
    "FedMC-ADMM (recommended)": (F.ALGORITHM, F.FedMCADMMConfig),
}
#: the paper preset's run (tenants, tenants per round, rounds), the same for both methods
RUN = PAPER_RUNS["fedmc-admm"]
PAPER_NOTE = ("paper: figure only (Fig. 2 has ML-1M, 10M, Netflix curves, no numbers; "
              "FedMC-ADMM below FedMAvg)")


def run_dataset(name: str, rounds: int, every: int, seeds: int) -> dict:
    fed = build_federation(load_movielens(name), RUN.clients, 0)
    out = {}
    for label, (alg, make) in VARIANTS.items():
        runs = []
        for seed in range(seeds):
            t0 = time.perf_counter()
            runs.append(trace(alg, make(), fed, rounds=rounds, per_round=RUN.per_round,
                              seed=seed, every=every))
            print(f"{name} {label} seed {seed}: test RMSE {runs[-1][-1]['test_rmse']:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        out[label] = {"config": make().model_dump(), "runs": runs}
    return out


def ceilings(out_dir, quick: bool) -> dict[str, float]:
    """Mean test RMSE of the centralised ALS per data set, from its result file (a quick
    one only for a quick run)."""
    for folder in (out_dir, E.RESULTS):
        path = folder / "centralised.json"
        doc = json.loads(path.read_text()) if path.is_file() else {}
        if doc and (quick or not doc.get("quick")):
            return {r["data"]: float(np.mean([t["rmse"] for t in r["test"]]))
                    for r in doc["results"]}
    return {}


def plot(results: dict, ceiling: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.8 * len(names)), squeeze=False)
    for row, name in zip(axes, names, strict=True):
        for label, res in results[name].items():
            style = "--" if "recommended" in label else "-"
            for ax, key in zip(row, ("data_term", "test_rmse"), strict=True):
                x, m, s = mean_curve(res["runs"], key)
                ax.plot(x, m, style, label=label)
                ax.fill_between(x, m - s, m + s, alpha=0.2)
        if name in ceiling:
            row[1].axhline(ceiling[name], color="k", ls=":", lw=1.2,
                           label=f"centralised ALS {ceiling[name]:.4f}")
        row[0].set_yscale("log")
        row[0].set_ylabel("(1/p) 1/2 ||P(M - UV)||^2 (train)")
        row[1].set_ylabel("test RMSE")
        row[1].set_ylim(0.8, 1.6)
        for ax in row:
            ax.set_xlabel("communication round")
            ax.set_title(name)
            ax.grid(alpha=0.3)
        row[1].legend(fontsize=8)
    fig.suptitle("FedMC-ADMM vs FedMAvg (FedMC-ADMM paper Fig. 2), mean ± std over seeds")
    E.save_figure(fig, path)


def comparisons(results: dict, rounds: int) -> list[dict]:
    rows = []
    for name, by_label in results.items():
        for label, res in by_label.items():
            finals = [run[-1] for run in res["runs"]]
            what = f"{name}, {label}, round {rounds}"
            rows.append(E.comparison(what, "test RMSE", None,
                                     [f["test_rmse"] for f in finals], PAPER_NOTE))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = E.parser("fedmc_vs_fedmavg", __doc__).parse_args(argv)
    datasets = ["ml-100k"] if args.quick else ["ml-100k", "ml-1m"]
    rounds, every = (10, 5) if args.quick else (RUN.rounds, 5)
    results = {d: run_dataset(d, rounds, every, args.seeds) for d in datasets}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, ceilings(args.out, args.quick), args.out / "fedmc_vs_fedmavg.png")
    E.write_result(args.out, "fedmc_vs_fedmavg", argv, args.quick,
                   {"rounds": rounds, "per_round": RUN.per_round, "clients": RUN.clients,
                    "results": results,
                    "comparisons": comparisons(results, rounds)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
