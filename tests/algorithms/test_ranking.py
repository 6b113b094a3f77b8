"""Ranking metrics (precision/recall/NDCG@k, coverage) against a brute-force computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms import registry
from algorithms.block import RatingBlock
from algorithms.data import build_federation
from algorithms.ranking import (
    ranking_report,
    relevance_threshold,
    tenant_ranking,
    top_k_rows,
)
from algorithms.recommend import top_k
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings


def _brute(a, b, train: RatingBlock, test: RatingBlock, threshold: float, k: int):
    """One user at a time with the served top_k and the textbook formulas."""
    prec, rec, ndcg, shown = [], [], [], set()
    for t in range(test.n_users):
        rel = {int(c) for r, c, v in zip(test.rows, test.cols, test.vals, strict=True)
               if r == t and v >= threshold}
        if not rel:
            continue
        seen = np.array([c for r, c in zip(train.rows, train.cols, strict=True) if r == t],
                        dtype=int)
        items, _ = top_k(a[t] @ b, k, seen)
        shown.update(int(i) for i in items)
        h = [1.0 if int(i) in rel else 0.0 for i in items]
        prec.append(sum(h) / k)
        rec.append(sum(h) / len(rel))
        dcg = sum(x / math.log2(j + 2) for j, x in enumerate(h))
        idcg = sum(1 / math.log2(j + 2) for j in range(min(len(rel), k)))
        ndcg.append(dcg / idcg)
    return np.mean(prec), np.mean(rec), np.mean(ndcg), len(prec), shown


def _random_tenant(rng, m=37, n=29, nnz=400):
    flat = rng.choice(m * n, size=nnz, replace=False)
    rows, cols = flat // n, flat % n
    vals = rng.integers(1, 6, size=nnz).astype(float)
    is_test = rng.random(nnz) < 0.3
    train = RatingBlock(rows[~is_test], cols[~is_test], vals[~is_test], m, n)
    test = RatingBlock(rows[is_test], cols[is_test], vals[is_test], m, n)
    return train, test


@pytest.mark.parametrize("k", [1, 5, 10, 40])
def test_tenant_ranking_matches_brute_force(k):
    rng = np.random.default_rng(k)
    train, test = _random_tenant(rng)
    a, b = rng.normal(size=(37, 3)), rng.normal(size=(3, 29))
    # k = 40 > items left for every user: excluded (training) items must never count
    s = tenant_ranking(a, b, train, test, 3.5, k)
    p, r, n, users, shown = _brute(a, b, train, test, 3.5, k)
    assert s.users == users > 0
    assert s.precision / s.users == pytest.approx(p, abs=1e-12)
    assert s.recall / s.users == pytest.approx(r, abs=1e-12)
    assert s.ndcg / s.users == pytest.approx(n, abs=1e-12)
    assert set(np.flatnonzero(s.recommended).tolist()) == shown


def test_ties_are_broken_by_lower_item_index_as_served():
    scores = np.array([[1.0, 3.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])
    assert top_k_rows(scores, 3).tolist() == [[1, 2, 3], [0, 1, 2]]
    for row in scores:
        assert top_k_rows(row[None], 3)[0].tolist() == top_k(row, 3)[0].tolist()


def test_perfect_and_worst_rankings():
    # one user, 4 items; item 3 was trained on; items 0 and 2 relevant in the test split
    train = RatingBlock([0], [3], [5.0], 1, 4)
    test = RatingBlock([0, 0, 0], [0, 1, 2], [5.0, 1.0, 4.0], 1, 4)
    b = np.eye(4)
    best = tenant_ranking(np.array([[3.0, 1.0, 2.0, 9.0]]), b, train, test, 3.5, 2)
    assert (best.precision, best.recall, best.ndcg) == (1.0, 1.0, pytest.approx(1.0))
    worst = tenant_ranking(np.array([[1.0, 3.0, 2.0, 9.0]]), b, train, test, 3.5, 1)
    assert (worst.precision, worst.recall, worst.ndcg) == (0.0, 0.0, 0.0)
    # relevant at ranks 2 and 3 of k = 3: DCG (1/log2 3 + 1/log2 4) over IDCG (1 + 1/log2 3)
    mid = tenant_ranking(np.array([[2.0, 3.0, 1.0, 9.0]]), b, train, test, 3.5, 3)
    expect = (1 / math.log2(3) + 0.5) / (1 + 1 / math.log2(3))
    assert mid.ndcg == pytest.approx(expect) and mid.precision == pytest.approx(2 / 3)
    assert best.recommended.tolist() == [True, False, True, False]


def test_relevance_threshold_follows_the_scale():
    assert relevance_threshold((1, 5)) == 3.5
    assert relevance_threshold((0, 1)) == 0.625
    assert relevance_threshold((-10, 10)) == 2.5


def test_report_of_a_trained_model_beats_random_scores():
    r = generate_ratings(120, 80, 3000, rank=3, noise=0.2, seed=1)
    fed = build_federation(r, 4, seed=0)
    alg = registry.get("fedmc-admm")
    res = simulate(alg, alg.config(), fed, rounds=30, per_round=4, seed=0, evaluate_every=30)
    rep = ranking_report(alg, res.global_msg, res.local_states, fed.train, fed.test,
                         fed.scale, k=5)
    # the same metric pooled by brute force over tenants
    rows = []
    for st, tr, te in zip(res.local_states, fed.train, fed.test, strict=True):
        a, b = alg.factors(res.global_msg, st)
        p, rc, n, u, _ = _brute(a, b, tr, te, 3.5, 5)
        rows.append((p * u, rc * u, n * u, u))
    tot = np.sum(rows, axis=0)
    assert rep.users_ranked == tot[3]
    assert rep.precision_at_k == pytest.approx(tot[0] / tot[3])
    assert rep.ndcg_at_k == pytest.approx(tot[2] / tot[3])
    rng = np.random.default_rng(0)
    rand = [tenant_ranking(rng.normal(size=(tr.n_users, 1)), rng.normal(size=(1, tr.n_items)),
                           tr, te, 3.5, 5) for tr, te in zip(fed.train, fed.test, strict=True)]
    rand_ndcg = sum(s.ndcg for s in rand) / sum(s.users for s in rand)
    assert rep.ndcg_at_k > rand_ndcg + 0.05, (rep, rand_ndcg)
    assert 0 < rep.coverage <= 1


def _top_k_rows_with_the_tie_rule_everywhere(scores, k):
    """The former top_k_rows: the lowest-index tie rule applied to every row."""
    n_rows, n = scores.shape
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    cut = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
    above, tied = scores > cut, scores == cut
    need = k - above.sum(axis=1, keepdims=True)
    take = above | (tied & (np.cumsum(tied, axis=1) <= need))
    cand = np.nonzero(take)[1].reshape(n_rows, k)
    cs = np.take_along_axis(scores, cand, axis=1)
    return np.take_along_axis(cand, np.lexsort((cand, -cs), axis=1), axis=1)


@pytest.mark.parametrize("k", [1, 5, 10])
def test_top_k_rows_equals_the_tie_rule_on_every_row(k):
    """Rows without a tie beyond the k-th take argpartition's k directly; the result
    equals the tie rule applied to every row: continuous scores, heavy ties (few distinct
    values), rows with fewer than k finite scores (-inf for excluded items)."""
    rng = np.random.default_rng(k)
    scores = np.vstack([rng.normal(size=(40, 300)),
                        rng.integers(0, 4, size=(40, 300)).astype(float)])
    scores[rng.random(scores.shape) < 0.3] = -np.inf
    scores[5, 3:] = -np.inf  # three finite scores only
    scores[6] = -np.inf
    np.testing.assert_array_equal(top_k_rows(scores, k),
                                  _top_k_rows_with_the_tie_rule_everywhere(scores, k))
