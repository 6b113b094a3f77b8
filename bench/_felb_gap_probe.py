"""Where Felb / Felb-MU lose F1 at MovieLens 25M's size (issue 22 part 2): measurements of
the two hypotheses of BENCHMARKS.md ("Felb Table 1 at the paper's size").

(a) *Tenants average away what each finds.* ``trace`` runs Felb or Felb-MU round by round
on the synthetic MovieLens 25M-shape set (``--fraction 0.1``: 5 tenants of ~3,250 users,
59,047 items) and, at the listed rounds, compares the tenants' uploads V_i: F1 of every
tenant with its own V_i (what local training found) against F1 with the broadcast V_hat
(what the server keeps); the cosine of component l of V_i with component l of V_j (the
same slot) against the best one-to-one matching of the components (Hungarian); and the
share of the Boolean components B(V_i) that survive in B(V_hat). ``--aggregation``
chooses the server step: ``mean`` (fedrec's: Elb prox of the mean with kappa/C,
lambda_t/C, the exact minimiser of eq. 10), ``alg1`` (Algorithm 1, line 16 as printed:
prox with kappa and lambda_t, ``server_prox='alg1'`` of
:class:`algorithms.felb.FelbConfig`), ``matched`` (a diagnostic: each V_i's components are
permuted to match V_hat's, by the Hungarian method on cosines, before eq. 10, and the
tenant permutes U_i's columns alike). ``--pooled`` merges the tenants into one (the
centralised fit of the same users: an upper reference for federated training).

(b) *The synthetic set may not hold a Boolean rank-20 fit of F1 0.19 that the squared loss
prefers.* ``tilings`` computes, on the pooled tenants, the best F1 of Boolean tilings
"user group x item set" with disjoint user groups (a Boolean factorisation of rank = the
number of groups, V shared by every tenant): for a given grouping the F1-optimal item sets
take every (group, item) cell whose density is above a threshold, found by scanning the
cells in order of density. Reported beside the F1 of the same tiling when only cells of
density above 1/2 are covered: the only cells whose covering lowers the squared loss
||A - U V||^2 that Felb minimises. Groupings: everyone (one tile), 20 activity quantiles,
20 spherical k-means clusters of the rows. ``--data ml-1m`` runs the same on real
binarised MovieLens 1M (for comparison with the generator).

    nice -n 10 python -m bench._felb_gap_probe tilings --fraction 0.1
    nice -n 10 python -m bench._felb_gap_probe trace --method felb --fraction 0.1
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from scipy.optimize import linear_sum_assignment  # noqa: E402

from algorithms import felb  # noqa: E402
from algorithms.binary_metrics import binarise, boolean_quality  # noqa: E402
from algorithms.block import RatingBlock  # noqa: E402
from algorithms.simulate import initialise, run_round  # noqa: E402

# ---------------------------------------------------------------------------- data

def blocks(data: str, fraction: float, seed: int = 0) -> list[RatingBlock]:
    """The tenants' Boolean blocks (every rating, no held-out split, as Table 1 scores):
    ``ml-25m`` the synthetic MovieLens 25M shape (``fraction`` of its users, ratings and 50
    tenants), ``ml-1m-synth`` the generator at MovieLens 1M's shape, ``ml-1m`` real
    MovieLens 1M (50 tenants; its train and test ratings together)."""
    if data == "ml-1m":
        from algorithms.data import build_federation, load_movielens
        fed = binarise(build_federation(load_movielens("ml-1m"), 50, seed), 3.5)
        return [RatingBlock(
            np.concatenate([tr.rows, te.rows]), np.concatenate([tr.cols, te.cols]),
            np.concatenate([tr.vals, te.vals]), tr.n_users, tr.n_items)
            for tr, te in zip(fed.train, fed.test, strict=True)]
    from bench.felb_table1 import paper_federation
    shape = "ml-1m" if data == "ml-1m-synth" else "ml-25m"
    return list(paper_federation(seed, 50, fraction, shape).train)


def pooled(bs: list[RatingBlock]) -> RatingBlock:
    """One block holding every tenant's users (tenant by tenant)."""
    off = np.cumsum([0] + [b.n_users for b in bs])
    return RatingBlock(np.concatenate([b.rows + o for b, o in zip(bs, off, strict=False)]),
                       np.concatenate([b.cols for b in bs]),
                       np.concatenate([b.vals for b in bs]), int(off[-1]), bs[0].n_items)


# ------------------------------------------------------------------------- tilings

