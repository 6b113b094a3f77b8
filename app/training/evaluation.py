"""Ranking metrics of a job's final model, computed inside the tenants' evaluation.

Same definitions and code as ``fedrec simulate`` (:mod:`algorithms.ranking`): each
tenant's held-out ratings at or above 62.5% of its declared scale (3.5 on 1-5 stars) are
the relevant items, its training items are excluded from the ranking, and the figures are
the mean over users with a relevant held-out item. Like the RMSE of a round, this reads
each tenant's local state and blocks: the tenants' own evaluation reported to the job,
not part of the server step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from algorithms import Message
from algorithms.base import Algorithm
from algorithms.block import RatingBlock
from algorithms.ranking import RankingReport, RankingSums, relevance_threshold, tenant_ranking

#: k of the reported precision@k, recall@k and NDCG@k
RANKING_K = 10


def job_ranking(alg: Algorithm, glob: Message, clients: list, locals_: dict[int, Message],
                scales: dict[int, tuple[float, float]],
                block: Callable[[Any, str], RatingBlock], k: int = RANKING_K
                ) -> dict[str, Any]:
    """``{"overall": {...}, "per_tenant": {tenant id: {...}}}`` of the final round."""
    total = None
    per_tenant: dict[str, Any] = {}
    for jc in clients:
        a, b = alg.factors(glob, locals_[jc.client_index])
        scale = scales[jc.tenant_id]
        cut = relevance_threshold(scale)
        sums = tenant_ranking(a, b, block(jc, "train"), block(jc, "test"), cut, k)
        per_tenant[str(jc.tenant_id)] = {
            **RankingReport.from_sums(sums, k, cut).as_dict()}
        total = sums if total is None else total.add(sums)
    overall = RankingReport.from_sums(total or RankingSums(0), k, None).as_dict()
    return {"overall": overall, "per_tenant": per_tenant}
