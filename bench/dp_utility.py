"""User-level DP: test RMSE of DPALS against epsilon (unit: one user, joint DP).

MovieLens 1M (``--data ml-100k`` for the small set), 80/20 split seed 0, 100 tenants,
delta 1e-6, DPALS at its defaults (tuned on a validation carve-out of the training set,
:func:`algorithms.tuning.validation_federation`, never on the test ratings). One
noise-free run, then per target epsilon one run with the noise added once to the sum of
the tenants' bounded uploads (placement ``central``), at each ``--tenant-epsilon`` one with
each tenant noising its own upload (placement ``tenant``, T times the variance), and at
each ``--tenant-unit-epsilons`` one under the tenant unit (the ``--dp gaussian`` wrapper);
all three default to the ``--epsilons``. Run seeds vary the initial V and the noise; the
split stays seed 0.
References (``bench/_dp_references.py``, drawn as horizontal lines): centralised ALS at
its tuned setting, a bias-only model, and the global mean of the training ratings.
``--replot`` redraws the figure from the result file.

    python -m bench dp_utility --epsilons 0.5 1 2 4 8 16 --seeds 3

``--data netflix-synthetic --ratings N``: Netflix's shape (480,189 users, 17,770 items)
drawn by :func:`algorithms.synthetic.generate_tenant_ratings` straight into the 100
tenants with N ratings (default Netflix's 100,480,507; as ``bench/scale.py`` does), split
80/20 per tenant (seed 0); by default only epsilon 1 and the noise-free run.

    python -m bench dp_utility --data netflix-synthetic --seeds 3

``--algorithms dp-fedmavg dp-fedmc-admm``: the user-level gradient methods instead (or
beside ``dpals``), each noise-free and at every ``--epsilons`` with central placement, at
its defaults (chosen on the validation carve-out) and, at each ``--small-epsilons``, with
``GRADIENT_SMALL_EPSILON``.
Without dpals the result goes to ``dp_utility_gradient[_DATA].json``.

    python -m bench dp_utility --algorithms dp-fedmavg dp-fedmc-admm --epsilons 1 8 --seeds 1
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from algorithms import dpals, registry
from algorithms.data import (
    Federation,
    build_federation,
    federation_from_tenants,
    load_movielens,
)
from algorithms.simulate import simulate
from bench._dp_references import (
    CENTRAL_ALS,
    CENTRAL_SWEEPS,
    bias_only,
    centralised_rmse,
    tenant_unit_rmse,
)
from bench._experiment import comparison, parser, run_time, save_figure, write_result
from privacy.randomness import private_federation
from privacy.user_level import UserLevelPrivatizer, plan

EXPERIMENT = ("User-level DP (DPALS, Chien et al. ICML 2021): test RMSE against epsilon, "
              "central and per-tenant noise")
NEEDS_DATA = True
DELTA = 1e-6
#: targets of the issue "User-level differential privacy that keeps the recommendations
#: useful" (not paper figures): (data, epsilon) -> RMSE at most
TARGETS = {("ml-1m", 8.0): 0.91, ("ml-1m", 1.0): 0.98, ("ml-100k", 8.0): 0.99}
#: the issue's target on the Netflix-shaped set: RMSE at epsilon 1 / noise-free RMSE
NETFLIX_RATIO_TARGET = 1.03
#: Netflix's users and items (the synthetic set keeps both at any number of ratings)
NETFLIX_USERS, NETFLIX_ITEMS, NETFLIX_RATINGS = 480_189, 17_770, 100_480_507
#: users and ratings of the --quick Netflix-shaped run (same 17,770 items)
QUICK_NETFLIX = (20_000, 400_000)
#: settings chosen on the validation carve-out for a small epsilon (at epsilon 1): run as
#: an extra row at each epsilon of --small-epsilons
SMALL_EPSILON = {"config": {"rank": 2, "rating_clip": 0.7}, "gram_share": 0.1}
#: the gradient methods' setting for a small epsilon (fewer, less noisy releases; chosen
#: for both on the validation carve-out of ML-1M at epsilon 1 from releases 5 and 10)
GRADIENT_SMALL_EPSILON = {"releases": 5}
GRADIENT_METHODS = ("dp-fedmavg", "dp-fedmc-admm")


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


def _mean_rmse(fed, data: str) -> float:
    """RMSE of predicting the training mean for every test rating."""
    mu = np.concatenate([b.vals for b in fed.train]).mean()
    test = np.concatenate([b.vals for b in fed.test])
    return float(np.sqrt(np.mean((test - mu) ** 2)))


def _size_dict(fed) -> dict[str, int]:
    return {"users": sum(b.n_users for b in fed.train), "items": int(fed.n_items),
            "train_ratings": sum(b.nnz for b in fed.train),
            "test_ratings": sum(b.nnz for b in fed.test)}


def _size(fed) -> str:
    n = _size_dict(fed)
    return (f"{n['users']:,} users, {n['items']:,} items, "
            f"{n['train_ratings'] + n['test_ratings']:,} ratings")


def _netflix_ratio(runs: list[dict[str, Any]]) -> float | None:
    """Mean test RMSE at epsilon 1 (central, defaults) over the noise-free mean."""
    free = [r["mean"] for r in runs if r["placement"] == "none"]
    one = [r["mean"] for r in runs if r["epsilon"] == 1.0 and r["placement"] == "central"
           and r["setting"] == "default"]
    return one[0] / free[0] if free and one else None


def load_federation(data: str, clients: int, ratings: int, quick: bool):
    """The federation of ``data``: MovieLens split at random into ``clients`` blocks, or the
    Netflix-shaped synthetic set drawn tenant by tenant (``ratings`` ratings)."""
    if data != "netflix-synthetic":
        return build_federation(load_movielens(data), clients, 0, 0.2)
    from algorithms.synthetic import generate_tenant_ratings

    users, ratings = QUICK_NETFLIX if quick else (NETFLIX_USERS, ratings)
    tr = generate_tenant_ratings(users, NETFLIX_ITEMS, ratings, clients, seed=0)
    return federation_from_tenants(tr.blocks, tr.user_ids, np.arange(NETFLIX_ITEMS), 0)


def main(argv: list[str] | None = None) -> int:
    ap = parser("dp_utility", __doc__, seeds=3)
    ap.add_argument("--data", default="ml-1m", choices=["ml-100k", "ml-1m", "netflix-synthetic"])
    ap.add_argument("--ratings", type=int, default=NETFLIX_RATINGS,
                    help="ratings of the netflix-synthetic set (480,189 users, 17,770 items; "
                    "default Netflix's 100,480,507: about 4 GB and 3 minutes of CPU a seed)")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--epsilons", type=float, nargs="+", default=None,
                    help="default 0.5 1 2 4 8 16 (netflix-synthetic: 1)")
    ap.add_argument("--tenant-epsilon", type=float, nargs="*", default=None,
                    help="epsilons of the placement-tenant runs (0 or none given: no such "
                    "run; default the --epsilons, netflix-synthetic none)")
    ap.add_argument("--tenant-unit-epsilons", type=float, nargs="*", default=None,
                    help="epsilons of the tenant-unit runs (the --dp gaussian wrapper; "
                    "default the --epsilons, netflix-synthetic none)")
    ap.add_argument("--small-epsilons", type=float, nargs="*", default=None,
                    help="epsilons also run with the small-epsilon setting (default 1, "
                    "netflix-synthetic none)")
    ap.add_argument("--algorithms", nargs="+", default=["dpals"],
                    choices=["dpals", *GRADIENT_METHODS],
                    help="user-level algorithms to run (default dpals; the gradient "
                    "methods run central placement only)")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw <out>/dp_utility[_DATA].png from its JSON")
    args = ap.parse_args(argv)
    if args.replot:
        return _replot(args.out, args.data)
    netflix = args.data == "netflix-synthetic"
    data = args.data if netflix else "ml-100k" if args.quick else args.data
    if args.quick:
        args.epsilons = [1.0] if netflix else [8.0]
    elif args.epsilons is None:
        args.epsilons = [1.0] if netflix else [0.5, 1, 2, 4, 8, 16]
    others = [] if netflix else args.epsilons
    tenant_eps = [e for e in (others if args.tenant_epsilon is None else args.tenant_epsilon)
                  if e > 0]
    unit_eps = others if args.tenant_unit_epsilons is None else args.tenant_unit_epsilons
    small_eps = ([] if netflix else [1.0]) if args.small_epsilons is None else \
        args.small_epsilons
    if args.quick:  # the quick run keeps one tenant-unit point (ML-100k) to exercise it
        small_eps, tenant_eps = [], []
        unit_eps = [] if netflix else [8.0]
    seeds = 1 if args.quick else args.seeds
    fed = load_federation(data, args.clients, args.ratings, args.quick)
    cfg = dpals.DPALSConfig()  # tuned at epsilon 8
    runs: list[dict[str, Any]] = []
    with_dpals = "dpals" in args.algorithms
    points = ([(0.0, "none", False)] + [(e, "central", False) for e in args.epsilons]
              + [(e, "central", True) for e in small_eps]
              + [(e, "tenant", False) for e in tenant_eps]) if with_dpals else []
    if not with_dpals:
        unit_eps = []
    runs += _gradient_runs([a for a in args.algorithms if a != "dpals"], fed, args.epsilons,
                           small_eps, seeds)
    for eps, placement, small in points:
        rmses, report = [], None
        run_cfg = cfg.model_copy(update=SMALL_EPSILON["config"]) if small else cfg
        share = SMALL_EPSILON["gram_share"] if small else None
        for seed in range(seeds):
            rmse, report = run_dpals(run_cfg, fed, epsilon=eps, delta=DELTA,
                                     placement="central" if placement == "none" else placement,
                                     seed=seed, gram_share=share)
            rmses.append(rmse)
        runs.append({"algorithm": "dpals", "epsilon": eps or None, "unit": "user",
                     "placement": placement,
                     "setting": "small-epsilon" if small else "default", "rmse": rmses,
                     "mean": statistics.fmean(rmses),
                     "noise_multiplier": report and report["noise_multiplier"],
                     "epsilon_spent": report and report["epsilon_max"]})
        _progress(eps, placement, "small" if small else "", rmses)
    for eps in unit_eps:
        out = [tenant_unit_rmse(cfg, fed, eps, DELTA, seed) for seed in range(seeds)]
        rmses = [o[0] for o in out]
        runs.append({"algorithm": "dpals", "epsilon": eps, "unit": "tenant",
                     "placement": "tenant",
                     "setting": "default", "rmse": rmses, "mean": statistics.fmean(rmses),
                     "noise_multiplier": out[0][1], "epsilon_spent": eps})
        _progress(eps, "tenant", "unit", rmses)
    refs = _references(fed, data, seeds)
    comparisons = []
    for r in runs:
        target = (TARGETS.get((data, r["epsilon"])) if r["placement"] == "central" else None)
        name = {"dpals": "DPALS", "dp-fedmavg": "DP-FedMAvg",
                "dp-fedmc-admm": "DP-FedMC-ADMM"}[r["algorithm"]]
        what = (f"{name} {data}, no noise" if r["epsilon"] is None else
                f"{name} {data}, {r['unit']} unit, eps {r['epsilon']:g}, delta 1e-6"
                + (f", {r['placement']}" if r["unit"] == "user" else ", --dp gaussian")
                + (", small-epsilon setting" if r["setting"] != "default" else ""))
        note = "'paper' = the issue's target, not a published figure" if target else ""
        comparisons.append(comparison(what, "test RMSE", target, r["rmse"], note))
    ratio = _netflix_ratio(runs) if netflix else None
    if ratio is not None:
        comparisons.append(comparison(
            f"DPALS {data} ({_size(fed)}), test RMSE at eps 1 / noise-free, delta 1e-6, central",
            "RMSE ratio", None if args.quick else NETFLIX_RATIO_TARGET, [ratio],
            "'paper' = the issue's target (within 3% of noise-free), not a published figure"))
    payload = {"data": data, "clients": args.clients, "delta": DELTA,
               "size": _size_dict(fed), "config": cfg.model_dump() if with_dpals else None,
               "global_mean_rmse": refs["global_mean"], "references": refs, "runs": runs,
               "rmse_ratio_eps1": ratio, "comparisons": comparisons}
    stem = "dp_utility" if data == "ml-1m" or args.quick else f"dp_utility_{data}"
    if not with_dpals:
        stem = stem.replace("dp_utility", "dp_utility_gradient", 1)
    if stem == "dp_utility" and with_dpals:
        path = write_result(args.out, stem, argv, args.quick, payload)
    else:  # written aside, then moved, so the ML-1M result beside it survives
        args.out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=args.out) as tmp:
            written = write_result(Path(tmp), "dp_utility", argv, args.quick, payload)
            path = written.replace(args.out / f"{stem}.json")
    _plot(runs, refs, data, _size(fed), args.clients, args.out / f"{stem}.png")
    print(f"wrote {path}")
    return 0


def _gradient_runs(names: list[str], fed, epsilons: list[float], small_eps: list[float],
                   seeds: int) -> list[dict[str, Any]]:
    """Noise-free and central-placement runs of the user-level gradient methods."""
    runs = []
    for name in names:
        base = registry.get(name).config()
        points = ([(0.0, False)] + [(e, False) for e in epsilons]
                  + [(e, True) for e in small_eps])
        for eps, small in points:
            cfg = base.model_copy(update=GRADIENT_SMALL_EPSILON) if small else base
            out = [run_user_level(name, cfg, fed, epsilon=eps, delta=DELTA,
                                  placement="central", seed=s) for s in range(seeds)]
            rmses, report = [o[0] for o in out], out[-1][1]
            runs.append({"algorithm": name, "epsilon": eps or None, "unit": "user",
                         "placement": "central" if eps else "none",
                         "setting": "small-epsilon" if small else "default",
                         "config": cfg.model_dump(), "rmse": rmses,
                         "mean": statistics.fmean(rmses),
                         "noise_multiplier": report and report["noise_multiplier"],
                         "sample_rate": report and report["sample_rate"],
                         "epsilon_spent": report and report["epsilon_max"]})
            _progress(eps, f"{name[:8]}", "small" if small else "", rmses)
    return runs


def _replot(out: Path, data: str) -> int:
    """Redraw the figure of an earlier run from its result file (no training)."""
    stem = "dp_utility" if data == "ml-1m" else f"dp_utility_{data}"
    doc = json.loads((out / f"{stem}.json").read_text())
    n = doc["size"]
    size = (f"{n['users']:,} users, {n['items']:,} items, "
            f"{n['train_ratings'] + n['test_ratings']:,} ratings")
    _plot(doc["runs"], doc["references"], doc["data"], size, doc["clients"],
          out / f"{stem}.png")
    print(f"wrote {out / stem}.png")
    return 0


def _progress(eps: float, placement: str, tag: str, rmses: list[float]) -> None:
    print(f"epsilon {eps or 'inf':>5} {placement:8s} {tag:5s} "
          f"RMSE {statistics.fmean(rmses):.4f}  ({run_time()['cpu_seconds']:.0f} s CPU "
          "so far)", flush=True)


def _references(fed, data: str, seeds: int) -> dict[str, Any]:
    """Test RMSE of the non-private references: centralised ALS (mean over seeds; None
    without a tuned setting), bias-only and the global mean."""
    als = [centralised_rmse(fed, data, s) for s in range(seeds)]
    refs = {"global_mean": _mean_rmse(fed, data), "bias_only": bias_only(fed),
            "centralised_als": None if als[0] is None else
            {**CENTRAL_ALS[data], "sweeps": CENTRAL_SWEEPS, "rmse": als,
             "mean": statistics.fmean(als)}}
    print(f"references: {refs}", flush=True)
    return refs


def _plot(runs: list[dict[str, Any]], refs: dict[str, Any], data: str, size: str,
          clients: int, path) -> None:
    """Test RMSE against epsilon per unit and placement, with the non-private references as
    horizontal lines. The y axis starts just below the best reference and ends a little
    above the global mean; a curve above that (the tenant unit) is drawn at the top edge
    with its values in the legend, so nothing is hidden and noise is not read as a trend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 6))
    dp_runs = [r for r in runs if r.get("algorithm", "dpals") == "dpals"]
    free = [r["mean"] for r in dp_runs if r["placement"] == "none"]
    lines = [("noise-free federated DPALS (same bounds)", free[0] if free else None, "g", "--"),
             ("centralised ALS (tuned, no privacy)",
              refs["centralised_als"] and refs["centralised_als"]["mean"], "tab:blue", "-."),
             ("bias-only (mean + user + item biases)", refs["bias_only"]["rmse"],
              "tab:orange", ":"),
             ("global mean", refs["global_mean"], "k", ":")]
    shown = [v for _, v, _, _ in lines if v is not None]
    bottom = min(shown) - 0.02
    top = refs["global_mean"] + 0.06
    for label, value, colour, style in lines:
        if value is not None:
            ax.axhline(value, ls=style, c=colour, lw=1.2, label=f"{label}: {value:.3f}")

    def curve(rows, fmt, colour, label):
        rows = sorted(rows, key=lambda r: r["epsilon"])
        inside = [(r["epsilon"], r["mean"]) for r in rows if r["mean"] <= top]
        off = [(r["epsilon"], r["mean"]) for r in rows if r["mean"] > top]
        if off:
            label += "\n(triangles: above the axis, value beneath)"
        if inside:
            ax.plot([p[0] for p in inside], [p[1] for p in inside], fmt, c=colour,
                    label=label)
        if off:  # upward triangles on the top edge, each value written under it
            ax.plot([p[0] for p in off], [top] * len(off), "^", c=colour, ms=8,
                    clip_on=False, label=None if inside else label)
            for xi, yi in off:
                ax.annotate(f"{yi:.2f}", (xi, top), xytext=(0, -13),
                            textcoords="offset points", ha="center", fontsize=7, c=colour)

    for name, colour in (("dp-fedmavg", "tab:brown"), ("dp-fedmc-admm", "tab:pink")):
        mine = [r for r in runs if r.get("algorithm") == name and r["epsilon"]
                and r["setting"] == "default"]
        if mine:
            curve(mine, "d--", colour, f"{name}, user unit, central noise")
    user = [r for r in dp_runs if r["unit"] == "user" and r["setting"] == "default"]
    curve([r for r in user if r["placement"] == "central"], "o-", "tab:red",
          "user unit, central noise")
    curve([r for r in user if r["placement"] == "tenant"], "s-", "tab:purple",
          "user unit, per-tenant noise (no secure agg.)")
    curve([r for r in dp_runs if r["unit"] == "tenant"], "x-", "tab:gray",
          "tenant unit (--dp gaussian wrapper)")
    small = [r for r in dp_runs if r["setting"] != "default"]
    if small:
        ax.plot([r["epsilon"] for r in small], [r["mean"] for r in small], "^", c="tab:red",
                mfc="none", label="user unit, central, epsilon-1 setting")
    ax.set_ylim(bottom, top)
    ax.set_xscale("log")
    eps = sorted({r["epsilon"] for r in runs if r["epsilon"]})
    ax.set_xticks(eps, [f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("epsilon (delta 1e-6)")
    ax.set_ylabel("test RMSE (lower is better)")
    seeds = len(runs[0]["rmse"])
    algs = "DPALS" if dp_runs else "DP-FedMAvg and DP-FedMC-ADMM"
    ax.set_title(f"{algs} on {data} ({size}),\n{clients} tenants, delta 1e-6, 80/20 split, "
                 f"test RMSE (mean of {seeds} run seed{'s' if seeds > 1 else ''})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
