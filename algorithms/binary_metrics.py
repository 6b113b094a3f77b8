"""Binary data: binarised federations and the metrics of Felb (the Felb paper, Sec. 4).

:func:`binarise` turns a rating federation into the Boolean one the paper factorises
(rating >= 3.5 -> 1, as for MovieLens in Sec. 4.2 and Apx. C); the blocks then list the
1s only and every other entry, rated low or unrated, is 0. :func:`reconstruction_quality`
gives the paper's F1 and RMSD of the Boolean reconstruction against the training matrix;
:func:`ranking_quality` gives precision@k and recall@k of the top-k unseen items against
the held-out positives, for any algorithm (binary or rating model) on the same users.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from algorithms.base import Algorithm
from algorithms.block import RatingBlock
from algorithms.data import Federation
from algorithms.messages import Message
from algorithms.recommend import top_k
from algorithms.simulate import SimulationResult

_CHUNK = 1024  # users scored at once: a chunk x n dense score matrix at most


def _positives(block: RatingBlock, threshold: float) -> RatingBlock:
    keep = block.vals >= threshold
    return RatingBlock(block.rows[keep], block.cols[keep], np.ones(int(keep.sum())),
                       block.n_users, block.n_items)


def binarise(fed: Federation, threshold: float = 3.5) -> Federation:
    """The same tenants, users, items and train/test split with ratings >= threshold -> 1.

    Entries below the threshold are dropped: a Boolean block lists its 1s only and every
    entry it does not list is 0 (fully observed, as in the paper). ``scale`` becomes (0, 1).
    """
    return Federation([_positives(b, threshold) for b in fed.train],
                      [_positives(b, threshold) for b in fed.test],
                      fed.user_ids, fed.item_ids, (0.0, 1.0))


def f1_and_rmsd(tp: int, fp: int, fn: int, n_entries: int) -> tuple[float, float]:
    """F1 = 2 TP / (2 TP + FP + FN) and RMSD = sqrt((FP + FN) / n_entries) of a Boolean
    reconstruction (Sec. 4: "RMSD and the F1 score between data and reconstruction").

    F1 is 1 when there is nothing to find and nothing is predicted.
    """
    if n_entries <= 0:
        raise ValueError("n_entries must be positive")
    denom = 2 * tp + fp + fn
    f1 = 1.0 if denom == 0 else 2.0 * tp / denom
    return f1, float(np.sqrt((fp + fn) / n_entries))


def _row_chunks(n_users: int):
    for start in range(0, n_users, _CHUNK):
        yield start, min(start + _CHUNK, n_users)


def _confusion(a: np.ndarray, b: np.ndarray, block: RatingBlock, cut: float
               ) -> tuple[int, int, int]:
    """TP, FP, FN of ``(A @ B >= cut)`` against the 1s of ``block``, chunk by chunk."""
    tp = predicted = 0
    ones = block.vals >= 0.5
    for start, stop in _row_chunks(block.n_users):
        pred = (a[start:stop] @ b) >= cut
        sel = ones & (block.rows >= start) & (block.rows < stop)
        tp += int(pred[block.rows[sel] - start, block.cols[sel]].sum())
        predicted += int(pred.sum())
    return tp, predicted - tp, int(ones.sum()) - tp


def reconstruction_quality(alg: Algorithm, global_msg: Message,
                           local_states: Sequence[Message], blocks: Sequence[RatingBlock],
                           cut: float = 0.5) -> tuple[float, float]:
    """F1 and RMSD of the reconstruction ``A_i @ B >= cut`` over all tenants' full blocks.

    With Felb's :func:`algorithms.felb.factors` this is exactly the Boolean product of
    the final Boolean factors. Entries are every (user, item) pair, listed or not.
    """
    tp = fp = fn = cells = 0
    for state, block in zip(local_states, blocks, strict=True):
        a, b = alg.factors(global_msg, state)
        t, p, n = _confusion(a, b, block, cut)
        tp, fp, fn, cells = tp + t, fp + p, fn + n, cells + block.n_users * block.n_items
    return f1_and_rmsd(tp, fp, fn, cells)


def _component_masks(b: np.ndarray) -> np.ndarray:
    """Each row of a Boolean (rows x k) matrix as ceil(k / 64) uint64 words of bits."""
    words = -(-b.shape[1] // 64)
    padded = np.zeros((b.shape[0], words * 64), dtype=bool)
    padded[:, :b.shape[1]] = b
    bits = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))
    return np.stack([np.bitwise_or.reduce(np.where(padded[:, 64 * w:64 * (w + 1)], bits,
                                                   np.uint64(0)), axis=1)
                     for w in range(words)], axis=1)


def boolean_confusion(u: np.ndarray, v: np.ndarray, block: RatingBlock
                      ) -> tuple[int, int, int]:
    """TP, FP, FN of the Boolean product ``u o v`` (m x k and k x n Boolean) against the
    1s of ``block``, without forming the m x n product.

    Each user and each item becomes a bit mask of its components; (t, j) is predicted
    exactly when the masks share a bit. TP checks the listed 1s only; the number of
    predicted entries counts pairs of distinct user and item masks, weighted by how many
    users and items carry them (tenants have a few thousand distinct masks at most).
    """
    mu, mv = _component_masks(np.asarray(u, bool)), _component_masks(np.asarray(v, bool).T)
    ones = block.vals >= 0.5
    hit = (mu[block.rows[ones]] & mv[block.cols[ones]]) != 0
    tp = int(hit.any(axis=1).sum())
    um, uc = np.unique(mu, axis=0, return_counts=True)
    vm, vc = np.unique(mv, axis=0, return_counts=True)
    step = max(1, (1 << 22) // max(vm.shape[0], 1))
    predicted = 0
    for s in range(0, um.shape[0], step):
        cover = ((um[s:s + step, None, :] & vm[None, :, :]) != 0).any(axis=2)
        predicted += int(uc[s:s + step] @ (cover @ vc))
    return tp, predicted - tp, int(ones.sum()) - tp


def boolean_quality(pairs: Sequence[tuple[np.ndarray, np.ndarray]],
                    blocks: Sequence[RatingBlock]) -> tuple[float, float]:
    """F1 and RMSD of each tenant's Boolean product ``U_i o V_i`` (``pairs``) against its
    block: what :func:`reconstruction_quality` gives for Felb's factors at cut 1/2, in
    time linear in the listed entries instead of users x items."""
    tp = fp = fn = cells = 0
    for (u, v), block in zip(pairs, blocks, strict=True):
        t, p, n = boolean_confusion(u, v, block)
        tp, fp, fn, cells = tp + t, fp + p, fn + n, cells + block.n_users * block.n_items
    return f1_and_rmsd(tp, fp, fn, cells)


def _hits_per_user(scores: np.ndarray, seen: RatingBlock, test: RatingBlock, start: int,
                   users: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(hits in the top k, number of held-out positives) of each user in ``users``."""
    seen_csr, test_csr = seen.csr, test.csr
    hits = np.zeros(users.size)
    relevant = np.zeros(users.size)
    for n, t in enumerate(users):
        exclude = seen_csr.indices[seen_csr.indptr[t]:seen_csr.indptr[t + 1]]
        items, _ = top_k(scores[t - start], k, exclude)
        wanted = test_csr.indices[test_csr.indptr[t]:test_csr.indptr[t + 1]]
        hits[n] = np.isin(items, wanted).sum()
        relevant[n] = wanted.size
    return hits, relevant


