"""Non-IID partitions of users into tenants (``fedrec simulate --partition``).

Every scheme puts each user in exactly one tenant and leaves no tenant empty; all are
seeded (stream ``(seed, 0, PARTITION)``, independent of the train/test split, so the held-out
ratings are the same under every partition and the schemes compare on equal terms).

``random``
    Near-equal random blocks (the papers' setting; :func:`build_federation`'s default).
``by-activity``
    Users sorted by their number of ratings and cut into near-equal contiguous blocks:
    tenant 0 holds the least active users, the last tenant the most active.
``by-item-cluster``
    Items are clustered by co-occurrence (k-means on a seeded randomized SVD of the
    user x item incidence matrix, ``min(clients, 10)`` clusters); each user's label is the
    cluster most of its ratings fall in; users sorted by label (then by the share of
    their ratings in it) are cut into near-equal blocks, so tenants differ in what they
    rate.
``dirichlet:ALPHA``
    The same user labels, each label's users spread over the tenants in proportions
    drawn from Dirichlet(ALPHA, ..., ALPHA) (the usual label-skew benchmark): ALPHA 0.1
    gives tenants dominated by one or two labels and unequal sizes, ALPHA 100 is close to
    random. Empty tenants are given a user from the largest.
``sizes:ALPHA``
    Random users, tenant sizes skewed: 1 + a multinomial share of the rest with
    Dirichlet(ALPHA) proportions.

:func:`skew` measures a partition: the Gini coefficient of tenant sizes (users) and the
mean total-variation distance between a tenant's and the whole federation's distribution
of ratings over item clusters.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

SCHEMES = "random, by-activity, by-item-cluster, dirichlet:ALPHA, sizes:ALPHA"
MAX_CLUSTERS = 10


@dataclasses.dataclass(frozen=True)
class Partition:
    kind: str
    alpha: float | None = None

    def __str__(self) -> str:
        return self.kind if self.alpha is None else f"{self.kind}:{self.alpha:g}"


def parse_partition(text: str | Partition) -> Partition:
    """``random`` / ``by-activity`` / ``by-item-cluster`` / ``dirichlet:A`` / ``sizes:A``."""
    if isinstance(text, Partition):
        return text
    kind, _, arg = str(text).strip().partition(":")
    if kind in ("random", "by-activity", "by-item-cluster") and not arg:
        return Partition(kind)
    if kind in ("dirichlet", "sizes"):
        try:
            alpha = float(arg)
        except ValueError:
            raise ValueError(f"partition {text!r}: {kind} needs a concentration, e.g. "
                             f"{kind}:0.1") from None
        if not (np.isfinite(alpha) and alpha > 0):
            raise ValueError(f"partition {text!r}: ALPHA must be a positive number")
        return Partition(kind, alpha)
    raise ValueError(f"partition {text!r}: expected one of {SCHEMES}")


def incidence(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int
              ) -> sp.csr_array:
    """Binary user x item matrix of who rated what."""
    return sp.csr_array((np.ones(users.shape[0]), (users, items)), shape=(n_users, n_items))


def item_clusters(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int,
                  n_groups: int, rng: np.random.Generator, dim: int = 8, iters: int = 25
                  ) -> np.ndarray:
    """Cluster label of every item: k-means on item embeddings from a randomized SVD of
    the incidence matrix (rows normalised to unit length, so popularity does not decide)."""
    x = incidence(users, items, n_users, n_items)
    dim = max(1, min(dim, n_items - 1, n_users - 1))
    q = rng.normal(size=(n_items, dim))
    for _ in range(3):  # subspace iteration on X^T X
        q, _ = np.linalg.qr(x.T @ (x @ q))
    emb = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    n_groups = max(1, min(n_groups, n_items))
    centres = emb[rng.choice(n_items, size=n_groups, replace=False)]
    label = np.zeros(n_items, dtype=np.int64)
    for _ in range(iters):
        d = ((emb[:, None, :] - centres[None]) ** 2).sum(-1)
        label = d.argmin(axis=1)
        for g in range(n_groups):
            members = emb[label == g]
            if members.shape[0]:
                centres[g] = members.mean(axis=0)
    return label


def user_labels(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int,
                n_groups: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(label, share): each user's dominant item cluster and the share of its ratings in it."""
    ic = item_clusters(users, items, n_users, n_items, n_groups, rng)
    g = int(ic.max()) + 1
    counts = np.bincount(users * g + ic[items], minlength=n_users * g).reshape(n_users, g)
    label = counts.argmax(axis=1)
    share = counts.max(axis=1) / np.maximum(counts.sum(axis=1), 1)
    return label, share


