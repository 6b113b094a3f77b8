"""Synthetic rating sets: every generator of fedrec's tests and benchmarks, drawn from a
seed, never stored.

Power-law item popularity and user activity, a low-rank preference structure with user
and item biases, and integer ratings 1-5 mapped to a target histogram by quantiles.
Vectorised over ratings, never a dense users x items array.

* :func:`generate_ratings`: MovieLens-like (its histogram), one flat list;
  :func:`generate_tenant_ratings` draws the same model tenant by tenant in a few tens of
  bytes per rating, for shapes up to Netflix's (480,189 x 17,770, 10^8 ratings).
* :func:`generate_skewed_ratings`: Amazon-review-like: most users rate once or twice, about
  half the items are rated once, 70% of ratings are 5s (sparse, skewed data that defaults
  tuned on MovieLens must still handle).
* :func:`generate_sparse_ratings`: a large sparse catalogue (200,000 users x 20,000 items,
  10^6 ratings by default) in which every user and every item has a rating.

:func:`describe` gives the shape figures of any of them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from algorithms.block import RatingBlock
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
                     min_per_user: int = 5, scale: str = "stars") -> Ratings:
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
    scale : str
        How the latent score becomes a rating (:data:`SCALES`): ``"stars"`` 1-5 with
        MovieLens' histogram; ``"half-stars"`` 0.5-5 in steps of 0.5, each star's share
        split evenly between it and the half star below; ``"continuous"`` the standardised
        score times 3.5, clipped to -10..10; ``"binary"`` 1 for the top 57.5% of scores
        (ML-1M's share of ratings >= 4), else 0.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}")
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
    return Ratings(users.astype(np.int64), items.astype(np.int64), _to_scale(score, scale))


#: rating scales :func:`generate_ratings` can draw, with their (lo, hi)
SCALES = {"stars": (1.0, 5.0), "half-stars": (0.5, 5.0), "continuous": (-10.0, 10.0),
          "binary": (0.0, 1.0)}


def _quantile_levels(score: np.ndarray, histogram: np.ndarray) -> np.ndarray:
    """Level index 0..len(histogram)-1 of each score, matching the histogram's shares."""
    cuts = np.quantile(score, np.cumsum(histogram)[:-1] / histogram.sum())
    return np.searchsorted(cuts, score).astype(float)


def _to_scale(score: np.ndarray, scale: str) -> np.ndarray:
    """Latent scores as ratings on ``scale`` (see :func:`generate_ratings`)."""
    if scale == "stars":
        return 1.0 + _quantile_levels(score, MOVIELENS_HISTOGRAM)
    if scale == "half-stars":
        return 0.5 + 0.5 * _quantile_levels(score, np.repeat(MOVIELENS_HISTOGRAM / 2, 2))
    if scale == "continuous":
        return np.clip(3.5 * (score - score.mean()) / score.std(), -10.0, 10.0)
    top = MOVIELENS_HISTOGRAM[3:].sum() / MOVIELENS_HISTOGRAM.sum()
    return (score >= np.quantile(score, 1.0 - top)).astype(float)


def _group_quotas(sizes: np.ndarray, weights: np.ndarray, n_ratings: int, min_per_user: int,
                  n_items: int, rng: np.random.Generator) -> np.ndarray:
    """Ratings per user group: ``min_per_user`` per user plus a multinomial share of the
    rest by the group's total activity, capped at the group's ``users x items`` pairs."""
    cap = sizes * n_items
    quota = sizes * min_per_user + rng.multinomial(n_ratings - int(sizes.sum()) * min_per_user,
                                                   weights / weights.sum())
    while np.any(quota > cap):
        excess = int(np.maximum(quota - cap, 0).sum())
        quota = np.minimum(quota, cap)
        room = np.where(quota < cap, weights, 0.0)
        quota += rng.multinomial(excess, room / room.sum())
    return quota