def ranking_quality(alg: Algorithm, global_msg: Message, local_states: Sequence[Message],
                    test_blocks: Sequence[RatingBlock], seen_blocks: Sequence[RatingBlock],
                    k: int = 10) -> tuple[float, float, int]:
    """Mean precision@k and recall@k over users with at least one held-out positive.

    Each user's items are ranked by ``A[t] @ B`` (ties by item index, as served by
    :func:`algorithms.recommend.top_k`), excluding the items listed for that user in
    ``seen_blocks``. precision = hits / k, recall = hits / (number of held-out positives).
    ``test_blocks`` list the held-out positives (a binarised federation's ``test``).
    Returns (precision, recall, number of users evaluated).
    """
    hits, relevant = [], []
    for state, test, seen in zip(local_states, test_blocks, seen_blocks, strict=True):
        a, b = alg.factors(global_msg, state)
        has = np.flatnonzero(np.bincount(test.rows, minlength=test.n_users) > 0)
        for start, stop in _row_chunks(test.n_users):
            users = has[(has >= start) & (has < stop)]
            if users.size:
                h, r = _hits_per_user(a[start:stop] @ b, seen, test, start, users, k)
                hits.append(h)
                relevant.append(r)
    if not hits:
        return float("nan"), float("nan"), 0
    h, r = np.concatenate(hits), np.concatenate(relevant)
    return float(np.mean(h / k)), float(np.mean(h / r)), int(h.size)


@dataclasses.dataclass(frozen=True)
class BinaryReport:
    """The binary metrics of one run (what ``fedrec simulate --algorithm felb`` prints)."""

    f1: float  #: F1 of the Boolean reconstruction of the training matrix
    rmsd: float  #: root mean squared deviation of that reconstruction
    precision_at_k: float  #: mean precision@k on the held-out positives
    recall_at_k: float  #: mean recall@k on the held-out positives
    k: int
    users_ranked: int  #: users with at least one held-out positive

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def binary_report(alg: Algorithm, result: SimulationResult, fed: Federation,
                  seen: Sequence[RatingBlock] | None = None, k: int = 10) -> BinaryReport:
    """F1 and RMSD on ``fed.train`` and precision/recall@k on ``fed.test``.

    ``fed`` is the binarised federation the run was trained on. ``seen`` are the blocks
    whose items are excluded from each user's ranking (default ``fed.train``, the training
    positives; pass the rating federation's ``train`` to exclude every rated item).
    """
    f1, rmsd = reconstruction_quality(alg, result.global_msg, result.local_states, fed.train)
    p, r, n = ranking_quality(alg, result.global_msg, result.local_states, fed.test,
                              fed.train if seen is None else seen, k)
    return BinaryReport(f1, rmsd, p, r, k, n)
