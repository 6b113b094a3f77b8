"""Privacy-utility curve: test RMSE against per-tenant epsilon (issue 5, part 7).

For each algorithm: one run without noise (the reference RMSE and the median norms of the
uploads, which set the clip bound C), then one run per (mechanism, target epsilon). The
noise is solved so that every tenant spends at most the target over the whole run, with
the unit protected = a tenant's whole rating block (replace-one, sensitivity 2C), delta =
1e-5 (< 1/943 users), and the exact transmissions of the seeded sampling schedule.

    nice -n 10 python -m bench.privacy_utility --algorithms fedmc-admm \\
        --epsilons 1 10 100 1000 10000 100000 --out bench/privacy_utility

writes ``<out>.json`` and ``<out>.png`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from algorithms import registry
from algorithms.base import default_select
from algorithms.data import build_federation, data_dir, load_ratings
from algorithms.simulate import simulate
from privacy.accountant import noise_for_epsilon, spend
from privacy.cli import sampling_plan
from privacy.clipping import joint_norm
from privacy.ledger import Budget, Ledger, worst_case_plan
from privacy.wrapper import DPPrivatizer, DPSpec, event_for, n_entries, sensitivity

DELTA = 1e-5


class NormRecorder:
    """A privatizer that changes nothing and records each upload's L2 and L1 norm."""

    def __init__(self) -> None:
        self.l2: list[float] = []
        self.l1: list[float] = []
        self.entries = 0

    def __call__(self, upload, client, round_):
        arrays = upload.arrays()
        self.l2.append(joint_norm(arrays, "l2"))
        self.l1.append(joint_norm(arrays, "l1"))
        self.entries = n_entries(upload)
        return upload


def run(alg, cfg, fed, run_cfg, seed, privatizer=None) -> tuple[float, float]:
    t0 = time.perf_counter()
    res = simulate(alg, cfg, fed, rounds=run_cfg["rounds"], per_round=run_cfg["per_round"],
                   seed=seed, privatizer=privatizer, evaluate_every=run_cfg["rounds"])
    return res.final.test_rmse, time.perf_counter() - t0


