"""RFRec / RFRecF settings scored on the validation carve-out, then on the test split.

The sets and runs of :mod:`bench.scale_defaults` (``alg.run_defaults``' clients, split seed
0); each setting is ``alg.config(**fields)`` and runs ``iterations`` rounds (the config's K,
as ``fedrec simulate``). ``--on val`` trains on 90% of each tenant's training ratings and
scores on the other 10% (:func:`algorithms.tuning.validation_federation`, the carve-out
``fedrec tune`` and the ALS ceiling use; the test ratings are not read); ``--on test``
trains on all training ratings and scores on the test split. One JSON line per run: the
RMSE every quarter of the run (the last is the result), the process CPU seconds, and
``ratio``: the RMSE over that of the centralised ALS fitted on the same training ratings
and scored on the same ratings, at the setting :mod:`bench.scale_defaults` chose for the
set on the ALS's own carve-out (its latest row in ``bench/results/scale_defaults.jsonl``).

    nice -n 10 python -m bench.rfrec_schedule --algorithm rfrec --data stars \
        --on val --set '{}' --set '{"lr_final": 0.1, "alpha": 0.2}'
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

from algorithms import registry
from algorithms.data import Federation, Ratings, build_federation
from algorithms.rfrec import run_batched
from algorithms.synthetic import generate_ratings
from algorithms.tuning import validation_federation
from bench import centralised as CB
from bench.scale_defaults import ratings as scale_ratings
from bench.scale_defaults import unit_scaled

RESULTS = Path(__file__).parent / "results" / "scale_defaults.jsonl"
_ALS: dict[tuple, float] = {}


def ratings(name: str) -> Ratings:
    """:func:`bench.scale_defaults.ratings`, and two small sets shaped as the 'dense' and
    'constusers' CSV sets of BENCHMARKS.md's unseen-data section (whose files are not in
    the repository): ``dense`` 50 users x 40 items with 90% observed, 1-5;
    ``constusers`` 300 x 400 with 6,000 ratings, 1-5, a quarter of the users (every 4th)
    giving all their items one rating (their first)."""
    if name == "dense":
        return generate_ratings(50, 40, 1800, rank=5, seed=1, min_per_user=20)
    if name == "constusers":
        r = generate_ratings(300, 400, 6000, rank=5, seed=2)
        users = np.unique(r.users)
        const = np.isin(r.users, users[::4])
        values = r.values.copy()
        for u in users[::4]:
            rows = np.flatnonzero(r.users == u)
            values[rows] = values[rows[0]]
        assert const.any()
        return Ratings(r.users, r.items, values)
    return scale_ratings(name)


@functools.cache
def als_setting(data: str) -> dict:
    """The ALS setting :mod:`bench.scale_defaults` chose for ``data`` on the ALS's own
    carve-out (its latest row in the results file), or chosen now the same way."""
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    chosen = [r["als"]["chosen"] for r in rows if r["data"] == data]
    if chosen:
        return chosen[-1]
    r = ratings(data)  # as als_ceiling, with at most one tenant per user
    fed = build_federation(r, min(100, len(set(r.users.tolist()))), 0)
    unit = (fed.scale[1] - fed.scale[0]) / 4.0
    best = min(CB.tune(unit_scaled(fed, unit), CB.GRID, CB.SWEEPS), key=lambda x: x["rmse"])
    return {k: best[k] for k in CB.GRID}


def als_rmse(data: str, fed: Federation, key: tuple) -> float:
    """The centralised ALS on ``fed`` (train -> test) at the setting chosen for ``data``."""
    if key not in _ALS:
        chosen = als_setting(data)
        unit = (fed.scale[1] - fed.scale[0]) / 4.0
        _ALS[key] = CB.fit_and_score(unit_scaled(fed, unit), chosen, CB.SWEEPS, 0)["rmse"] * unit
    return _ALS[key]


@functools.cache
def federation(data: str, clients: int, on: str) -> Federation:
    """The split of :mod:`bench.scale_defaults` (seed 0), or its carve-out with ``val``."""
    r = ratings(data)
    fed = build_federation(r, min(clients, len(set(r.users.tolist()))), 0)
    return validation_federation(fed) if on == "val" else fed


def score(name: str, data: str, fields: dict, on: str, clients: int | None = None) -> dict:
    """One run of ``alg.config(**fields)`` on ``data``, scored on ``on`` (val or test)."""
    alg = registry.get(name)
    d = alg.run_defaults
    fed = federation(data, clients or d["clients"], on)
    cfg = alg.config(**fields)
    rounds = cfg.iterations
    t0 = time.process_time()
    res = run_batched(cfg, fed, rounds=rounds, seed=0,
                      evaluate_every=max(1, rounds // 4), per_round=d["per_round"])
    cpu = time.process_time() - t0
    curve = [round(h.test_rmse, 4) for h in res.history if h.test_rmse == h.test_rmse]
    als = als_rmse(data, fed, (data, fed.n_clients, on))
    return {"algorithm": name, "data": data, "on": on, "fields": fields,
            "clients": fed.n_clients, "rounds": rounds, "rmse": round(res.final.test_rmse, 5),
            "ratio": round(res.final.test_rmse / als, 4), "als": round(als, 5),
            "curve": curve, "cpu_s": round(cpu, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithm", choices=["rfrec", "rfrecf"], required=True)
    ap.add_argument("--data", default="stars", help="comma-separated set names")
    ap.add_argument("--on", choices=["val", "test"], default="val")
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="JSON",
                    help="config fields of one setting (repeatable; default: the defaults)")
    args = ap.parse_args(argv)
    settings = [json.loads(s) for s in args.set] or [{}]
    for data in args.data.split(","):
        for fields in settings:
            print(json.dumps(score(args.algorithm, data, fields, args.on, args.clients)),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
