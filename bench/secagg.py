"""Secure aggregation: cost per round for 10, 100 and 1000 tenants, and the accuracy of
distributed DP (placement tenant + secure aggregation) against central placement.

Cost: one round of :mod:`privacy.secagg` on vectors of the DPALS upload at MovieLens 1M
shape (rank 4, d = 5, 3706 items, gram upper triangles + rhs = 3706 x (15 + 5) = 74,120
values of 64 bits). Up to ``--full-max`` tenants (default 100) every tenant runs every
phase for real in one process. Beyond, the round is *simulated*: ``--sample`` tenants run
every phase for real against all their peers (their inbox holds real encrypted shares
from every other tenant, they mask with every other tenant's real key), the other tenants
only advertise real keys and encrypt real shares for the sampled tenants; the
coordinator's work is timed component by component on the same operations
:func:`privacy.secagg.aggregate` performs (routing, Lagrange coefficients, one Shamir
reconstruction and one self-mask expansion per survivor, one pairwise-mask expansion
per dropped tenant and survivor). Times are CPU seconds of the working thread
(``time.thread_time``: what a step costs on an idle core; the shared machine's wall time
stretches with its load). Bytes are counted from the messages.

Utility: DPALS on MovieLens 1M (80/20 split seed 0, 100 tenants, delta 1e-6, its
defaults), test RMSE at each ``--epsilons`` for central placement, placement tenant
without secure aggregation and placement tenant with it (run seeds vary the initial V and
the noise; the split stays seed 0).

    python -m bench secagg --seeds 3
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from algorithms import dpals
from algorithms.data import build_federation, load_movielens
from algorithms.simulate import simulate
from bench._experiment import comparison, parser, write_result
from privacy import secagg as S
from privacy.distributed import SecureAggregationPrivatizer
from privacy.randomness import private_federation
from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

EXPERIMENT = ("Secure aggregation (Bonawitz et al. CCS 2017): seconds and bytes per round "
              "for 10/100/1000 tenants; RMSE of distributed DP vs central (DPALS, ML-1M)")
NEEDS_DATA = True
DELTA = 1e-6
ML1M_ITEMS, RANK = 3706, 4
#: CPU seconds of this thread: on the shared machine wall time stretches with the load
CLOCK = time.thread_time
LENGTH = ML1M_ITEMS * ((RANK + 1) * (RANK + 2) // 2 + RANK + 1)  # 74,120


def _timer(store: dict):
    def record(phase: str, who: int | None, seconds: float) -> None:
        store[("coordinator" if who is None else "tenant", phase)].append(seconds)
    return record


def cost_full(n: int, length: int, dropped: int = 0) -> dict[str, Any]:
    """Every phase of every tenant for real; ``dropped`` tenants vanish before masking."""
    rng = np.random.default_rng(0)
    inputs = {i: rng.integers(0, 2 ** 63, length, dtype=np.uint64) for i in range(n)}
    times: dict = defaultdict(list)
    res = S.run_round(inputs, b"bench", dropout_tolerance=0.1 if dropped <= n // 10 else 0.49,
                      drop_before_input=range(dropped), timer=_timer(times), clock=CLOCK)
    expect = np.zeros(length, dtype=np.uint64)
    for i in res.survivors:
        expect += inputs[i]
    assert np.array_equal(res.total, expect)
    per_tenant = defaultdict(float)
    for (who, phase), vals in times.items():
        if who == "tenant":
            per_tenant[phase] = statistics.fmean(vals)
    coord = {phase: sum(v) for (who, phase), v in times.items() if who == "coordinator"}
    surv = res.survivors
    return {"tenants": n, "dropped": dropped, "threshold": res.roster.threshold,
            "simulated": False, "tenant_seconds": dict(per_tenant),
            "tenant_seconds_total": sum(per_tenant.values()),
            "coordinator_seconds": coord, "coordinator_seconds_total": sum(coord.values()),
            "bytes_sent_per_tenant": statistics.fmean(res.bytes_sent[i] for i in surv),
            "bytes_received_per_tenant": statistics.fmean(res.bytes_received[i]
                                                         for i in surv)}


def _shares_for(state: S.TenantState, roster: S.KeyRoster, recipients: list[int]
                ) -> list[S.EncryptedShare]:
    """A non-sampled tenant's phase 1, restricted to the sampled recipients (real shares of
    a real self-mask seed and mask key, real AEAD), evaluated only at their points."""
    state.roster = roster
    state.self_seed = os.urandom(32)
    b = S.shamir_split(state.self_seed, recipients, roster.threshold)
    s = S.shamir_split(S._priv_bytes(state.mask_sk), recipients, roster.threshold)
    out = []
    for v in recipients:
        key = S._channel_key(state.channel_sk, roster.key(v).channel_pk, roster.round_id,
                             state.tenant, v)
        plain = S._tag(b"", state.tenant, v) + np.concatenate([b[v], s[v]]).astype(
            "<u4").tobytes()
        ct = S.ChaCha20Poly1305(key).encrypt(b"\0" * 12, plain,
                                             S._tag(roster.round_id, state.tenant, v))
        out.append(S.EncryptedShare(state.tenant, v, ct))
    return out


def cost_sampled(n: int, length: int, sample: int, dropped_frac: float = 0.1
                 ) -> dict[str, Any]:
    """The simulated round of the module docstring."""
    rid = b"bench-sampled"
    sampled = list(range(sample))
    times: dict = defaultdict(list)
    states, adverts = {}, []
    for i in range(n):
        t0 = CLOCK()
        states[i], ad = S.advertise(i, rid)
        times["advertise"].append(CLOCK() - t0)
        adverts.append(ad)
    t0 = CLOCK()
    roster = S.make_roster(adverts, rid, length)
    coord = {"advertise": CLOCK() - t0}
    messages: list[S.ShareKeys] = []
    for i in range(n):
        if i in sampled:
            t0 = CLOCK()
            msg = S.share_keys(states[i], roster)
            times["share_keys"].append(CLOCK() - t0)
        else:
            real = _shares_for(states[i], roster, sampled)
            filler = [S.EncryptedShare(i, v, os.urandom(len(real[0].ciphertext)))
                      for v in range(n) if v != i and v not in sampled]
            msg = S.ShareKeys(i, tuple(real + filler))
        messages.append(msg)
    t0 = CLOCK()
    inboxes = S.route_shares(roster, messages)
    coord["share_keys"] = CLOCK() - t0
    rng = np.random.default_rng(0)
    masked = {}
    for i in range(n):
        x = rng.integers(0, 2 ** 63, length, dtype=np.uint64)
        if i in sampled:
            t0 = CLOCK()
            masked[i] = S.mask_input(states[i], inboxes[i], x)
            times["mask_input"].append(CLOCK() - t0)
        else:  # indistinguishable from a real y to the coordinator
            masked[i] = S.MaskedInput(i, x)
    t0 = CLOCK()
    request = S.unmask_request(roster, inboxes[0].participants, masked)
    coord["unmask"] = CLOCK() - t0
    responses = []
    for i in sampled:
        t0 = CLOCK()
        responses.append(S.unmask(states[i], request))
        times["unmask"].append(CLOCK() - t0)
    # the coordinator's phase 4, component by component (module docstring)
    t = roster.threshold
    one = S.shamir_split(os.urandom(32), list(range(t)), t)
    t0 = CLOCK()
    lam = S.lagrange_at_zero(list(range(t)))
    total = np.zeros(length, dtype=np.uint64)
    for u in range(n):
        total += masked[u].y
        seed = S.shamir_combine(one, lam)
        total -= S.prg(S._self_mask_key(seed, rid, u), length)
    coord["aggregate"] = CLOCK() - t0
    sk = S.X25519PrivateKey.generate()  # one recovered pairwise mask: agreement + PRG
    t0 = CLOCK()
    for u in range(20):
        S.prg(S.mask_key(sk, roster.key(u).mask_pk, rid, n, u), length)
    per_prg = (CLOCK() - t0) / 20
    n_drop = int(dropped_frac * n)
    per_tenant = {k: statistics.fmean(v) for k, v in times.items()}
    bytes_sent = (S.message_bytes(adverts[0]) + S.message_bytes(messages[0])
                  + S.message_bytes(masked[0]) + S.message_bytes(responses[0]))
    bytes_recv = (S.message_bytes(roster) + S.message_bytes(inboxes[0])
                  + S.message_bytes(request) + total.nbytes)
    return {"tenants": n, "dropped": 0, "threshold": t, "simulated": True,
            "sampled_tenants": sample, "tenant_seconds": per_tenant,
            "tenant_seconds_total": sum(per_tenant.values()),
            "coordinator_seconds": coord, "coordinator_seconds_total": sum(coord.values()),
            "coordinator_seconds_extra_if_dropped": {
                "fraction": dropped_frac, "seconds": n_drop * (n - n_drop) * per_prg,
                "note": f"{n_drop} x {n - n_drop} pairwise masks (key agreement + expansion) at "
                        f"{per_prg * 1e3:.2f} ms each (extrapolated)"},
            "bytes_sent_per_tenant": bytes_sent, "bytes_received_per_tenant": bytes_recv}


def run_user(cfg, fed, *, epsilon: float, mode: str, seed: int) -> tuple[float, dict]:
    """Test RMSE and privacy report of DPALS with the user unit: mode central, tenant or
    secagg (placement tenant with secure aggregation)."""
    bounds = dpals.user_bounds(cfg)
    spec = UserLevelSpec(epsilon=epsilon, delta=DELTA, n_users=sum(b.n_users for b in fed.train),
                         releases=cfg.sweeps, sample_rate=bounds.sample_rate,
                         placement="central" if mode == "central" else "tenant",
                         secure_aggregation=mode == "secagg")
    cls = SecureAggregationPrivatizer if mode == "secagg" else UserLevelPrivatizer
    priv = cls(spec, bounds, fed.n_clients, seed)
    fed = private_federation(fed)  # per-user caps and samples from a fresh secret
    res = simulate(dpals.ALGORITHM, cfg, fed, rounds=cfg.sweeps + 1, per_round=fed.n_clients,
                   seed=seed, privatizer=priv, aggregator=priv.aggregate,
                   evaluate_every=cfg.sweeps + 1)
    return res.final.test_rmse, priv.report()


def main(argv: list[str] | None = None) -> int:
    ap = parser("secagg", __doc__, seeds=3)
    ap.add_argument("--tenants", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--full-max", type=int, default=100,
                    help="largest number of tenants run in full (beyond: simulated)")
    ap.add_argument("--sample", type=int, default=5,
                    help="tenants run for real in a simulated round (default 5)")
    ap.add_argument("--epsilons", type=float, nargs="*", default=[8.0, 1.0])
    ap.add_argument("--data", default="ml-1m", choices=["ml-100k", "ml-1m"])
    ap.add_argument("--parts", nargs="+", choices=["cost", "utility"],
                    default=["cost", "utility"],
                    help="what to run; one part alone writes secagg_<part>.json")
    args = ap.parse_args(argv)
    length = 2000 if args.quick else LENGTH
    sizes = [5, 30] if args.quick else args.tenants
    full_max = 10 if args.quick else args.full_max
    cost = []
    for n in sizes if "cost" in args.parts else []:
        row = (cost_full(n, length) if n <= full_max
               else cost_sampled(n, length, 2 if args.quick else args.sample))
        cost.append(row)
        print(f"{n:5d} tenants{' (simulated)' if row['simulated'] else ''}: tenant "
              f"{row['tenant_seconds_total']:.3f} s, coordinator "
              f"{row['coordinator_seconds_total']:.3f} s, sent "
              f"{row['bytes_sent_per_tenant'] / 1e3:.0f} kB, received "
              f"{row['bytes_received_per_tenant'] / 1e3:.0f} kB per tenant", flush=True)
        if n <= full_max and not args.quick:  # the most dropouts the round tolerates
            drop = cost_full(n, length, dropped=n // 10)
            row["with_dropouts"] = drop
            print(f"      with {n // 10} dropped: coordinator "
                  f"{drop['coordinator_seconds_total']:.3f} s", flush=True)
    data = "ml-100k" if args.quick else args.data
    fed = build_federation(load_movielens(data), 10 if args.quick else 100, 0, 0.2)
    cfg = dpals.DPALSConfig()
    seeds = 1 if args.quick else args.seeds
    epsilons = [8.0] if args.quick else args.epsilons
    runs, comparisons = [], []
    for eps in epsilons if "utility" in args.parts else []:
        means = {}
        for mode in ("central", "tenant", "secagg"):
            out = [run_user(cfg, fed, epsilon=eps, mode=mode, seed=s) for s in range(seeds)]
            rmses = [o[0] for o in out]
            rep = out[-1][1]
            runs.append({"epsilon": eps, "mode": mode, "rmse": rmses,
                         "mean": statistics.fmean(rmses), "epsilon_spent": rep["epsilon_max"],
                         "releases": rep["releases"]})
            means[mode] = statistics.fmean(rmses)
            print(f"eps {eps:g} {mode:8s} RMSE {', '.join(f'{r:.4f}' for r in rmses)} "
                  f"(mean {means[mode]:.4f}), epsilon spent {rep['epsilon_max']:.4g}",
                  flush=True)
        ratio = [r / c for r, c in zip(runs[-1]["rmse"], runs[-3]["rmse"], strict=True)]
        comparisons.append(comparison(
            f"DPALS {data}, user unit, eps {eps:g}: RMSE tenant+secure aggregation / central",
            "RMSE ratio", None if args.quick else 1.01, ratio,
            "'paper' = the issue's target (within 1% of central), not a published figure"))
    payload = {"vector_length": length, "cost": cost, "data": data, "delta": DELTA,
               "utility": runs, "comparisons": comparisons}
    if len(args.parts) == 2:
        write_result(args.out, "secagg", argv, args.quick, payload)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:  # command stays "bench secagg"
        written = write_result(Path(tmp), "secagg", argv, args.quick, payload)
        written.replace(args.out / f"secagg_{args.parts[0]}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
