"""Settings and runner shared by the RFRec / RFRecF experiments (the RFRec paper).

Two settings per method:

``paper``
    the paper's Sec. 4.1.3 hyper-parameters and protocol: one client per user, K = 100
    iterations, d = 20, alpha = 0.05 (RFRec) / 0.025 (RFRecF), lambda = 10, p = 0.5,
    lambda_u = 0.1, N(0, 1e-4) init, Algorithm 2's schedule for RFRecF. The printed
    gradient step diverges at these settings (docs/benchmarks/rfrec_table2.md), so the
    step is the authors' code's Adam with a sigmoid link on ratings scaled to [0, 1].
    For RFRec this is ``fedrec simulate --preset paper`` (:mod:`algorithms.presets`).
``ours``
    chosen on a validation carve-out of ML-100k (10% of each client's training ratings,
    never the test ratings: :func:`algorithms.tuning.validation_federation`), starting from
    the authors' notebooks, Adam + sigmoid. RFRec: 200 clients of users, lambda_u = 0.3,
    alpha = 0.1, lambda = 20, 200 iterations. RFRecF: the notebook's schedule
    (``schedule='code'``: every zeta = 0 iteration a main update, a full reset to V_bar
    after each aggregation), p = 0.8, alpha = 0.02 (Adam learning rate alpha/(1-p) = 0.1),
    lambda = 40 (move rate alpha lambda / p = 1), 50 clients, lambda_u = 3.0, 400
    iterations (a second validation search, over 3 carve-outs).
``paper-code`` (RFRecF only)
    the ``paper`` setting with the notebook's schedule (main update at every zeta = 0
    iteration, move to the average at rate min(1, alpha lambda / p) after an aggregation),
    so that alpha and lambda keep their meaning in the lambda x alpha grid.
``code``
    the authors' released notebooks, which print the paper's Table 2 ML-1M figures
    (RFRec 0.8863, RFRecF 0.8849): 200 clients of users, Adam + sigmoid, lambda_u 0.1.
    RFRec: learning rate 0.1, the notebook's lambda_L = 10 on the unhalved penalty
    (lambda = 20 here), 100 iterations. RFRecF: the notebook's schedule with its
    threshold 0.8 (p = 0.8), Adam learning rate 0.1 (alpha = 0.02), a full reset to V_bar
    after each aggregation (lambda = 40), 200 iterations. For RFRecF this is ``fedrec
    simulate --preset paper`` (:mod:`algorithms.presets`): Algorithm 2 as printed does not
    reach the paper's figures.

Not an experiment itself (no ``EXPERIMENT``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from algorithms import presets
from algorithms.data import Federation, Ratings, build_federation, load_movielens
from algorithms.rfrec import RFRecConfig, RFRecFConfig, RFRecGlobal, run_batched
from algorithms.simulate import SimulationResult
from bench import _experiment

#: Table 2: (mean, std) of RMSE and MAE
TABLE2 = {
    ("ml-100k", "rfrec"): {"RMSE": (0.9325, 0.0023), "MAE": (0.7237, 0.0015)},
    ("ml-100k", "rfrecf"): {"RMSE": (0.9385, 0.0077), "MAE": (0.7317, 0.0064)},
    ("ml-1m", "rfrec"): {"RMSE": (0.8831, 0.0038), "MAE": (0.6937, 0.0034)},
    ("ml-1m", "rfrecf"): {"RMSE": (0.8840, 0.0042), "MAE": (0.6906, 0.0033)},
}
#: Table 3 (ML-1M): RMSE and MAE with 0 / 20 / 50 / 80 / 90 % of the devices dropped
DROP_RATES = (0, 20, 50, 80, 90)
TABLE3 = {
    "rfrec": {"MAE": (0.6937, 0.6958, 0.7083, 0.7090, 0.7117),
              "RMSE": (0.8831, 0.8870, 0.8956, 0.8966, 0.9001)},
    "rfrecf": {"MAE": (0.6906, 0.6974, 0.7017, 0.7038, 0.7064),
               "RMSE": (0.8840, 0.8891, 0.9005, 0.9048, 0.9057)},
}
#: Table 4 (ML-1M RMSE): rows alpha, columns lambda
GRID_ALPHAS = (0.1, 0.05, 0.025, 0.0125)
GRID_LAMS = (5.0, 10.0, 20.0, 40.0)
TABLE4 = {
    "rfrec": ((0.8912, 0.8948, 0.8963, 0.9036), (0.8957, 0.8846, 0.8869, 0.8887),
              (0.9057, 0.8928, 0.8897, 0.8983), (0.8895, 0.8870, 0.8891, 0.8920)),
    "rfrecf": ((0.9169, 0.9035, 0.9066, 0.9139), (0.9254, 0.9108, 0.8923, 0.9070),
               (0.9101, 0.8830, 0.8856, 0.8908), (1.0491, 0.9588, 0.9102, 0.8992)),
}
METHOD = {"rfrec": "RFRec", "rfrecf": "RFRecF"}
DATA = {"ml-100k": "ML-100k", "ml-1m": "ML-1M"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Clients (0: one per user), iterations and config fields of one setting."""

    clients: int
    rounds: int
    fields: dict[str, Any]


