"""Felb and Felb-MU against the voting-federated baseline on binarised MovieLens (Felb paper
Table 1, row "Movielens").

Setting: ML-1M, ratings >= 3.5 -> 1 (every other pair 0), 80/20 random split (seeded), 50
tenants, k = 20, T = 10 local steps per round, all tenants every round, no DP (Sec. 4.2,
Apx. D). Felb / Felb-MU run ``--rounds`` rounds (default 20 rather than the paper's 100;
see docs/benchmarks/felb_table1.md); the baseline is local Elbmf (``--baseline-iters``,
default 200 instead of Apx. D's 1000), majority vote (eq. 12), U_i refit. F1 is that of the Boolean
reconstruction against the training matrix, as in Table 1. Seeds vary the split, the
tenant partition and the initialisation.

    nice -n 10 python -m bench felb_table1            # ML-1M, 3 seeds, ~210 s of CPU
    python -m bench felb_table1 --quick               # ML-100k, 5 rounds, 1 seed
    nice -n 10 python -m bench felb_table1 --paper-size   # MovieLens 25M's shape, 1 seed

``--paper-size`` is the paper's scale: MovieLens 25M itself is not available here, so a
synthetic rating set of its shape (162,541 users, 59,047 rated movies, 25,000,095 ratings;
power-law activity and popularity, low-rank preferences, MovieLens' star histogram; see
:func:`algorithms.synthetic.generate_tenant_ratings`) is binarised at 3.5 and dealt to 50
tenants of about 3,250 users. As in Table 1, each method factorises the whole data matrix
(no held-out split) and F1 / RMSD compare the Boolean reconstruction with it, computed
from component bit masks (:func:`algorithms.binary_metrics.boolean_quality`) since the
users x items product has 10^10 entries. The result goes to ``felb_table1_paper.json``
(``--shape``, ``--fraction``, ``--proximity`` and ``--start`` add a suffix: diagnostic
variants). With ``--paper-size`` Felb and Felb-MU start from V_hat^0 uniform on
[0, 1/sqrt(n)] (``start='scaled'`` of :class:`algorithms.felb.FelbConfig`, a deviation
from Algorithm 1's [0, 1], which learns nothing at 59,047 items); ``--start uniform`` runs
the paper's start. The ML-1M run keeps the paper's start unless ``--start scaled``, and
Felb's default server prox (Algorithm 1, line 16 as printed: kappa, lambda_t) unless
``--server-prox eq10`` (kappa/C, lambda_t/C, the exact minimiser of eq. 10; adds ``_eq10``
to the result file), with or without ``--paper-size``. With ``--paper-size`` the result
also has the generator's oracle: the F1 of its own probabilities of a 1, cut at 1/2 and at
other cuts (:func:`oracle_quality`), the ceiling the synthetic set puts on Table 1.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from algorithms import binary_baseline, felb
from algorithms.binary_metrics import binarise, binary_report, boolean_quality, f1_and_rmsd
from algorithms.block import RatingBlock
from algorithms.data import Federation, build_federation, load_movielens
from algorithms.presets import PAPER_RUNS, paper_config
from algorithms.rng import SERVER, derive_rng
from algorithms.simulate import SimulationResult, initialise, run_round, simulate
from algorithms.synthetic import LatentModel, generate_tenant_ratings
from bench import _experiment as E
from bench import _felb_synth as S

EXPERIMENT = "Felb paper Table 1 (Movielens): F1 of Felb, Felb-MU and the voting baseline"
NEEDS_DATA = True
#: Table 1, Movielens row: Elbmf under voting 0.017, Felb-MU 0.193, Felb 0.163
PAPER = {"felb-mu": 0.193, "felb": 0.163, "vote": 0.017}
LABELS = {"felb-mu": "Felb-MU", "felb": "Felb", "vote": "Elbmf + vote (baseline)"}
NOTE = {
    "felb-mu": "paper: MovieLens 25M-size (162,541 users, ~3,250 per tenant), 100 rounds; "
               "here ML-1M, ~121 users per tenant: F1 is much lower",
    "felb": "as Felb-MU: far fewer users per tenant than the paper's MovieLens",
    "vote": "paper's Elbmf-vote column; here 200 instead of 1000 local Elbmf iterations",
}

_PROX = felb.FelbConfig().server_prox  # the default server prox: Algorithm 1, line 16
_PROX_LABEL = ", server prox of eq. 10 (kappa/C, lambda_t/C)"  # the other one


#: shapes of the synthetic sets: MovieLens 25M (Table 2's Movielens row; 59,047 of its
#: 62,423 movie ids have ratings) and, to measure what the generator changes against real
#: data, MovieLens 1M
SHAPES = {"ml-25m": {"n_users": 162_541, "n_items": 59_047, "n_ratings": 25_000_095},
          "ml-1m": {"n_users": 6_040, "n_items": 3_706, "n_ratings": 1_000_209}}


def _row(method, alg, result, fed, seconds, rounds, cfg) -> dict:
    report = binary_report(alg, result, fed)
    return {"method": method, **report.as_dict(), "train_seconds": round(seconds, 1),
            "rounds": rounds, "config": cfg.model_dump()}


def felb_config(method: str, args) -> felb.FelbConfig:
    """Felb / Felb-MU's config: ``fedrec simulate --preset paper``'s
    (:func:`algorithms.presets.paper_config`), the options given replacing its fields."""
    start = getattr(args, "start", None)
    server_prox = getattr(args, "server_prox", None)
    return paper_config(method, rank=args.rank, local_steps=args.local_steps,
                        proximity=args.proximity,
                        **({} if start is None else {"start": start}),
                        **({} if server_prox is None else {"server_prox": server_prox}))


def _run_felb(method: str, fed, args) -> dict:
    alg = felb.ALGORITHMS[method]
    cfg = felb_config(method, args)
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


def paper_data(seed: int, clients: int = 50, fraction: float = 1.0,
               shape: str = "ml-25m") -> tuple[Federation, LatentModel]:
    """Binarised (>= 3.5) synthetic ratings of MovieLens 25M's (or ``shape``'s) shape in
    ``clients`` tenants, and the latent model they were drawn from.

    ``fraction`` < 1 scales users, ratings and tenants together (items stay 59,047), so a
    tenant keeps about 3,250 users: a quicker run of the same per-tenant problem. Every
    block is training data; ``test`` blocks are empty (Table 1 scores the fit itself).
    """
    n_clients = max(1, round(clients * fraction))
    dims = SHAPES[shape]
    ratings = generate_tenant_ratings(round(dims["n_users"] * fraction), dims["n_items"],
                                      round(dims["n_ratings"] * fraction), n_clients,
                                      seed=seed)
    empty = [RatingBlock(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0),
                         b.n_users, b.n_items) for b in ratings.blocks]
    fed = Federation(ratings.blocks, empty, ratings.user_ids,
                     np.arange(ratings.n_items), (1.0, 5.0))
    return binarise(fed, THRESHOLD), ratings.model


def paper_federation(seed: int, clients: int = 50, fraction: float = 1.0,
                     shape: str = "ml-25m") -> Federation:
    """The federation of :func:`paper_data`."""
    return paper_data(seed, clients, fraction, shape)[0]


THRESHOLD = 3.5  #: ratings >= 3.5 are 1s (Sec. 4.2, Apx. C)
#: the oracle's probability cuts: a pair is predicted 1 when P(it is a 1) >= the cut
ORACLE_CUTS = np.round(np.arange(0.08, 0.96, 0.01), 2)
_ORACLE_USERS = 128  # users whose candidate pairs are scored at once


def _oracle_counts(model: LatentModel, tenant: int, block: RatingBlock, cuts: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(TP, predicted) of the rule 'P(1) >= cut' in one tenant, for each cut.

    P(1) = P(rated) P(star >= 4 | rated) <= P(rated), and P(rated) grows with the item's
    popularity, so each user's candidates for the lowest cut are a prefix of the items by
    falling popularity (found by bisection); pairs outside it are below every cut.
    """
    draws = model.draws(tenant)
    star = int(np.ceil(THRESHOLD))

    def prob(users, items, pairs):
        return (model.observed(tenant, users, items, draws, pairs)
                * model.star_at_least(star, tenant, users, items, pairs))

    tp = np.zeros(cuts.size, dtype=np.int64)
    for s in range(0, block.nnz, 1 << 20):
        p = np.sort(prob(block.rows[s:s + (1 << 20)], block.cols[s:s + (1 << 20)], True))
        tp += p.size - np.searchsorted(p, cuts, side="left")
    order = np.argsort(-model.item_weights, kind="stable")
    users = np.arange(block.n_users)
    lo, hi = np.zeros(users.size, np.int64), np.full(users.size, order.size, np.int64)
    while np.any(lo < hi):  # lo -> n_u, the number of items with P(rated) >= cuts[0]
        mid = (lo + hi) // 2
        inside = model.observed(tenant, users, order[np.minimum(mid, order.size - 1)],
                                draws, True) >= cuts[0]
        active = lo < hi
        lo = np.where(active & inside, mid + 1, lo)
        hi = np.where(active & ~inside, mid, hi)
    predicted = np.zeros(cuts.size, dtype=np.int64)
    for s in range(0, users.size, _ORACLE_USERS):
        us, n_u = users[s:s + _ORACLE_USERS], lo[s:s + _ORACLE_USERS]
        width = int(n_u.max())
        if width == 0:
            continue
        p = prob(us, order[:width], False)
        p[np.arange(width)[None, :] >= n_u[:, None]] = 0.0
        p = np.sort(p[p >= cuts[0]])
        predicted += p.size - np.searchsorted(p, cuts, side="left")
    return tp, predicted


