"""Shared by the FedMC-ADMM paper experiments: a seeded run traced every few rounds.

:func:`algorithms.simulate.simulate` records figures only; Figs. 3 and 4 of
FedMC-ADMM paper also need the training time and the sparsity of U and V, so :func:`trace`
runs ``simulate`` itself (same random streams) with a hook on the round state and measures
at round 0 and every ``every`` rounds. Training time counts client and server work only,
as ``simulate`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.data import Federation
from algorithms.simulate import (
    RoundState,
    evaluate,
    initialise,
    run_round,
    simulate,
    tenant_errors,
    total_objective,
)
from bench import _experiment as E


def data_term(alg: Algorithm, global_msg, local_states, fed: Federation) -> float:
    """(1/p) * 1/2 sum_i ||P_Omega_i(M_i - prediction)||^2 on the training ratings: the
    data part of F in problem (1), computed the same way for every algorithm."""
    parts = [tenant_errors(alg, global_msg, s, b) for s, b in zip(local_states, fed.train,
                                                                   strict=True)]
    return 0.5 * sum(p[0] for p in parts) / fed.n_clients


def nonzero_fractions(global_msg, local_states) -> dict[str, float]:
    """Share of non-zero entries of U = [U_1; ...; U_p], of V, and of both together."""
    nz_u = sum(int(np.count_nonzero(s.U)) for s in local_states)
    n_u = sum(s.U.size for s in local_states)
    nz_v, n_v = int(np.count_nonzero(global_msg.V)), global_msg.V.size
    return {"nnz_u": nz_u / n_u, "nnz_v": nz_v / n_v, "nnz_uv": (nz_u + nz_v) / (n_u + n_v)}


def measure(alg: Algorithm, cfg: Any, fed: Federation, global_msg, local_states,
            sparsity: bool) -> dict[str, float]:
    rmse, mae = evaluate(alg, global_msg, local_states, fed.test, fed.scale)
    row = {"test_rmse": rmse, "test_mae": mae,
           "objective": total_objective(alg, global_msg, local_states, fed.train, cfg),
           "data_term": data_term(alg, global_msg, local_states, fed)}
    if sparsity:
        row.update(nonzero_fractions(global_msg, local_states))
    return row


def trace(alg: Algorithm, cfg: Any, fed: Federation, *, rounds: int, per_round: int,
          seed: int, every: int, sparsity: bool = False) -> list[dict[str, float]]:
    """Rows {round, seconds (cumulative training time), test_rmse, test_mae, objective (the
    algorithm's own), data_term, [nnz_u, nnz_v, nnz_uv]} at round 0, every ``every`` rounds
    and the last round."""
    server, global_msg, local_states = initialise(alg, cfg, fed.train, seed)
    rows = [{"round": 0, "seconds": 0.0,
             **measure(alg, cfg, fed, global_msg, local_states, sparsity)}]
    seconds = 0.0

    def see(st: RoundState) -> None:
        nonlocal seconds
        seconds += st.seconds
        if st.round % every == 0 or st.round == rounds:
            rows.append({"round": st.round, "seconds": seconds,
                         **measure(alg, cfg, fed, st.global_msg, st.local_states, sparsity)})

    simulate(alg, cfg, fed, rounds=rounds, per_round=per_round, seed=seed, evaluate_every=0,
             on_state=see, start=RoundState(0, global_msg, server, local_states))
    return rows


def mean_curve(runs: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x = rounds, mean, std) of ``key`` across seeds (runs share their round grid)."""
    x = np.array([r["round"] for r in runs[0]])
    y = np.array([[r[key] for r in run] for run in runs], dtype=float)
    return x, y.mean(axis=0), y.std(axis=0)



def warm_up(alg: Algorithm, cfg: Any, fed: Federation) -> None:
    """One round, discarded: triggers any just-in-time compilation."""
    server, global_msg, local_states = initialise(alg, cfg, fed.train, 0)
    run_round(alg, cfg, 1, 0, 10, global_msg, server, local_states, fed.train)


def sweep(alg: Algorithm, configs: dict[str, Any], fed: Federation, *, rounds: int,
          every: int, seeds: int, sparsity: bool = False, tag: str = "") -> dict[str, dict]:
    """Traced runs of every labelled config over seeds 0..seeds-1 (10 tenants per round).

    Seeds are the outer loop, so a change of the machine's load over the sweep spreads over
    all configs instead of biasing the training time of the last ones. Each config first
    runs one untimed round so that compiling the numba kernels is not counted."""
    for cfg in configs.values():
        warm_up(alg, cfg, fed)
    out = {label: {"config": cfg.model_dump(), "runs": []} for label, cfg in configs.items()}
    for seed in range(seeds):
        for label, cfg in configs.items():
            run = trace(alg, cfg, fed, rounds=rounds, per_round=10, seed=seed, every=every,
                        sparsity=sparsity)
            out[label]["runs"].append(run)
            print(f"{tag} {label} seed {seed}: test RMSE {run[-1]['test_rmse']:.4f}, "
                  f"{run[-1]['seconds']:.1f} s training", flush=True)
    return out


def plot_against_time(results: dict[str, dict], panels: list[tuple[str, str, bool]],
                      title: str, path) -> None:
    """One panel per (key, y label, log y): mean over seeds against mean training time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(results)))
    for ax, (key, ylabel, log) in zip(axes[0], panels, strict=True):
        for colour, (label, res) in zip(colours, results.items(), strict=True):
            _, t, _ = mean_curve(res["runs"], "seconds")
            _, m, s = mean_curve(res["runs"], key)
            ax.plot(t, m, color=colour, label=label, marker=".", ms=3)
            ax.fill_between(t, m - s, m + s, color=colour, alpha=0.15)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("training time (s, client + server work)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    E.save_figure(fig, path)