def tiling_f1(a: sp.csr_matrix, groups: np.ndarray) -> dict:
    """Best F1 of 'group g x its item set' tilings for the row partition ``groups``.

    The cells (g, j) covered are those of density above a threshold tau; F1 is maximised
    over tau by a scan of the cells in decreasing density. Also: F1 when tau = 1/2.
    """
    n_groups = int(groups.max()) + 1
    g = sp.csr_matrix((np.ones(a.shape[0]), (groups, np.arange(a.shape[0]))),
                      shape=(n_groups, a.shape[0]))
    counts = np.asarray((g @ a).todense()).ravel()
    sizes = np.repeat(np.bincount(groups, minlength=n_groups), a.shape[1]).astype(float)
    keep = counts > 0
    counts, sizes = counts[keep], sizes[keep]
    dens = counts / sizes
    order = np.argsort(-dens, kind="stable")
    tp, pred = np.cumsum(counts[order]), np.cumsum(sizes[order])
    n_ones = a.nnz
    f1 = 2 * tp / (pred + n_ones)
    best = int(np.argmax(f1))
    half = dens[order] > 0.5
    f1_half = (2 * tp[half].max() / (pred[half].max() + n_ones)) if half.any() else 0.0
    # FP + FN of the best tiling over that of the empty reconstruction (n_ones): above 1
    # means the tiling's squared error ||A - U o V||^2 is worse than predicting no 1 at all
    errors = (pred[best] - tp[best]) + (n_ones - tp[best])
    # the best F1 of a prefix whose squared error is no worse than the empty one's
    ok = (pred - tp) + (n_ones - tp) <= n_ones
    f1_ok = float(f1[ok].max()) if ok.any() else 0.0
    return {"f1": float(f1[best]), "tau": float(dens[order][best]),
            "cells": best + 1, "f1_half": float(f1_half), "cells_half": int(half.sum()),
            "error_ratio": float(errors / n_ones), "f1_no_worse": f1_ok}


def kmeans_rows(a: sp.csr_matrix, k: int, iters: int, rng: np.random.Generator) -> np.ndarray:
    """Spherical k-means of the rows of ``a`` (cosine), seeded at ``k`` random rows."""
    norms = np.sqrt(np.asarray(a.multiply(a).sum(axis=1)).ravel())
    x = sp.diags(1.0 / np.maximum(norms, 1e-12)) @ a
    centres = np.asarray(x[rng.choice(a.shape[0], k, replace=False)].todense())
    labels = np.zeros(a.shape[0], np.int64)
    for _ in range(iters):
        labels = np.asarray((x @ centres.T).argmax(axis=1)).ravel()
        for c in range(k):
            members = labels == c
            if members.any():
                s = np.asarray(x[members].sum(axis=0)).ravel()
                centres[c] = s / max(np.linalg.norm(s), 1e-12)
    return labels


def tilings(args) -> None:
    bs = blocks(args.data, args.fraction)
    whole = pooled(bs)
    a = whole.csr.astype(np.float64)
    print(f"{args.data} x{args.fraction:g}: {len(bs)} tenants, {a.shape[0]} users, "
          f"{a.shape[1]} items, {a.nnz} ones", flush=True)
    activity = np.asarray((a > 0).sum(axis=1)).ravel()
    ranks = np.argsort(np.argsort(activity, kind="stable"), kind="stable")
    groupings = {"everyone (1 tile)": np.zeros(a.shape[0], np.int64),
                 f"{args.k} activity quantiles": ranks * args.k // a.shape[0],
                 f"{args.k} k-means clusters": kmeans_rows(a, args.k, 15,
                                                           np.random.default_rng(0))}
    for name, groups in groupings.items():
        t0 = time.process_time()
        r = tiling_f1(a, groups)
        print(f"  {name}: best F1 {r['f1']:.4f} (cells of density >= {r['tau']:.3f}, "
              f"{r['cells']} group x item cells; FP+FN {r['error_ratio']:.2f} x the empty "
              f"reconstruction's); covering only density > 1/2: F1 "
              f"{r['f1_half']:.4f} ({r['cells_half']} cells); best F1 with FP+FN no worse than the "
              f"empty reconstruction's: {r['f1_no_worse']:.4f}; {time.process_time() - t0:.1f} s",
              flush=True)
    if args.per_tenant:  # the same on one tenant alone
        a0 = bs[0].csr.astype(np.float64)
        r = tiling_f1(a0, np.zeros(a0.shape[0], np.int64))
        print(f"  tenant 0 alone, everyone: best F1 {r['f1']:.4f} ({r['cells']} items); "
              f"density > 1/2: F1 {r['f1_half']:.4f} ({r['cells_half']} items)")


# --------------------------------------------------------------------------- trace