def oracle_quality(model: LatentModel, blocks: list[RatingBlock],
                   cuts: np.ndarray = ORACLE_CUTS) -> dict:
    """F1 and RMSD against the data of the generator's own knowledge: predict (t, j) = 1
    when P(rated and star >= 4) under ``model`` is at least a cut, scored by
    :func:`algorithms.binary_metrics.f1_and_rmsd` like every method of the bench.

    At the cut 1/2 (``f1``, ``rmsd``) it is the reconstruction of least expected squared
    error (a 1 costs 1 - p, a 0 costs p): what a squared-loss fit as Felb's aims at, with
    no limit on the rank and no Boolean structure. ``f1_accepted`` is the most F1 of a cut
    whose reconstruction has no more wrong cells than predicting no 1 at all (FP <= TP),
    as every fit squared loss prefers to the empty one; for each number of predicted cells
    the cut holds the most expected TP, so no reconstruction that does not fit the noise
    of the data does better in expectation. ``f1_best`` is the most F1 of any cut.
    """
    tp = np.zeros(cuts.size, dtype=np.int64)
    predicted = np.zeros(cuts.size, dtype=np.int64)
    ones = cells = 0
    for t, block in enumerate(blocks):
        a, b = _oracle_counts(model, t, block, cuts)
        tp, predicted = tp + a, predicted + b
        ones, cells = ones + block.nnz, cells + block.n_users * block.n_items
    scores = [f1_and_rmsd(int(a), int(b - a), ones - int(a), cells)
              for a, b in zip(tp, predicted, strict=True)]
    f1 = np.array([f for f, _ in scores])
    half = int(np.flatnonzero(np.isclose(cuts, 0.5))[0])
    best = int(np.argmax(f1))
    # no more wrong cells than the empty reconstruction (FP <= TP): what squared loss accepts
    accepted = int(np.argmax(np.where(predicted <= 2 * tp, f1, -1.0)))
    return {"f1": scores[half][0], "rmsd": scores[half][1],
            "f1_accepted": scores[accepted][0], "rmsd_accepted": scores[accepted][1],
            "cut_accepted": float(cuts[accepted]),
            "f1_best": scores[best][0], "rmsd_best": scores[best][1],
            "cut_best": float(cuts[best])}


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, round(time.perf_counter() - wall, 1), round(time.process_time() - cpu, 1)


