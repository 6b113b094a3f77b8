"""FedMC-ADMM RMSE targets: tuning on a validation carve-out, then the final test runs.

Setting of issue 3: 80/20 split seed 0, 100 tenants, 10 tenants per round, 100 rounds,
no DP. ``tune`` never looks at the test ratings: it holds out 10% of every tenant's
training ratings (seeded) and reports validation RMSE for each config of a grid.
``final`` trains on the whole training split and reports test RMSE / MAE.

    nice -n 10 python -m bench.fedmc_admm_targets tune --data ml-100k \
        --grid '{"beta": [0.003, 0.01], "lam": [3, 5]}'
    nice -n 10 python -m bench.fedmc_admm_targets final --data ml-1m [--paper] \
        [--set rank=5] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

from algorithms import fedmc_admm as F
from algorithms import tuning
from algorithms.data import Federation, build_federation, load_movielens
from algorithms.simulate import simulate

VALIDATION_STREAM = tuning.VALIDATION


def validation_federation(fed: Federation, seed: int = 0, fraction: float = 0.1) -> Federation:
    """Train on 90% of each tenant's training ratings, validate on the other 10% (the
    carve-out ``fedrec tune`` uses: :func:`algorithms.tuning.validation_federation`)."""
    return tuning.validation_federation(fed, seed, fraction)


def run(cfg: F.FedMCADMMConfig, fed: Federation, rounds: int, per_round: int,
        every: int) -> dict:
    t0 = time.perf_counter()
    res = simulate(F.ALGORITHM, cfg, fed, rounds=rounds, per_round=per_round, seed=0,
                   evaluate_every=every)
    curve = [(h.round, h.test_rmse) for h in res.history if h.test_rmse == h.test_rmse]
    return {"config": cfg.model_dump(), "rmse": res.final.test_rmse, "mae": res.final.test_mae,
            "objective": res.final.objective, "curve": curve,
            "median_round_s": sorted(h.seconds for h in res.history)[len(res.history) // 2],
            "wall_s": time.perf_counter() - t0}


def _parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, value = item.split("=", 1)
        out[key] = json.loads(value) if value[:1] in "0123456789-[{tfn" else value
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["tune", "final"])
    ap.add_argument("--data", default="ml-100k")
    ap.add_argument("--grid", default="{}", help="JSON: field -> list of values (tune)")
    ap.add_argument("--set", nargs="*", default=[], help="field=value overrides")
    ap.add_argument("--paper", action="store_true", help="start from paper_settings()")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--every", type=int, default=10, help="evaluate every k rounds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    fed = build_federation(load_movielens(args.data), 100, 0)
    if args.mode == "tune":
        fed = validation_federation(fed)
    base = F.FedMCADMMConfig.paper_settings() if args.paper else F.FedMCADMMConfig()
    base = base.model_copy(update=_parse_set(args.set))
    grid = json.loads(args.grid)
    results = []
    for combo in itertools.product(*grid.values()):
        cfg = F.FedMCADMMConfig(**{**base.model_dump(), **dict(zip(grid, combo, strict=True))})
        out = run(cfg, fed, args.rounds, args.per_round, args.every)
        results.append(out)
        label = "validation" if args.mode == "tune" else "test"
        print(f"{args.data} {label} RMSE {out['rmse']:.4f} MAE {out['mae']:.4f} "
              f"({out['wall_s']:.0f}s) {dict(zip(grid, combo, strict=True)) or ''}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"data": args.data, "mode": args.mode, "results": results}, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
