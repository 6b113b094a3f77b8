"""Issue 4 target: Felb and Felb-MU against the voting-federated baseline on binarised ML-1M.

ML-1M (ratings >= 3.5 -> 1; 80/20 random split, seeded), 50 tenants, k = 20, synchronisation
every 10 local steps, 100 rounds (Appendix D). The baseline fits Elbmf locally
(``--baseline-iters`` iterations), aggregates once by eqs. 11-13 and refits U_i. Prints one
JSON line per method: F1 and RMSD of the Boolean reconstruction of the training matrix,
precision@10 / recall@10 on the held-out positives, and training seconds (evaluation
excluded; the baseline's local fit is shared by the three aggregations). Usage::

    nice -n 10 python -m bench.felb_targets [--data ml-1m] [--rounds 100] [--methods ...]
"""

from __future__ import annotations

import os

# Per-tenant products are tiny (k = 20): BLAS threads only add contention on a shared box.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from algorithms import binary_baseline, felb  # noqa: E402
from algorithms._rng import SERVER, derive_rng  # noqa: E402
from algorithms.binary_metrics import binarise, binary_report  # noqa: E402
from algorithms.data import build_federation, load_movielens  # noqa: E402
from algorithms.simulate import (  # noqa: E402
    SimulationResult,
    initialise,
    run_round,
    simulate,
)

METHODS = ("felb", "felb-mu", "vote", "average", "or")


def _row(method, alg, result, fed, seconds, rounds, cfg) -> dict:
    report = binary_report(alg, result, fed)
    return {"method": method, **report.as_dict(), "train_seconds": round(seconds, 1),
            "rounds": rounds, "config": cfg.model_dump()}


def _run_felb(method: str, fed, args) -> dict:
    alg = felb.ALGORITHMS[method]
    start = getattr(args, "start", None)
    server_prox = getattr(args, "server_prox", None)
    cfg = alg.config(rank=args.rank, local_steps=args.local_steps, proximity=args.proximity,
                     **({} if start is None else {"start": start}),
                     **({} if server_prox is None else {"server_prox": server_prox}))
    result = simulate(alg, cfg, fed, rounds=args.rounds, per_round=fed.n_clients,
                      seed=args.seed, evaluate_every=args.rounds)
    seconds = sum(h.seconds for h in result.history)
    return _row(method, alg, result, fed, seconds, args.rounds, cfg)


def _run_baselines(methods: list[str], fed, args) -> list[dict]:
    """One local Elbmf fit per tenant (round 1, the same for every aggregation), then per
    aggregation: the server step and one refit round. Equal to separate ``simulate`` runs."""
    alg = binary_baseline.ALGORITHM
    base = alg.config(rank=args.rank, local_iters=args.baseline_iters)
    server, glob, locs = initialise(alg, base, fed.train, args.seed)
    t0 = time.perf_counter()
    _, _, fitted, _, uploads = run_round(alg, base, 1, args.seed, fed.n_clients, glob, server,
                                         locs, fed.train)
    fit_seconds = time.perf_counter() - t0
    rows = []
    for method in methods:
        cfg = base.model_copy(update={"aggregation": method})
        t0 = time.perf_counter()
        srv, g = alg.server_step(server, uploads, cfg, derive_rng(args.seed, 1, SERVER))
        g, srv, final, _, _ = run_round(alg, cfg, 2, args.seed, fed.n_clients, g, srv, fitted,
                                        fed.train)
        seconds = fit_seconds + time.perf_counter() - t0
        result = SimulationResult([], g, srv, final)
        rows.append(_row(method, alg, result, fed, seconds, 2, cfg))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="ml-1m", choices=["ml-100k", "ml-1m"])
    p.add_argument("--threshold", type=float, default=3.5)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rank", type=int, default=20)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--proximity", type=float, default=felb.FelbConfig().proximity)
    p.add_argument("--baseline-iters", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = p.parse_args(argv)
    ratings = load_movielens(args.data)
    fed = binarise(build_federation(ratings, args.clients, args.seed), args.threshold)
    for method in [m for m in args.methods if m.startswith("felb")]:
        print(json.dumps(_run_felb(method, fed, args)), flush=True)
    baselines = [m for m in args.methods if not m.startswith("felb")]
    for row in _run_baselines(baselines, fed, args) if baselines else []:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