_DATA: dict = {}  # seed -> (federation, latent model), read by forked workers


def _fit_and_score(m: str, seed: int, rounds: int, baseline_iters: int,
                   proximity: float | None, start: str | None = None,
                   server_prox: str | None = None, config: dict | None = None) -> dict:
    """Train method ``m`` on seed ``seed``'s set and score its Boolean reconstruction;
    ``m = 'oracle'`` scores the generator's own probabilities (:func:`oracle_quality`)."""
    fed, model = _DATA[seed]
    if m == "oracle":
        row, wall, cpu = _timed(lambda: oracle_quality(model, fed.train))
        print(f"seed {seed} oracle   F1 {row['f1']:.4f} (cut 1/2), {row['f1_accepted']:.4f} "
              f"(FP <= TP, cut {row['cut_accepted']}), {row['f1_best']:.4f} (best, cut "
              f"{row['cut_best']}); {cpu} s CPU", flush=True)
        return {**row, "eval_cpu_seconds": cpu, "eval_wall_seconds": wall}
    (alg, res, _), wall, cpu = _timed(lambda: S.fit(m, fed, 20, rounds, seed, baseline_iters,
                                                    proximity=proximity, start=start,
                                                    server_prox=server_prox,
                                                    **(config or {})))
    module = felb if m in felb.ALGORITHMS else binary_baseline
    pairs = [module.boolean_factors(res.global_msg, s) for s in res.local_states]
    (f1, rmsd), _, eval_cpu = _timed(lambda: boolean_quality(pairs, fed.train))
    print(f"seed {seed} {m:8s} F1 {f1:.4f} RMSD {rmsd:.5f} train {cpu} s CPU "
          f"({wall} s wall), F1 {eval_cpu} s", flush=True)
    return {"f1": f1, "rmsd": rmsd, "train_cpu_seconds": cpu, "train_wall_seconds": wall,
            "eval_cpu_seconds": eval_cpu}


