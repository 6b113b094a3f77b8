"""FedMAvg and FedMGS clustering on the synthetic Gaussian model, iid and non-iid, m = 10 and
m = 100 (FedMAvg/FedMGS paper Sec. V-F, Table I, column "syn"; k-means++ as the reference).

The paper's model X = W H + E at SNR -3 dB (:func:`algorithms.clustering.synthetic`), 100
clients, iid (Case 1: random balanced split) or non-iid (Case 2: k-means into 100 groups),
Q1 = 10, FedMAvg diminishing Q2 (Q_hat = 50), FedMGS Q2 = 10, SNCP schedule of Sec. V-F.
Step sizes are the paper's (Sec. V-A, :class:`algorithms.clustering.ClusterConfig`).
Table I reports Case 2 only (M = 2000, N = 10000, K = 20, up to the stopping rule); the
default size here is scaled down (M = 2000, N = 2000, K = 20, at most 100 rounds) to fit
the ten-minute budget of a benchmark on 2 shared cores. ``--paper-size`` is the paper's
setting: M = 2000, N = 10000, K = 20, its stopping rule (relative change of F below 1e-8)
and round cap (500, Sec. V-A), Case 2 only unless ``--partitions`` says otherwise; it writes
``clustering_table1_paper-size.json`` / ``.png`` beside the default result (``--jobs``
runs the cells in parallel processes, ``--methods`` chooses cells). ``--preset authors``
(implies ``--paper-size``) stops by Sec. V-F's rule for the clustering experiment, the
relative change alone, capped at 1,000 rounds (``algorithms.presets.CLUSTER_PRESETS``, as
``fedrec cluster --preset authors``), and writes ``clustering_table1_authors.json``. Seeds
vary the data, the partition and the algorithms' randomness. Reuses
:mod:`algorithms.clustering`.

    OPENBLAS_NUM_THREADS=1 nice -n 10 python -m bench clustering_table1
    OPENBLAS_NUM_THREADS=1 nice -n 10 python -m bench clustering_table1 --paper-size --jobs 3
    OPENBLAS_NUM_THREADS=1 python -m bench clustering_table1 --preset authors \
        --methods fedmavg/100 --jobs 3

Set OPENBLAS_NUM_THREADS=1 in the environment: ``fedrec`` imports numpy before this module,
so a setting made here is too late, and threaded BLAS on a loaded 2-core box runs several
times slower.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import functools  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from algorithms import clustering as cl  # noqa: E402
from algorithms.presets import CLUSTER_PRESETS  # noqa: E402
from algorithms.rng import SPLIT, derive_rng  # noqa: E402
from bench import _experiment as E  # noqa: E402

EXPERIMENT = ("FedMAvg/FedMGS paper Table I (syn): FedMAvg/FedMGS clustering accuracy, "
              "iid and non-iid, m = 10 and 100")
#: Table I, column "syn" (Case 2, non-iid), accuracy in %
PAPER = {("fedmavg", 10): 86.2, ("fedmavg", 100): 85.5, ("fedmgs", 10): 88.4,
         ("fedmgs", 100): 87.7, ("kmeans", 0): 69.4}
METHODS = (("fedmavg", 10), ("fedmavg", 100), ("fedmgs", 10), ("fedmgs", 100))
PARTITIONS = ("noniid", "iid")


def label(method: str, m: int) -> str:
    return "k-means++ (pooled)" if method == "kmeans" else (
        f"{'FedMAvg' if method == 'fedmavg' else 'FedMGS'} (m = {m})")


def _data(args, seed: int, kind: str | None) -> tuple:
    """(x, labels) of a seed, or with ``kind`` its parts (xs, labels of each part)."""
    return _make(args.m, args.n, args.k, args.snr_db, args.clients, seed, kind)


@functools.lru_cache(maxsize=8)
def _make(m: int, n: int, k: int, snr_db: float, clients: int, seed: int, kind: str | None
          ) -> tuple:
    x, labels = cl.synthetic(m, n, k, snr_db, derive_rng(seed, 0, SPLIT))
    if kind is None:
        return x, labels
    parts = cl.partition(x, clients, kind, derive_rng(seed, 1, SPLIT))
    return [x[:, p] for p in parts], [labels[p] for p in parts]


def run_cell(args, seed: int, kind: str, method: str, m: int) -> dict:
    """Accuracy (%), rounds and accuracy curve of one method, partition and m on one seed
    (``kind`` "pooled": k-means++ on the pooled data)."""
    t0 = time.perf_counter()
    if method == "kmeans":
        x, labels = _data(args, seed, None)
        return {"accuracy": 100 * cl.accuracy(labels, cl.kmeans(x, args.k,
                                                                derive_rng(seed, 2, SPLIT)))}
    xs, ls = _data(args, seed, kind)
    cfg = cl.ClusterConfig(method=method, k=args.k, per_round=min(m, len(xs)),
                           rounds=args.rounds, q1=10, stop_tol=args.stop_tol)

    def progress(r: cl.ClusterRound) -> None:
        if r.round % 250 == 0:
            print(f"seed {seed} {kind}/{method}/{m} round {r.round}: accuracy "
                  f"{100 * r.accuracy:.1f}% ({time.perf_counter() - t0:.0f} s)", flush=True)
    res = cl.run(xs, cfg, seed, ls, on_round=progress)
    out = {"accuracy": 100 * res.accuracy, "rounds": len(res.history), "clients": len(xs),
           "seconds": time.perf_counter() - t0,
           "curve": [100 * r.accuracy for r in res.history]}
    print(f"seed {seed} {kind}/{method}/{m} accuracy {out['accuracy']:.1f}% "
          f"rounds {out['rounds']} ({out['seconds']:.0f} s)", flush=True)
    return out


def _cell(task: tuple) -> dict:
    args, *rest = task
    return run_cell(args, *rest)


def run_all(args) -> list[dict]:
    """Every seed's results ({"kmeans": %, "<kind>/<method>/<m>": cell}), the cells run in
    ``args.jobs`` parallel processes (one process per cell on a shared machine gets the
    work done sooner than one per seed)."""
    cells = [(s, "pooled", "kmeans", 0) for s in range(args.seeds)] + [
        (s, kind, method, m) for s in range(args.seeds) for kind in args.partitions
        for method, m in args.methods]
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        if args.seeds * (len(args.partitions) + 1) <= 8:  # made once, inherited by fork
            for s, kind in {(c[0], None if c[2] == "kmeans" else c[1]) for c in cells}:
                _data(args, s, kind)

        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_cell, [(args, *c) for c in cells]))
    else:
        results = [run_cell(args, *c) for c in cells]
    runs: list[dict] = [{} for _ in range(args.seeds)]
    for (seed, kind, method, m), res in zip(cells, results, strict=True):
        if method == "kmeans":
            runs[seed]["kmeans"] = res["accuracy"]
        else:
            runs[seed][f"{kind}/{method}/{m}"] = res
    return runs


def comparisons(runs: list[dict], size: str, partitions=PARTITIONS, methods=METHODS
                ) -> list[dict]:
    rows = []
    for kind in partitions:
        for method, m in methods:
            paper = PAPER[(method, m)] if kind == "noniid" else None
            note = (f"{size}; paper at M 2000, N 10000, K 20" if paper is not None else
                    "Table I is Case 2 only; iid accuracy is shown in Fig. 4 as a curve")
            rows.append(E.comparison(f"syn {kind}, {label(method, m)}", "accuracy %", paper,
                                     [r[f"{kind}/{method}/{m}"]["accuracy"] for r in runs],
                                     note, lower_is_better=False))
    rows.append(E.comparison("syn, k-means++ (pooled)", "accuracy %", PAPER[("kmeans", 0)],
                             [r["kmeans"] for r in runs], f"{size}; centralised reference",
                             lower_is_better=False))
    return rows


def plot(runs: list[dict], path, partitions=PARTITIONS, methods=METHODS) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(partitions), figsize=(5 * len(partitions) + 0.5, 3.8),
                             sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], partitions, strict=True):
        for method, m in methods:
            curve = runs[0][f"{kind}/{method}/{m}"]["curve"]
            ax.plot(np.arange(1, len(curve) + 1), curve, label=label(method, m))
            if kind == "noniid":
                ax.axhline(PAPER[(method, m)], ls=":", lw=0.8,
                           color=ax.get_lines()[-1].get_color())
        ax.axhline(runs[0]["kmeans"], color="k", ls="--", lw=0.8, label="k-means++ (pooled)")
        ax.set_title(f"{'non-iid (Case 2)' if kind == 'noniid' else 'iid (Case 1)'}, seed 0"
                     + ("; dotted: Table I" if kind == "noniid" else ""), fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("clustering accuracy (%)")
    axes[0][-1].legend(fontsize=8)
    E.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    ap = E.parser("clustering_table1", __doc__)
    ap.add_argument("--M", dest="m", type=int, default=None, help="features (default 2000)")
    ap.add_argument("--N", dest="n", type=int, default=None, help="samples (default 2000)")
    ap.add_argument("--K", dest="k", type=int, default=None, help="clusters (default 20)")
    ap.add_argument("--rounds", type=int, default=None, help="round cap (default 100)")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--snr-db", type=float, default=-3.0)
    ap.add_argument("--paper-size", action="store_true",
                    help="the paper's M 2000, N 10000, K 20, Case 2 only, stopped by "
                         "--preset; writes clustering_table1_paper-size.json")
    ap.add_argument("--preset", choices=sorted(CLUSTER_PRESETS), default="paper",
                    help="with --paper-size, the stopping rule: 'paper' (Sec. V-A: relative "
                         "change of F below 1e-8 or 500 rounds) or 'authors' (Sec. V-F's "
                         "clustering rule: the relative change alone, capped at "
                         f"{CLUSTER_PRESETS['authors']['rounds']} rounds to bound the "
                         "compute; implies --paper-size, writes "
                         "clustering_table1_authors.json) (default: paper)")
    ap.add_argument("--methods", nargs="+", default=None,
                    choices=[f"{method}/{m}" for method, m in METHODS],
                    help="cells to run, method/m (default: all four)")
    ap.add_argument("--partitions", nargs="+", choices=PARTITIONS, default=None,
                    help="partitions to run (default: both; noniid with --paper-size)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="cells (seed, partition, method, m) run in parallel processes")
    args = ap.parse_args(argv)
    args.paper_size = args.paper_size or args.preset == "authors"
    stop = CLUSTER_PRESETS[args.preset]
    small = ((100, 800, 5, 40) if args.quick else
             (2000, 10000, 20, stop["rounds"]) if args.paper_size else (2000, 2000, 20, 100))
    args.stop_tol = stop["stop_tol"]
    args.methods = tuple(mm for mm in METHODS if args.methods is None
                         or f"{mm[0]}/{mm[1]}" in args.methods)
    args.m, args.n, args.k, args.rounds = (v if v is not None else d for v, d in zip(
        (args.m, args.n, args.k, args.rounds), small, strict=True))
    if args.partitions is None:
        args.partitions = ("noniid",) if args.paper_size else PARTITIONS
    args.partitions = tuple(k for k in PARTITIONS if k in args.partitions)
    if args.quick:
        args.clients = min(args.clients, 20)
    runs = run_all(args)
    size = (f"{'paper size: ' if (args.m, args.n, args.k) == (2000, 10000, 20) else ''}"
            f"M {args.m}, N {args.n}, K {args.k}, stop at {args.stop_tol:g} or {args.rounds} "
            f"rounds" if args.paper_size else
            f"M {args.m}, N {args.n}, K {args.k}, <= {args.rounds} rounds")
    stem = ("clustering_table1" if not args.paper_size else "clustering_table1_paper-size"
            if args.preset == "paper" else f"clustering_table1_{args.preset}")
    timing = {"wall_seconds": round(time.perf_counter() - t0, 1),
              "cpu_seconds": round(time.process_time(), 1)}
    E.write_result(args.out, "clustering_table1", argv, args.quick, {**timing,
        "settings": {"M": args.m, "N": args.n, "K": args.k, "rounds": args.rounds,
                     "stop_tol": args.stop_tol, "preset": args.preset,
                     "clients": args.clients, "snr_db": args.snr_db, "q1": 10,
                     "partitions": list(args.partitions),
                     "methods": [f"{method}/{m}" for method, m in args.methods],
                     "config": {method: cl.ClusterConfig(method=method).model_dump()
                                for method in ("fedmavg", "fedmgs")}},
        "comparisons": comparisons(runs, size, args.partitions, args.methods), "runs": runs},
        stem=stem)
    plot(runs, args.out / f"{stem}.png", args.partitions, args.methods)
    return 0


if __name__ == "__main__":
    sys.exit(main())
