"""A sparse, skewed 1-5 rating set shaped like Amazon product reviews (issue 17: defaults
that work on any rating data).

Most users rate once or twice (activity drawn from a zeta law), item popularity is a power
law (about half the items rated once), and ratings are skewed toward 5 (about 70% 5s), as
in Amazon review dumps. Ratings come from a latent score (user bias, item bias, a rank-3
preference and noise) mapped to 1-5 by quantiles of :data:`HISTOGRAM`, so the set has some
signal a model can find but far less than MovieLens. Drawn from one seed, never stored.

``python -m bench.skewed_ratings OUT.csv`` writes the full-size set (29,997 users x 11,277
items, 60,000 ratings by default: the shape of the set in BENCHMARKS.md) as
``user,item,rating`` lines for ``fedrec simulate --data``.
"""

from __future__ import annotations

import argparse

import numpy as np

from algorithms.data import Ratings

#: share of each star, 1..5: Amazon-like, 70% fives
HISTOGRAM = np.array([0.06, 0.04, 0.07, 0.13, 0.70])


def generate_skewed_ratings(n_users: int = 29_997, n_items: int = 11_277,
                            n_ratings: int = 60_000, *, seed: int = 0,
                            active_share: float = 0.08, activity_exponent: float = 1.6,
                            item_exponent: float = 0.7, once_share: float = 0.44,
                            noise: float = 1.0) -> Ratings:
    """Draw the set: ``n_ratings`` distinct (user, item) pairs, every user at least once.

    User u rates ``1 + Zeta(activity_exponent)``-distributed items (rescaled to the
    total), items are drawn with weight ``rank^-item_exponent``; the latent score is
    ``b_u + b_i + u.v`` (standard deviations 0.8, 0.6, 0.5) plus ``noise`` times unit
    Gaussian noise, mapped to stars by :data:`HISTOGRAM`'s quantiles."""
    if n_ratings < n_users or n_ratings > n_users * n_items:
        raise ValueError("need n_users <= n_ratings <= n_users * n_items")
    rng = np.random.default_rng(seed)
    # a share ``active_share`` of the users rate 2+ items (Pareto-tailed counts), the
    # rest exactly once
    active = rng.random(n_users) < active_share
    extra = np.where(active, rng.pareto(activity_exponent, n_users) + 1.0, 0.0)
    extra = extra * (n_ratings - n_users) / max(extra.sum(), 1.0)
    counts = 1 + np.floor(extra + rng.random(n_users) * active).astype(np.int64)
    counts = np.minimum(counts, n_items)
    # half the catalogue (``once_share``) is a tail of items drawn once each, the rest is
    # drawn by power-law popularity
    users = rng.permutation(np.repeat(np.arange(n_users), counts))
    n_tail = int(once_share * n_items)
    head = n_items - n_tail
    pop = np.arange(1, head + 1, dtype=float) ** -item_exponent
    pop /= pop.sum()
    items = np.concatenate([head + np.arange(min(n_tail, users.size)),
                            rng.choice(head, max(users.size - n_tail, 0), p=pop)])
    keys = np.unique(users.astype(np.int64) * n_items + items)
    while keys.size < n_ratings:  # top up (repeated pairs collapsed) with fresh pairs
        u = rng.choice(users, n_ratings - keys.size)
        keys = np.unique(np.concatenate([keys, u * n_items + rng.choice(head, u.size,
                                                                        p=pop)]))
    if keys.size > n_ratings:  # drop surplus pairs, never a user's only one
        first = np.unique(keys // n_items, return_index=True)[1]
        rest = np.setdiff1d(np.arange(keys.size), first)
        drop = rng.choice(rest, keys.size - n_ratings, replace=False)
        keys = np.delete(keys, drop)
    perm = rng.permutation(n_items)  # tail items not all at the end
    keys = np.sort((keys // n_items) * n_items + perm[keys % n_items])
    uu, ii = keys // n_items, keys % n_items
    rank = 3
    score = (0.8 * rng.standard_normal(n_users)[uu] + 0.6 * rng.standard_normal(n_items)[ii]
             + 0.5 * np.einsum("ij,ij->i", rng.standard_normal((n_users, rank))[uu],
                               rng.standard_normal((n_items, rank))[ii]) / np.sqrt(rank)
             + noise * rng.standard_normal(uu.size))
    cuts = np.quantile(score, np.cumsum(HISTOGRAM)[:-1])
    stars = 1.0 + np.searchsorted(cuts, score)
    return Ratings(uu.astype(np.int64), ii.astype(np.int64), stars.astype(float))


def describe(r: Ratings) -> dict[str, float]:
    """The shape figures BENCHMARKS.md quotes: users, items, ratings, share of 5s, of users
    with one or two ratings and of items rated once."""
    per_user = np.bincount(np.unique(r.users, return_inverse=True)[1])
    per_item = np.bincount(np.unique(r.items, return_inverse=True)[1])
    return {"users": int(per_user.size), "items": int(per_item.size), "ratings": len(r),
            "fives": float(np.mean(r.values == 5)), "mean": float(r.values.mean()),
            "users_1_or_2": float(np.mean(per_user <= 2)),
            "items_rated_once": float(np.mean(per_item == 1))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="CSV file to write (user,item,rating)")
    p.add_argument("--users", type=int, default=29_997)
    p.add_argument("--items", type=int, default=11_277)
    p.add_argument("--ratings", type=int, default=60_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    r = generate_skewed_ratings(args.users, args.items, args.ratings, seed=args.seed)
    np.savetxt(args.out, np.column_stack([r.users, r.items, r.values]), fmt="%d,%d,%d")
    print(describe(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
