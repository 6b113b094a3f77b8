"""Attack-based privacy audit (issue 5, part 6): membership AUC and reconstruction RMSE.

For each algorithm, with and without DP, run on MovieLens 100k and attack every tenant's
last upload as the server received it (see :mod:`privacy.audit`):

* membership AUC: was item j in the tenant's training ratings (members) or only in its
  held-out ratings (non-members)? 0.5 = chance;
* reconstruction RMSE of the tenant-item mean training rating by a ridge regression trained
  on the uploads of the even-numbered tenants (assumed known to the attacker), evaluated on
  the odd ones; "chance" predicts the mean of the known targets;
* FedMGS only, ``--fedmgs-exact``: one user per tenant (943 tenants), one round; the exact
  single-rater reconstruction of every rating of tenants 0-99 from G_j, b_j (RMSE and
  share exact).

DP runs: Gaussian noise solved for a per-tenant epsilon over the whole run (unit: tenant
block, delta 1e-5), clip C = median L2 norm of the clean run's uploads.

    nice -n 10 python -m bench.privacy_audit --algorithm fedmc-admm --epsilons 10 1000
    nice -n 10 python -m bench.privacy_audit --fedmgs-exact --epsilons 10 1000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from algorithms import registry
from algorithms.base import default_select
from algorithms.data import build_federation, data_dir, load_ratings
from algorithms.simulate import RoundState, evaluate, simulate
from privacy.accountant import noise_for_epsilon
from privacy.audit import (
    auc,
    fedmgs_single_rater,
    item_features,
    item_membership_scores,
    resolve_sign,
    ridge_fit,
    ridge_predict,
)
from privacy.cli import sampling_plan
from privacy.clipping import joint_norm
from privacy.ledger import Budget, Ledger, worst_case_plan
from privacy.wrapper import DPPrivatizer, DPSpec

DELTA = 1e-5


def observe(alg, cfg, fed, rounds, per_round, seed, privatizer, keep=None):
    """Run the federation; return each tenant's last upload with the broadcast it answered
    (only for tenants ``i < keep`` if given, to bound memory)."""
    seen: dict[int, tuple] = {}

    def see(st: RoundState) -> None:
        for i, up in st.uploads.items():
            if keep is None or i < keep:
                seen[i] = (up, st.previous_global)

    res = simulate(alg, cfg, fed, rounds=rounds, per_round=per_round, seed=seed,
                   privatizer=privatizer, evaluate_every=0, on_state=see)
    rmse, _ = evaluate(alg, res.global_msg, res.local_states, fed.test, fed.scale)
    return seen, rmse


def _reference(upload, glob):
    shapes = {a.shape for a in upload.arrays().values()}
    return next((a for a in glob.arrays().values() if a.shape in shapes), None)


def attack(fed, seen) -> dict:
    """Membership AUC (mean over tenants) and regression reconstruction RMSE."""
    n = fed.n_items
    aucs, feats, targets, owners = [], [], [], []
    for i, (up, glob) in sorted(seen.items()):
        ref = _reference(up, glob)
        score = item_membership_scores(up.arrays(), ref, n)
        train, test = fed.train[i], fed.test[i]
        members = np.unique(train.cols)
        non = np.setdiff1d(np.unique(test.cols), members)
        aucs.append(auc(score[members], score[non]))
        sums = np.bincount(train.cols, train.vals, n)[members]
        counts = np.bincount(train.cols, None, n)[members]
        feats.append(item_features(up.arrays(), ref, n)[members])
        targets.append(sums / counts)
        owners.append(np.full(members.size, i))
    x, y, own = np.vstack(feats), np.concatenate(targets), np.concatenate(owners)
    shadow = own % 2 == 0
    w = ridge_fit(x[shadow], y[shadow])
    err = ridge_predict(w, x[~shadow]) - y[~shadow]
    chance = y[~shadow] - y[shadow].mean()
    return {"membership_auc": float(np.nanmean(aucs)),
            "reconstruction_rmse": float(np.sqrt(np.mean(err**2))),
            "chance_rmse": float(np.sqrt(np.mean(chance**2))),
            "tenants_attacked": len(seen)}


def exact_fedmgs(fed, seen) -> dict:
    """FedMGS, one user per tenant: read every rating off (G_j, b_j).

    The offset and the sign are fixed with the average rating and the histogram of the
    tenants not attacked (auxiliary knowledge). "exact up to offset": right once the
    tenant's constant shift is removed.
    """
    others = np.concatenate([b.vals for i, b in enumerate(fed.train) if i not in seen])
    prior = float(others.mean())
    hist = np.bincount(np.rint(others - fed.scale[0]).astype(int))
    errs, exact, centred_exact = [], 0, 0
    for i, (up, _) in seen.items():
        items, vals = fedmgs_single_rater(up.gram, up.cross, assume_single=True)
        truth = np.full(fed.n_items, np.nan)
        truth[fed.train[i].cols] = fed.train[i].vals
        keep = ~np.isnan(truth[items])
        e = resolve_sign(vals[keep], fed.scale, hist, prior) - truth[items][keep]
        errs.append(e)
        exact += int(np.sum(np.abs(e) < 1e-6))
        centred_exact += int(np.sum(np.abs(e - np.median(e)) < 1e-6))
    e = np.concatenate(errs)
    return {"reconstruction_rmse": float(np.sqrt(np.mean(e**2))),
            "share_exact": exact / e.size, "share_exact_up_to_offset": centred_exact / e.size,
            "ratings_attacked": int(e.size)}


def dp_privatizer(alg, fed, rounds, per_round, seed, eps, clip):
    if alg.select is default_select:
        plan = sampling_plan(fed.n_clients, rounds, per_round, seed)
    else:
        plan = worst_case_plan(range(fed.n_clients), rounds)
    z = noise_for_epsilon("gaussian", eps, DELTA, max(plan.values()))
    spec = DPSpec(mechanism="gaussian", clip=clip, noise_multiplier=z, delta=DELTA)
    led = Ledger.open({i: Budget(eps, DELTA) for i in range(fed.n_clients)})
    priv = DPPrivatizer(spec, led, seed)
    priv.check_plan(plan)
    return priv


def audit(name, epsilons, seed, exact_mode=False) -> list[dict]:
    alg = registry.get(name)
    cfg = alg.config()
    run = dict(alg.run_defaults)
    if exact_mode:
        run.update(clients=943, per_round=943, rounds=1)
    fed = build_federation(load_ratings(data_dir() / "ml-100k" / "u.data"), run["clients"], seed)
    per_round = run["per_round"] or fed.n_clients
    do = exact_fedmgs if exact_mode else attack
    keep = 100 if exact_mode else None
    seen, rmse = observe(alg, cfg, fed, run["rounds"], per_round, seed, None, keep)
    clip = float(np.median([joint_norm(u.arrays(), "l2") for u, _ in seen.values()]))
    rows = [{"algorithm": name, "dp": "none", "epsilon": None, "test_rmse": rmse, **do(fed, seen)}]
    print(json.dumps(rows[-1]), flush=True)
    for eps in epsilons:
        priv = dp_privatizer(alg, fed, run["rounds"], per_round, seed, eps, clip)
        row = {"algorithm": name, "dp": "gaussian", "epsilon": eps, "clip": clip}
        try:
            seen, rmse = observe(alg, cfg, fed, run["rounds"], per_round, seed, priv, keep)
            row.update(test_rmse=rmse, **do(fed, seen))
        except (np.linalg.LinAlgError, FloatingPointError, ValueError) as exc:
            row["error"] = f"training diverged under noise: {type(exc).__name__}: {exc}"
        rows.append({**row, "epsilon_spent_max": priv.report()["epsilon_max"]})
        print(json.dumps(rows[-1]), flush=True)
    for r in rows:
        r["setting"] = "exact (1 user/tenant, 1 round)" if exact_mode else "regression"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="fedmc-admm")
    ap.add_argument("--fedmgs-exact", action="store_true")
    ap.add_argument("--epsilons", nargs="*", type=float, default=[10.0, 1000.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="append the rows to this JSON file")
    args = ap.parse_args()
    if data_dir() is None:
        raise SystemExit("MovieLens not found: set FEDREC_DATA_DIR")
    name = "fedmgs" if args.fedmgs_exact else args.algorithm
    rows = audit(name, args.epsilons, args.seed, args.fedmgs_exact)
    if args.out is not None:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(old + rows, indent=1))


if __name__ == "__main__":
    main()
