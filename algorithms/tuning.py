"""Hyper-parameter search on a validation carve-out of the training ratings (``fedrec tune``).

The test ratings are never read: :func:`tune` takes the federation's ``train`` blocks
only, carves 10% of each tenant's training ratings out as validation
(:func:`validation_federation`, seeded per tenant, the carve-out the benchmarks tune
the centralised ALS ceiling on), trains on the other 90% and scores on the carve-out.

The search is successive halving with the run length as the resource, over a Latin
hypercube of draws from the algorithm's declared space (``<Config>.search_space``, next to
each config: field -> ``("log", lo, hi)`` for a log-uniform draw or ``("choice",
[values])``), widened here by the inner steps per round (:func:`extended_space`) and with
rank and the fixed lambda drawn jointly (:func:`couple_rank_and_lambda`: a larger rank
gets a proportionally stronger lambda; a per-rating weight is not scaled). ``trials``
configs, the recommended default first (then the default with 2N inner steps,
:func:`run_length_anchors`, and the config's declared anchors, :func:`declared_anchors`),
run for ``rounds / eta^(rungs-1)`` rounds; the best
``1/eta`` of the others (always with the default and the declared anchors) *continue*
their runs to ``eta`` times the rounds,
until the last rung reaches ``rounds``, the longest run the search may choose. The choice
is the config and run length (a rung) with the lowest validation RMSE (``metric="ndcg"``:
the highest NDCG@10, for ranking models) among the finalists; the default is scored at
every rung, so the choice beats or ties the default at each of those run lengths by
construction. A
wall-clock budget is planned for: a rung that would not fit is shortened, and what was
cut is reported (``TuneResult.cuts``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.block import RatingBlock
from algorithms.data import Federation, split_mask
from algorithms.rng import derive_rng
from algorithms.simulate import RoundState, simulate

#: stream of the validation carve-out (tenant i uses ``(seed, 0, VALIDATION + i)``)
VALIDATION = 10_000
#: stream of the random search's draws
SEARCH = 30_000


def validation_federation(fed: Federation, seed: int = 0, fraction: float = 0.1
                          ) -> Federation:
    """Train on ``1 - fraction`` of each tenant's *training* ratings, validate on the rest.

    Only ``fed.train`` is read; the returned federation's ``test`` is the carve-out.
    """
    train, val = [], []
    for i, block in enumerate(fed.train):
        fit, held = validation_split(block, seed, i, fraction)
        train.append(fit)
        val.append(held)
    return Federation(train, val, fed.user_ids, fed.item_ids, fed.scale)


def validation_split(block: RatingBlock, seed: int, client: int, fraction: float
                     ) -> tuple[RatingBlock, RatingBlock]:
    """(fit, validation) of tenant ``client``'s training block: ``fraction`` of its
    ratings, drawn from ``(seed, 0, VALIDATION + client)``, are the validation carve-out
    (the same carve-out ``fedrec tune`` and a training job's run-length selection use)."""
    mask = split_mask(block.nnz, fraction, derive_rng(seed, 0, VALIDATION + client))
    return block.subset(~mask), block.subset(mask)


def search_space(alg: Algorithm) -> dict[str, tuple]:
    """The algorithm's declared space; ValueError if it has none."""
    space = getattr(alg.config, "search_space", None)
    if not space:
        raise ValueError(f"{alg.name} declares no search space (tunable: those whose "
                         "config has search_space)")
    return dict(space)


def draws(space: dict[str, tuple], n: int, rng: np.random.Generator
          ) -> list[dict[str, Any]]:
    """``n`` points of ``space`` as a Latin hypercube: each log-uniform range is cut into
    ``n`` equal strata (in log scale) and every stratum is drawn once, each choice is taken
    equally often, the columns shuffled independently (floats to 3 significant digits).
    A few trials thus cover every range instead of clustering by chance."""
    columns: dict[str, list] = {}
    for name, spec in space.items():
        if spec[0] == "log":
            u = (rng.permutation(n) + rng.random(n)) / max(n, 1)
            lo, hi = math.log(spec[1]), math.log(spec[2])
            columns[name] = [float(f"{math.exp(lo + x * (hi - lo)):.3g}") for x in u]
        elif spec[0] == "choice":
            values = list(spec[1])
            columns[name] = [values[i] for i in
                             rng.permutation(np.resize(np.arange(len(values)), n))]
        else:
            raise ValueError(f"search space of {name}: unknown kind {spec[0]!r}")
    return [{name: columns[name][i] for name in space} for i in range(n)]


def extended_space(alg: Algorithm) -> dict[str, tuple]:
    """What :func:`tune` draws: the declared space, plus the inner steps N per round as
    ``("choice", [N, 2N])`` when the config has ``inner_steps`` and the space does not name
    it (more local work per round: the run length inside a round)."""
    space = search_space(alg)
    fields = alg.config.model_fields
    if "inner_steps" in fields and "inner_steps" not in space:
        n = int(fields["inner_steps"].default)
        space["inner_steps"] = ("choice", [n, 2 * n])
    return space


def run_length_anchors(alg: Algorithm, space: dict[str, tuple], base: dict[str, Any]
                       ) -> list[dict[str, Any]]:
    """The default with each other value of the inner steps: the validated setting with
    more local work per round, always among the trials (draws of the other fields rarely
    land near the default's)."""
    if "inner_steps" not in space:
        return []
    n = alg.config(**base).inner_steps
    return [{"inner_steps": v} for v in space["inner_steps"][1] if v != n]


def declared_anchors(alg: Algorithm) -> list[dict[str, Any]]:
    """The algorithm's declared extra starting points (``<Config>.search_anchors``, none if
    absent): settings measured good on some data, tried on every search beside the
    default, never dropped by the budget planning and, like the default, continued to
    every rung (a declared point is judged at the run lengths the choice is made at, not
    cut by a draw that is ahead after a short run)."""
    return [dict(a) for a in getattr(alg.config, "search_anchors", ())]


def couple_rank_and_lambda(points: list[dict[str, Any]], default_rank: int
                           ) -> list[dict[str, Any]]:
    """Rank and the fixed user-side ridge drawn jointly: a drawn ``lam`` (a weight per user
    row) is the weight *at the default rank*, and a point of rank r gets
    ``lam * r / default_rank`` (more factors need a stronger penalty to not overfit; floats
    to 3 significant digits). A per-rating weight (``lam_rating``, weighted-lambda) is
    not scaled: its best value hardly moves with the rank (a centralised ALS on MovieLens
    1M: 0.06 at rank 10, 0.08 at 20 and 40), and scaled by r / 10 the rank-20 and rank-40
    draws were all too strong)."""
    out = []
    for p in points:
        q = dict(p)
        for key in RIDGES:
            if "rank" in q and key in q:
                q[key] = float(f"{q[key] * q['rank'] / default_rank:.3g}")
        out.append(q)
    return out


#: the user-side ridge weights that :func:`couple_rank_and_lambda` scales with the rank
RIDGES = ("lam",)


def rungs_of(rounds: int, eta: int, n: int) -> list[int]:
    """Run lengths of the rungs for ``n`` configs: ``rounds / eta^k`` up to ``rounds``, one
    rung per ``eta``-fold cut of the pool (``rounds`` alone for one config)."""
    levels = max(1, math.ceil(math.log(n, eta)) + 1) if n > 1 else 1
    return sorted({max(1, round(rounds / eta ** (levels - 1 - i))) for i in range(levels)})


def plan_rounds(plan: list[int], n: int, eta: int, protected: int = 1) -> int:
    """Rounds successive halving runs in all for ``n`` configs on the rungs ``plan``: each
    rung continues ``p + ceil((survivors - p) / eta)`` configs (the ``p = protected``
    ones, the default and the declared anchors, and the best of the others) from the
    previous rung's rounds."""
    total, prev, alive = 0, 0, n
    for level, r in enumerate(plan):
        if level > 0:
            p = min(protected, alive)
            alive = p + math.ceil((alive - p) / eta)
        total += alive * (r - prev)
        prev = r
    return total


#: a drawn config's cost per round against the default's, assumed before it is measured
#: (ranks 5/10/20 and N or 2N inner steps average about twice the default's work)
DRAW_COST = 2.0


@dataclasses.dataclass
class Trial:
    params: dict[str, Any]  #: the fields changed from the base config ({} = the default)
    rounds: int = 0  #: rounds of its latest (highest-rung) evaluation
    #: validation loss at that evaluation: the RMSE, or 1 - NDCG@10 when the search's
    #: metric is "ndcg" (:func:`metric_value` turns it back into the metric)
    rmse: float = float("inf")
    #: (rounds, validation RMSE) at every rung it reached, a run continued rung to rung
    history: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0  #: wall seconds its rounds took

    @property
    def best(self) -> tuple[int, float]:
        """(rounds, validation RMSE) of its best evaluation (the shorter run on a tie)."""
        if not self.history:
            return (0, float("inf"))
        return min(self.history, key=lambda h: (h[1], h[0]))


@dataclasses.dataclass
class TuneResult:
    best: Trial
    default: Trial
    trials: list[Trial]
    seconds: float  #: wall seconds of the search
    budget_exhausted: bool
    base: dict[str, Any]  #: the base config's fields (``best.params`` replace some)
    rounds: int = 0  #: the chosen run length (the rung of ``best``'s best evaluation)
    finalists: list[Trial] = dataclasses.field(default_factory=list)
    cuts: list[str] = dataclasses.field(default_factory=list)  #: what the budget cut
    cpu_seconds: float = 0.0  #: CPU seconds of this process during the search
    rungs: list[int] = dataclasses.field(default_factory=list)  #: planned run lengths
    metric: str = "rmse"  #: what the search chose by (``Trial.rmse`` holds its loss)

    @property
    def rmse(self) -> float:
        """Validation loss of the choice (``best`` at ``rounds``): its RMSE, or
        1 - NDCG@10 with metric "ndcg"."""
        return self.best.best[1]

    @property
    def value(self) -> float:
        """The choice's validation metric (RMSE or NDCG@10)."""
        return metric_value(self.metric, self.rmse)

    def config(self, alg: Algorithm):
        return alg.config(**{**self.base, **self.best.params})


#: the metrics a search can choose by: validation RMSE (rating models) or NDCG@10
#: (ranking models: the lists they serve are what matters)
METRICS = ("rmse", "ndcg")
#: k of the validation NDCG
NDCG_K = 10


def metric_value(metric: str, loss: float) -> float:
    """The metric a validation loss stands for (RMSE, or NDCG@10 = 1 - loss)."""
    return loss if metric == "rmse" else 1.0 - loss


def validation_loss(alg: Algorithm, res: Any, val: Federation, metric: str) -> float:
    """A run's validation loss (lower is better): RMSE, or 1 - NDCG@10 of each tenant's
    list with its fitted items excluded and relevance at the scale's default cut
    (:mod:`algorithms.ranking`)."""
    if metric == "rmse":
        return res.final.test_rmse
    from algorithms.ranking import ranking_report

    report = ranking_report(alg, res.global_msg, res.local_states, val.train, val.test,
                            val.scale, k=NDCG_K)
    return 1.0 - report.ndcg_at_k


def _advance(alg: Algorithm, cfg: Any, val: Federation, start: RoundState | None,
             rounds: int, per_round: int, seed: int, timing: list[float] | None = None,
             metric: str = "rmse") -> tuple[float, RoundState | None]:
    """Run (or continue) to ``rounds`` rounds; the validation RMSE there and the state
    (``timing``, if given, receives each round's seconds of client and server work).

    Rounds draw their randomness from (seed, round, client), so a run continued from
    round r is the run of ``rounds`` rounds from scratch, number for number."""
    try:
        res = simulate(alg, cfg, val, rounds=rounds, per_round=per_round, seed=seed,
                       evaluate_every=rounds, start=start)
    except (FloatingPointError, ValueError, np.linalg.LinAlgError):
        return float("inf"), None
    if timing is not None:
        timing.extend(rec.seconds for rec in res.history)
    rmse = validation_loss(alg, res, val, metric)
    if not math.isfinite(rmse):
        return float("inf"), None
    return rmse, RoundState(rounds, res.global_msg, res.server_state, res.local_states)


def tune(alg: Algorithm, fed: Federation, *, rounds: int, per_round: int, seed: int = 0,
         trials: int = 9, eta: int = 3, budget_seconds: float = 600.0,
         base: dict[str, Any] | None = None,
         on_trial: Callable[[Trial], None] | None = None, metric: str = "rmse"
         ) -> TuneResult:
    """Successive halving with the run length as the resource (module docstring).

    ``rounds`` is the longest run the search may choose (the last rung). Each rung
    *continues* its configs' runs from the previous rung's state, so the rung of
    ``rounds / eta`` costs ``rounds / eta - rounds / eta^2`` more rounds per config. The
    choice is the finalist (a config that entered the last rung that started, and was
    scored at some rung) with the lowest validation RMSE at any of its rungs, with that
    rung's rounds as its run length.

    ``budget_seconds`` (wall) is planned for: the default's first rung measures a round's
    cost (its median round), and drawn configs are dropped (the last first; they stay in
    ``trials``, never run) until the whole plan is estimated to fit, a drawn config
    costing :data:`DRAW_COST` times the default's; before each later rung its cost is estimated
    from each config's measured seconds per round, and a rung that would not fit is
    shortened to the rounds that do (at least one more); no run starts after the budget
    is spent. Every cut is described in ``TuneResult.cuts``.
    """
    if trials < 1 or eta < 2 or rounds < 1:
        raise ValueError("trials must be >= 1, eta >= 2 and rounds >= 1")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}")
    t0, c0 = time.perf_counter(), time.process_time()
    space = extended_space(alg)
    base = dict(base or {})
    val = validation_federation(fed, seed)  # reads fed.train only
    rng = derive_rng(seed, 0, SEARCH)
    default_rank = alg.config(**base).rank if "rank" in alg.config.model_fields else 1
    anchors = [{}] + run_length_anchors(alg, space, base) + declared_anchors(alg)
    anchors = anchors[:trials]
    pool = [Trial(p) for p in anchors] + [
        Trial(p) for p in couple_rank_and_lambda(draws(space, trials - len(anchors), rng),
                                                 default_rank)]
    default, everyone = pool[0], list(pool)
    # the default and the declared anchors go on to every rung
    declared = declared_anchors(alg)
    protected = {id(default)} | {id(t) for t in pool[1:len(anchors)] if t.params in declared}
    plan = rungs_of(rounds, eta, len(pool))
    states: dict[int, RoundState | None] = {}
    cuts: list[str] = []
    # probe: the default's first rung measures a round's cost; configs are dropped (the
    # last drawn first) until the whole plan is estimated to fit the budget
    t1, timing = time.perf_counter(), []
    default.rmse, states[id(default)] = _advance(alg, alg.config(**base), val, None, plan[0],
                                                 per_round, seed, timing, metric)
    default.seconds = time.perf_counter() - t1
    default.rounds = plan[0]
    default.history.append((plan[0], default.rmse))
    if on_trial is not None:
        on_trial(default)
    # the median round: the first rounds may include compiling the kernels
    per_round_s = float(np.median(timing)) if timing else default.seconds / plan[0]
    left = budget_seconds - (time.perf_counter() - t0)

    def estimate(n: int, rungs: list[int]) -> float:
        work = plan_rounds(rungs, n, eta, min(n, len(protected))) - rungs[0]  # the
        # default's first rung is done
        return per_round_s * work * (DRAW_COST if n > 1 else 1.0)

    n_planned = len(pool)
    while len(pool) > len(anchors) and estimate(len(pool), plan) > left:
        pool.pop()
        plan = rungs_of(rounds, eta, len(pool))
    if len(pool) < n_planned:
        cuts.append(f"{n_planned - len(pool)} of {n_planned} configs dropped before the "
                    f"search to fit the budget ({per_round_s:.3g} s per round)")
    if default.rounds != plan[0]:  # fewer configs: a longer first rung, continued
        default.rounds = 0
    exhausted = False
    alive = entering = pool
    for level, planned in enumerate(plan):
        target = planned
        last = level == len(plan) - 1
        others = [t for t in alive if id(t) not in protected]
        keep = len(others) if last else math.ceil(len(others) / eta)
        left = budget_seconds - (time.perf_counter() - t0)
        if level > 0 and left <= 0:
            exhausted, entering = True, alive
            cuts.append(f"rungs of {', '.join(map(str, plan[level:]))} rounds not run "
                        "(budget spent)")
            break
        if level > 0:  # the rung's cost from each config's measured seconds per round
            rate = sum(t.seconds / max(t.rounds, 1) for t in alive)
            from_round = max(t.rounds for t in alive)
            if rate * (target - from_round) > left:
                target = max(from_round + 1, from_round + int(left / max(rate, 1e-9)))
                if target < planned:
                    cuts.append(f"rung {level + 1} shortened from {planned} to {target} "
                                f"rounds to fit the budget")
                else:
                    target = planned
        scored: list[Trial] = []
        for trial in alive:
            if scored and time.perf_counter() - t0 > budget_seconds:
                exhausted = True
                cuts.append(f"rung {level + 1} ({target} rounds): {len(alive) - len(scored)}"
                            f" of {len(alive)} configs not run (budget spent)")
                break
            key = id(trial)
            if trial.rounds == target:  # the probe: already at this rung
                scored.append(trial)
                continue
            t1 = time.perf_counter()
            trial.rmse, state = _advance(alg, alg.config(**{**base, **trial.params}), val,
                                         states.get(key), target, per_round, seed,
                                         metric=metric)
            trial.seconds += time.perf_counter() - t1
            trial.rounds = target
            trial.history.append((target, trial.rmse))
            states[key] = state
            scored.append(trial)
            # keep the states of the protected and the current best `keep` only (memory)
            leaders = {id(t) for t in sorted((t for t in scored if id(t) not in protected),
                                             key=lambda t: t.rmse)[:keep]}
            for t in scored:
                if last or (id(t) not in protected and id(t) not in leaders):
                    states[id(t)] = None
            if on_trial is not None:
                on_trial(trial)
        entering, alive = alive, scored
        if last:
            break
        if exhausted or target < planned:  # no time left for a longer rung
            exhausted = True
            cuts.append(f"rungs of {', '.join(map(str, plan[level + 1:]))} rounds not run")
            break
        # the best 1/eta of the others go on, and the default and declared anchors with them
        alive = [t for t in alive if id(t) in protected] + sorted(
            (t for t in alive if id(t) not in protected), key=lambda t: t.rmse)[:keep]
    # the configs no comparison eliminated: those that entered the last rung that started
    # (one the budget cut short keeps its unrun configs at their previous rung)
    finalists = [t for t in entering if t.history] if exhausted else alive
    best = min(finalists, key=lambda t: t.best[1])  # ties: the earliest, the default first
    states.clear()
    return TuneResult(best, default, everyone, time.perf_counter() - t0, exhausted, base,
                      rounds=best.best[0], finalists=finalists, cuts=cuts,
                      cpu_seconds=time.process_time() - c0, rungs=plan, metric=metric)