def _chunks(order: np.ndarray, n_clients: int) -> np.ndarray:
    tenant = np.empty(order.shape[0], dtype=np.int64)
    for t, chunk in enumerate(np.array_split(order, n_clients)):
        tenant[chunk] = t
    return tenant


def _fill_empty(tenant: np.ndarray, n_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Move one user from the largest tenant into each empty one."""
    tenant = tenant.copy()
    for t in range(n_clients):
        sizes = np.bincount(tenant, minlength=n_clients)
        if sizes[t] == 0:
            donor = int(sizes.argmax())
            tenant[rng.choice(np.flatnonzero(tenant == donor))] = t
    return tenant


def assign_users(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int,
                 n_clients: int, scheme: str | Partition, rng: np.random.Generator
                 ) -> np.ndarray:
    """Tenant of every user (0..n_clients-1, none empty) under ``scheme``.

    ``users`` and ``items`` are the 0-based user and item index of every rating.
    """
    part = parse_partition(scheme)
    if not 1 <= n_clients <= n_users:
        raise ValueError(f"clients must be between 1 and the number of users ({n_users})")
    if part.kind == "random":
        return _chunks(rng.permutation(n_users), n_clients)
    if part.kind == "by-activity":
        activity = np.bincount(users, minlength=n_users)
        tiebreak = rng.permutation(n_users)
        return _chunks(np.lexsort((tiebreak, activity)), n_clients)
    if part.kind == "sizes":
        props = rng.dirichlet(np.full(n_clients, part.alpha))
        sizes = 1 + rng.multinomial(n_users - n_clients, props)
        return rng.permutation(np.repeat(np.arange(n_clients), sizes))
    label, share = user_labels(users, items, n_users, n_items,
                               min(n_clients, MAX_CLUSTERS), rng)
    if part.kind == "by-item-cluster":
        return _chunks(np.lexsort((rng.permutation(n_users), -share, label)), n_clients)
    # dirichlet: each label's users over the tenants in Dirichlet(alpha) proportions
    tenant = np.empty(n_users, dtype=np.int64)
    for g in np.unique(label):
        members = rng.permutation(np.flatnonzero(label == g))
        props = rng.dirichlet(np.full(n_clients, part.alpha))
        cuts = np.round(np.cumsum(props)[:-1] * members.size).astype(np.int64)
        for t, chunk in enumerate(np.split(members, cuts)):
            tenant[chunk] = t
    return _fill_empty(tenant, n_clients, rng)


def gini(x: np.ndarray) -> float:
    """Gini coefficient of non-negative values (0: all equal)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    if n == 0 or x.sum() == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ x / (n * x.sum()))


def skew(blocks, n_groups: int = MAX_CLUSTERS, seed: int = 0) -> dict[str, float]:
    """How non-IID a list of tenant rating blocks is (see the module docstring).

    ``size_gini`` over tenants' user counts; ``label_tv``: mean over tenants of the total
    variation distance between the tenant's ratings' item-cluster histogram and the
    federation's (item clusters from :func:`item_clusters`, seeded with ``seed``).
    """
    offsets = np.cumsum([0] + [b.n_users for b in blocks])
    users = np.concatenate([b.rows.astype(np.int64) + offsets[t] for t, b in enumerate(blocks)])
    items = np.concatenate([b.cols.astype(np.int64) for b in blocks])
    n_items = blocks[0].n_items
    ic = item_clusters(users, items, int(offsets[-1]), n_items, n_groups,
                       np.random.default_rng(seed))
    g = int(ic.max()) + 1
    overall = np.bincount(ic[items], minlength=g) / max(items.size, 1)
    tv = []
    for b in blocks:
        if b.nnz:
            h = np.bincount(ic[b.cols], minlength=g) / b.nnz
            tv.append(0.5 * np.abs(h - overall).sum())
    return {"size_gini": gini([b.n_users for b in blocks]),
            "label_tv": float(np.mean(tv)) if tv else 0.0}