def run_paper(seeds: list[int], rounds: int, baseline_iters: int, clients: int,
              fraction: float, shape: str = "ml-25m", proximity: float | None = None,
              jobs: int = 1, start: str | None = None, server_prox: str | None = None,
              oracle: bool = True, methods: list[str] | None = None,
              config: dict | None = None) -> list[dict]:
    """Per seed: F1 and RMSD of Felb, Felb-MU (and the voting baseline unless
    ``baseline_iters`` is 0, the generator's oracle if ``oracle``) on one synthetic
    MovieLens 25M-shape set; CPU and wall seconds of each part. ``methods`` keeps some of
    them, ``config`` overrides more Felb fields (``proximity_scale``). ``jobs`` > 1 runs the
    (seed, method) pairs in that many forked processes (they share the data sets' pages;
    each figure is that of a sequential run)."""
    runs = []
    for seed in seeds:
        (fed, model), wall, cpu = _timed(lambda s=seed: paper_data(s, clients, fraction, shape))
        ones = sum(b.nnz for b in fed.train)
        users = sum(b.n_users for b in fed.train)
        print(f"seed {seed} data: {fed.n_clients} tenants, {users} users, {fed.n_items} "
              f"items, {ones} ones; {cpu} s CPU", flush=True)
        _DATA[seed] = fed, model
        runs.append({"data": {"ones": ones, "users": users, "tenants": fed.n_clients,
                              "cpu_seconds": cpu, "wall_seconds": wall}})
    methods = [m for m in ["felb", "felb-mu"] + (["vote"] if baseline_iters else [])
               + (["oracle"] if oracle else []) if methods is None or m in methods]
    tasks = [(m, seed, rounds, baseline_iters, proximity, start, server_prox, config)
             for seed in seeds for m in methods]
    try:
        if jobs > 1:
            import multiprocessing

            with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
                results = pool.starmap(_fit_and_score, tasks, chunksize=1)
        else:
            results = [_fit_and_score(*t) for t in tasks]
    finally:
        _DATA.clear()
    for (m, seed, *_), row in zip(tasks, results, strict=True):
        runs[seeds.index(seed)][m] = row
    return runs


