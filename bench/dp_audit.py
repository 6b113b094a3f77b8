"""Privacy audit of user-level DP: a membership attack on a planted canary user of DPALS.

The empirical epsilon of *Auditing Differentially Private Machine Learning* (Jagielski et
al., NeurIPS 2020) and *Adversary Instantiation* (Nasr et al., IEEE S&P 2021), see
:func:`privacy.audit.epsilon_lower_bound`. Setting:

* a small synthetic set (:func:`algorithms.synthetic.generate_ratings`), users split into
  tenants (:func:`algorithms.data.build_federation`, seed 0);
* the canary: one extra user of tenant 0 who rates the ``2 x --canary-items`` least rated
  items, alternately the top and the lowest rating (so a user bias cannot absorb the
  pattern, and few other ratings dilute it);
* half the runs with the canary, half without, everything else equal but the run seed
  (initial V and noise draws); DPALS at its defaults, noise solved for the claimed epsilon
  at ``--delta``, placement central (the sum is noised once: the smallest noise);
* the adversary sees every released V (each sweep's broadcast, as any tenant does); its
  score is the norm of the mean released column (factors and bias) of the canary's
  top-rated items minus that of its low-rated ones, summed over the sweeps weighted by
  each release's privacy share, fixed before any run ("higher = canary in");
* the bound: Clopper-Pearson at 95% on the best threshold's error rates.

A positive control runs the same attack without noise: it must separate the runs, or the
attack is too weak for its bound to mean anything. A lower bound below the claimed epsilon
is consistent with the claim but does not prove it (a stronger attack may exist).

    python -m bench dp_audit --epsilons 1 4 8 --runs 1000
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from algorithms import dpals
from algorithms.block import RatingBlock
from algorithms.data import Federation, build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from bench._experiment import parser, write_result
from privacy.audit import auc, epsilon_lower_bound
from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

EXPERIMENT = ("User-level DP audit (Jagielski et al. 2020, Nasr et al. 2021): empirical "
              "epsilon lower bound of a canary-user membership attack on DPALS")
DELTA = 1e-5
ALPHA = 0.05


def canary_federation(fed: Federation, n_items: int
                      ) -> tuple[Federation, np.ndarray, np.ndarray]:
    """``fed`` with one canary user appended to tenant 0, and the canary's items.

    The canary rates the ``2 n_items`` least rated items (ties by index), alternately the
    top and the lowest rating: its mean is the scale's middle, so its user bias cannot
    absorb the pattern, and the items rated by few others move most. Returns the
    federation, the top-rated and the low-rated items."""
    counts = np.bincount(np.concatenate([b.cols for b in fed.train]), minlength=fed.n_items)
    rare = np.argsort(counts, kind="stable")[: 2 * n_items]
    top, low = rare[0::2], rare[1::2]
    lo, hi = fed.scale
    b = fed.train[0]
    train0 = RatingBlock(np.concatenate([b.rows, np.full(2 * n_items, b.n_users)]),
                         np.concatenate([b.cols, top, low]),
                         np.concatenate([b.vals, np.full(n_items, hi), np.full(n_items, lo)]),
                         b.n_users + 1, b.n_items, b.scale)
    t = fed.test[0]
    test0 = RatingBlock(t.rows, t.cols, t.vals, t.n_users + 1, t.n_items, t.scale)
    uids = [np.append(fed.user_ids[0], -1), *fed.user_ids[1:]]
    return (Federation([train0, *fed.train[1:]], [test0, *fed.test[1:]], uids,
                       fed.item_ids, fed.scale), top, low)


def released_vs(cfg: dpals.DPALSConfig, fed: Federation, seed: int,
                spec: UserLevelSpec | None) -> list[np.ndarray]:
    """Every V the server broadcasts in one DPALS run (one per sweep)."""
    alg = dpals.ALGORITHM
    priv = None if spec is None else UserLevelPrivatizer(
        spec, dpals.user_bounds(cfg), fed.n_clients, seed)
    out: list[np.ndarray] = []
    simulate(alg, cfg, fed, rounds=cfg.sweeps, per_round=fed.n_clients, seed=seed,
             privatizer=priv, aggregator=None if priv is None else priv.aggregate,
             evaluate_every=0, on_state=lambda st: out.append(st.global_msg.V))
    return out


def score(vs: list[np.ndarray], top: np.ndarray, low: np.ndarray,
          weights: list[float]) -> float:
    """The attack: the norm of the released columns of V (factors and bias) of the
    canary's top-rated items minus those of its low-rated ones, summed over the sweeps
    with ``weights`` (public: each release's privacy share, so less noisy sweeps count
    more).

    Why: the canary alone moves item j's column along its own x (sign of its centred
    rating), mostly in the factor rows since ``||u|| >> c``; x is unknown to the attacker
    (it depends on the initial V), hence the norm. Reading only the bias row loses most of
    the signal (AUC 0.95 instead of 1.0 without noise on the default set)."""
    gaps = [v[:, top].mean(axis=1) - v[:, low].mean(axis=1) for v in vs]
    return float(np.linalg.norm(np.tensordot(weights, gaps, axes=1)))


def audit(cfg: dpals.DPALSConfig, fed: Federation, with_canary: Federation,
          items: tuple[np.ndarray, np.ndarray], epsilon: float | None, runs: int,
          delta: float = DELTA, first_seed: int = 0) -> dict[str, Any]:
    """``runs`` runs (half with the canary), the attack's AUC and the epsilon lower bound.

    ``epsilon`` None: no noise (the positive control). Run seeds differ between all runs."""
    n_users = sum(b.n_users for b in with_canary.train)
    spec = None if epsilon is None else UserLevelSpec(
        epsilon=epsilon, delta=delta, n_users=n_users, releases=cfg.sweeps,
        placement="central", sample_rate=cfg.user_sample_rate)
    weights = [1.0] * cfg.sweeps if spec is None else spec.weights()
    half = runs // 2
    s_in = [score(released_vs(cfg, with_canary, first_seed + s, spec), *items, weights)
            for s in range(half)]
    s_out = [score(released_vs(cfg, fed, first_seed + half + s, spec), *items, weights)
             for s in range(half)]
    bound = epsilon_lower_bound(np.array(s_in), np.array(s_out), delta, ALPHA)
    return {"claimed_epsilon": epsilon, "delta": delta, "runs": 2 * half,
            "auc": auc(np.array(s_in), np.array(s_out)), **bound,
            "mean_score_in": float(np.mean(s_in)), "mean_score_out": float(np.mean(s_out))}


def main(argv: list[str] | None = None) -> int:
    ap = parser("dp_audit", __doc__, seeds=1)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    ap.add_argument("--runs", type=int, default=1000,
                    help="runs per claimed epsilon, half of them with the canary")
    ap.add_argument("--control-runs", type=int, default=None,
                    help="runs of the noise-free control (default: --runs)")
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--ratings", type=int, default=6000)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--canary-items", type=int, default=10)
    args = ap.parse_args(argv)
    if args.quick:
        args.epsilons, args.runs, args.control_runs = [4.0], 40, 40
    fed = build_federation(generate_ratings(args.users, args.items, args.ratings, seed=0),
                           args.clients, 0)
    with_canary, top, low = canary_federation(fed, args.canary_items)
    items = (top, low)
    cfg = dpals.DPALSConfig()
    rows = []
    control = audit(cfg, fed, with_canary, items, None, args.control_runs or args.runs)
    print(_line(control), flush=True)
    for eps in args.epsilons:
        rows.append(audit(cfg, fed, with_canary, items, eps, args.runs))
        print(_line(rows[-1]), flush=True)
    setting = {"users": args.users, "items": args.items, "ratings": args.ratings,
               "tenants": args.clients, "canary_items": args.canary_items,
               "placement": "central", "config": cfg.model_dump(), "confidence": 1 - ALPHA}
    write_result(args.out, "dp_audit", argv, args.quick,
                 {"setting": setting, "no_noise_control": control, "audits": rows})
    return 0


def _line(row: dict[str, Any]) -> str:
    eps = "none (control)" if row["claimed_epsilon"] is None else row["claimed_epsilon"]
    return (f"claimed epsilon {eps}: lower bound {row['epsilon_lower_bound']:.3f} "
            f"(at most {row['max_measurable']:.2f} measurable), AUC {row['auc']:.3f}, "
            f"{row['runs']} runs")


if __name__ == "__main__":
    sys.exit(main())