def curve(name: str, epsilons: list[float], mechanisms: list[str], seed: int, fed_cache: dict
          ) -> list[dict]:
    alg = registry.get(name)
    cfg, run_cfg = alg.config(), dict(alg.run_defaults)
    key = run_cfg["clients"]
    if key not in fed_cache:
        fed_cache[key] = build_federation(
            load_ratings(data_dir() / "ml-100k" / "u.data"), key, seed)
    fed = fed_cache[key]
    per_round = run_cfg["per_round"] or fed.n_clients
    run_cfg["per_round"] = per_round
    rec = NormRecorder()
    rmse0, sec = run(alg, cfg, fed, run_cfg, seed, rec)
    rows = [dict(algorithm=name, mechanism="none", target_epsilon=None, epsilon_max=None,
                 rmse=rmse0, rmse_increase=0.0, seconds=sec, clip=None)]
    print(f"{name}: no DP RMSE {rmse0:.4f}; upload L2 norm median {np.median(rec.l2):.4g}, "
          f"L1 median {np.median(rec.l1):.4g}, {rec.entries} entries", flush=True)
    if alg.select is default_select:  # the schedule is known from the seed
        plan = sampling_plan(fed.n_clients, run_cfg["rounds"], per_round, seed)
    else:  # e.g. RFRec selects everybody: worst case
        plan = worst_case_plan(range(fed.n_clients), run_cfg["rounds"])
    tmax = max(plan.values())
    for mech in mechanisms:
        clip = float(np.median(rec.l2 if mech == "gaussian" else rec.l1))
        for eps in epsilons:
            z = noise_for_epsilon(mech, eps, DELTA, tmax)
            spec = DPSpec(mechanism=mech, clip=clip, noise_multiplier=z, delta=DELTA)
            ledger = Ledger.open({i: Budget(eps, DELTA) for i in range(fed.n_clients)})
            priv = DPPrivatizer(spec, ledger, seed)
            priv.check_plan(plan, rec.entries)
            rmse, sec = run(alg, cfg, fed, run_cfg, seed, priv)
            rep = priv.report(rec.entries)
            rows.append(dict(algorithm=name, mechanism=mech, target_epsilon=eps,
                             epsilon_max=rep["epsilon_max"], rmse=rmse,
                             rmse_increase=rmse / rmse0 - 1.0, seconds=sec, clip=clip,
                             noise_multiplier=z, noise_scale=z * sensitivity(spec, rec.entries),
                             max_transmissions=tmax, stopped=len(rep["stopped"])))
            r = rows[-1]
            print(f"  {mech:8s} eps<={eps:<8g} spent {r['epsilon_max']:.4g}  RMSE {rmse:.4f} "
                  f"({100 * r['rmse_increase']:+.1f}%)  noise/entry {r['noise_scale']:.3g}",
                  flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in sorted({r["algorithm"] for r in rows}):
        base = next(r["rmse"] for r in rows if r["algorithm"] == name and r["mechanism"] == "none")
        ax.axhline(base, ls=":", color="grey")
        ax.axhline(base * 1.05, ls="--", color="grey", lw=0.8)
        for mech, marker in (("gaussian", "o"), ("laplace", "s")):
            pts = [(r["epsilon_max"], r["rmse"]) for r in rows
                   if r["algorithm"] == name and r["mechanism"] == mech]
            if pts:
                x, y = zip(*sorted(pts), strict=True)
                ax.plot(x, y, marker=marker, label=f"{name}, {mech}")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon per tenant over the whole run (delta = 1e-5, unit: tenant block)")
    ax.set_ylabel("test RMSE (ML-100k)")
    ax.set_title("dotted: no DP; dashed: +5%")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def rfrec_paper_accounting(rank: int = 20, n_items: int = 1682, rounds: int = 100) -> None:
    """RFRec's chosen pair (delta = 0.2, s = 0.04, Sec. 4.6) accounted per entry and per tenant."""
    d = rank * n_items
    spec = DPSpec(mechanism="laplace", norm="value", clip=0.2, noise_scale=0.04, delta=DELTA)
    ev = event_for(spec, d)
    print(f"RFRec eq. 9, delta=0.2, s=0.04, upload {rank} x {n_items} = {d} entries")
    print(f"  per entry, per transmission (the paper's 2 delta / s): {2 * 0.2 / 0.04:g}")
    for k in (1, rounds):
        s = spend([ev.times(k)], DELTA)
        print(f"  per tenant block, {k} transmission(s): epsilon {s.epsilon:.4g} "
              f"(RDP {s.epsilon_rdp:.4g}, basic composition {s.epsilon_pure:.4g}, delta 1e-5)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithms", nargs="+", default=["fedmc-admm"])
    ap.add_argument("--mechanisms", nargs="+", default=["gaussian", "laplace"])
    ap.add_argument("--epsilons", nargs="+", type=float, default=[1, 10, 100, 1000, 10000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/privacy_utility"))
    ap.add_argument("--append", action="store_true",
                    help="add to the rows already in <out>.json (runs split under 10 minutes)")
    ap.add_argument("--rfrec-paper-accounting", action="store_true",
                    help="only print RFRec's paper setting accounted per entry and per tenant")
    args = ap.parse_args()
    if args.rfrec_paper_accounting:
        return rfrec_paper_accounting()
    if data_dir() is None:
        raise SystemExit("MovieLens not found: set FEDREC_DATA_DIR")
    path = args.out.with_suffix(".json")
    rows: list[dict] = json.loads(path.read_text()) if args.append and path.exists() else []
    cache: dict = {}
    for name in args.algorithms:
        rows += curve(name, args.epsilons, args.mechanisms, args.seed, cache)
    path.write_text(json.dumps(rows, indent=1))
    plot(rows, args.out.with_suffix(".png"))
    print("\n| algorithm | mechanism | target eps | eps spent (max) | test RMSE | vs no DP |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        eps = "-" if r["target_epsilon"] is None else f"{r['target_epsilon']:g}"
        spent = "-" if r["epsilon_max"] is None else f"{r['epsilon_max']:.4g}"
        print(f"| {r['algorithm']} | {r['mechanism']} | {eps} | {spent} | {r['rmse']:.4f} "
              f"| {100 * r['rmse_increase']:+.1f}% |")


if __name__ == "__main__":
    main()