def seed_args(seed: int, rounds: int, baseline_iters: int, start: str | None = None,
              server_prox: str | None = None) -> argparse.Namespace:
    """The options of one MovieLens seed: the paper preset's rank, T and gamma (Appendix
    D: 20, 10, 1)."""
    base = paper_config("felb")
    return argparse.Namespace(rank=base.rank, local_steps=base.local_steps,
                              proximity=base.proximity, rounds=rounds, seed=seed,
                              baseline_iters=baseline_iters, start=start,
                              server_prox=server_prox)


def run_seed(data: str, seed: int, rounds: int, baseline_iters: int, clients: int,
             start: str | None = None, server_prox: str | None = None) -> dict:
    """F1, RMSD, P@10, R@10 and seconds of each method on one seeded split."""
    fed = binarise(build_federation(load_movielens(data), clients, seed), 3.5)
    args = seed_args(seed, rounds, baseline_iters, start, server_prox)
    rows = {m: _run_felb(m, fed, args) for m in ("felb", "felb-mu")}
    rows["vote"] = _run_baselines(["vote"], fed, args)[0]
    for m, r in rows.items():
        print(f"seed {seed} {m:8s} F1 {r['f1']:.4f} RMSD {r['rmsd']:.5f} "
              f"train {r['train_seconds']} s", flush=True)
    return rows


