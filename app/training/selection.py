"""Model selection on a validation carve-out, and which model serves the lists.

Run length. A job with ``validation_fraction > 0`` trains on the rest of each hosted
tenant's training ratings (:func:`algorithms.tuning.validation_split`, the carve-out
``fedrec tune`` uses) and scores every round on the carve-out: NDCG@10 for a ranking
model, RMSE for a rating model (Cremonesi, Koren, Turrin, "Performance of recommender
algorithms on top-N recommendation tasks": a model is chosen by the measure of the task
it serves). It stops once :data:`PATIENCE` rounds in a row failed to beat its best
round, so a model that overfits with rounds does not run on to the configured length.
A ranking model with a popularity prior (ials) also gets the prior's weight chosen there
when the job ends (:func:`choose_prior`): how much the popularity list should count is a
property of the data, not a constant.

A DP job does not select: choosing the round on the tenants' validation ratings would be
a data-dependent release the ledger never charged. Its run length is the configured one
(public), and its report says so.

Lists. When a job completes, its model's precision and NDCG@10 on the held-out split are
set beside those of a most-popular list (each tenant's own training counts, the same
split); a model that loses does not serve lists: popularity does, with the reason
(:func:`lists_decision`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from algorithms import Message, registry
from algorithms.base import Algorithm
from algorithms.block import RatingBlock
from algorithms.ranking import (
    RankingReport,
    RankingSums,
    pooled_ndcg,
    relevance_threshold,
    tenant_ranking,
)
from algorithms.simulate import combine_errors, tenant_errors
from algorithms.tuning import validation_split

#: share of each hosted tenant's training ratings a job that selects carves out
DEFAULT_FRACTION = 0.1
#: rounds in a row without a better validation score before a selecting job stops
PATIENCE = 3
#: k of the validation NDCG and of the held-out comparison with popularity
K = 10

NOT_SELECTED_DP = ("not selected: the job is differentially private, and choosing its "
                   "round on the tenants' validation ratings would be a data-dependent "
                   "release the ledger does not charge; it runs its configured rounds")
NOT_SELECTED_AGENTS = ("not selected: agent tenants keep their ratings, so no validation "
                       "carve-out is held here; the job runs its configured rounds")
NOT_SELECTED_OFF = "not selected: validation_fraction is 0; the job runs its configured rounds"


def metric_of(algorithm: str) -> str:
    """The validation metric of a model: "ndcg" (ranking models) or "rmse"."""
    return "ndcg" if registry.model_kind(algorithm) == "ranking" else "rmse"


def carve(train: RatingBlock, seed: int, client: int, fraction: float
          ) -> tuple[RatingBlock, RatingBlock | None]:
    """(the ratings a job fits on, its validation carve-out or None when it selects
    nothing)."""
    if fraction <= 0:
        return train, None
    return validation_split(train, seed, client, fraction)


def initial(algorithm: str, fraction: float, private: bool, agents: bool) -> dict[str, Any]:
    """The ``selection`` a job starts with: what it will select on, or why it does not."""
    if fraction > 0:
        return {"metric": metric_of(algorithm), "validation_fraction": fraction,
                "patience": PATIENCE, "best_round": None, "best": None, "history": []}
    why = NOT_SELECTED_DP if private else NOT_SELECTED_AGENTS if agents else NOT_SELECTED_OFF
    return {"metric": None, "reason": why}


def validation_score(alg: Algorithm, glob: Message, parts: Iterable[tuple[Message,
                     RatingBlock, RatingBlock, tuple[float, float]]], metric: str) -> float:
    """Pooled validation score over tenants' (local state, fit block, carve-out, scale):
    RMSE, or NDCG@10 with relevance at the scale's default cut."""
    parts = list(parts)
    if not parts:
        return float("nan")
    if metric == "rmse":
        errs = [tenant_errors(alg, glob, state, valid, scale)
                for state, _, valid, scale in parts]
        return float(combine_errors(errs)[0])
    return pooled_ndcg(alg.factors, glob, parts, K)


def choose_prior(alg: Algorithm, glob: Message, parts: Iterable[tuple[Message, RatingBlock,
                 RatingBlock, tuple[float, float]]]) -> tuple[Message, dict[str, Any] | None]:
    """(the model with its popularity prior's beta chosen on the validation carve-out, the
    record of the choice) for a model with such a prior (ials, :func:`algorithms.ials.
    choose_prior_weight`: the beta of best pooled NDCG@10 over the tenants' (local state,
    fit block, carve-out, scale)); (``glob``, None) for any other model. Only a job that
    selects calls it, i.e. never a DP job: the choice reads the carve-out uncharged."""
    from algorithms.ials import GlobalModel, choose_prior_weight

    parts = list(parts)
    if not isinstance(glob, GlobalModel) or glob.prior is None or not parts:
        return glob, None
    states, fits, valids, scales = (list(x) for x in zip(*parts, strict=True))
    beta, scores = choose_prior_weight(glob, states, fits, valids, scales)
    record = {"default": glob.prior_weight, "chosen": beta,
              "validation_ndcg": [[b, _num(v)] for b, v in scores.items()]}
    return glob.replace(prior_weight=beta), record


