"""Hyper-parameter search on a validation carve-out of the training ratings (``fedrec tune``).

The test ratings are never read: :func:`tune` takes the federation's ``train`` blocks
only, carves 10% of each tenant's training ratings out as validation
(:func:`validation_federation`, seeded per tenant, the carve-out the benchmarks tune
the centralised ALS ceiling on), trains on the other 90% and scores on the carve-out.

The search is successive halving over a Latin hypercube of draws from the algorithm's
declared space (``<Config>.search_space``, next to each config: field -> ``("log", lo,
hi)`` for a log-uniform draw or ``("choice", [values])``): ``trials`` configs, the
recommended default first, run for ``rounds / eta^(rungs-1)`` rounds; the best ``1/eta``
(always with the default) go on with ``eta`` times the rounds, until the last rung runs the full
``rounds``. The chosen config is the best on validation at the last rung, so it beats or
ties the default by construction (the default is always scored at the last rung too). A
time budget stops a rung early: the choice is then made among the configs that the last
started rung scored (the default first among them).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms._rng import derive_rng
from algorithms.base import Algorithm
from algorithms.data import Federation, split_mask
from algorithms.simulate import simulate

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
        mask = split_mask(block.nnz, fraction, derive_rng(seed, 0, VALIDATION + i))
        train.append(block.subset(~mask))
        val.append(block.subset(mask))
    return Federation(train, val, fed.user_ids, fed.item_ids, fed.scale)


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


@dataclasses.dataclass
class Trial:
    params: dict[str, Any]  #: the fields changed from the base config ({} = the default)
    rounds: int = 0  #: rounds of its latest (highest-rung) evaluation
    rmse: float = float("inf")  #: validation RMSE at that evaluation
    history: list[tuple[int, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TuneResult:
    best: Trial
    default: Trial
    trials: list[Trial]
    seconds: float
    budget_exhausted: bool
    base: dict[str, Any]  #: the base config's fields (``best.params`` replace some)

    def config(self, alg: Algorithm):
        return alg.config(**{**self.base, **self.best.params})


def _score(alg: Algorithm, cfg: Any, val: Federation, rounds: int, per_round: int,
           seed: int) -> float:
    try:
        res = simulate(alg, cfg, val, rounds=rounds, per_round=per_round, seed=seed,
                       evaluate_every=rounds)
    except (FloatingPointError, ValueError, np.linalg.LinAlgError):
        return float("inf")
    rmse = res.final.test_rmse
    return rmse if math.isfinite(rmse) else float("inf")


def tune(alg: Algorithm, fed: Federation, *, rounds: int, per_round: int, seed: int = 0,
         trials: int = 9, eta: int = 3, budget_seconds: float = 600.0,
         base: dict[str, Any] | None = None,
         on_trial: Callable[[Trial], None] | None = None) -> TuneResult:
    """Successive halving over ``trials`` configs (see the module docstring)."""
    if trials < 1 or eta < 2 or rounds < 1:
        raise ValueError("trials must be >= 1, eta >= 2 and rounds >= 1")
    t0 = time.perf_counter()
    space = search_space(alg)
    base = dict(base or {})
    val = validation_federation(fed, seed)  # reads fed.train only
    rng = derive_rng(seed, 0, SEARCH)
    pool = [Trial({})] + [Trial(p) for p in draws(space, trials - 1, rng)]
    default = pool[0]
    rungs = max(1, math.ceil(math.log(len(pool), eta)) + 1) if len(pool) > 1 else 1
    exhausted = False
    alive = pool
    for level in range(rungs):
        r = max(1, rounds // eta ** (rungs - 1 - level))
        scored = []
        for trial in alive:
            if scored and time.perf_counter() - t0 > budget_seconds:
                exhausted = True
                break
            trial.rmse = _score(alg, alg.config(**{**base, **trial.params}), val, r,
                                per_round, seed)
            trial.rounds = r
            trial.history.append((r, trial.rmse))
            scored.append(trial)
            if on_trial is not None:
                on_trial(trial)
        alive = scored
        if exhausted or level == rungs - 1:
            break
        # the best 1/eta of the others go on, and the default with them
        keep = max(1, math.ceil(len(alive) / eta))
        alive = [default] + sorted((t for t in alive if t is not default),
                                   key=lambda t: t.rmse)[:keep]
    best = min(alive, key=lambda t: t.rmse)  # ties: the earliest, the default first
    return TuneResult(best, default, pool, time.perf_counter() - t0, exhausted, base)