def plot(runs: list[dict], path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    x = np.arange(len(PAPER))
    for ax, metric in zip(axes, ("f1", "rmsd"), strict=True):
        vals = [[r[m][metric] for r in runs] for m in PAPER]
        ax.bar(x - 0.2 if metric == "f1" else x, [np.mean(v) for v in vals], 0.4,
               yerr=[np.std(v) for v in vals], label="fedrec (ML-1M)", capsize=3)
        if metric == "f1":
            ax.bar(x + 0.2, list(PAPER.values()), 0.4, label="paper (Table 1)")
            ax.legend(fontsize=8)
        ax.set_xticks(x, [LABELS[m] for m in PAPER], fontsize=8)
        ax.set_title(metric.upper())
    fig.suptitle("Felb Table 1, MovieLens: F1 / RMSD of the Boolean reconstruction")
    E.save_figure(fig, path)


def _comparisons(what: str, methods: list[str], runs: list[dict], paper: dict | None,
                 notes: dict, rmsd_note: str) -> list[dict]:
    """F1 rows (beside ``paper``'s figures, if any) then RMSD rows of ``methods``."""
    rows = [E.comparison(f"{what}, {LABELS[m]}", "F1", None if paper is None else paper[m],
                         [r[m]["f1"] for r in runs], notes[m], lower_is_better=False)
            for m in methods]
    return rows + [E.comparison(f"{what}, {LABELS[m]}", "RMSD", None,
                                [r[m]["rmsd"] for r in runs], rmsd_note, True)
                   for m in methods]


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    ap = E.parser("felb_table1", __doc__)
    ap.add_argument("--data", choices=["ml-100k", "ml-1m"], default=None,
                    help="default ml-1m (ml-100k with --quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"Felb rounds (default {PAPER_RUNS['felb'].rounds}, the paper preset's)")
    ap.add_argument("--baseline-iters", type=int, default=None,
                    help="local Elbmf iterations of the baseline (default 200; 50 with "
                         "--paper-size, where 0 leaves the baseline out)")
    ap.add_argument("--clients", type=int, default=PAPER_RUNS["felb"].clients)
    ap.add_argument("--paper-size", action="store_true",
                    help="synthetic MovieLens 25M-shape data instead of --data (1 seed "
                         "unless --seeds)")
    ap.add_argument("--fraction", type=float, default=None,
                    help="with --paper-size: this fraction of its users, ratings and "
                         "tenants (default 1; 0.04 with --quick)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="ml-25m",
                    help="with --paper-size: the shape of the synthetic set (ml-1m measures "
                         "the generator against the real ML-1M run; result file "
                         "felb_table1_paper_ml-1m.json)")
    ap.add_argument("--proximity", type=float, default=None,
                    help="with --paper-size: Felb's proximity weight gamma (default "
                         f"{felb.FelbConfig().proximity:g}; the paper gives no value)")
    ap.add_argument("--start", choices=["scaled", "uniform"], default=None,
                    help="Felb's start V_hat^0: 'uniform' on [0, 1] (the paper's; default "
                         "on ML-1M) or 'scaled' on [0, 1/sqrt(n)] (default with "
                         "--paper-size); another than the default adds _<start> to the "
                         "result file")
    ap.add_argument("--server-prox", choices=["eq10", "alg1"], default=None,
                    help="Felb's server prox: 'alg1' (kappa, lambda_t, Algorithm 1 line 16 "
                         "as printed; the default) or 'eq10' (kappa/C, lambda_t/C, eq. 10's "
                         "exact minimiser); 'eq10' adds _eq10 to the result file")
    ap.add_argument("--jobs", type=int, default=1,
                    help="with --paper-size: run the (seed, method) pairs in this many "
                         "processes")
    ap.add_argument("--proximity-scale", choices=["absolute", "curvature"], default=None,
                    help="with --paper-size: Felb's proximity_scale (gamma as given, or "
                         "relative to ||U^T U||); given, it adds _<scale> to the result file")
    ap.add_argument("--methods", default=None,
                    help="with --paper-size: a comma list of felb, felb-mu, vote, oracle "
                         "(default all); given, it adds _<methods> to the result file")
    ap.add_argument("--no-oracle", action="store_true",
                    help="with --paper-size: leave out the oracle rows (the F1 of the "
                         "generator's own probabilities)")
    ap.set_defaults(seeds=None)
    args = ap.parse_args(argv)
    if args.paper_size:
        return paper_main(args, argv)
    seeds = args.seeds or 3
    data = args.data or ("ml-100k" if args.quick else "ml-1m")
    rounds = args.rounds or (5 if args.quick else PAPER_RUNS["felb"].rounds)
    iters = args.baseline_iters or (30 if args.quick else 200)
    start = args.start or paper_config("felb").start
    prox = args.server_prox or paper_config("felb").server_prox
    runs = [run_seed(data, s, rounds, iters, args.clients, start, prox) for s in range(seeds)]
    suffix = ("" if start == "uniform" else f"_{start}") + ("" if prox == _PROX else f"_{prox}")
    what = (data + ("" if start == "uniform" else f", {start} start")
            + ("" if prox == _PROX else _PROX_LABEL))
    comparisons = _comparisons(what, list(PAPER), runs, PAPER, NOTE,
                               "Table 3 gives RMSD on MovieLens 25M only")
    timing = {"wall_seconds": round(time.perf_counter() - t0, 1),
              "cpu_seconds": round(time.process_time(), 1)}
    E.write_result(args.out, "felb_table1", argv, args.quick, {**timing,
        "settings": {"data": data, "clients": args.clients, "rank": 20, "local_steps": 10,
                     "rounds": rounds, "baseline_iters": iters, "threshold": 3.5,
                     "start": start, "server_prox": prox},
        "comparisons": comparisons, "runs": runs}, stem="felb_table1" + suffix)
    plot(runs, args.out / f"felb_table1{suffix}.png")
    return 0


PAPER_NOTE = {
    "felb-mu": "synthetic MovieLens 25M shape (162,541 users, 59,047 items, 25M ratings, "
               "50 tenants of ~3,250 users); paper: MovieLens 25M, 100 rounds",
    "felb": "as Felb-MU",
    "vote": "paper's Elbmf-vote column; here fewer local Elbmf iterations (see command)",
}

SHAPE_NOTE = ("the generator at ML-1M's shape (50 tenants of ~121 users), to set beside the "
              "real ML-1M rows")


def _oracle_rows(what: str, rows: list[dict]) -> list[dict]:
    """F1 rows of the generator's oracle (:func:`oracle_quality`): the ceiling of a
    squared-loss fit, of any fit as good as the empty one, and of any cut."""
    def row(label, key, cut_key, note):
        cuts = sorted({r[cut_key] for r in rows}) if cut_key else []
        return E.comparison(f"{what}, oracle: {label}", "F1", None, [r[key] for r in rows],
                            note + (f" (cut {', '.join(f'{c:g}' for c in cuts)})" if cuts
                                    else ""), lower_is_better=False)
    return [row("P(1) >= 1/2", "f1", None,
                "the generating probabilities rounded at 1/2: least expected squared error, "
                "any rank; Felb's loss aims here"),
            row("P(1) >= cut, FP <= TP", "f1_accepted", "cut_accepted",
                "most F1 of a cut whose reconstruction errs no more than predicting no 1"),
            row("P(1) >= best cut", "f1_best", "cut_best",
                "most F1 of any cut: needs more wrong cells than the empty reconstruction")]


def paper_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The ``--paper-size`` run: one result file, ``felb_table1_paper.json``."""
    seeds = args.seeds or 1
    fraction = args.fraction or (0.04 if args.quick else 1.0)
    rounds = args.rounds or (2 if args.quick else 20)
    iters = 5 if args.quick and args.baseline_iters is None else (
        50 if args.baseline_iters is None else args.baseline_iters)
    start = args.start or "scaled"
    prox = args.server_prox or _PROX
    runs = run_paper(list(range(seeds)), rounds, iters, args.clients, fraction, args.shape,
                     args.proximity, args.jobs, start, prox, not args.no_oracle,
                     args.methods and args.methods.split(","),
                     {} if args.proximity_scale is None else
                     {"proximity_scale": args.proximity_scale})
    methods = [m for m in PAPER if m in runs[0]]
    dims = SHAPES[args.shape]
    variant = (("" if args.shape == "ml-25m" else f"_{args.shape}")
               + ("" if fraction == 1 else f"_x{fraction:g}")
               + ("" if args.proximity is None else f"_gamma{args.proximity:g}")
               + ("" if args.proximity_scale is None else f"_{args.proximity_scale}")
               + ("" if args.methods is None else "_" + args.methods.replace(",", "-"))
               + ("" if start == "scaled" else f"_{start}")
               + ("" if prox == _PROX else f"_{prox}"))
    what = (f"synthetic {args.shape.upper()} shape" + (f" x {fraction:g}" if fraction != 1
                                                       else "")
            + ("" if args.proximity is None else f", gamma {args.proximity:g}")
            + ("" if args.proximity_scale is None else f" ({args.proximity_scale})")
            + ("" if start == "scaled" else f", {start} start")
            + ("" if prox == _PROX else _PROX_LABEL))
    paper_shape = args.shape == "ml-25m" and fraction == 1  # else a diagnostic: no figure
    note = {m: (PAPER_NOTE[m] if paper_shape else SHAPE_NOTE if args.shape == "ml-1m"
                else f"diagnostic: {fraction:g} of the users, ratings and tenants")
            + ("" if args.proximity is None else f"; gamma {args.proximity:g} instead of "
               f"{felb.FelbConfig().proximity:g}")
            + ("" if start == "scaled" else f"; start {start}")
            + ("" if prox == _PROX else "; server prox kappa/C, lambda_t/C (eq. 10)")
            for m in methods}
    comparisons = _comparisons(what, methods, runs, PAPER if paper_shape else None, note,
                               "Table 3's MovieLens RMSD is on another scale")
    if "oracle" in runs[0]:
        comparisons += _oracle_rows(what, [r["oracle"] for r in runs])
    E.write_result(args.out, "felb_table1", argv, args.quick, {
        "settings": {"data": f"synthetic {args.shape} shape", "fraction": fraction,
                     **{k: round(v * fraction) for k, v in dims.items() if k != "n_items"},
                     "n_items": dims["n_items"], "clients": args.clients, "rank": 20,
                     "local_steps": 10, "rounds": rounds, "baseline_iters": iters,
                     "proximity": (felb.FelbConfig().proximity if args.proximity is None
                                   else args.proximity), "threshold": 3.5,
                     "start": start, "server_prox": prox,
                     "proximity_scale": args.proximity_scale or "the method's default"},
        "comparisons": comparisons, "runs": runs},
        stem="felb_table1_paper" + variant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
