"""The ``paper`` preset: the run that reproduces each paper, one definition for the CLI and
the lab.

``fedrec simulate --preset paper`` and the paper-reproduction benchmarks both read
:data:`PAPER_RUNS`, so the command line and ``fedrec bench`` run the same optimiser, the
same hyper-parameters and the same federation shape, and cannot drift apart. An entry is
the config's :meth:`~algorithms.base.AlgorithmConfig.paper_settings` (the paper's literal
values) with the fields the reproduction had to change, plus the run: tenants, tenants per
round and rounds. Where the literal settings do not train (RFRec's printed gradient step
diverges on MovieLens; RFRecF's Algorithm 2 at p = 0.5 leaves a quarter of the iterations
as main updates), the entry is what the benchmark found to reproduce the paper's figure,
and ``why`` says so.

An algorithm without an entry (no paper, or no benchmark of its paper's figure) runs its
``paper_settings()`` on its recommended run.

Clustering (``fedrec cluster``, FedMAvg/FedMGS paper Table I) has its own presets,
:data:`CLUSTER_PRESETS`: ``paper`` stops at Sec. V-A's rule (relative change of F below
1e-8 or 500 rounds); ``authors`` at Sec. V-F's rule for the clustering of Table I, the
relative change alone, which gives no round count: :data:`AUTHORS_ROUND_CAP` (twice
Sec. V-A's 500) bounds the compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from algorithms import registry
from algorithms.base import AlgorithmConfig


@dataclasses.dataclass(frozen=True)
class PaperRun:
    """The run reproducing one paper's figure: config fields over ``paper_settings()`` and
    the federation's shape."""

    fields: Mapping[str, Any]
    #: tenants; 0: one tenant per user (the RFRec paper's device-per-user setting)
    clients: int
    #: tenants per round; 0: every tenant every round
    per_round: int
    rounds: int
    #: the data set and figure the setting is for, and the benchmark that measures it
    reproduces: str
    bench: str
    #: why the entry differs from ``paper_settings()``, and what to expect elsewhere
    why: str = ""

    def run(self) -> dict[str, int]:
        """``{"clients", "per_round", "rounds"}``: the CLI's run defaults under the preset."""
        return {"clients": self.clients, "per_round": self.per_round, "rounds": self.rounds}


#: the RFRec paper: its Sec. 4.1.3 values with the authors' code's optimiser (Adam, sigmoid
#: link on ratings scaled to [0, 1]); the printed gradient step diverges on MovieLens
_ADAM_SIGMOID: dict[str, Any] = {"optimizer": "adam", "link": "sigmoid"}

PAPER_RUNS: dict[str, PaperRun] = {
    "fedmc-admm": PaperRun(
        {}, 100, 10, 100,
        "FedMC-ADMM paper Sec. 5.2, Fig. 2 (ML-1M at rank 5)", "fedmc_vs_fedmavg",
        "the authors' beta and tiny init; lambda = 1e-6 regularises nothing, so its ML-100k "
        "test RMSE is well above the recommended preset's (the bench's ML-100k rows)"),
    "fedmavg": PaperRun(
        {}, 100, 10, 100,
        "FedMC-ADMM paper Sec. 5.2, Fig. 2: the FedMAvg baseline (ML-1M at rank 5)",
        "fedmc_vs_fedmavg",
        "the baseline as that paper states it (Uniform[0, 1] init, no centring): the weak "
        "baseline of Fig. 2, above the global mean's error on MovieLens (the bench's rows)"),
    "rfrec": PaperRun(
        _ADAM_SIGMOID, 0, 0, 100,
        "RFRec paper Table 2 and Table 3 (ML-100k, ML-1M), one device per user",
        "rfrec_table2",
        "Sec. 4.1.3's values with the authors' code's Adam and sigmoid link: the printed "
        "gradient step diverges on MovieLens"),
    "rfrecf": PaperRun(
        {**_ADAM_SIGMOID, "schedule": "code", "p": 0.8, "alpha": 0.02, "lam": 40.0,
         "lam_u": 0.1, "iterations": 200}, 200, 0, 200,
        "RFRec paper Table 2 and Table 3, RFRecF (ML-1M)", "rfrec_dropped",
        "the authors' released notebook, which prints Table 2's ML-1M figure: Algorithm 2 "
        "as printed (p = 0.5) makes a quarter of the iterations main updates and stays near "
        "its init (rfrec_table2's RFRecF paper rows)"),
    "felb": PaperRun(
        {}, 50, 0, 20,
        "Felb paper Table 1, Movielens (ML-25M: about 3,250 users per tenant)", "felb_table1",
        "Appendix D's values, 50 tenants, all every round, 20 rounds (the bench's budget; "
        "the paper's is 100); tenants of a few dozen users (ML-100k) learn no Boolean "
        "tile: F1 near 0"),
    "felb-mu": PaperRun(
        {}, 50, 0, 20,
        "Felb paper Table 1, Movielens (ML-25M: about 3,250 users per tenant)", "felb_table1",
        "as Felb's"),
}


def paper_run(name: str) -> PaperRun | None:
    """The paper preset's run of algorithm ``name``, or None (no reproduction benchmark)."""
    return PAPER_RUNS.get(name)


def paper_config(name: str, **overrides: Any) -> AlgorithmConfig:
    """Algorithm ``name``'s config under the ``paper`` preset, ``overrides`` replacing fields."""
    entry = PAPER_RUNS.get(name)
    fields = {} if entry is None else dict(entry.fields)
    return registry.get(name).config.paper_settings(**{**fields, **overrides})


#: clustering presets (``fedrec cluster --preset``, ``bench clustering_table1 --preset``):
#: the stopping rule ``stop_tol`` and round cap ``rounds`` of
#: :class:`algorithms.clustering.ClusterConfig`
AUTHORS_ROUND_CAP = 1000
CLUSTER_PRESETS: dict[str, dict[str, Any]] = {
    # Sec. V-A: "smaller than 1e-8 or 500 communication rounds"
    "paper": {"stop_tol": 1e-8, "rounds": 500},
    # Sec. V-F (clustering, Table I): "the stopping condition is set to eps < 1e-8", no
    # round count; the cap bounds the compute (FedMAvg at m = 100 is still rising at 500)
    "authors": {"stop_tol": 1e-8, "rounds": AUTHORS_ROUND_CAP},
}