def _cos(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    nx = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    ny = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
    return nx @ ny.T


def _match(ref: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Permutation p with v[p] best matching ``ref`` row by row (max total cosine)."""
    _, p = linear_sum_assignment(-_cos(ref, v))
    return p


def trace(args) -> None:
    bs = blocks(args.data, args.fraction)
    if args.pooled:
        bs = [pooled(bs)]
    alg = felb.ALGORITHMS[args.method]
    cfg = alg.config(rank=20, local_steps=10, proximity=args.gamma, start=args.start,
                     server_prox="alg1" if args.aggregation == "alg1" else "eq10")
    seed = 0
    server, glob, locs = initialise(alg, cfg, bs, seed)
    perms: dict[int, np.ndarray] = {}

    def matched(uploads, k):
        """Each V_i's components permuted to V_hat's order (to tenant 0's in round 1)."""
        ref = uploads[min(uploads)].v if k == 1 else glob.v_hat
        perms.clear()
        perms.update({i: _match(ref, up.v) for i, up in uploads.items()})
        return {i: felb.FelbUpload(up.v[perms[i]]) for i, up in uploads.items()}
    report = set(args.report) | {args.rounds}
    print(f"{args.method} {args.data} x{args.fraction:g}{' pooled' if args.pooled else ''}: "
          f"{len(bs)} tenant(s), {sum(b.n_users for b in bs)} users; start {args.start}, "
          f"gamma {args.gamma:g}, aggregation {args.aggregation}", flush=True)
    cpu = time.process_time()
    for r in range(1, args.rounds + 1):
        agg = matched if args.aggregation == "matched" else None
        glob, server, locs, _, ups = run_round(alg, cfg, r, seed, len(bs), glob, server,
                                               locs, bs, aggregator=agg)
        if perms:  # each tenant reorders its U_i's columns as its V_i was (it can match
            # its own upload to the V_hat it receives: no data leave the tenant)
            locs = [felb.FelbLocal(s.u[:, perms[i]], s.u_prev[:, perms[i]])
                    for i, s in enumerate(locs)]
            ups = {i: felb.FelbUpload(up.v[perms[i]]) for i, up in ups.items()}
        if r not in report:
            continue
        vs = [ups[i].v for i in sorted(ups)]
        bu = [felb.boolean(s.u) for s in locs]
        bv_hat = felb.boolean(glob.v_hat)
        f1_own, rmsd_own = boolean_quality([(u, felb.boolean(v)) for u, v in zip(bu, vs,
                                                                          strict=True)], bs)
        f1_hat, rmsd_hat = boolean_quality([(u, bv_hat) for u in bu], bs)
        cells = sum(b.n_users * b.n_items for b in bs)
        empty = np.sqrt(sum(b.nnz for b in bs) / cells)  # RMSD of no 1 at all
        line = (f"round {r}: F1 own V_i {f1_own:.4f}, with V_hat {f1_hat:.4f} (FP+FN "
                f"{(rmsd_hat / empty) ** 2:.3f} x the empty reconstruction's); "
                f"B(V_hat) {bv_hat.sum()} ones in {int(bv_hat.any(axis=1).sum())} non-empty "
                f"components")
        if len(vs) > 1:
            same, best, moved = [], [], 0
            pairs = ([(i, j) for i in range(len(vs)) for j in range(i + 1, len(vs))]
                     if len(vs) <= 5 else [(0, j) for j in range(1, len(vs))])
            for i, j in pairs:  # every pair of 5 tenants, tenant 0 with each of more
                c = _cos(vs[i], vs[j])
                same.append(np.mean(np.diag(c)))
                p = _match(vs[i], vs[j])
                best.append(np.mean(c[np.arange(len(p)), p]))
                moved += int((p != np.arange(len(p))).sum())
            # Boolean components of the uploads and how many of their 1s V_hat keeps
            kept = [(felb.boolean(v) & bv_hat).sum() / max(felb.boolean(v).sum(), 1)
                    for v in vs]
            hat_cos = np.mean([np.mean(np.diag(_cos(v, glob.v_hat))) for v in vs])
            line += (f"; cos(V_i[l], V_j[l]) same slot {np.mean(same):.3f}, best matching "
                     f"{np.mean(best):.3f} ({moved} of {len(same) * cfg.rank} slots move); "
                     f"cos(V_i[l], V_hat[l]) {hat_cos:.3f}; 1s of B(V_i) kept in B(V_hat) "
                     f"{np.mean(kept):.2f}; B(V_i) sizes "
                     f"{[int(felb.boolean(v).sum()) for v in vs][:5]}")
        print(line + f" [{time.process_time() - cpu:.0f} s CPU]", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("tilings", "trace"):
        p = sub.add_parser(name)
        p.add_argument("--data", choices=["ml-25m", "ml-1m-synth", "ml-1m"], default="ml-25m")
        p.add_argument("--fraction", type=float, default=0.1)
    t = sub.choices["tilings"]
    t.add_argument("--k", type=int, default=20)
    t.add_argument("--per-tenant", action="store_true")
    t = sub.choices["trace"]
    t.add_argument("--method", choices=sorted(felb.ALGORITHMS), default="felb")
    t.add_argument("--rounds", type=int, default=20)
    t.add_argument("--report", type=int, nargs="*", default=[1, 2, 5, 10])
    t.add_argument("--gamma", type=float, default=1.0)
    t.add_argument("--start", choices=["scaled", "uniform"], default="scaled")
    t.add_argument("--aggregation", choices=["mean", "alg1", "matched"], default="mean")
    t.add_argument("--pooled", action="store_true")
    args = ap.parse_args(argv)
    {"tilings": tilings, "trace": trace}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
