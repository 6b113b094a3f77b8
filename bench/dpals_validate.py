"""Validation search for DPALS (or ``--algorithm dp-fedmavg`` / ``dp-fedmc-admm``) under
user-level DP (never the test ratings).

For every point of the grid, train DPALS on 90% of each tenant's training ratings
(``bench.fedmc_admm_targets.validation_federation``) with the noise solved for
``--epsilon`` at ``--delta`` (0: noise-free) and read the RMSE on the other 10%, averaged
over ``--runs`` run seeds (initial V and noise draws; the split is seed 0). Grid values are
comma lists of DPALS options, e.g.::

    python -m bench.dpals_validate --data ml-1m --epsilon 8 \\
        --grid max_ratings_per_user=50,100 noise_reg=0.5,1,2

Not an experiment itself (no ``EXPERIMENT``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from algorithms import dpals, registry
from algorithms.data import Federation, build_federation, load_movielens
from algorithms.simulate import simulate
from bench.fedmc_admm_targets import validation_federation
from privacy.randomness import private_federation
from privacy.user_level import UserLevelPrivatizer, plan


def run_dpals(cfg: dpals.DPALSConfig, fed: Federation, *, epsilon: float, delta: float,
              placement: str, seed: int, gram_share: float | None = None,
              release_growth: float | None = None) -> tuple[float, dict[str, Any] | None]:
    """Test RMSE of one DPALS run on ``fed`` (and its privacy report; None if noise-free).
    ``gram_share``/``release_growth`` None: the privacy layer's defaults."""
    return run_user_level("dpals", cfg, fed, epsilon=epsilon, delta=delta,
                          placement=placement, seed=seed, gram_share=gram_share,
                          release_growth=release_growth)


def run_user_level(name: str, cfg: Any, fed: Federation, *, epsilon: float, delta: float,
                   placement: str, seed: int, gram_share: float | None = None,
                   release_growth: float | None = None) -> tuple[float, dict[str, Any] | None]:
    """Test RMSE of one run of a user-level algorithm (dpals, dp-fedmavg, dp-fedmc-admm)
    on ``fed`` with every tenant in every round, its releases then one refresh round (and
    the privacy report; None if noise-free). ``gram_share``/``release_growth`` None: the
    privacy layer's (or the algorithm's) defaults."""
    alg = registry.get(name)
    releases = registry.user_releases(cfg, 0)
    priv = None
    if epsilon > 0:
        bounds = registry.user_bounds(name, cfg)
        request = {"epsilon": epsilon, "delta": delta, "placement": placement,
                   **({} if gram_share is None else {"gram_share": gram_share}),
                   **({} if release_growth is None else {"release_growth": release_growth})}
        spec = plan(request, bounds, sum(b.n_users for b in fed.train), releases)
        priv = UserLevelPrivatizer(spec, bounds, fed.n_clients, seed)
        fed = private_federation(fed)  # per-user caps and samples from a fresh secret
    res = simulate(alg, cfg, fed, rounds=releases + 1, per_round=fed.n_clients,
                   seed=seed, privatizer=priv, aggregator=priv.aggregate if priv else None,
                   evaluate_every=releases + 1)
    return res.final.test_rmse, priv.report() if priv else None


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    grid = {}
    for item in items:
        key, values = item.split("=", 1)
        grid[key] = [_value(v) for v in values.split(",")]
    return grid


def search(data: str, grid: dict[str, list[Any]], base: dict[str, Any], *, epsilon: float,
           delta: float, placement: str, clients: int, runs: int,
           gram_share: float | None = None, release_growth: float | None = None,
           algorithm: str = "dpals") -> list[dict]:
    fed = validation_federation(build_federation(load_movielens(data), clients, 0, 0.2))
    rows = []
    for values in itertools.product(*grid.values()):
        kw = {**base, **dict(zip(grid, values, strict=True))}
        cfg = registry.get(algorithm).config(**kw)
        rmses = [run_user_level(algorithm, cfg, fed, epsilon=epsilon, delta=delta,
                                placement=placement, seed=s, gram_share=gram_share,
                                release_growth=release_growth)[0] for s in range(runs)]
        rows.append({"config": kw, "validation_rmse": float(np.mean(rmses))})
        print(f"{kw}: {np.mean(rmses):.4f}", flush=True)
    best = min(rows, key=lambda r: r["validation_rmse"])
    print(f"best: {best['config']} {best['validation_rmse']:.4f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="ml-1m", choices=["ml-100k", "ml-1m"])
    ap.add_argument("--algorithm", default="dpals",
                    choices=["dpals", "dp-fedmavg", "dp-fedmc-admm"])
    ap.add_argument("--epsilon", type=float, default=8.0, help="0: noise-free")
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--placement", default="central", choices=["central", "tenant"])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--gram-share", type=float, default=None,
                    help="share of each release's privacy spent on the gram arrays")
    ap.add_argument("--release-growth", type=float, default=None,
                    help="release k gets a privacy share proportional to growth^k")
    ap.add_argument("--runs", type=int, default=2, help="run seeds to average")
    ap.add_argument("--base", nargs="*", default=[], help="fixed options key=value")
    ap.add_argument("--grid", nargs="*", default=[], help="key=v1,v2,...")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    base = {k: v[0] for k, v in parse_grid(args.base).items()}
    rows = search(args.data, parse_grid(args.grid), base, epsilon=args.epsilon,
                  delta=args.delta, placement=args.placement, clients=args.clients,
                  runs=args.runs, gram_share=args.gram_share,
                  release_growth=args.release_growth, algorithm=args.algorithm)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
