"""Reference lines and the tenant-unit curve of ``bench/dp_utility.py``.

* centralised ALS (mean + biases + rank-r factors, ``algorithms/centralised.py``) pooled
  over the tenants, at the setting ``bench/centralised.py`` chose on validation
  (BENCHMARKS.md, "Centralised ceiling"), 10 sweeps;
* bias-only: the training mean plus ridge user and item biases (alternating exact
  solves), the ridge chosen on the validation carve-out of the training set;
* DPALS under the tenant unit: the ``--dp gaussian`` wrapper (each tenant's whole upload
  clipped to L2 norm ``--dp-clip`` and noised, Gaussian RDP over its transmissions), as
  ``fedrec simulate --algorithm dpals --privacy tenant --epsilon E --delta D`` runs it.
"""

from __future__ import annotations

import argparse

import numpy as np

from algorithms import centralised as C
from algorithms import dpals
from algorithms.base import default_select
from algorithms.data import Federation
from algorithms.rng import derive_rng
from algorithms.simulate import simulate
from algorithms.tuning import validation_federation
from bench.centralised import INIT_STREAM, pooled
from privacy.cli import add_dp_arguments, privatizer_from_args, sampling_plan

#: bench/centralised.py's validation choice per data set (bench/results/centralised.json)
CENTRAL_ALS = {"ml-1m": {"rank": 10, "lam": 0.06, "lam_bias": 2.0},
               "ml-100k": {"rank": 10, "lam": 0.12, "lam_bias": 2.0}}
CENTRAL_SWEEPS = 10
BIAS_RIDGES = (1.0, 3.0, 10.0, 25.0)


def centralised_rmse(fed: Federation, data: str, seed: int) -> float | None:
    """Test RMSE of centralised ALS at the tuned setting (None where none was tuned)."""
    params = CENTRAL_ALS.get(data)
    if params is None:
        return None
    u, i, v, m = pooled(fed.train)
    tu, ti, tv, _ = pooled(fed.test)
    model = C.fit_als(u, i, v, m, fed.n_items, iterations=CENTRAL_SWEEPS,
                      rng=derive_rng(seed, 0, INIT_STREAM), **params)
    return C.rmse(model, tu, ti, tv, fed.scale)[0]


def fit_biases(users: np.ndarray, items: np.ndarray, values: np.ndarray, n_users: int,
               n_items: int, lam: float, sweeps: int = 10
               ) -> tuple[float, np.ndarray, np.ndarray]:
    """(mu, b_u, c_i) minimising sum (r - mu - b_u - c_i)^2 + lam (|b|^2 + |c|^2), mu the
    training mean, by alternating exact solves (each a per-row mean with ridge lam)."""
    mu = float(values.mean())
    b, c = np.zeros(n_users), np.zeros(n_items)
    n_u = np.bincount(users, minlength=n_users) + lam
    n_i = np.bincount(items, minlength=n_items) + lam
    for _ in range(sweeps):
        b = np.bincount(users, weights=values - mu - c[items], minlength=n_users) / n_u
        c = np.bincount(items, weights=values - mu - b[users], minlength=n_items) / n_i
    return mu, b, c


def _bias_rmse(fed: Federation, lam: float) -> float:
    u, i, v, m = pooled(fed.train)
    tu, ti, tv, _ = pooled(fed.test)
    mu, b, c = fit_biases(u, i, v, m, fed.n_items, lam)
    pred = np.clip(mu + b[tu] + c[ti], *fed.scale)
    return float(np.sqrt(np.mean((pred - tv) ** 2)))


def bias_only(fed: Federation) -> dict[str, float]:
    """Test RMSE of the bias-only model, its ridge chosen on the validation carve-out."""
    val = validation_federation(fed)
    lam = min(BIAS_RIDGES, key=lambda r: _bias_rmse(val, r))
    return {"lam": lam, "rmse": _bias_rmse(fed, lam)}


def tenant_unit_rmse(cfg: dpals.DPALSConfig, fed: Federation, epsilon: float, delta: float,
                     seed: int) -> tuple[float, float]:
    """(test RMSE, noise multiplier) of DPALS under the tenant unit's Gaussian wrapper."""
    args = add_dp_arguments(argparse.ArgumentParser()).parse_args(
        ["--dp", "gaussian", "--dp-epsilon", str(epsilon), "--dp-delta", str(delta)])
    rounds = cfg.sweeps + 1
    n = fed.n_clients
    plan = (sampling_plan(n, rounds, n, seed) if dpals.ALGORITHM.select is default_select
            else None)
    priv = privatizer_from_args(args, n, rounds, seed,
                                n_users=sum(b.n_users for b in fed.train), plan=plan)
    res = simulate(dpals.ALGORITHM, cfg, fed, rounds=rounds, per_round=n, seed=seed,
                   privatizer=priv, evaluate_every=rounds)
    return res.final.test_rmse, priv.spec.noise_multiplier
