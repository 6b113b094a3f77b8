"""Rating files, the random 80/20 split and the partition of users into tenants.

Used by the simulator, the CLI and the benchmarks; the service builds the same
:class:`Federation` from its database.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from algorithms.block import RatingBlock
from algorithms.rng import PARTITION, SPLIT, derive_rng

DATA_DIR_ENV = "FEDREC_DATA_DIR"


def data_dir() -> Path | None:
    """The folder holding the MovieLens sets (``ml-100k/u.data``, ``ml-1m/...``):
    $FEDREC_DATA_DIR when it names a folder, else None (no data set installed)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env and Path(env).is_dir() else None


@dataclasses.dataclass(frozen=True, eq=False)
class Ratings:
    """A flat list of (user, item, value) triples with the raw (external) ids.

    Ids are int64 when every id of the column is an integer, else strings.
    ``duplicates`` counts the (user, item) pairs of the file that were rated again
    further down (the last rating is kept, see :func:`load_ratings`)."""

    users: np.ndarray
    items: np.ndarray
    values: np.ndarray
    duplicates: int = 0

    def __len__(self) -> int:
        return int(self.values.shape[0])


def _ids(column: np.ndarray) -> np.ndarray:
    """int64 ids when every id is an integer (``"007"`` is 7), else the stripped strings."""
    column = np.char.strip(column.astype(str))
    try:
        return column.astype(np.int64)
    except (ValueError, OverflowError):
        return column


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_ratings(path: str | os.PathLike) -> Ratings:
    """Read a ratings file with the one ratings reader (:mod:`algorithms.ratings_io`, as
    the API reads an upload): MovieLens ``u.data`` (tab), ML-1M/10M ``::``, delimited text
    ``user,item,rating[,more columns]`` (comma, semicolon, tab or spaces, found on line 1;
    then ``3,5`` is 3.5 unless the delimiter is a comma), JSON ``{"ratings": [...]}``
    (``.json``) or Parquet, gzip-compressed or not.

    A header line is recognised by its names; columns after the third are ignored here.
    Ids may be any integers or strings. A (user, item) pair rated more than once keeps its
    last rating (``Ratings.duplicates`` counts the others). A rating that is not a finite
    number, or a line with fewer than 3 fields, is a ``ValueError`` naming the line.
    """
    path = Path(path)
    lines, users, items, ratings = _rows_of(path)
    if not ratings:
        raise ValueError(f"{path}: no ratings")
    users_a, items_a = _ids(np.array(users, dtype=object)), _ids(np.array(items, dtype=object))
    values = _values(ratings, lines, path)
    keep = _last_of_each_pair(users_a, items_a)
    duplicates = len(values) - keep.size
    if duplicates:
        users_a, items_a, values = users_a[keep], items_a[keep], values[keep]
    return Ratings(users_a, items_a, values, duplicates)


def _rows_of(path: Path) -> tuple[list[int], list, list, list]:
    """The file's rows as columns (line numbers, users, items, ratings, unvalidated); the
    first structural error is a ``ValueError`` naming its line."""
    from algorithms.ratings_io import RowError, UploadRejected, read_rows

    name = path.name.lower().removesuffix(".gz")
    media = "application/json" if name.endswith(".json") else "text/csv"
    lines, users, items, ratings = [], [], [], []
    try:
        with path.open("rb") as f:
            for row in read_rows(f, media, extra_columns=True):
                if isinstance(row, RowError):
                    raise ValueError(f"{path}: line {row.line}: {row.reason}")
                lines.append(row[0])
                users.append(row[1])
                items.append(row[2])
                ratings.append(row[3])
    except UploadRejected as exc:
        first = exc.errors[0] if exc.errors else None
        raise ValueError(f"{path}: " + (f"line {first.line}: {first.reason}" if first
                                        else str(exc))) from None
    return lines, users, items, ratings


