"""Centralised ceiling: ALS matrix factorisation with mean + user/item biases on the
federated benchmarks' split, tuned on a validation carve-out, never on the test ratings.

Same data as every federated MovieLens benchmark: ``build_federation(ratings, 100, 0)``
(80/20 split, seed 0), pooled back into one matrix, so the train and test ratings are
exactly the federated runs' ones. Tuning uses
:func:`algorithms.tuning.validation_federation` (10% of each tenant's training ratings,
seeded), the carve-out ``fedrec tune`` uses. The chosen setting is then fitted on the whole training
split with ``--seeds`` initialisations; test RMSE / MAE are over all test ratings with
predictions clipped to [1, 5], as :func:`algorithms.simulate.evaluate` does.

    nice -n 10 python -m bench centralised            # ML-100k and ML-1M, 3 seeds
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np

from algorithms import centralised as C
from algorithms.data import Federation, build_federation, load_movielens
from algorithms.rng import derive_rng
from algorithms.tuning import validation_federation
from bench import _experiment as E

EXPERIMENT = ("centralised ALS-MF with biases (ceiling for FedMC-ADMM paper Fig. 2; "
              "RFRec paper Table 2 centralised PMF)")
NEEDS_DATA = True
GRID = {"rank": [5, 10], "lam": [0.03, 0.06, 0.12, 0.25], "lam_bias": [2.0, 20.0]}
QUICK_GRID = {"rank": [5], "lam": [0.05, 0.1], "lam_bias": [5.0]}
SWEEPS, QUICK_SWEEPS = 10, 4
INIT_STREAM = 20_000
PAPER = {"ml-1m": (0.8762, "RFRec paper Table 2, centralised PMF (its own split)")}


def pooled(blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(users, items, values, n_users) of tenant blocks stacked into one matrix: tenant t's
    local row r becomes user ``offset_t + r`` (items are already global)."""
    offsets = np.cumsum([0] + [b.n_users for b in blocks])
    users = np.concatenate([b.rows.astype(np.int64) + offsets[t] for t, b in enumerate(blocks)])
    items = np.concatenate([b.cols.astype(np.int64) for b in blocks])
    values = np.concatenate([b.vals for b in blocks])
    return users, items, values, int(offsets[-1])


def fit_and_score(fed: Federation, params: dict, sweeps: int, seed: int) -> dict:
    """Fit on ``fed.train`` and score on ``fed.test`` (RMSE, MAE, clipped to the scale)."""
    u, i, v, m = pooled(fed.train)
    tu, ti, tv, _ = pooled(fed.test)
    t0 = time.perf_counter()
    model = C.fit_als(u, i, v, m, fed.n_items, iterations=sweeps,
                      rng=derive_rng(seed, 0, INIT_STREAM), **params)
    rmse, mae = C.rmse(model, tu, ti, tv, fed.scale)
    return {**params, "rmse": rmse, "mae": mae, "seconds": time.perf_counter() - t0}


def tune(fed: Federation, grid: dict, sweeps: int) -> list[dict]:
    """Validation RMSE of every grid point (seed 0), on the carve-out only."""
    val = validation_federation(fed)
    rows = []
    for combo in itertools.product(*grid.values()):
        params = dict(zip(grid, combo, strict=True))
        rows.append(fit_and_score(val, params, sweeps, 0))
        print(f"  validation {params}: RMSE {rows[-1]['rmse']:.4f}", flush=True)
    return rows


def ceiling(name: str, grid: dict, sweeps: int, seeds: int) -> dict:
    """Tune on validation, then the chosen setting's test figures over ``seeds`` seeds."""
    fed = build_federation(load_movielens(name), 100, 0)
    grid_rows = tune(fed, grid, sweeps)
    best = min(grid_rows, key=lambda r: r["rmse"])
    chosen = {k: best[k] for k in grid}
    tests = [fit_and_score(fed, chosen, sweeps, s) for s in range(seeds)]
    print(f"{name}: chosen {chosen}, test RMSE "
          f"{np.mean([t['rmse'] for t in tests]):.4f}", flush=True)
    return {"data": name, "chosen": chosen, "sweeps": sweeps, "validation": grid_rows,
            "test": tests}


def plot(results: list[dict], path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        rows = res["validation"]
        for rank in sorted({r["rank"] for r in rows}):
            for lb in sorted({r["lam_bias"] for r in rows}):
                pts = sorted((r["lam"], r["rmse"]) for r in rows
                             if r["rank"] == rank and r["lam_bias"] == lb)
                ax.plot(*zip(*pts, strict=True), marker="o",
                        label=f"rank {rank}, bias ridge {lb:g}")
        test = np.mean([t["rmse"] for t in res["test"]])
        ax.axhline(test, color="k", ls="--", lw=1,
                   label=f"test RMSE of chosen {res['chosen']['rank']}/"
                         f"{res['chosen']['lam']:g}/{res['chosen']['lam_bias']:g}: {test:.4f}")
        ax.set_xscale("log")
        ax.set_xlabel("factor ridge lambda (weighted by ratings)")
        ax.set_ylabel("RMSE")
        ax.set_title(f"{res['data']}: validation RMSE of the ALS grid")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    E.save_figure(fig, path)


def comparisons(results: list[dict]) -> list[dict]:
    """Test RMSE of the chosen setting per data set, beside a published centralised figure."""
    rows = []
    for res in results:
        paper, source = PAPER.get(res["data"], (None, "no published centralised figure"))
        setting = (f"{res['data']}, ALS rank {res['chosen']['rank']}, lambda "
                   f"{res['chosen']['lam']:g}, bias ridge {res['chosen']['lam_bias']:g}")
        note = (f"paper: {source}; fedrec: split seed 0 of the federated runs, seeds vary "
                "the init only")
        rows.append(E.comparison(setting, "test RMSE", paper,
                                 [t["rmse"] for t in res["test"]], note))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = E.parser("centralised", __doc__)
    args = ap.parse_args(argv)
    datasets = ["ml-100k"] if args.quick else ["ml-100k", "ml-1m"]
    grid = QUICK_GRID if args.quick else GRID
    sweeps = QUICK_SWEEPS if args.quick else SWEEPS
    results = [ceiling(d, grid, sweeps, args.seeds) for d in datasets]
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.out / "centralised.png")
    E.write_result(args.out, "centralised", argv, args.quick,
                   {"grid": grid, "results": results, "comparisons": comparisons(results)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
