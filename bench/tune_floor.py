"""What FedMC-ADMM's model can reach on MovieLens 1M (issue 17's tune target, test RMSE
<= 0.845): a centralised ALS of the *same* model and ridge family, on the federated runs'
split (``build_federation(ml-1m, 100, 0)``), scored on the validation carve-out
(``--on val``: 10% of each tenant's training ratings, as ``fedrec tune``) or on the test
ratings (``--on test``: fitted on all training ratings), predictions clipped to [1, 5].

Each point is a FedMC-ADMM config (JSON of its fields; unnamed ones take the defaults) and
is mapped to :func:`algorithms.centralised.fit_als`'s ``ridges``: a user's factors and
bias get ``lam + lam_rating s n_u``, an item's factors ``p gamma + gamma_rating s n_j`` and
its bias that plus ``item_bias_ridge`` (p the tenants, 100; s the tenants' mean ridge scale,
:func:`algorithms._scale.ridge_scale_of`; FedMC-ADMM's objective is
(1/p) sum_i f_i + R(V), so R(V)'s gamma weighs p gamma against the squared errors). The
ALS is the exact block minimiser the federated run approaches.

    nice -n 10 python -m bench.tune_floor --on test --sweeps 40 \\
        '{"lam": 5, "gamma": 0.1, "lam_rating": 0.02, "gamma_rating": 0.02}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from algorithms import centralised as C
from algorithms._rng import derive_rng
from algorithms._scale import ridge_scale_of
from algorithms.data import build_federation, load_movielens
from algorithms.fedmc_admm import FedMCADMMConfig
from algorithms.tuning import validation_federation
from bench.centralised import INIT_STREAM, pooled

TENANTS = 100


def ridges(cfg: FedMCADMMConfig, p: int, s: float) -> tuple[tuple, tuple]:
    """fit_als's (lam, lam_bias, lam_fixed, bias_rating) of the users and of the items."""
    user = (cfg.lam_rating * s, cfg.lam, cfg.lam, cfg.lam_rating * s)
    pg = p * cfg.gamma
    item = (cfg.gamma_rating * s, pg + cfg.item_bias_ridge, pg, cfg.gamma_rating * s)
    return user, item


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="FedMC-ADMM fields as JSON")
    ap.add_argument("--on", choices=["val", "test"], default="val")
    ap.add_argument("--sweeps", type=int, default=20)
    ap.add_argument("--data", default="ml-1m")
    args = ap.parse_args(argv)
    fed = build_federation(load_movielens(args.data), TENANTS, 0)
    f = validation_federation(fed) if args.on == "val" else fed
    users, items, values, m = pooled(f.train)
    tu, ti, tv, _ = pooled(f.test)
    # the tenants' ridge scales differ little on MovieLens (each holds ~7,000 ratings)
    s = float(np.mean([ridge_scale_of(b, 1.0) for b in f.train]))
    for text in args.configs:
        fields = json.loads(text)
        cfg = FedMCADMMConfig(**fields)
        t0 = time.process_time()
        model = C.fit_als(users, items, values, m, f.n_items, rank=cfg.rank, lam=0.0,
                          lam_bias=0.0, iterations=args.sweeps,
                          rng=derive_rng(0, 0, INIT_STREAM), ridges=ridges(cfg, TENANTS, s))
        rmse, mae = C.rmse(model, tu, ti, tv, f.scale)
        print(json.dumps({"data": args.data, "on": args.on, "config": fields,
                          "sweeps": args.sweeps, "ridge_scale": round(s, 4),
                          "rmse": round(rmse, 4), "mae": round(mae, 4),
                          "cpu_seconds": round(time.process_time() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
