"""Client scaling on synthetic tiles: data scarcity and abundance (Felb paper Sec. 4.1.2, Fig. 3).

Scarcity: the data size is fixed (``--rows``, default 2048 rows; the paper's 2^16) and the
client count grows, so each client holds fewer rows. Abundance: every client holds
``--rows-per-client`` rows (default 50; the paper's 500), so the data grows with the
clients. Client counts default to 4, 16, 64 (the paper's 2^2 ... 2^9). Tiles as in Sec. 4.1
(:mod:`bench._felb_synth`, 10% XOR noise, 150 columns, k = 6), Felb / Felb-MU with T = 10
local steps and ``--rounds`` rounds, local Elbmf + majority vote as the baseline. Measured:
RMSD and F1 of the reconstruction against the data, training seconds (as in Fig. 3, which
gives curves only). Sizes are scaled down to fit the ten-minute budget.

    nice -n 10 python -m bench felb_clients
"""

from __future__ import annotations

import sys
import time

import numpy as np

from bench import _experiment as E
from bench import _felb_synth as S

EXPERIMENT = "Felb paper Fig. 3: Felb, Felb-MU and the voting baseline as clients grow (tiles)"
SCENARIOS = ("scarcity", "abundance")


def run_seed(args, seed: int) -> dict:
    """{scenario: {method: {metric: [value per client count]}}} on one seed."""
    out = {sc: {m: {"f1": [], "rmsd": [], "f1_signal": [], "seconds": []} for m in S.METHODS}
           for sc in SCENARIOS}
    for s_i, sc in enumerate(SCENARIOS):
        for i, c in enumerate(args.clients):
            rows = args.rows if sc == "scarcity" else c * args.rows_per_client
            data, signal = S.tiles(rows, args.cols, args.tiles, args.noise,
                                   S.data_rng(seed, 10 * s_i + i))
            fed = S.federation(data, signal, c, S.data_rng(seed, 100 + 10 * s_i + i))
            for m in S.METHODS:
                alg, res, sec = S.fit(m, fed, args.tiles, args.rounds, seed,
                                      args.baseline_iters)
                for key, val in {**S.scores(alg, res, fed), "seconds": sec}.items():
                    out[sc][m][key].append(val)
                print(f"seed {seed} {sc} clients {c:4d} rows {rows} {m:8s} "
                      f"RMSD {out[sc][m]['rmsd'][-1]:.3f} F1 {out[sc][m]['f1'][-1]:.3f} "
                      f"({sec:.1f} s)", flush=True)
    return out


def plot(runs: list[dict], clients, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.2))
    for row, sc in zip(axes, SCENARIOS, strict=True):
        for ax, key in zip(row, ("rmsd", "f1", "seconds"), strict=True):
            for m in S.METHODS:
                v = np.array([r[sc][m][key] for r in runs])
                ax.errorbar(clients, v.mean(0), yerr=v.std(0), marker="o", ms=3, capsize=2,
                            label=S.LABELS[m])
            ax.set_xscale("log", base=2)
            ax.set_title(f"{sc}: {key if key != 'seconds' else 'training seconds'}",
                         fontsize=9)
            ax.set_xlabel("clients")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Felb Fig. 3 reproduction, {len(runs)} seeds (mean ± sd)", fontsize=10)
    E.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    ap = E.parser("felb_clients", __doc__)
    ap.add_argument("--clients", type=int, nargs="+", default=None,
                    help="client counts (default 4 16 64)")
    ap.add_argument("--rows", type=int, default=None, help="scarcity: rows (default 2048)")
    ap.add_argument("--rows-per-client", type=int, default=None,
                    help="abundance: rows per client (default 50)")
    ap.add_argument("--cols", type=int, default=150)
    ap.add_argument("--tiles", type=int, default=6, help="tiles = rank k (default 6)")
    ap.add_argument("--noise", type=float, default=0.1, help="XOR noise (default 0.1)")
    ap.add_argument("--rounds", type=int, default=None, help="Felb rounds (default 20)")
    ap.add_argument("--baseline-iters", type=int, default=None,
                    help="local Elbmf iterations (default 200)")
    args = ap.parse_args(argv)
    q = args.quick
    args.clients = args.clients or ([2, 8] if q else [4, 16, 64])
    args.rows = args.rows or (256 if q else 2048)
    args.rows_per_client = args.rows_per_client or (30 if q else 50)
    args.cols = 60 if q else args.cols
    args.rounds = args.rounds or (4 if q else 20)
    args.baseline_iters = args.baseline_iters or (20 if q else 200)
    runs = [run_seed(args, s) for s in range(args.seeds)]
    rows = [E.comparison(f"{sc}, {args.clients[-1]} clients, {S.LABELS[m]}", "RMSD", None,
                         [r[sc][m]["rmsd"][-1] for r in runs],
                         "paper: Fig. 3 curves only (Felb-MU best under scarcity)")
            for sc in SCENARIOS for m in S.METHODS]
    timing = {"wall_seconds": round(time.perf_counter() - t0, 1),
              "cpu_seconds": round(time.process_time(), 1)}
    E.write_result(args.out, "felb_clients", argv, q, {**timing,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "comparisons": rows, "runs": runs})
    plot(runs, args.clients, args.out / "felb_clients.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
