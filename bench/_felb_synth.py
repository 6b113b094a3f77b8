"""Synthetic tile data of Felb's Sec. 4.1 and the fits shared by its synthetic experiments.

"Random binomial-noise matrices into which we insert random densely populated tiles
containing approximately 90% 1s" (Felb paper Sec. 4.1): :func:`tiles` draws ``n_tiles``
tiles (a random subset of rows times a random subset of columns, each cell 1 with
probability ``density``), ORs them into the signal S, and XORs S with Bernoulli(``noise``)
("destructive XOR noise", 0 = tiles only, 0.5 = pure noise). :func:`federation` deals the
rows out to tenants at random; a tenant's ``train`` block lists the 1s of the data A and
its ``test`` block the 1s of the signal S, so F1 on ``train`` is the paper's F1 (data) and
F1 on ``test`` its F1* (ground-truth signal). Felb / Felb-MU run through
:func:`algorithms.simulate.simulate`; the voting baseline as in :mod:`bench.felb_table1`.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import time  # noqa: E402

import numpy as np  # noqa: E402

from algorithms import binary_baseline, felb  # noqa: E402
from algorithms.binary_metrics import reconstruction_quality  # noqa: E402
from algorithms.block import RatingBlock  # noqa: E402
from algorithms.data import Federation  # noqa: E402
from algorithms.rng import SPLIT, derive_rng  # noqa: E402
from algorithms.simulate import SimulationResult, initialise, run_round, simulate  # noqa: E402

METHODS = ("felb", "felb-mu", "vote")
LABELS = {"felb": "Felb", "felb-mu": "Felb-MU", "vote": "Elbmf + vote"}


def tiles(n_rows: int, n_cols: int, n_tiles: int, noise: float, rng: np.random.Generator,
          density: float = 0.9, size: tuple[float, float] = (0.05, 0.25)
          ) -> tuple[np.ndarray, np.ndarray]:
    """(data A, signal S), Boolean n_rows x n_cols: OR of dense tiles, XOR Bernoulli(noise).

    Each tile spans a uniform fraction in ``size`` of the rows and of the columns.
    """
    signal = np.zeros((n_rows, n_cols), dtype=bool)
    for _ in range(n_tiles):
        rows = rng.choice(n_rows, int(rng.uniform(*size) * n_rows) or 1, replace=False)
        cols = rng.choice(n_cols, int(rng.uniform(*size) * n_cols) or 1, replace=False)
        signal[np.ix_(rows, cols)] |= rng.random((rows.size, cols.size)) < density
    return signal ^ (rng.random(signal.shape) < noise), signal


def _block(dense: np.ndarray) -> RatingBlock:
    r, c = np.nonzero(dense)
    return RatingBlock(r, c, np.ones(r.size), dense.shape[0], dense.shape[1])


def federation(data: np.ndarray, signal: np.ndarray, n_clients: int,
               rng: np.random.Generator) -> Federation:
    """Rows dealt to ``n_clients`` tenants at random (near-equal); test = the signal."""
    parts = np.array_split(rng.permutation(data.shape[0]), n_clients)
    return Federation([_block(data[p]) for p in parts], [_block(signal[p]) for p in parts],
                      [np.sort(p) for p in parts], np.arange(data.shape[1]), (0.0, 1.0))


def fit(method: str, fed: Federation, rank: int, rounds: int, seed: int,
        baseline_iters: int, privatizer=None, local_steps: int = 10,
        proximity: float | None = None, start: str | None = None,
        server_prox: str | None = None, **config):
    """Train one method on all tenants; returns (algorithm, result, training seconds).
    ``proximity``, ``start`` and ``server_prox`` (and any other ``config`` field) override
    Felb's gamma, start and server prox (defaults :class:`algorithms.felb.FelbConfig`'s)."""
    t0 = time.perf_counter()
    if method in felb.ALGORITHMS:
        alg = felb.ALGORITHMS[method]
        cfg = alg.config(rank=rank, local_steps=local_steps,
                         **({} if proximity is None else {"proximity": proximity}),
                         **({} if start is None else {"start": start}),
                         **({} if server_prox is None else {"server_prox": server_prox}),
                         **config)
        res = simulate(alg, cfg, fed, rounds=rounds, per_round=fed.n_clients, seed=seed,
                       privatizer=privatizer, evaluate_every=rounds)
        return alg, res, sum(h.seconds for h in res.history)
    alg = binary_baseline.ALGORITHM
    cfg = alg.config(rank=rank, local_iters=baseline_iters, aggregation=method)
    server, glob, locs = initialise(alg, cfg, fed.train, seed)
    glob, server, locs, _, _ = run_round(alg, cfg, 1, seed, fed.n_clients, glob, server, locs,
                                         fed.train, privatizer)
    glob, server, locs, _, _ = run_round(alg, cfg, 2, seed, fed.n_clients, glob, server, locs,
                                         fed.train)
    return alg, SimulationResult([], glob, server, locs), time.perf_counter() - t0


def scores(alg, res: SimulationResult, fed: Federation) -> dict[str, float]:
    """F1 and RMSD against the data, F1* against the signal (Fig. 2's three columns)."""
    f1, rmsd = reconstruction_quality(alg, res.global_msg, res.local_states, fed.train)
    f1_signal, _ = reconstruction_quality(alg, res.global_msg, res.local_states, fed.test)
    return {"f1": f1, "rmsd": rmsd, "f1_signal": f1_signal}


def data_rng(seed: int, setting: int = 0) -> np.random.Generator:
    """The data generator of a seed and setting (independent of every algorithm stream)."""
    return derive_rng(seed, setting, SPLIT)
