"""White-box audit of the noisy releases (issue 29): a canary at the sensitivity bound.

For each placement (central, tenant, secure aggregation, central with users sampled at
rate q) and each claimed epsilon, the release function the product calls is run many
times with and without a canary of exactly the declared sensitivity in every bounded
array, and the likelihood-ratio score of each release is computed by an auditor who knows
every other contribution (:mod:`privacy.release_audit`). Three noise sources: fresh
generators (the claim's assumption: the empirical epsilon must stay below the claim), the
same generator state in every run, and generators whose seed the attacker knows (both
must be caught: empirical epsilon above the claim). Reported: the claim (what the ledger
charges), the held-out Clopper-Pearson bound (rigorous, capped by the run count) and the
Gaussian-DP fit with its lower confidence bound (not capped; assumes Gaussian scores).

Setting: DPALS uploads (rank 2, 5 ratings per user; gram, rhs and centre arrays) of
``--tenants`` tenants over ``--items`` items, one release (the first of a plan of one),
delta 1e-5, 95% confidence.

    python -m bench release_audit --epsilons 1 2 4 8 --runs 2000
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from algorithms import dpals
from bench._experiment import parser, write_result
from privacy import release_audit as A
from privacy.user_level import UserLevelSpec

EXPERIMENT = ("White-box audit of the noisy releases: a canary at the sensitivity bound, "
              "held-out Clopper-Pearson and Gaussian-DP fit, with negative controls")
DELTA = 1e-5
SAMPLED_RATE = 0.5


def _upload(rng: np.random.Generator, bounds, n_items: int, d: int) -> dpals.Upload:
    x = rng.normal(size=(n_items, 6, d))
    m = np.array([rng.uniform(-6, 6), 6.0]) if bounds.centre else None
    return dpals.Upload(A=np.einsum("nki,nkj->nij", x, x), b=rng.normal(size=(n_items, d)),
                        m=m)


def scenario(placement: str, epsilon: float, n_items: int = 4, tenants: int = 3,
             seed: int = 0) -> A.Scenario:
    """DPALS uploads of ``tenants`` tenants and the user-level spec of ``placement`` at
    the claimed ``epsilon`` (one release)."""
    rate = SAMPLED_RATE if placement == "central_sampled" else 1.0
    cfg = dpals.DPALSConfig(rank=2, max_ratings_per_user=5, user_sample_rate=rate)
    bounds = dpals.user_bounds(cfg)
    rng = np.random.default_rng(seed)
    uploads = {i: _upload(rng, bounds, n_items, cfg.rank + 1) for i in range(tenants)}
    spec = UserLevelSpec(
        epsilon=epsilon, delta=DELTA, n_users=1000, releases=1, sample_rate=rate,
        placement="central" if placement.startswith("central") else "tenant",
        secure_aggregation=placement == "secure_aggregation")
    return A.Scenario(spec, bounds, uploads)


def audit_all(epsilons: list[float], runs: int, n_items: int, tenants: int
              ) -> list[dict[str, Any]]:
    """Every placement x noise source x claim (the sampled placement with fresh noise
    only: its controls are those of central)."""
    rows = []
    for eps in epsilons:
        for placement in A.PLACEMENTS:
            s = scenario(placement, eps, n_items, tenants)
            sources = (A.FRESH,) if placement == "central_sampled" else A.NOISE_SOURCES
            for source in sources:
                rows.append(A.run_audit(s, placement, source, runs))
                print(_line(rows[-1]), flush=True)
    return rows


def _line(r: dict[str, Any]) -> str:
    gdp = r.get("gdp", {}).get("epsilon_lower")
    return (f"{r['placement']:<19} {r['noise']:<6} claim {r['claimed_epsilon']:.3f}: "
            f"held-out {r['held_out']['epsilon']:.3f} (max {r['held_out']['max_measurable']:.2f})"
            f", GDP lower {'-' if gdp is None else f'{gdp:.3f}'}"
            f" -> {'REFUTED' if r['refutes_claim'] else 'consistent'}")


def main(argv: list[str] | None = None) -> int:
    ap = parser("release_audit", __doc__, seeds=1)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    ap.add_argument("--runs", type=int, default=2000,
                    help="releases with the canary (and as many without) per audit")
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--tenants", type=int, default=3)
    args = ap.parse_args(argv)
    if args.quick:
        args.epsilons, args.runs = [2.0], 40
    rows = audit_all(args.epsilons, args.runs, args.items, args.tenants)
    fresh = [r for r in rows if r["noise"] == A.FRESH]
    controls = [r for r in rows if r["noise"] != A.FRESH]
    summary = {"fresh_all_below_claim": all(not r["refutes_claim"] for r in fresh),
               "controls_all_caught": all(r["refutes_claim"] for r in controls)}
    print(summary, flush=True)
    setting = {"items": args.items, "tenants": args.tenants, "delta": DELTA,
               "sampled_rate": SAMPLED_RATE, "runs_per_side": args.runs, "confidence": 0.95}
    write_result(args.out, "release_audit", argv, args.quick,
                 {"setting": setting, "summary": summary, "audits": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