def better(metric: str, value: float, best: float | None) -> bool:
    """``value`` beats ``best`` (lower RMSE, higher NDCG; a NaN never does)."""
    if not np.isfinite(value):
        return False
    if best is None:
        return True
    return value < best if metric == "rmse" else value > best


def update(selection: dict[str, Any], round_: int, value: float) -> tuple[dict[str, Any],
                                                                          bool]:
    """(the selection after round ``round_`` scored ``value``, whether the job stops)."""
    out = {**selection, "history": [*selection["history"], [round_, _num(value)]]}
    if better(out["metric"], value, out["best"]):
        out["best_round"], out["best"] = round_, float(value)
    # no finite score yet (e.g. no validation rating): the configured rounds run
    stop = out["best_round"] is not None and round_ - out["best_round"] >= out["patience"]
    if stop:
        out["stopped_at"] = round_
        out["reason"] = (f"stopped after round {round_}: validation {out['metric']} has not "
                         f"improved on round {out['best_round']} for {out['patience']} "
                         "rounds")
    return out, stop


def popularity_sums(fit: RatingBlock, test: RatingBlock, scale: tuple[float, float]
                    ) -> RankingSums:
    """Ranking sums of a most-popular list (items by their count of the tenant's training
    ratings) on the same held-out split as the model."""
    counts = np.bincount(fit.cols, minlength=fit.n_items).astype(np.float64)
    ones = np.ones((max(fit.n_users, test.n_users), 1))
    return tenant_ranking(ones, counts[None, :], fit, test, relevance_threshold(scale), K)


def popularity_ranking(clients: list, block: Callable[[Any, str], RatingBlock],
                       scales: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """``{"overall": ..., "per_tenant": ...}`` of popularity, as :func:`job_ranking`."""
    total, per_tenant = None, {}
    for jc in clients:
        sums = popularity_sums(block(jc, "train"), block(jc, "test"), scales[jc.tenant_id])
        per_tenant[str(jc.tenant_id)] = RankingReport.from_sums(
            sums, K, relevance_threshold(scales[jc.tenant_id])).as_dict()
        total = sums if total is None else total.add(sums)
    overall = RankingReport.from_sums(total or RankingSums(0), K, None).as_dict()
    return {"overall": overall, "per_tenant": per_tenant}


HELD_OUT_NOTE = ("the choice reads the held-out ratings of the job's hosted tenants: a "
                 "one-bit, data-dependent decision outside the DP guarantee")


def lists_decision(algorithm: str, model: dict[str, Any] | None,
                   popularity: dict[str, Any] | None, policy: str = "auto"
                   ) -> dict[str, Any]:
    """Who serves the lists of the job's tenants: the model when its NDCG@10 on the
    held-out split is at least popularity's, else popularity; with both figures and the
    reason. ``policy`` "model" (the job's ``lists``) keeps the model whatever the figures."""
    m = (model or {}).get("ndcg_at_k")
    p = (popularity or {}).get("ndcg_at_k")
    figures = {"policy": policy, "model": _figures(model),
               "popularity": _figures(popularity), "note": HELD_OUT_NOTE}
    if policy == "model":
        return {"lists": "model", **figures,
                "reason": "the job's lists setting is 'model': its model serves the lists "
                          "whatever the comparison with popularity"}
    if m is None or p is None:
        return {"lists": "model", **figures,
                "reason": "no held-out ranking to compare here (agent tenants evaluate on "
                          "their own machines, or no hosted tenant has a relevant held-out "
                          "rating): the model serves the lists"}
    if m >= p:
        return {"lists": "model", **figures,
                "reason": f"{algorithm} NDCG@{K} {m:.4f} >= popularity {p:.4f} on the "
                          "held-out split: the model serves the lists"}
    return {"lists": "popularity", **figures,
            "reason": f"{algorithm} NDCG@{K} {m:.4f} < popularity {p:.4f} on the held-out "
                      "split: popularity serves the lists"}


def _figures(report: dict[str, Any] | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {key: report.get(key) for key in ("precision_at_k", "ndcg_at_k", "recall_at_k",
                                             "users_ranked")}


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None
