"""Top-k ranking: popularity, DP popularity, centralised EASE and iALS, federated ials and
dp-ials (issue 30).

The project's protocol (:mod:`algorithms.ranking`): 80/20 split (seed 0), 100 tenants as
``fedrec simulate`` builds them, k = 10, a held-out rating >= 62.5% of the scale relevant,
training items excluded. Rows: the exact popularity list (Cremonesi, Koren, Turrin,
*Performance of Recommender Algorithms on Top-N Recommendation Tasks*, RecSys 2010), the DP
popularity list at each epsilon, the ceilings (centralised EASE, Steck, *Embarrassingly
Shallow Autoencoders for Sparse Data*, WWW 2019, and a centralised iALS), the federated
``ials`` and the user-level ``dp-ials`` at epsilon 1 / 4 / 8, central placement and tenant
placement with secure aggregation (delta 1e-6). Columns: precision / recall / NDCG@10,
catalogue coverage, the share of top-10 slots given to items with fewer than 5 training
ratings, and the run time. Data: MovieLens 100k and 1M and two skewed synthetic sets
(:func:`algorithms.synthetic.generate_skewed_ratings` at a smaller catalogue): ``skewed``,
whose users pick items by popularity alone (the popularity list is the best list there by
construction: the control), and ``skewed-taste``, the same shape with each user's picks
following the user's taste as well (``taste`` :data:`TASTE`).

``--validate`` scores a grid on a validation carve-out of the training data (20% of each
tenant's training ratings; the test split is never read) instead: how the defaults of
``ials`` and ``dp-ials`` were chosen. ``--support`` measures lists built from noisy
counts (DP popularity at several k, dp-ials) with and without a support bar on their
released counts (:func:`count_support`; ``--carve``: on that carve-out): how DP
popularity's default k was chosen.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

import numpy as np

from algorithms import RatingBlock, registry
from algorithms import popularity as P
from algorithms.data import Federation, build_federation, load_movielens, split_block
from algorithms.ranking import (
    RankingReport,
    RankingSums,
    relevance_threshold,
    tenant_ranking,
    top_k_rows,
)
from algorithms.simulate import simulate
from bench import _experiment as E

EXPERIMENT = ("top-k ranking on MovieLens and a skewed set: popularity, DP popularity, "
              "EASE / iALS ceilings, ials and dp-ials (issue 30)")
NEEDS_DATA = True
TENANTS, SEED, DELTA, K, RARE = 100, 0, 1e-6, 10, 5
EPSILONS = (1.0, 4.0, 8.0)
#: EASE's lambda per data set, chosen on the validation carve-out (``--validate`` with
#: algorithm ``ease``, see BENCHMARKS.md)
EASE_LAMBDA = {"ml-100k": 300.0, "ml-1m": 1000.0, "skewed": 3000.0, "skewed-taste": 300.0}
#: gamma of the ``skewed-taste`` set: a user picks head item j with weight
#: ``popularity_j exp(gamma x_u . y_j / sqrt(3))`` (:func:`algorithms.synthetic.
#: generate_skewed_ratings`'s ``taste``)
TASTE = 2.0
#: the synthetic sets: data set name -> the generator's ``taste``
SYNTHETIC = {"skewed": 0.0, "skewed-taste": TASTE}
#: share of each tenant's training ratings a dp-ials row holds out to choose its prior's
#: weight (the service's default carve-out, :data:`app.training.selection.DEFAULT_FRACTION`)
DP_CARVE = 0.1
#: label of the dp-ials rows whose prior weight is chosen by the charged DP selection
#: (:func:`dp_ials_selected`; the plain dp-ials rows keep the fixed default)
SELECTED = "dp-ials, DP prior choice"
#: rank of the centralised iALS ceiling (no upload to hold in memory)
CEILING_RANK = 64


def skewed(taste: float = 0.0) -> Any:
    """The skewed synthetic set at a catalogue the 100 tenants' uploads fit in memory
    (``taste`` > 0: users' picks follow their taste too)."""
    from bench.skewed_ratings import generate_skewed_ratings

    return generate_skewed_ratings(n_users=6000, n_items=2000, n_ratings=40_000, seed=0,
                                   taste=taste)


def load(name: str) -> Federation:
    """The data set ``name`` split and partitioned as ``fedrec simulate`` does."""
    ratings = skewed(SYNTHETIC[name]) if name in SYNTHETIC else load_movielens(name)
    return build_federation(ratings, TENANTS, SEED, 0.2)


def pooled(blocks: list[RatingBlock]) -> RatingBlock:
    """The tenants' blocks as one block (users stacked in tenant order)."""
    off = np.cumsum([0] + [b.n_users for b in blocks])
    return RatingBlock(np.concatenate([b.rows + o for b, o in zip(blocks, off, strict=False)]),
                       np.concatenate([b.cols for b in blocks]),
                       np.concatenate([b.vals for b in blocks]), int(off[-1]),
                       blocks[0].n_items, blocks[0].scale)


def validation(fed: Federation, fraction: float = 0.2) -> Federation:
    """A carve-out of the training data: ``fraction`` of each tenant's training ratings
    held out (the test split is not touched)."""
    rng = np.random.default_rng(12345)
    parts = [split_block(b, fraction, rng) for b in fed.train]
    return Federation([p[0] for p in parts], [p[1] for p in parts], fed.user_ids,
                      fed.item_ids, fed.scale)


def rare_share(a: np.ndarray, b: np.ndarray, train: RatingBlock, test: RatingBlock,
               counts: np.ndarray, threshold: float) -> tuple[int, int, int]:
    """(top-k slots given to items with fewer than ``RARE`` training ratings, all filled
    slots, all k slots) over the scored users (those with a relevant held-out item)."""
    users = np.unique(test.rows[test.vals >= threshold])
    seen = train.csr
    rare = slots = total = 0
    for lo in range(0, users.size, 1024):
        u = users[lo:lo + 1024]
        scores = np.asarray(a[u] @ b, dtype=float)
        s = seen[u].tocoo()
        scores[s.row, s.col] = -np.inf
        top = top_k_rows(scores, K)
        # a slot is filled only by an item with a finite score: a list shorter than k
        # (items the released counts do not support score -inf) has no item in the rest
        filled = np.isfinite(np.take_along_axis(scores, top, axis=1))
        rare += int((filled & (counts[top] < RARE)).sum())
        slots += int(filled.sum())
        total += int(u.size) * K
    return rare, slots, total


def score(pairs, fed: Federation) -> dict[str, Any]:
    """Metrics of per-tenant factor pairs ``[(A_i, B)]`` on ``fed``'s held-out ratings."""
    cut = relevance_threshold(fed.scale)
    counts = sum(np.bincount(t.cols, minlength=fed.n_items) for t in fed.train)
    total, rare, slots, every = RankingSums(fed.n_items), 0, 0, 0
    for (a, b), tr, te in zip(pairs, fed.train, fed.test, strict=True):
        total = total.add(tenant_ranking(a, b, tr, te, cut, K))
        r, s, n = rare_share(a, b, tr, te, counts, cut)
        rare, slots, every = rare + r, slots + s, every + n
    rep = RankingReport.from_sums(total, K, None).as_dict()
    return {**rep, "rare_slot_share": rare / max(slots, 1),
            "filled_slot_share": slots / max(every, 1)}


def run(name: str, fed: Federation, cfg=None, epsilon: float | None = None,
        placement: str = "central") -> tuple[Any, float]:
    """A run of registered algorithm ``name`` (user-level DP at ``epsilon``, placement
    ``central`` or ``tenant+secagg``); returns its simulation result and wall seconds."""
    alg = registry.get(name)
    cfg = cfg or alg.config()
    priv = None if epsilon is None else privatizer(registry.user_bounds(name, cfg),
                                                   cfg.sweeps, fed, epsilon, placement)
    t0 = time.perf_counter()
    res = simulate(alg, cfg, fed, rounds=cfg.sweeps + 1, per_round=fed.n_clients, seed=SEED,
                   privatizer=priv, aggregator=None if priv is None else priv.aggregate,
                   evaluate_every=0)
    return res, time.perf_counter() - t0


def federated(name: str, fed: Federation, cfg=None, epsilon: float | None = None,
              placement: str = "central") -> tuple[list, float]:
    """:func:`run`'s factor pairs and wall seconds."""
    res, wall = run(name, fed, cfg, epsilon, placement)
    alg = registry.get(name)
    return [alg.factors(res.global_msg, s) for s in res.local_states], wall


def ials_selected(fed: Federation, cfg) -> tuple[list, float, float]:
    """Non-private ``ials`` as a job with a validation carve-out runs it: fitted on the
    training ratings minus the carve-out (:func:`validation`), its popularity prior's beta
    chosen there (:func:`algorithms.ials.choose_prior_weight`), then fitted on all the
    training ratings and served with that beta. Returns the factor pairs, the wall seconds
    of both fits and the beta."""
    from algorithms.ials import choose_prior_weight

    alg = registry.get("ials")
    val = validation(fed)
    res, wall_val = run("ials", val, cfg)
    beta, _ = choose_prior_weight(res.global_msg, res.local_states, val.train, val.test,
                                  [val.scale] * val.n_clients)
    res, wall = run("ials", fed, cfg)
    glob = res.global_msg.replace(prior_weight=beta)
    return [alg.factors(glob, s) for s in res.local_states], wall_val + wall, beta


def dp_ials_selected(fed: Federation, cfg, epsilon: float, placement: str
                     ) -> tuple[list, float, float]:
    """``dp-ials`` as a job with a validation carve-out runs it: fitted under user-level
    DP on the training ratings minus the carve-out (:data:`DP_CARVE` of each tenant's),
    its popularity prior's beta chosen by the charged DP selection (:func:`privacy.
    selection.select` of :func:`algorithms.ials.prior_scores`, the share
    ``selection_share`` of the same budget), then each tenant re-solves its users against
    the released model on all its training ratings (local, nothing released). Returns
    the factor pairs, the wall seconds and the beta."""
    from algorithms.ials import DP_PRIOR_GRID, prior_scores
    from privacy.accountant import spend
    from privacy.selection import choose_prior

    alg = registry.get("dp-ials")
    val = validation(fed, DP_CARVE)
    priv = privatizer(registry.user_bounds("dp-ials", cfg), cfg.sweeps, val, epsilon,
                      placement, cfg.selection_share)
    t0 = time.perf_counter()
    res = simulate(alg, cfg, val, rounds=cfg.sweeps + 1, per_round=val.n_clients, seed=SEED,
                   privatizer=priv, aggregator=priv.aggregate, evaluate_every=0)
    parts = list(zip(res.local_states, val.train, val.test, [val.scale] * val.n_clients,
                     strict=True))
    glob, record = choose_prior(priv.spec, priv.ledger, res.global_msg, parts,
                                range(val.n_clients), cfg.sweeps + 2, SEED)
    beta = glob.prior_weight
    states = [alg.client_step(glob, st, b, cfg, None)[0]
              for st, b in zip(res.local_states, fed.train, strict=True)]
    wall = time.perf_counter() - t0
    worst = max(spend(priv.ledger.history(t), DELTA).epsilon for t in priv.ledger.tenants())
    # the lab's view, what no job releases: the choice on the exact sums
    exact = np.sum([prior_scores(res.global_msg, *p, DP_PRIOR_GRID) for p in parts], axis=0)
    print(f"  selection: beta {beta:g} (non-private choice "
          f"{DP_PRIOR_GRID[int(np.argmax(exact))]:g}), noise std {record['noise_std']:.3g}, "
          f"noisy sums {np.round(record['noisy_ndcg_sums'], 1).tolist()}, exact "
          f"{np.round(exact, 1).tolist()}, epsilon spent {worst:.4f}", flush=True)
    return [alg.factors(glob, st) for st in states], wall, beta


def privatizer(bounds, releases: int, fed: Federation, epsilon: float, placement: str,
               selection_share: float = 0.0):
    """The user-level privatizer of a run (the one ``fedrec simulate --privacy user``
    builds); ``selection_share`` > 0 plans the DP selection release too."""
    from privacy.distributed import SecureAggregationPrivatizer
    from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

    secure = placement == "tenant+secagg"
    kwargs = {} if bounds.release_growth is None else {"release_growth": bounds.release_growth}
    spec = UserLevelSpec(epsilon=epsilon, delta=DELTA, n_users=sum(b.n_users for b in fed.train),
                         releases=releases, placement="tenant" if secure else "central",
                         secure_aggregation=secure, selection_share=selection_share,
                         **kwargs)
    cls = SecureAggregationPrivatizer if secure else UserLevelPrivatizer
    return cls(spec, bounds, fed.n_clients, SEED)


def popularity(fed: Federation, epsilon: float | None) -> tuple[list, float]:
    """The exact popularity list, or the DP one (central) at ``epsilon``."""
    cfg = P.PopularityConfig(max_items_per_user=None if epsilon is None
                             else P.dp_items_per_user(epsilon))
    t0 = time.perf_counter()
    if epsilon is None:
        res = P.fit(fed, cfg)
    else:
        priv = privatizer(P.user_bounds(cfg), 1, fed, epsilon, "central")
        res = P.fit(fed, cfg, privatizer=priv, aggregator=priv.aggregate)
    wall = time.perf_counter() - t0
    return [P.ALGORITHM.factors(res.global_msg, s) for s in res.local_states], wall


def split_rows(x: np.ndarray, fed: Federation) -> list[np.ndarray]:
    """Rows of a pooled user matrix back into the tenants' blocks."""
    off = np.cumsum([0] + [b.n_users for b in fed.train])
    return [x[lo:hi] for lo, hi in zip(off[:-1], off[1:], strict=True)]


def ease(fed: Federation, lam: float) -> tuple[list, float]:
    """Centralised EASE on the binarised pooled training ratings:
    ``B = I - P diag(1 / diag P)``, ``P = (X^T X + lam I)^-1``, scores ``X B``."""
    t0 = time.perf_counter()
    x = pooled(fed.train).with_values(np.ones(pooled(fed.train).nnz)).csr.toarray()
    p = np.linalg.inv(x.T @ x + lam * np.eye(x.shape[1]))
    b = -p / np.diag(p)
    np.fill_diagonal(b, 0.0)
    wall = time.perf_counter() - t0
    return [(xi, b) for xi in split_rows(x, fed)], wall


def central_ials(fed: Federation, rank: int) -> tuple[list, float]:
    """Centralised iALS with ``ials``'s defaults at ``rank``: the engine on one tenant
    holding the pooled ratings (the same numbers as
    :func:`algorithms.centralised.fit_ials`, tested, at numba's speed)."""
    one = Federation([pooled(fed.train)], [pooled(fed.test)],
                     [np.arange(sum(b.n_users for b in fed.train))], fed.item_ids, fed.scale)
    pairs, wall = federated("ials", one, registry.get("ials").config(rank=rank))
    return [(xi, pairs[0][1]) for xi in split_rows(pairs[0][0], fed)], wall


def rows_of(data: str, quick: bool, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Every row of the table on data set ``data`` (``only``: just the rows with these
    labels)."""
    fed = load(data)
    eps = (8.0,) if quick else EPSILONS
    ials_cfg = registry.get("ials").config(**({"rank": 8, "sweeps": 2} if quick else {}))
    dp_cfg = registry.get("dp-ials").config(**({"rank": 4, "sweeps": 2} if quick else {}))
    runs: list[tuple[str, Any]] = [("popularity", lambda: popularity(fed, None))]
    runs += [(f"DP popularity, epsilon {e:g}", lambda e=e: popularity(fed, e)) for e in eps]
    runs += [(f"centralised EASE (lambda {EASE_LAMBDA[data]:g})",
              lambda: ease(fed, EASE_LAMBDA[data]))]
    if not quick:
        runs += [(f"centralised iALS (rank {CEILING_RANK})",
                  lambda: central_ials(fed, CEILING_RANK))]
    runs += [("ials", lambda: ials_selected(fed, ials_cfg))]
    places = ("central",) if quick else ("central", "tenant+secagg")
    runs += [(f"dp-ials, epsilon {e:g}, {p}", lambda e=e, p=p: federated(
        "dp-ials", fed, dp_cfg, e, p)) for e in eps for p in places]
    runs += [(f"{SELECTED}, epsilon {e:g}, {p}", lambda e=e, p=p: dp_ials_selected(
        fed, dp_cfg, e, p)) for e in eps for p in places]
    runs = [(label, fit) for label, fit in runs if not only or label in only]
    out = []
    for label, fit in runs:
        pairs, wall, *chosen = fit()
        row = {"data": data, "row": label, **score(pairs, fed), "seconds": round(wall, 1),
               **({"popularity_prior": chosen[0]} if chosen else {})}
        print(f"{data:8s} {label:38s} P@10 {row['precision_at_k']:.4f} NDCG@10 "
              f"{row['ndcg_at_k']:.4f} rare {row['rare_slot_share']:.4f} "
              f"{row['seconds']:.1f} s", flush=True)
        out.append(row)
    return out


def validate(data: str, name: str, grid: dict[str, list], epsilon: float | None
             ) -> list[dict[str, Any]]:
    """NDCG@10 of each grid point on the validation carve-out (a pooled tenant: without
    noise, or with central noise, the federation's numbers); ``name`` a registered
    algorithm or ``ease`` (grid ``lam``)."""
    fed = validation(load(data))
    one = Federation([pooled(fed.train)], [pooled(fed.test)],
                     [np.arange(sum(b.n_users for b in fed.train))], fed.item_ids, fed.scale)
    out = []
    for combo in itertools.product(*grid.values()):
        params = dict(zip(grid, combo, strict=True))
        if name == "ease":
            pairs, wall = ease(one, params["lam"])
        else:
            pairs, wall = federated(name, one, registry.get(name).config(**params), epsilon)
        row = {"data": data, "algorithm": name, "epsilon": epsilon,
               "config": params, **score(pairs, one),
               "seconds": round(wall, 1)}
        print(row, flush=True)
        out.append(row)
    return out


def spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row label of repeated runs: the runs' mean, standard deviation, min and max of
    NDCG@10 and P@10."""
    out = []
    for label in dict.fromkeys(r["row"] for r in rows):
        got = [r for r in rows if r["row"] == label]
        line = {"row": label, "runs": len(got)}
        for key in ("ndcg_at_k", "precision_at_k"):
            v = np.array([r[key] for r in got], dtype=float)
            line[key] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1
                         else 0.0, "min": float(v.min()), "max": float(v.max())}
        print(line, flush=True)
        out.append(line)
    return out


def count_gate(data: str, draws: int, gates: list[float], epsilons=(1.0, 8.0)
               ) -> list[dict[str, Any]]:
    """dp-ials (central, default config) with and without ``count_gate`` t for each t of
    ``gates``: each draw is one fit (fresh noise) scored with every t, at the default beta
    and at beta 0 (what the DP choice picks at times), so the differences are paired; the
    means over the draws. The weights are :func:`algorithms.ials.count_weights` of the
    fit's released counts and noise, as a run with that ``count_gate`` serves them. Also
    per epsilon: the count noise's standard deviation s, how many items' released counts
    exceed 3 s (and how many of those have fewer than ``RARE`` training ratings), and the
    list of the released counts alone (the prior with no factors, beta "inf"): the best a
    list can do on the count release by itself."""
    from algorithms.ials import count_weights

    fed, alg = load(data), registry.get("dp-ials")
    exact = sum(np.bincount(t.cols, minlength=fed.n_items) for t in fed.train)
    out: list[dict[str, Any]] = []
    for eps in epsilons:
        acc: dict[tuple[float, float], list] = {}
        for _ in range(draws):
            res, _wall = run("dp-ials", fed, None, eps, "central")
            st, glob = res.server_state, res.global_msg
            counts = st.pop_sum / st.pop_weight
            clear = counts > 3 * st.pop_noise
            acc.setdefault("noise", []).append(
                [st.pop_noise, int(clear.sum()), int((clear & (exact < RARE)).sum())])
            only = glob.replace(V=np.zeros_like(glob.V), prior_weight=1.0)
            sc = score([alg.factors(only, s) for s in res.local_states], fed)
            acc.setdefault((np.inf, 0.0), []).append(
                [sc["precision_at_k"], sc["ndcg_at_k"], sc["rare_slot_share"]])
            for beta in (glob.prior_weight, 0.0):
                for t in [0.0, *gates]:
                    g = glob.replace(prior_weight=beta,
                                     item_weight=count_weights(counts, st.pop_noise, t))
                    sc = score([alg.factors(g, s) for s in res.local_states], fed)
                    acc.setdefault((beta, t), []).append(
                        [sc["precision_at_k"], sc["ndcg_at_k"], sc["rare_slot_share"]])
        noise = np.mean(acc.pop("noise"), axis=0)
        print(f"{data} epsilon {eps:g}: count noise std {noise[0]:.1f}, items counted above "
              f"3 std {noise[1]:.1f} (rare {noise[2]:.1f})", flush=True)
        out.append({"data": data, "epsilon": eps, "count_noise_std": noise[0],
                    "items_above_3_std": noise[1], "rare_items_above_3_std": noise[2]})
        for (beta, t), v in acc.items():
            m = np.mean(v, axis=0)
            row = {"data": data, "epsilon": eps, "popularity_prior": str(beta)
                   if np.isinf(beta) else beta, "count_gate": t,
                   "draws": draws, "precision_at_k": m[0], "ndcg_at_k": m[1],
                   "rare_slot_share": m[2], "rare_slot_share_max": max(x[2] for x in v)}
            print(row, flush=True)
            out.append(row)
    return out


#: the training count below which an item counts as rarely rated: a noisy count must reach
#: it plus z noise standard deviations to be served (:func:`supported`)
SUPPORT_COUNT = 5.0


def supported(counts: np.ndarray, noise_std: float, z: float | None) -> np.ndarray | None:
    """Which items a list built from released ``counts`` whose noise has standard deviation
    ``noise_std`` may serve under the support bar: those whose count reaches
    ``SUPPORT_COUNT + z noise_std``; None (all) without noise or with ``z`` None.
    Post-processing of a DP release and its public noise level (measured, not adopted:
    docs/benchmarks/ranking.md)."""
    if z is None or not noise_std > 0:
        return None
    return np.asarray(counts, dtype=float) >= SUPPORT_COUNT + z * noise_std


def _gated(pairs: list, served: np.ndarray | None, demote: bool = False) -> list:
    """Factor pairs whose items outside ``served`` are dropped (score -inf, so a list may
    be shorter than k) or, with ``demote``, ranked below every served item (a list filled
    with served items first, then the rest): an extra column of ones in A and a row in B
    of 0 for served items and -inf (or -1e12) for the others."""
    if served is None:
        return pairs
    row = np.where(served, 0.0, -1e12 if demote else -np.inf)[None, :]
    return [(np.hstack([a, np.ones((a.shape[0], 1))]), np.vstack([b, row]))
            for a, b in pairs]


def count_support(data: str, draws: int, zs: list[float], epsilons=(1.0, 8.0),
                  ks: list[int] | None = None, carve: bool = False
                  ) -> list[dict[str, Any]]:
    """Lists built from noisy released counts with and without the support bar
    (:func:`supported`: an item is served only when its released count reaches 5 + z s,
    s the count noise's standard deviation), for each z of ``zs`` on the same fits (each
    draw one fit with fresh noise): DP popularity (central, the whole budget on the
    counts, each user's items scaled to L2 weight sqrt(k) for k 100, the library's
    default at the epsilon, :func:`algorithms.popularity.dp_items_per_user`, and each of
    ``ks``) and dp-ials (central, default config; the bar on its prior's count release,
    items dropped, or demoted below the supported ones). Means, and the largest
    rare-slot share, over the draws; also how many items each bar keeps.
    First, the list the service serves when a model loses (each tenant's exact counts of
    its own training ratings, :func:`app.training.selection.popularity_sums`; no noise).
    ``carve``: on the validation carve-out (:func:`validation`; the test split unread)."""
    fed, alg = (validation(load(data)) if carve else load(data)), registry.get("dp-ials")
    tenant = score([(np.ones((tr.n_users, 1)), np.bincount(
        tr.cols, minlength=fed.n_items).astype(float)[None, :]) for tr in fed.train], fed)
    out: list[dict[str, Any]] = [{
        "data": data, "epsilon": None, "list": "tenant popularity (exact)",
        **{key: tenant[key] for key in ("precision_at_k", "ndcg_at_k", "rare_slot_share",
                                        "filled_slot_share")}}]
    print(f"{data} tenant popularity (exact) P@10 {tenant['precision_at_k']:.4f} NDCG@10 "
          f"{tenant['ndcg_at_k']:.4f} rare {tenant['rare_slot_share']:.4f}", flush=True)
    for eps in epsilons:
        acc: dict[tuple[str, Any], list] = {}
        for _ in range(draws):
            for k in dict.fromkeys([P.DP_ITEMS_PER_USER, P.dp_items_per_user(eps),
                                    *(ks or [])]):
                cfg = P.PopularityConfig(max_items_per_user=k)
                priv = privatizer(P.user_bounds(cfg), 1, fed, eps, "central")
                res = P.fit(fed, cfg, privatizer=priv, aggregator=priv.aggregate)
                base = [P.ALGORITHM.factors(res.global_msg, st) for st in res.local_states]
                glob = res.global_msg
                how = f"DP popularity, k {k}"
                for z in [None, *zs]:
                    ok = supported(glob.counts, glob.noise, z)
                    sc = score(_gated(base, ok), fed)
                    acc.setdefault((how, z), []).append(
                        [sc["precision_at_k"], sc["ndcg_at_k"], sc["rare_slot_share"],
                         sc["filled_slot_share"], glob.noise,
                         fed.n_items if ok is None else int(ok.sum())])
            dp, _wall = run("dp-ials", fed, None, eps, "central")
            st = dp.server_state
            counts = st.pop_sum / st.pop_weight
            pairs = [alg.factors(dp.global_msg, s) for s in dp.local_states]
            for z in [None, *zs]:
                ok = supported(counts, st.pop_noise, z)
                for how, demote in (("dp-ials", False), ("dp-ials, demoted", True)):
                    if z is None and demote:
                        continue
                    sc = score(_gated(pairs, ok, demote), fed)
                    acc.setdefault((how, z), []).append(
                        [sc["precision_at_k"], sc["ndcg_at_k"], sc["rare_slot_share"],
                         sc["filled_slot_share"], st.pop_noise,
                         fed.n_items if ok is None else int(ok.sum())])
        for (how, z), v in acc.items():
            m = np.mean(v, axis=0)
            row = {"data": data, "epsilon": eps, "list": how, "support_z": z,
                   "draws": draws, "precision_at_k": m[0], "ndcg_at_k": m[1],
                   "rare_slot_share": m[2], "rare_slot_share_max": max(x[2] for x in v),
                   "filled_slot_share": m[3], "count_noise_std": m[4], "items_served": m[5]}
            print(f"{data} eps {eps:g} {how:20s} z {str(z):4s} P@10 {m[0]:.4f} NDCG@10 "
                  f"{m[1]:.4f} rare {m[2]:.4f} (max {row['rare_slot_share_max']:.4f}) "
                  f"filled {m[3]:.3f} s {m[4]:.1f} items {m[5]:.1f}", flush=True)
            out.append(row)
    return [{**r, "split": "validation" if carve else "test"} for r in out]


def main(argv: list[str] | None = None) -> int:
    ap = E.parser("ranking", __doc__, seeds=1)
    ap.add_argument("--data", nargs="+", default=["ml-100k", "ml-1m", "skewed"],
                    help="data sets (ml-100k, ml-1m, skewed, skewed-taste)")
    ap.add_argument("--validate", default=None, metavar="JSON",
                    help='score a grid on the validation carve-out instead, e.g. '
                         '\'{"algorithm": "ials", "grid": {"rank": [16, 32]}}\' '
                         '(an "epsilon" key: central DP)')
    ap.add_argument("--rows", nargs="+", default=None, metavar="TEXT",
                    help="only the rows with these labels (e.g. 'ials' 'dp-ials, epsilon 8, "
                         "central'), written as ranking_<data>_rows.json")
    ap.add_argument("--count-gate", nargs="+", type=float, default=None, metavar="T",
                    help="instead: dp-ials (central, epsilon 1 and 8) scored with and "
                         "without count_gate T on the same fits (ranking_count_gate_<data>)")
    ap.add_argument("--support", nargs="+", type=float, default=None, metavar="Z",
                    help="instead: DP popularity and dp-ials (central, epsilon 1 and 8) "
                         "with items served only when their released count reaches "
                         "5 + Z count-noise standard deviations, on the same fits "
                         "(ranking_support_<data>)")
    ap.add_argument("--items-per-user", nargs="+", type=int, default=None, metavar="K",
                    help="with --support: DP popularity also with each user's items "
                         "scaled to L2 weight sqrt(K) (besides 100 and the default at "
                         "the epsilon)")
    ap.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 8.0], metavar="E",
                    help="with --support: the epsilons (default 1 8)")
    ap.add_argument("--carve", action="store_true",
                    help="with --support: score on the validation carve-out of the training "
                         "ratings instead of the test split (ranking_support_validation_<data>)")
    ap.add_argument("--draws", type=int, default=4,
                    help="with --count-gate or --support: fits (fresh noise) per epsilon")
    ap.add_argument("--repeat", type=int, default=None, metavar="N",
                    help="run the rows (--rows) N times, each with fresh noise, and write "
                         "each row's mean and standard deviation (ranking_<data>_repeats)")
    args = ap.parse_args(argv)
    if args.repeat:
        for d in args.data:
            rows = [r for _ in range(args.repeat) for r in rows_of(d, args.quick, args.rows)]
            E.write_result(args.out, "ranking", argv, args.quick,
                           {"repeats": rows, "spread": spread(rows)},
                           stem=f"ranking_{d}_repeats")
        return 0
    if args.count_gate:
        for d in args.data:
            E.write_result(args.out, "ranking", argv, args.quick,
                           {"count_gate": count_gate(d, args.draws, args.count_gate)},
                           stem=f"ranking_count_gate_{d}")
        return 0
    if args.support:
        for d in args.data:
            E.write_result(args.out, "ranking", argv, args.quick,
                           {"support": count_support(d, args.draws, args.support,
                                                     tuple(args.epsilons),
                                                     ks=args.items_per_user,
                                                     carve=args.carve)},
                           stem=f"ranking_support_{'validation_' if args.carve else ''}{d}")
        return 0
    if args.validate:
        import json

        spec = json.loads(args.validate)
        rows = [r for d in args.data for r in validate(d, spec["algorithm"], spec["grid"],
                                                       spec.get("epsilon"))]
        E.write_result(args.out, "ranking", argv, args.quick, {"validation": rows},
                       stem=f"ranking_validation_{spec['algorithm']}")
        return 0
    for d in ["ml-100k"] if args.quick else args.data:  # one file per data set, when done
        stem = None if args.quick else f"ranking_{d}" + ("_rows" if args.rows else "")
        E.write_result(args.out, "ranking", argv, args.quick,
                       {"rows": rows_of(d, args.quick, args.rows), "tenants": TENANTS,
                        "delta": DELTA, "k": K}, stem=stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