def _preset(method: str) -> Setting:
    """The ``paper`` preset of ``fedrec simulate`` (:data:`algorithms.presets.PAPER_RUNS`),
    so that the CLI and these benches run one setting."""
    run = presets.PAPER_RUNS[method]
    return Setting(run.clients, run.rounds, dict(run.fields))


SETTINGS = {
    ("rfrec", "paper"): _preset("rfrec"),
    ("rfrecf", "paper"): Setting(0, 100, {"optimizer": "adam", "link": "sigmoid"}),
    ("rfrecf", "paper-code"): Setting(0, 100, {"optimizer": "adam", "link": "sigmoid",
                                               "schedule": "code"}),
    ("rfrec", "code"): Setting(200, 100, {"optimizer": "adam", "link": "sigmoid",
                                          "alpha": 0.1, "lam": 20.0, "lam_u": 0.1}),
    ("rfrecf", "code"): _preset("rfrecf"),
    ("rfrec", "ours"): Setting(200, 200, {"optimizer": "adam", "link": "sigmoid",
                                          "alpha": 0.1, "lam": 20.0, "lam_u": 0.3}),
    ("rfrecf", "ours"): Setting(50, 400, {"optimizer": "adam", "link": "sigmoid",
                                          "schedule": "code", "p": 0.8, "alpha": 0.02,
                                          "lam": 40.0, "lam_u": 3.0}),
}


def config(method: str, variant: str, **override: Any) -> RFRecConfig:
    """The config of ``(method, variant)`` with ``override`` applied, on top of the
    paper's settings (``ours`` was the configs' default until they gained bias terms and
    a weighted ridge; it stays the setting of the Table 2-4 benches, without either)."""
    cls = RFRecFConfig if method == "rfrecf" else RFRecConfig
    return cls.paper_settings(**{**SETTINGS[(method, variant)].fields, **override})


@functools.lru_cache(maxsize=2)
def ratings(data: str) -> Ratings:
    return load_movielens(data)


def federation(data: str, clients: int, seed: int) -> Federation:
    """80/20 random split with ``seed``; ``clients`` 0 means one client per user."""
    r = ratings(data)
    return build_federation(r, clients or int(np.unique(r.users).shape[0]), seed)


def run(method: str, variant: str, data: str, seed: int, *, rounds: int | None = None,
        clients: int | None = None, drop: float = 0.0, evaluate_every: int | None = None,
        on_global: Callable[[RFRecGlobal], None] | None = None, absent: str = "idle",
        aggregate: str = "received", **override: Any) -> SimulationResult:
    """One seeded run on the batched path; ``drop`` is the fraction of clients absent from
    each iteration (a fresh uniform draw every iteration), ``absent`` what they do
    and ``aggregate`` what the server averages (:func:`algorithms.rfrec.run_batched`)."""
    s = SETTINGS[(method, variant)]
    fed = federation(data, s.clients if clients is None else clients, seed)
    rounds = s.rounds if rounds is None else rounds
    per_round = 0 if drop <= 0 else max(1, int(round((1.0 - drop) * fed.n_clients)))
    return run_batched(config(method, variant, **override), fed, rounds=rounds, seed=seed,
                       evaluate_every=evaluate_every or rounds, per_round=per_round,
                       on_global=on_global, absent=absent, aggregate=aggregate)


def describe(method: str, variant: str, data: str, **override: Any) -> str:
    """A short description of a setting for the results table."""
    s = SETTINGS[(method, variant)]
    clients = "per-user clients" if s.clients == 0 else f"{s.clients} clients"
    extra = "".join(f", {k}={v}" for k, v in override.items())
    return f"{DATA[data]}, {METHOD[method]}, {variant} setting ({clients}, {s.rounds} it.{extra})"


def write(out: Path, name: str, stem: str, argv: list[str] | None, quick: bool,
          payload: dict[str, Any]) -> Path:
    """``_experiment.write_result`` to ``<out>/<stem>.json``: a non-default run (``stem`` !=
    ``name``) never replaces the default ``<name>.json``."""
    return _experiment.write_result(out, name, argv, quick, payload, stem=stem)
