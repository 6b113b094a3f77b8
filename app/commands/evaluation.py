"""Options and reports ``fedrec simulate`` shares with ``fedrec tune``: the tenant
partition (:mod:`algorithms.partition`) and the ranking metrics (:mod:`algorithms.ranking`)."""

from __future__ import annotations

import argparse
from typing import Any

from algorithms.data import Federation
from algorithms.partition import SCHEMES, parse_partition, skew
from algorithms.ranking import ranking_report, relevance_threshold
from algorithms.simulate import SimulationResult


def _partition(text: str) -> str:
    try:
        return str(parse_partition(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_partition_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partition", type=_partition, default="random", metavar="SCHEME",
                   help=f"how users are grouped into tenants: {SCHEMES} (non-IID: tenants "
                        "differ in activity, in what they rate or in size; see "
                        "algorithms/partition.py) (default: random)")


def add_evaluation_arguments(p: argparse.ArgumentParser) -> None:
    """--partition, --top-k and --relevance-threshold."""
    add_partition_argument(p)
    p.add_argument("--top-k", type=_positive_int, default=10, metavar="K",
                   help="k of precision@k, recall@k and NDCG@k (default: 10)")
    p.add_argument("--relevance-threshold", type=float, default=None, metavar="X",
                   help="a held-out rating >= X is relevant to the ranking metrics "
                        "(default: 62.5%% up the rating scale, 3.5 on 1-5 stars)")


def ranking_of(alg, result: SimulationResult, fed: Federation, args: argparse.Namespace,
               quiet: bool = False) -> dict[str, Any]:
    """Ranking metrics of a finished run on ``fed``'s held-out *ratings* (training items
    excluded), printed in one line and returned for the JSON report."""
    k = getattr(args, "top_k", 10)
    threshold = getattr(args, "relevance_threshold", None)
    rep = ranking_report(alg, result.global_msg, result.local_states, fed.train, fed.test,
                         fed.scale, k=k, threshold=threshold)
    out = rep.as_dict()
    out["threshold"] = relevance_threshold(fed.scale) if threshold is None else threshold
    if not quiet:
        print(f"ranking (held-out rating >= {out['threshold']:g}, training items excluded, "
              f"{rep.users_ranked} users): precision@{k} {rep.precision_at_k:.4f}, "
              f"recall@{k} {rep.recall_at_k:.4f}, NDCG@{k} {rep.ndcg_at_k:.4f}, "
              f"coverage {rep.coverage:.4f}")
    return out


def popularity_of(args: argparse.Namespace, fed: Federation, unit: str,
                  quiet: bool = False) -> dict[str, Any]:
    """The popularity baseline on the model's split, printed beside it (every ranking model
    must beat it): the exact list for non-private runs, for ``--privacy user`` the DP list
    (:mod:`algorithms.popularity`) under the same epsilon, delta and placement, its own
    release with its own budget, k its default at that epsilon
    (:func:`algorithms.popularity.dp_items_per_user`; a baseline, never served by this
    command)."""
    import secrets

    from algorithms import popularity

    if unit == "user":
        from privacy.cli import DEFAULT_EPSILON, user_privatizer_from_args

        eps = args.epsilon if getattr(args, "epsilon", None) is not None else DEFAULT_EPSILON
        cfg = popularity.PopularityConfig(max_items_per_user=popularity.dp_items_per_user(eps))
        if getattr(args, "secure_aggregation", False):
            # its clipped-sum release has no secure aggregation; central placement, which
            # secure aggregation matches in accuracy, is the fair baseline (and says so)
            args = argparse.Namespace(**{**vars(args), "secure_aggregation": False,
                                         "placement": "central", "dropout_tolerance": None})
        # never the model's --seed: noise drawn from the same stream as the model's own
        # releases would be the same numbers, which a reader of both could cancel
        priv = user_privatizer_from_args(args, popularity.user_bounds(cfg), 1, fed.n_clients,
                                         sum(b.n_users for b in fed.train),
                                         secrets.randbits(63))
        result = popularity.fit(fed, cfg, seed=args.seed, privatizer=priv,
                                aggregator=priv.aggregate)
        label = (f"DP popularity (epsilon {priv.spec.epsilon:g}, placement "
                 f"{priv.spec.placement}, each user's items scaled to "
                 f"sqrt({cfg.max_items_per_user}))")
    else:
        result, label = popularity.fit(fed, seed=args.seed), "popularity (exact counts)"
    k = getattr(args, "top_k", 10)
    rep = ranking_report(popularity.ALGORITHM, result.global_msg, result.local_states,
                         fed.train, fed.test, fed.scale, k=k,
                         threshold=getattr(args, "relevance_threshold", None))
    if not quiet:
        print(f"baseline {label}: precision@{k} {rep.precision_at_k:.4f}, recall@{k} "
              f"{rep.recall_at_k:.4f}, NDCG@{k} {rep.ndcg_at_k:.4f}, coverage "
              f"{rep.coverage:.4f}")
    return {"list": label, **rep.as_dict()}


def partition_summary(fed: Federation, partition: str) -> dict[str, Any]:
    """The partition's name and its measured skew (tenant-size Gini, label TV)."""
    sizes = [b.n_users for b in fed.train]
    return {"scheme": partition, "tenant_users_min": min(sizes),
            "tenant_users_max": max(sizes), **skew(fed.train)}
