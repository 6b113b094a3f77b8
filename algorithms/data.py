"""Rating files, the random 80/20 split and the partition of users into tenants.

Used by the simulator, the CLI and the benchmarks; the service builds the same
:class:`Federation` from its database.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import re
import warnings
from pathlib import Path

import numpy as np

from algorithms._rng import PARTITION, SPLIT, derive_rng
from algorithms.block import RatingBlock

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


def _open_text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte-order mark (spreadsheet exports)
        raw = raw[3:]
    return raw.decode("latin-1")


#: field separators tried on the first line, in order ("::" first; None: whitespace)
SEPARATORS = ("::", "\t", ";", ",", None)


def _separator(first: str) -> str | None:
    """The first of :data:`SEPARATORS` that splits ``first`` into 3 or more fields."""
    for sep in SEPARATORS:
        if len(first.split(sep)) >= 3:
            return sep
    raise ValueError("line 1 has fewer than 3 fields (user, item, rating); fields may be "
                     "separated by ',', ';', tab, '::' or spaces")


def _unquote(field: str) -> str:
    field = field.strip()
    return field[1:-1] if len(field) >= 2 and field[0] == field[-1] == '"' else field


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _line_of(text: str, skip: int, row: int) -> int:
    """The 1-based line number of data row ``row`` (blank lines are not rows)."""
    count = -1
    for number, line in enumerate(text.splitlines(), start=1):
        if number <= skip or not line.strip():
            continue
        count += 1
        if count == row:
            return number
    return -1


def _ids(column: np.ndarray) -> np.ndarray:
    """int64 ids when every id is an integer (``"007"`` is 7), else the stripped strings."""
    column = np.char.strip(column)
    try:
        return column.astype(np.int64)
    except (ValueError, OverflowError):
        return column


def load_ratings(path: str | os.PathLike) -> Ratings:
    """Read MovieLens ``u.data`` (tab), ML-1M/10M ``::`` or delimited text
    ``user,item,rating[,more columns]``: comma, semicolon (then ``3,5`` is 3.5), tab or
    whitespace separated, the separator found on line 1.

    Gzip is detected from the magic bytes, a UTF-8 byte-order mark dropped and fields may
    be quoted (``"276725";"034545104X";"5"``). A header line is skipped when its third
    field is not a number; columns after the third (a timestamp) are ignored. Ids may be
    any integers or strings. A (user, item) pair rated more than once keeps its last
    rating (``Ratings.duplicates`` counts the others). A rating that is not a finite
    number, or a line with fewer than 3 fields, is a ``ValueError`` naming the line.
    """
    path = Path(path)
    text = _open_text(path)
    first = text.lstrip("\r\n").split("\n", 1)[0].rstrip("\r")
    if not first.strip():
        raise ValueError(f"{path}: no ratings (the file is empty)")
    try:
        sep = _separator(first)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    rating = _unquote(first.split(sep)[2])
    header = not _is_number(rating.replace(",", ".") if sep == ";" else rating)
    if sep == "::":
        text, sep = text.replace("::", "\t"), "\t"
    blank = len(text) - len(text.lstrip("\r\n"))  # leading blank lines are skipped too
    skip = text[:blank].count("\n") + int(header)
    fast = _numeric(text, sep, skip)
    if fast is not None:
        users, items, values = fast
    else:
        users, items, values = _textual(text, sep, skip, path)
    if values.shape[0] == 0:
        raise ValueError(f"{path}: no ratings")
    keep = _last_of_each_pair(users, items)
    duplicates = len(values) - keep.size
    if duplicates:
        users, items, values = users[keep], items[keep], values[keep]
    return Ratings(users, items, values, duplicates)


def _loadtxt(text: str, sep: str | None, skip: int, dtype) -> np.ndarray:
    with warnings.catch_warnings():  # numpy's note that blank lines are not rows
        warnings.simplefilter("ignore", UserWarning)
        return np.loadtxt(io.StringIO(text), delimiter=sep, skiprows=skip, usecols=(0, 1, 2),
                          dtype=dtype, quotechar='"', comments=None, ndmin=2)


def _numeric(text: str, sep: str | None, skip: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Integer ids and finite ratings read as numbers (8 bytes a field, as MovieLens
    files are), or None when the file has anything else (string ids, a bad rating...)."""
    try:
        arr = _loadtxt(text, sep, skip, np.float64)
    except ValueError:
        return None
    ids = arr[:, :2]
    if not (np.all(np.isfinite(arr)) and np.all(np.abs(ids) < 2.0 ** 53)
            and np.all(ids == np.round(ids))):
        return None
    return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2].copy()


def _textual(text: str, sep: str | None, skip: int, path: Path
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids as strings (integers when they all are) and ratings parsed one by one, naming
    the line of the first that is not a finite number."""
    try:
        arr = _loadtxt(text, sep, skip, str)
    except ValueError as exc:
        found = re.search(r"at row (\d+)", str(exc))  # 1-based, blank lines not counted
        where = f"line {_line_of(text, skip, int(found.group(1)) - 1)}: " if found else ""
        raise ValueError(f"{path}: {where}fewer than 3 fields (user, item, rating) "
                         f"separated by {sep or 'spaces'!r}") from None
    return _ids(arr[:, 0]), _ids(arr[:, 1]), _values(arr[:, 2], sep, path, text, skip)


def _values(column: np.ndarray, sep: str | None, path: Path, text: str, skip: int
            ) -> np.ndarray:
    """The ratings as float64; the first that is not a finite number is named by line."""
    column = np.char.strip(column)
    if sep == ";":
        column = np.char.replace(column, ",", ".")  # decimal commas go with semicolons
    try:
        values = column.astype(np.float64)
    except ValueError:
        values = np.array([float(v) if _is_number(v) else np.nan for v in column.tolist()])
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = int(bad[0])
        raise ValueError(f"{path}: line {_line_of(text, skip, row)}: rating "
                         f"{str(column[row])!r} is not a finite number ({bad.size} such "
                         f"rating(s) in the file)")
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