def _values(column: list, lines: list[int], path: Path) -> np.ndarray:
    """The ratings as float64; the first that is not a finite number is named by line."""
    try:
        values = np.array(column, dtype=np.float64)
    except (ValueError, TypeError):
        values = np.array([float(v) if isinstance(v, int | float) or (
            isinstance(v, str) and _is_number(v)) else np.nan for v in column])
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = int(bad[0])
        raise ValueError(f"{path}: line {lines[row]}: rating {str(column[row]).strip()!r} "
                         f"is not a finite number ({bad.size} such rating(s) in the file)")
    return values


def _last_of_each_pair(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Sorted indices of the last occurrence of each (user, item) pair."""
    _, u = np.unique(users, return_inverse=True)
    _, i = np.unique(items, return_inverse=True)
    pair = u.astype(np.int64) * (int(i.max()) + 1) + i
    _, first_of_reversed = np.unique(pair[::-1], return_index=True)
    return np.sort(pair.size - 1 - first_of_reversed)


def load_movielens(name: str) -> Ratings:
    """``ml-100k`` or ``ml-1m`` from :func:`data_dir` (raises FileNotFoundError if absent)."""
    base = data_dir()
    files = {"ml-100k": "ml-100k/u.data", "ml-1m": "ml-1m/ratings_no_timestamps.dat.gz"}
    if base is None or not (base / files[name]).is_file():
        raise FileNotFoundError(f"{name} not found; set {DATA_DIR_ENV} to the data folder")
    return load_ratings(base / files[name])


def n_users_of(ratings: Ratings) -> int:
    return int(np.unique(ratings.users).shape[0])


def default_clients(default: int, ratings: Ratings) -> int:
    """The number of tenants a run takes when none was asked for: the algorithm's
    ``default``, or one tenant per user on data with fewer users than that."""
    return max(1, min(int(default), n_users_of(ratings)))


def check_rating_values(ratings: Ratings) -> None:
    """Refuse data a rating model cannot learn from: every rating the same value (implicit
    feedback, e.g. all 1s, has nothing to predict; the binary algorithms take it)."""
    values = np.unique(ratings.values)
    if values.shape[0] < 2:
        raise ValueError(f"all {len(ratings)} ratings are {values[0]:g}: a rating model has "
                         "nothing to predict; for implicit feedback (every rating 1) use a "
                         "binary algorithm (--algorithm felb or felb-mu)")


@dataclasses.dataclass(frozen=True, eq=False)
class Federation:
    """Ratings split into train/test and partitioned by user into tenants.

    ``train[i]`` and ``test[i]`` are tenant i's blocks over the same local users
    (``user_ids[i]`` maps local row -> raw user id) and the shared items (``item_ids``
    maps column -> raw item id). ``scale`` is the (min, max) rating.
    """

    train: list[RatingBlock]
    test: list[RatingBlock]
    user_ids: list[np.ndarray]
    item_ids: np.ndarray
    scale: tuple[float, float]

    @property
    def n_clients(self) -> int:
        return len(self.train)

    @property
    def n_items(self) -> int:
        return int(self.item_ids.shape[0])


def split_mask(n: int, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean test mask with round(test_fraction * n) entries chosen uniformly."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError("test_fraction must be in [0, 1)")
    mask = np.zeros(n, dtype=bool)
    mask[rng.permutation(n)[: int(round(test_fraction * n))]] = True
    return mask


def build_federation(ratings: Ratings, n_clients: int, seed: int,
                     test_fraction: float = 0.2, partition: str = "random") -> Federation:
    """Split ratings at random (seeded) and partition users into ``n_clients`` disjoint,
    near-equal random blocks, as in the FedMC-ADMM and RFRec experiments.

    ``partition`` chooses another (non-IID) grouping of users into tenants
    (:mod:`algorithms.partition`: ``by-activity``, ``by-item-cluster``, ``dirichlet:A``,
    ``sizes:A``); the train/test split is the same under every partition."""
    from algorithms.partition import assign_users, parse_partition

    scheme = parse_partition(partition)
    item_ids, cols = np.unique(ratings.items, return_inverse=True)
    user_ids, users = np.unique(ratings.users, return_inverse=True)
    if not 1 <= n_clients <= user_ids.shape[0]:
        raise ValueError(f"clients must be between 1 and the number of users ({len(user_ids)})")
    rng = derive_rng(seed, 0, SPLIT)
    test = split_mask(len(ratings), test_fraction, rng)
    if scheme.kind == "random":
        tenant_of_user = np.empty(user_ids.shape[0], dtype=np.int64)
        for t, chunk in enumerate(np.array_split(rng.permutation(user_ids.shape[0]),
                                                 n_clients)):
            tenant_of_user[chunk] = t
    else:
        tenant_of_user = assign_users(users, cols, user_ids.shape[0], item_ids.shape[0],
                                      n_clients, scheme, derive_rng(seed, 0, PARTITION))
    order = np.argsort(tenant_of_user, kind="stable")
    local_row = np.empty_like(order)
    bounds = np.searchsorted(tenant_of_user[order], np.arange(n_clients + 1))
    for t in range(n_clients):
        local_row[order[bounds[t]:bounds[t + 1]]] = np.arange(bounds[t + 1] - bounds[t])
    tenant = tenant_of_user[users]
    scale = (float(ratings.values.min()), float(ratings.values.max()))
    block_scale = scale if scale[0] < scale[1] else None
    n_items = item_ids.shape[0]
    train_blocks, test_blocks, uids = [], [], []
    by_tenant = np.argsort(tenant, kind="stable")
    tb = np.searchsorted(tenant[by_tenant], np.arange(n_clients + 1))
    for t in range(n_clients):
        idx = by_tenant[tb[t]:tb[t + 1]]
        m = int(bounds[t + 1] - bounds[t])
        rows, c, v, is_test = local_row[users[idx]], cols[idx], ratings.values[idx], test[idx]
        train_blocks.append(RatingBlock(rows[~is_test], c[~is_test], v[~is_test], m, n_items,
                                        block_scale))
        test_blocks.append(RatingBlock(rows[is_test], c[is_test], v[is_test], m, n_items,
                                       block_scale))
        uids.append(user_ids[order[bounds[t]:bounds[t + 1]]])
    return Federation(train_blocks, test_blocks, uids, item_ids, scale)


def split_block(block: RatingBlock, test_fraction: float, rng: np.random.Generator
                ) -> tuple[RatingBlock, RatingBlock]:
    """(train, test) of one tenant's block, ``round(test_fraction * nnz)`` entries held out."""
    test = split_mask(block.nnz, test_fraction, rng)
    return block.subset(~test), block.subset(test)


def federation_from_tenants(blocks: list[RatingBlock], user_ids: list[np.ndarray],
                            item_ids: np.ndarray, seed: int, test_fraction: float = 0.2,
                            scale: tuple[float, float] = (1.0, 5.0)) -> Federation:
    """A federation whose tenants are given (the service's case): each tenant's held-out
    split is drawn from its own stream ``(seed, tenant index, SPLIT)``. A block without a
    declared scale gets ``scale`` (the algorithms normalise ratings by it)."""
    train, test = [], []
    for i, block in enumerate(blocks):
        tr, te = tenant_split(block, i, seed, test_fraction, scale)
        train.append(tr)
        test.append(te)
    return Federation(train, test, list(user_ids), np.asarray(item_ids), scale)


def tenant_split(block: RatingBlock, index: int, seed: int, test_fraction: float,
                 scale: tuple[float, float]) -> tuple[RatingBlock, RatingBlock]:
    """(train, test) of tenant ``index`` of a job, as :func:`federation_from_tenants` draws
    it; a tenant agent calls this on its own ratings to get the same split."""
    if block.scale is None and scale[0] < scale[1]:
        block = block.with_scale(scale)
    return split_block(block, test_fraction, derive_rng(seed, index, SPLIT))
