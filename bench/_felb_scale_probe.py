"""Why Felb / Felb-MU reconstruct almost nothing at MovieLens 25M's size: a trace of the
first rounds on one tenant of ~3,250 users (59,047 items) beside one of ~121 (3,706 items).

Prints, after rounds 1 and 5 of one tenant alone (k = 20, T = 10, gamma = 1), from the
paper's uniform start on [0, 1] and from fedrec's default scaled start on [0, 1/sqrt(n)]
(:class:`algorithms.felb.FelbConfig` ``start``): ||V V^T||_2
of V_hat, the median and largest entry of U_i, the share of U_i and of V_hat at or above
1/2 (B(U), B(V_hat)), and the median of the V step's proximity weight xi gamma (xi =
1/||U^T U||_2 for Felb, V / (U^T U V) for Felb-MU, eq. 8). Used by the section "Felb
Table 1 at the paper's size" in BENCHMARKS.md::

    nice -n 10 python -m bench._felb_scale_probe
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from algorithms import felb  # noqa: E402
from algorithms.simulate import simulate  # noqa: E402
from bench.felb_table1 import paper_federation  # noqa: E402


def trace(shape: str, method: str, rounds: tuple[int, ...] = (1, 5),
          start: str = "uniform") -> list[str]:
    """One line per round in ``rounds`` for the first tenant of the ``shape`` set."""
    fed = paper_federation(0, 50, 0.02, shape)  # 0.02 of 50 tenants: one tenant
    block, lines = fed.train[0], []
    alg = felb.ALGORITHMS[method]
    cfg = alg.config(rank=20, local_steps=10, proximity=1.0, start=start)

    def on_state(st) -> None:
        if st.round not in rounds:
            return
        u, v = st.local_states[0].u, st.global_msg.v_hat
        g = u.T @ u
        xi = (v.T / np.maximum(v.T @ g, 1e-12) if method == "felb-mu"
              else np.full(v.T.shape, 1.0 / np.linalg.norm(g, 2)))
        lines.append(f"{shape} {method} {start} ({block.n_users} users, {block.n_items} items, "
                     f"{block.nnz} ones) round {st.round}: ||V V^T|| "
                     f"{np.linalg.norm(v @ v.T, 2):.3g}, U median {np.median(u):.2e} max "
                     f"{u.max():.3f}, B(U) {np.mean(u >= 0.5):.4f}, xi gamma median "
                     f"{np.median(xi) * cfg.proximity:.3g}, B(V_hat) {np.mean(v >= 0.5):.4f}")

    simulate(alg, cfg, fed, rounds=max(rounds), per_round=1, seed=0, evaluate_every=0,
             on_state=on_state)
    return lines


if __name__ == "__main__":
    for start in ("uniform", "scaled"):
        for shape in ("ml-1m", "ml-25m"):
            for method in ("felb-mu", "felb"):
                print("\n".join(trace(shape, method, start=start)), flush=True)