class _Sampler:
    """Inverse-CDF sampling of indices with a guide table (Chen and Asau): the same index
    as ``searchsorted(cdf, u, side='right')``, about twice as fast for large draws."""

    def __init__(self, weights: np.ndarray, buckets: int = 1 << 18) -> None:
        cdf = np.cumsum(weights)
        self.cdf = cdf / cdf[-1]
        self.buckets = buckets
        grid = np.arange(buckets) / buckets
        self.guide = np.searchsorted(self.cdf, grid, side="right").astype(np.int32)

    def __call__(self, uniforms: np.ndarray) -> np.ndarray:
        idx = self.guide[(uniforms * self.buckets).astype(np.int64)].astype(np.int64)
        last = self.cdf.size - 1
        while True:  # walk up to the first cdf entry above u (a pass or two)
            step = self.cdf[np.minimum(idx, last)] <= uniforms
            if not step.any():
                return np.minimum(idx, last)
            idx += step


def _sample_group(n_local: int, n_items: int, quota: int, user_sampler: _Sampler,
                  item_sampler: _Sampler, min_per_user: int, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``quota`` distinct (local user, item) pairs of one group, sorted by (user, item):
    ``min_per_user`` draws per user, then users by activity x items by popularity, drawn
    in batches (sized by the last batch's yield of new pairs) until the quota is reached;
    the surplus is dropped at random from the last batch's new pairs (the first batch, the
    per-user draws, never has a surplus since the quota is at least its size)."""
    keys = np.empty(0, dtype=np.int64)
    ratio = 1.0
    users = np.repeat(np.arange(n_local, dtype=np.int64), min_per_user)
    while keys.size < quota:
        if keys.size:
            users = user_sampler(rng.random(int((quota - keys.size) * 1.1 / ratio) + 16))
        cand = np.sort(users * n_items + item_sampler(rng.random(users.size)))
        cand = cand[np.concatenate([[True], cand[1:] != cand[:-1]])]
        at = np.minimum(np.searchsorted(keys, cand), max(keys.size - 1, 0))
        new = cand[keys[at] != cand] if keys.size else cand
        ratio = max(new.size / users.size, 0.05)
        if keys.size + new.size > quota:  # drop a random part of the last batch's surplus
            new = np.sort(rng.choice(new, quota - keys.size, replace=False))
        keys = np.sort(np.concatenate([keys, new]), kind="stable")
    return keys // n_items, keys % n_items


@dataclasses.dataclass(frozen=True, eq=False)
class LatentModel:
    """What :func:`generate_tenant_ratings` drew before sampling: enough to give the
    probability of every (user, item) rating and of its star, for oracle measurements.

    A tenant's pairs are ``min_per_user`` draws per user by popularity, then draws of
    users by activity within the tenant and items by popularity until its quota of
    distinct pairs; the star of a pair is the noisy latent score cut at ``cuts``.
    """

    user_weights: np.ndarray  #: activity of each user (sums to 1 over all users)
    item_weights: np.ndarray  #: popularity of each item (sums to 1)
    user_factors: np.ndarray  #: (n_users, rank)
    item_factors: np.ndarray  #: (n_items, rank)
    user_bias: np.ndarray
    item_bias: np.ndarray
    noise_sd: float  #: standard deviation of the Gaussian noise on the latent score
    cuts: np.ndarray  #: the 4 score cut points between stars 1..5
    bounds: np.ndarray  #: tenant t holds the users bounds[t] .. bounds[t + 1] - 1
    quotas: np.ndarray  #: distinct pairs of each tenant
    min_per_user: int

    def draws(self, tenant: int, bins: int = 1024) -> float:
        """D, the Poisson number of activity x popularity draws of ``tenant`` for which
        the expected number of distinct pairs is its quota (bisection on log D; items
        grouped into ``bins`` popularity quantiles, whose means stand for them)."""
        lo, hi = int(self.bounds[tenant]), int(self.bounds[tenant + 1])
        w = self.user_weights[lo:hi] / self.user_weights[lo:hi].sum()
        order = np.sort(self.item_weights)
        groups = np.array_split(order, min(bins, order.size))
        pi = np.array([g.mean() for g in groups])
        count = np.array([g.size for g in groups], dtype=float)
        keep = (1.0 - pi) ** self.min_per_user

        def expected(d: float) -> float:
            return float(((1.0 - keep * np.exp(-d * np.outer(w, pi))) @ count).sum())

        a, b = 0.0, 80.0  # log D
        for _ in range(48):
            mid = 0.5 * (a + b)
            a, b = (mid, b) if expected(math.exp(mid)) < self.quotas[tenant] else (a, mid)
        return math.exp(0.5 * (a + b))

    def observed(self, tenant: int, users: np.ndarray, items: np.ndarray, draws: float,
                 pairs: bool = False) -> np.ndarray:
        """P(pair drawn) of local ``users`` x ``items`` given :meth:`draws`: the outer
        table, or of the pairs (``users[n]``, ``items[n]``) when ``pairs``."""
        lo, hi = int(self.bounds[tenant]), int(self.bounds[tenant + 1])
        w = self.user_weights[lo + users] / self.user_weights[lo:hi].sum()
        pi = self.item_weights[items]
        rate = w * pi if pairs else np.outer(w, pi)
        return 1.0 - (1.0 - pi) ** self.min_per_user * np.exp(-draws * rate)

    def star_at_least(self, star: int, tenant: int, users: np.ndarray, items: np.ndarray,
                      pairs: bool = False) -> np.ndarray:
        """P(star >= ``star`` | rated) of local ``users`` x ``items`` (outer, or the pairs
        (``users[n]``, ``items[n]``) when ``pairs``); ``star`` from 1 (certain) to the
        number of stars."""
        from scipy.special import ndtr

        if not 1 <= star <= len(self.cuts) + 1:
            raise ValueError(f"star must be from 1 to {len(self.cuts) + 1}, got {star}")
        g = int(self.bounds[tenant]) + users
        shape = (users.size,) if pairs else (users.size, items.size)
        if star == 1:  # every rating is at least one star (cuts[-1] would be the top cut)
            return np.ones(shape)
        uf, vf = self.user_factors[g], self.item_factors[items]
        if pairs:
            mean = np.einsum("ij,ij->i", uf, vf) + self.user_bias[g] + self.item_bias[items]
        else:
            mean = uf @ vf.T + self.user_bias[g][:, None] + self.item_bias[items][None, :]
        return ndtr((mean - self.cuts[star - 2]) / self.noise_sd)


@dataclasses.dataclass(frozen=True, eq=False)
class TenantRatings:
    """Synthetic ratings already partitioned by user into tenants.

    ``blocks[t]`` holds tenant t's ratings (local user rows, global item columns);
    ``user_ids[t]`` maps its local rows to global user ids (a contiguous range);
    ``model`` is the latent model they were drawn from.
    """

    blocks: list[RatingBlock]
    user_ids: list[np.ndarray]
    n_users: int
    n_items: int
    model: LatentModel | None = None

    @property
    def n_ratings(self) -> int:
        return sum(b.nnz for b in self.blocks)


def generate_tenant_ratings(n_users: int, n_items: int, n_ratings: int, n_tenants: int,
                            rank: int = 10, noise: float = 0.5, *, seed: int = 0,
                            user_exponent: float = 0.6, item_exponent: float = 0.9,
                            min_per_user: int = 5) -> TenantRatings:
    """The model of :func:`generate_ratings`, drawn tenant by tenant, for large shapes.

    Same latent model (power-law activity and popularity, rank-``rank`` preferences with
    user and item biases, Gaussian noise, stars by quantile mapping onto
    :data:`MOVIELENS_HISTOGRAM`), but a different sampling order, so the numbers differ
    from :func:`generate_ratings` for the same seed. Users are split into ``n_tenants``
    contiguous id ranges; since the activity weights are randomly permuted this is a
    uniformly random partition. Each tenant gets a multinomial share of the ratings by its
    users' total activity and draws its distinct pairs on its own, so no global sort of
    ``n_ratings`` keys is needed and the per-rating arrays are int32 rows and columns and
    float64 scores, then stars (plus one concatenated copy of the scores for the
    quantiles): Netflix's shape (480,189 x 17,770, 10^8 ratings) peaks at about 3.4 GB.

    Parameters
    ----------
    n_users, n_items, n_ratings, rank, noise, seed, user_exponent, item_exponent, min_per_user
        As in :func:`generate_ratings` (``min_per_user`` draws per user, duplicates merged).
    n_tenants : int
        Number of tenants (1 <= n_tenants <= n_users).
    """
    if min(n_users, n_items, rank) < 1 or n_ratings < 1:
        raise ValueError("n_users, n_items, rank and n_ratings must be positive")
    if n_ratings > n_users * n_items:
        raise ValueError("n_ratings exceeds n_users * n_items")
    if not 1 <= n_tenants <= n_users:
        raise ValueError("n_tenants must be between 1 and n_users")
    rng = np.random.default_rng(seed)
    min_per_user = min(min_per_user, n_ratings // n_users, n_items)
    pu = _power_law_weights(n_users, user_exponent, rng)
    pi = _power_law_weights(n_items, item_exponent, rng)
    u = rng.standard_normal((n_users, rank)) / np.sqrt(rank)
    vt = rng.standard_normal((n_items, rank))
    b_u = 0.5 * rng.standard_normal(n_users)
    b_i = 0.7 * rng.standard_normal(n_items)
    bounds = np.linspace(0, n_users, n_tenants + 1).round().astype(np.int64)
    sizes = np.diff(bounds)
    quotas = _group_quotas(sizes, np.add.reduceat(pu, bounds[:-1]), n_ratings, min_per_user,
                           n_items, rng)
    item_sampler = _Sampler(pi)
    rows, cols, scores = [], [], []
    for t in range(n_tenants):
        lo, hi = int(bounds[t]), int(bounds[t + 1])
        r, c = _sample_group(hi - lo, n_items, int(quotas[t]), _Sampler(pu[lo:hi], 1 << 14),
                             item_sampler, min_per_user, rng)
        g = r + lo
        scores.append(np.einsum("ij,ij->i", u[g], vt[c]) + b_u[g] + b_i[c])
        rows.append(r.astype(np.int32))
        cols.append(c.astype(np.int32))
    total = sum(s.size for s in scores)
    mean = sum(float(s.sum()) for s in scores) / total
    std = np.sqrt(sum(float(((s - mean) ** 2).sum()) for s in scores) / total)
    for s in scores:
        s += noise * std * rng.standard_normal(s.size)
    cuts = np.quantile(np.concatenate(scores),
                       np.cumsum(MOVIELENS_HISTOGRAM)[:-1] / MOVIELENS_HISTOGRAM.sum())
    blocks = []
    for t in range(n_tenants):
        stars = 1.0 + np.searchsorted(cuts, scores[t]).astype(float)
        scores[t] = None
        blocks.append(RatingBlock(rows[t], cols[t], stars, int(sizes[t]), n_items, (1.0, 5.0)))
        rows[t] = cols[t] = None
    uids = [np.arange(bounds[t], bounds[t + 1]) for t in range(n_tenants)]
    model = LatentModel(pu, pi, u, vt, b_u, b_i, float(noise * std), cuts, bounds,
                        np.asarray(quotas), min_per_user)
    return TenantRatings(blocks, uids, n_users, n_items, model)


#: share of each star, 1..5, of :func:`generate_skewed_ratings`: Amazon-like, 70% fives
AMAZON_HISTOGRAM = np.array([0.06, 0.04, 0.07, 0.13, 0.70])


def generate_skewed_ratings(n_users: int = 29_997, n_items: int = 11_277,
                            n_ratings: int = 60_000, *, seed: int = 0,
                            active_share: float = 0.08, activity_exponent: float = 1.6,
                            item_exponent: float = 0.7, once_share: float = 0.44,
                            noise: float = 1.0, taste: float = 0.0) -> Ratings:
    """A sparse, skewed 1-5 set shaped like Amazon product reviews: ``n_ratings`` distinct
    (user, item) pairs, every user at least once.

    A share ``active_share`` of the users rate 2+ items (Pareto(``activity_exponent``)
    counts rescaled to the total), the rest exactly once; a tail of ``once_share`` of the
    items is rated once each, the others are drawn with weight ``rank^-item_exponent``. The
    latent score ``b_u + b_i + u.v`` (standard deviations 0.8, 0.6, 0.5; rank 3) plus
    ``noise`` times unit Gaussian noise is mapped to stars by :data:`AMAZON_HISTOGRAM`'s
    quantiles, so the set has some signal a model can find but far less than MovieLens.

    With ``taste = 0`` (the default) a user's items are drawn by popularity alone, whoever
    the user is, so the popularity list is the best list there by construction (the
    ranking bench's control). ``taste = gamma > 0`` makes the choice depend on the user
    too: user u picks a head item j with probability proportional to ``w_j exp(gamma
    x_u . y_j / sqrt(rank))``, the same unit-normal factors ``x_u``, ``y_j`` whose
    product sets the stars (then drawn from their own stream, seeded by ``(seed, 1)``);
    the tail items stay rated once each by random users."""
    if n_ratings < n_users or n_ratings > n_users * n_items:
        raise ValueError("need n_users <= n_ratings <= n_users * n_items")
    rng = np.random.default_rng(seed)
    active = rng.random(n_users) < active_share
    extra = np.where(active, rng.pareto(activity_exponent, n_users) + 1.0, 0.0)
    extra = extra * (n_ratings - n_users) / max(extra.sum(), 1.0)
    counts = 1 + np.floor(extra + rng.random(n_users) * active).astype(np.int64)
    counts = np.minimum(counts, n_items)
    users = rng.permutation(np.repeat(np.arange(n_users), counts))
    n_tail = int(once_share * n_items)
    head = n_items - n_tail
    pop = np.arange(1, head + 1, dtype=float) ** -item_exponent
    pop /= pop.sum()
    rank = 3
    n_tail_used = min(n_tail, users.size)
    if taste:  # the factors first, on their own stream: the choice of items needs them
        frng = np.random.default_rng([seed, 1])
        x, y = (frng.standard_normal((n_users, rank)),
                frng.standard_normal((n_items, rank)))
        log_w, gamma = np.log(pop), taste / np.sqrt(rank)
        # each user's head items at once, without replacement (Gumbel top-k)
        want = np.minimum(np.bincount(users[n_tail_used:], minlength=n_users), head)
        keys = np.unique(np.concatenate([
            users[:n_tail_used].astype(np.int64) * n_items + head + np.arange(n_tail_used),
            _taste_pairs(want, x, y[:head], log_w, gamma, rng, n_items)]))

        def draw(who: np.ndarray) -> np.ndarray:
            return _taste_choice(who, x, y[:head], log_w, gamma, rng)
    else:
        def draw(who: np.ndarray) -> np.ndarray:
            return rng.choice(head, who.size, p=pop)
        items = np.concatenate([head + np.arange(n_tail_used), draw(users[n_tail_used:])])
        keys = np.unique(users.astype(np.int64) * n_items + items)
    while keys.size < n_ratings:  # top up (repeated pairs collapsed) with fresh pairs
        u = rng.choice(users, n_ratings - keys.size)
        keys = np.unique(np.concatenate([keys, u * n_items + draw(u)]))
    if keys.size > n_ratings:  # drop surplus pairs, never a user's only one
        first = np.unique(keys // n_items, return_index=True)[1]
        rest = np.setdiff1d(np.arange(keys.size), first)
        drop = rng.choice(rest, keys.size - n_ratings, replace=False)
        keys = np.delete(keys, drop)
    perm = rng.permutation(n_items)  # tail items not all at the end
    keys = np.sort((keys // n_items) * n_items + perm[keys % n_items])
    uu, ii = keys // n_items, keys % n_items
    b_u, b_i = rng.standard_normal(n_users), rng.standard_normal(n_items)
    if taste:  # item ids were permuted after the choice: y of id perm[j] is y[j]
        y_id = np.empty_like(y)
        y_id[perm] = y
    else:
        x, y_id = rng.standard_normal((n_users, rank)), rng.standard_normal((n_items, rank))
    score = (0.8 * b_u[uu] + 0.6 * b_i[ii]
             + 0.5 * np.einsum("ij,ij->i", x[uu], y_id[ii]) / np.sqrt(rank)
             + noise * rng.standard_normal(uu.size))
    cuts = np.quantile(score, np.cumsum(AMAZON_HISTOGRAM)[:-1])
    stars = 1.0 + np.searchsorted(cuts, score)
    return Ratings(uu.astype(np.int64), ii.astype(np.int64), stars.astype(float))


def _taste_choice(users: np.ndarray, x: np.ndarray, y: np.ndarray, log_w: np.ndarray,
                  gamma: float, rng: np.random.Generator, chunk: int = 2048) -> np.ndarray:
    """One item per entry of ``users``, item j with probability proportional to ``exp(log_w_j
    + gamma x_u . y_j)`` (Gumbel-max, a chunk of users at a time)."""
    out = np.empty(users.size, dtype=np.int64)
    for lo in range(0, users.size, chunk):
        u = users[lo:lo + chunk]
        logits = log_w + gamma * (x[u] @ y.T)
        out[lo:lo + chunk] = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)
    return out


def _taste_pairs(want: np.ndarray, x: np.ndarray, y: np.ndarray, log_w: np.ndarray,
                 gamma: float, rng: np.random.Generator, n_items: int, chunk: int = 2048
                 ) -> np.ndarray:
    """``want[u]`` distinct items j < len(log_w) for each user u as keys ``u * n_items + j``,
    drawn without replacement with weights ``exp(log_w_j + gamma x_u . y_j)`` (Gumbel
    top-k: the ``want[u]`` largest of the perturbed logits)."""
    who = np.flatnonzero(want > 0)
    n, out = log_w.size, []  # candidates: the first n item indices
    for lo in range(0, who.size, chunk):
        u = who[lo:lo + chunk]
        logits = log_w + gamma * (x[u] @ y.T)
        order = np.argsort(-(logits + rng.gumbel(size=logits.shape)), axis=1)
        take = np.arange(n) < want[u][:, None]
        out.append(np.repeat(u.astype(np.int64), want[u]) * n_items + order[take])
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def _covering_pairs(n_users: int, n_items: int, n_ratings: int, user_exponent: float,
                    item_exponent: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``n_ratings`` distinct (user, item) pairs, every user and every item in one."""
    n_u, n_i, n = n_users, n_items, n_ratings
    if n < max(n_u, n_i) or n > n_u * n_i:
        raise ValueError("n_ratings must be at least max(n_users, n_items) and at most "
                         "n_users * n_items")
    pu = _power_law_weights(n_u, user_exponent, rng)
    pi = _power_law_weights(n_i, item_exponent, rng)
    # one rating per user, the rest by activity, at most a tenth of the catalogue each
    per_user = 1 + rng.multinomial(n - n_u, pu)
    cap = max(1, n_i // 10)
    while np.any(per_user > cap):
        excess = int(np.maximum(per_user - cap, 0).sum())
        per_user = np.minimum(per_user, cap)
        room = np.where(per_user < cap, pu, 0.0)
        per_user += rng.multinomial(excess, room / room.sum())
    users = np.repeat(np.arange(n_u), per_user)
    # one rating per item first (to random users' slots), the rest by popularity
    items = rng.choice(n_i, n, p=pi)
    first = rng.permutation(n)[:n_i]
    items[first] = np.arange(n_i)
    later = np.ones(n, dtype=bool)  # a repeated pair keeps its item's first rating
    later[first] = False
    for _ in range(1000):
        key = users.astype(np.int64) * n_i + items
        order = np.lexsort((later, key))
        dup = np.zeros(n, dtype=bool)
        dup[order[1:]] = key[order[1:]] == key[order[:-1]]
        if not dup.any():
            return users, items
        # redraw the item of a repeated pair (its user keeps the rating), by popularity
        items[dup] = rng.choice(n_i, int(dup.sum()), p=pi)
    raise RuntimeError("could not draw distinct pairs")  # pragma: no cover


def generate_sparse_ratings(n_users: int = 200_000, n_items: int = 20_000,
                            n_ratings: int = 1_000_000, *, seed: int = 0,
                            histogram: tuple[float, ...] = (0.06, 0.11, 0.26, 0.35, 0.22),
                            user_exponent: float = 0.9, item_exponent: float = 0.9
                            ) -> Ratings:
    """A large sparse catalogue: every user and every item has at least one rating; the
    remaining ratings go to users by a power law of activity (at most a tenth of the
    catalogue each) and to items by a power law of popularity, redrawn until every pair is
    distinct; a rank-5 preference with user and item biases and Gaussian noise is mapped
    to 1-5 stars by quantiles of ``histogram`` (shares of 1..5; default MovieLens-like).
    Ratings come in a random order, not grouped by user."""
    rng = np.random.default_rng(seed)
    users, items = _covering_pairs(n_users, n_items, n_ratings, user_exponent,
                                   item_exponent, rng)
    rank = 5
    p = rng.standard_normal((n_users, rank)) / np.sqrt(rank)
    q = rng.standard_normal((n_items, rank))
    b_u = 0.5 * rng.standard_normal(n_users)
    b_i = 0.7 * rng.standard_normal(n_items)
    score = np.einsum("ij,ij->i", p[users], q[items]) + b_u[users] + b_i[items]
    score += 0.5 * score.std() * rng.standard_normal(score.size)
    hist = np.asarray(histogram, dtype=float)
    cuts = np.quantile(score, np.cumsum(hist)[:-1] / hist.sum())
    stars = 1.0 + np.searchsorted(cuts, score).astype(float)
    order = rng.permutation(n_ratings)
    return Ratings(users[order].astype(np.int64), items[order].astype(np.int64), stars[order])


def describe(ratings: Ratings) -> dict:
    """A set's shape: users, items, ratings, the share of 5s and the mean rating, the share
    of users with one or two ratings and of items rated once, the most ratings of one user
    and of one item, and the share of each rating value."""
    _, per_user = np.unique(ratings.users, return_counts=True)
    _, per_item = np.unique(ratings.items, return_counts=True)
    values, counts = np.unique(ratings.values, return_counts=True)
    return {"users": int(per_user.size), "items": int(per_item.size),
            "ratings": len(ratings), "fives": float(np.mean(ratings.values == 5)),
            "mean": float(ratings.values.mean()),
            "users_1_or_2": float(np.mean(per_user <= 2)),
            "items_rated_once": float(np.mean(per_item == 1)),
            "max_per_user": int(per_user.max()), "max_per_item": int(per_item.max()),
            "histogram": {f"{v:g}": float(c / len(ratings))
                          for v, c in zip(values.tolist(), counts.tolist(), strict=True)}}
