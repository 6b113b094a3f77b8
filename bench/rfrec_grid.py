"""RFRec / RFRecF test RMSE over the lambda x alpha grid of the paper's Table 4 (the RFRec paper).

Grid lambda in {5, 10, 20, 40}, alpha in {0.1, 0.05, 0.025, 0.0125} (Sec. 3.6.2 / 4.6),
everything else at the paper's protocol: one client per user, K = 100 iterations,
lambda_u = 0.1, p = 0.5, with the authors' Adam + sigmoid (the printed gradient step
diverges). RFRec uses the ``paper`` setting, RFRecF the ``paper-code`` setting (the
authors' notebook schedule; Algorithm 2's schedule learns almost nothing in 100
iterations, see rfrec_table2). Settings in bench/rfrec_common.py.

The paper's grid is on ML-1M; one ML-1M run takes minutes on the shared 2-core machine,
so the default is ML-100k (3 seeds) and the rows compare against the ML-1M figures only
for orientation: the paper's claim under test is where the optimum lies (lambda = 10 with
alpha = 0.05 for RFRec and 0.025 for RFRecF). ``--data ml-1m`` runs the paper's data set
(writes ``rfrec_grid_ml-1m.json``). ``--quick``: the 2 x 2 corner, 10 iterations.
"""

from __future__ import annotations

import numpy as np

from bench import _experiment
from bench import rfrec_common as C

EXPERIMENT = "RFRec/RFRecF RMSE over the lambda x alpha grid vs the paper's Table 4"
NEEDS_DATA = True
NAME = "rfrec_grid"
VARIANT = {"rfrec": "paper", "rfrecf": "paper-code"}


def measure(data: str, alphas, lams, seeds: int, rounds: int | None) -> dict:
    """Test RMSE of every (method, alpha, lambda, seed)."""
    cells: dict = {}
    for method in ("rfrec", "rfrecf"):
        for alpha in alphas:
            for lam in lams:
                vals = []
                for seed in range(seeds):
                    res = C.run(method, VARIANT[method], data, seed, rounds=rounds,
                                alpha=alpha, lam=lam)
                    vals.append(res.final.test_rmse)
                cells[f"{method}/{alpha}/{lam}"] = vals
                print(f"{method} alpha {alpha} lambda {lam}: "
                      + " ".join(f"{v:.4f}" for v in vals), flush=True)
    return cells


def comparisons(data: str, cells: dict, alphas, lams) -> list[dict]:
    rows = []
    for method in ("rfrec", "rfrecf"):
        for alpha in alphas:
            for lam in lams:
                paper = C.TABLE4[method][C.GRID_ALPHAS.index(alpha)][C.GRID_LAMS.index(lam)]
                what = (f"{C.DATA[data]}, {C.METHOD[method]}, {VARIANT[method]}, "
                        f"alpha {alpha}, lambda {lam:g}")
                note = "" if data == "ml-1m" else "paper's figure is ML-1M"
                rows.append(_experiment.comparison(what, "RMSE", paper,
                                                   cells[f"{method}/{alpha}/{lam}"], note=note))
    return rows


def best(cells: dict, method: str, alphas, lams) -> dict:
    """The grid cell with the lowest mean RMSE (the paper: lambda 10 and its alpha)."""
    means = {(a, la): float(np.nanmean(cells[f"{method}/{a}/{la}"]))
             for a in alphas for la in lams}
    (a, la), v = min(means.items(), key=lambda kv: (np.isnan(kv[1]), kv[1]))
    return {"alpha": a, "lambda": la, "rmse": v}


def plot(data: str, cells: dict, alphas, lams, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, method in zip(axes, ("rfrec", "rfrecf"), strict=True):
        grid = np.array([[np.nanmean(cells[f"{method}/{a}/{la}"]) for la in lams]
                         for a in alphas])
        im = ax.imshow(grid, cmap="viridis_r")
        for i in range(len(alphas)):
            for j in range(len(lams)):
                paper = C.TABLE4[method][C.GRID_ALPHAS.index(alphas[i])][
                    C.GRID_LAMS.index(lams[j])]
                light = grid[i, j] < np.nanmean(grid)  # the reversed colormap is light
                ax.text(j, i, f"{grid[i, j]:.4f}\n({paper:.4f})", ha="center", va="center",
                        fontsize=7, color="k" if light else "w")
        ax.set_xticks(range(len(lams)), [f"{la:g}" for la in lams])
        ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_xlabel("lambda")
        ax.set_ylabel("alpha")
        ax.set_title(f"{C.METHOD[method]} on {C.DATA[data]} (paper ML-1M)")
        fig.colorbar(im, ax=ax, fraction=0.046)
    _experiment.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = _experiment.parser(NAME, __doc__)
    ap.add_argument("--data", choices=["ml-100k", "ml-1m"], default="ml-100k")
    args = ap.parse_args(argv)
    alphas = C.GRID_ALPHAS[:2] if args.quick else C.GRID_ALPHAS
    lams = C.GRID_LAMS[:2] if args.quick else C.GRID_LAMS
    cells = measure(args.data, alphas, lams, args.seeds, 10 if args.quick else None)
    stem = NAME if args.data == "ml-100k" else f"{NAME}_{args.data}"
    optimum = {m: best(cells, m, alphas, lams) for m in ("rfrec", "rfrecf")}
    print("best cells:", optimum)
    path = C.write(args.out, NAME, stem, argv, args.quick,
                                    {"data": args.data, "cells": cells, "best": optimum,
                                     "variants": VARIANT,
                                     "comparisons": comparisons(args.data, cells, alphas,
                                                                lams)})
    plot(args.data, cells, alphas, lams, args.out / f"{stem}.png")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
