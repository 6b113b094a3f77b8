"""A realistic synthetic ratings generator.

Power-law item popularity and user activity, a low-rank preference structure with user
and item biases, and integer ratings 1-5 whose histogram matches MovieLens (quantile
mapping). Vectorised over ratings: the Netflix shape (480,189 x 17,770, 10^8 ratings)
takes memory linear in the number of ratings and never a dense users x items array.
"""

from __future__ import annotations

import numpy as np

from algorithms.data import Ratings

#: ML-1M's rating histogram (1..5), used to map latent scores to stars.
MOVIELENS_HISTOGRAM = np.array([56_174, 107_557, 261_197, 348_971, 226_310], dtype=float)


def _power_law_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    w = (np.arange(1, n + 1, dtype=float)) ** (-exponent)
    return rng.permutation(w / w.sum())


def _sample_pairs(n_users: int, n_items: int, n_ratings: int, rng: np.random.Generator,
                  user_exp: float, item_exp: float, min_per_user: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (user, item) pairs: min_per_user each, the rest by activity x popularity."""
    pu = _power_law_weights(n_users, user_exp, rng)
    pi = _power_law_weights(n_items, item_exp, rng)
    base_u = np.repeat(np.arange(n_users), min_per_user)
    keys = np.empty(0, dtype=np.int64)
    need = n_ratings
    while need > 0:
        extra = int(need * 1.1) + 16
        users = np.concatenate([base_u, rng.choice(n_users, extra, p=pu)]) if keys.size == 0 \
            else rng.choice(n_users, extra, p=pu)
        items = rng.choice(n_items, users.size, p=pi)
        cand = users.astype(np.int64) * n_items + items
        keys = np.unique(np.concatenate([keys, cand]))
        need = n_ratings - keys.size
    # keep every user's guaranteed ratings when trimming: drop random surplus keys
    if keys.size > n_ratings:
        keys = np.sort(rng.choice(keys, n_ratings, replace=False))
    return keys // n_items, keys % n_items


def generate_ratings(n_users: int = 2000, n_items: int = 1500, n_ratings: int = 120_000,
                     rank: int = 10, noise: float = 0.5, *, seed: int = 0,
                     user_exponent: float = 0.6, item_exponent: float = 0.9,
                     min_per_user: int = 5) -> Ratings:
    """Draw a synthetic rating set.

    Parameters
    ----------
    n_users, n_items, n_ratings : int
        Shape and number of distinct observed (user, item) pairs.
    rank : int
        Rank of the latent preference matrix.
    noise : float
        Standard deviation of the Gaussian noise on the latent score, relative to the
        score's own standard deviation.
    seed : int
        Everything is drawn from ``np.random.default_rng(seed)``.
    user_exponent, item_exponent : float
        Power-law exponents of user activity and item popularity (weight of the k-th
        most active user / popular item is proportional to k^-exponent).
    min_per_user : int
        Ratings every user has at least (when n_ratings allows).
    """
    if min(n_users, n_items, rank) < 1 or n_ratings < 1:
        raise ValueError("n_users, n_items, rank and n_ratings must be positive")
    if n_ratings > n_users * n_items:
        raise ValueError("n_ratings exceeds n_users * n_items")
    rng = np.random.default_rng(seed)
    min_per_user = min(min_per_user, n_ratings // n_users, n_items)
    users, items = _sample_pairs(n_users, n_items, n_ratings, rng, user_exponent,
                                 item_exponent, min_per_user)
    u = rng.standard_normal((n_users, rank)) / np.sqrt(rank)
    v = rng.standard_normal((rank, n_items))
    b_u = 0.5 * rng.standard_normal(n_users)
    b_i = 0.7 * rng.standard_normal(n_items)
    score = np.einsum("ij,ji->i", u[users], v[:, items]) + b_u[users] + b_i[items]
    score += noise * score.std() * rng.standard_normal(score.size)
    cuts = np.quantile(score, np.cumsum(MOVIELENS_HISTOGRAM)[:-1] / MOVIELENS_HISTOGRAM.sum())
    stars = 1.0 + np.searchsorted(cuts, score).astype(float)
    return Ratings(users.astype(np.int64), items.astype(np.int64), stars)
