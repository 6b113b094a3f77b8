"""Robustness to destructive XOR noise on synthetic tiles (Felb paper Sec. 4.1.1, Fig. 2).

Tile data of Sec. 4.1 (:mod:`bench._felb_synth`: dense tiles with ~90% 1s, XOR noise from 0
to 0.5), 10 clients, k = number of tiles, Felb / Felb-MU (T = 10 local steps, ``--rounds``
rounds) against local Elbmf + majority vote. Measured per noise level: F1 and RMSD of the
reconstruction against the noisy data, F1* against the noise-free signal, training seconds.
The paper shows Fig. 2 as curves only (no numbers) and does not state the matrix size;
the default here is 600 x 150 with 6 tiles and 30 rounds (fits the ten-minute budget).
Seeds vary the data and the initialisation (the paper averages 10 trials).

    nice -n 10 python -m bench felb_noise
"""

from __future__ import annotations

import sys
import time

import numpy as np

from bench import _experiment as E
from bench import _felb_synth as S

EXPERIMENT = "Felb paper Fig. 2: Felb, Felb-MU and the voting baseline under XOR noise (tiles)"
NOISE = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


def run_seed(args, seed: int) -> dict:
    """{method: {metric: [value per noise level]}} on one seed."""
    out = {m: {"f1": [], "rmsd": [], "f1_signal": [], "seconds": []} for m in S.METHODS}
    for i, noise in enumerate(args.noise):
        data, signal = S.tiles(args.rows, args.cols, args.tiles, noise, S.data_rng(seed, i))
        fed = S.federation(data, signal, args.clients, S.data_rng(seed, 100 + i))
        for m in S.METHODS:
            alg, res, sec = S.fit(m, fed, args.tiles, args.rounds, seed, args.baseline_iters)
            for key, val in {**S.scores(alg, res, fed), "seconds": sec}.items():
                out[m][key].append(val)
            print(f"seed {seed} noise {noise:.2f} {m:8s} F1 {out[m]['f1'][-1]:.3f} "
                  f"F1* {out[m]['f1_signal'][-1]:.3f} RMSD {out[m]['rmsd'][-1]:.3f} "
                  f"({sec:.1f} s)", flush=True)
    return out


def plot(runs: list[dict], noise, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(14, 3.4))
    titles = {"rmsd": "RMSD (data)", "f1": "F1 (data)", "f1_signal": "F1* (signal)",
              "seconds": "training seconds"}
    for ax, (key, title) in zip(axes, titles.items(), strict=True):
        for m in S.METHODS:
            v = np.array([r[m][key] for r in runs])
            ax.errorbar(noise, v.mean(0), yerr=v.std(0), marker="o", ms=3, capsize=2,
                        label=S.LABELS[m])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("XOR noise")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Felb Fig. 2 reproduction: tiles, {len(runs)} seeds (mean ± sd)", fontsize=10)
    E.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    ap = E.parser("felb_noise", __doc__)
    ap.add_argument("--rows", type=int, default=None, help="rows (default 600)")
    ap.add_argument("--cols", type=int, default=None, help="columns (default 150)")
    ap.add_argument("--tiles", type=int, default=6, help="tiles = rank k (default 6)")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=None, help="Felb rounds (default 30)")
    ap.add_argument("--baseline-iters", type=int, default=None,
                    help="local Elbmf iterations (default 200)")
    args = ap.parse_args(argv)
    q = args.quick
    args.rows = args.rows or (200 if q else 600)
    args.cols = args.cols or (60 if q else 150)
    args.rounds = args.rounds or (5 if q else 30)
    args.baseline_iters = args.baseline_iters or (20 if q else 200)
    args.noise = (0.0, 0.25, 0.5) if q else NOISE
    runs = [run_seed(args, s) for s in range(args.seeds)]
    rows = []
    for m in S.METHODS:
        for i in (0, len(args.noise) // 2 if q else 2):
            rows.append(E.comparison(
                f"noise {args.noise[i]:.2f}, {S.LABELS[m]}", "F1* (signal)", None,
                [r[m]["f1_signal"][i] for r in runs],
                "paper: Fig. 2 curves only (Felb/Felb-MU best at every noise level)",
                lower_is_better=False))
    timing = {"wall_seconds": round(time.perf_counter() - t0, 1),
              "cpu_seconds": round(time.process_time(), 1)}
    E.write_result(args.out, "felb_noise", argv, q, {**timing,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "comparisons": rows, "runs": runs})
    plot(runs, args.noise, args.out / "felb_noise.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
