"""``fedrec simulate``: run a federated algorithm in-process on a ratings file."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import typing
from pathlib import Path
from typing import Any

from algorithms import registry
from algorithms.base import default_select
from algorithms.binary_metrics import binarise, binary_report
from algorithms.data import Ratings, build_federation, data_dir, load_ratings
from algorithms.simulate import RoundRecord, client_round, initialise, simulate
from algorithms.synthetic import generate_ratings
from privacy.cli import (
    add_dp_arguments,
    add_privacy_arguments,
    privacy_unit,
    privatizer_from_args,
    sampling_plan,
    user_privatizer_from_args,
)

_RUN_FLAGS = ("clients", "per_round", "rounds")


def _config_fields() -> dict[str, tuple[type, str]]:
    """Every config field of every algorithm: flag name -> (type, help)."""
    fields: dict[str, tuple[type, str]] = {}
    for name in registry.names():
        for fname, f in registry.get(name).config.model_fields.items():
            ann = f.annotation
            if typing.get_origin(ann) is typing.Literal and len(typing.get_args(ann)) == 1:
                continue  # a fixed, informational field (FedMGS' privacy_preserving=False)
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            typ = args[0] if typing.get_origin(ann) is not None and args else ann
            typ = typ if typ in (int, float, str, bool) else str
            helps = fields.get(fname, (typ, ""))[1]
            text = f"{name}: {f.description or fname}"
            fields[fname] = (typ, f"{helps}; {text}" if helps else text)
    return fields


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a federation in-process on a ratings file",
                       description=__doc__)
    p.add_argument("--data", type=Path, default=None,
                   help="ratings file: MovieLens u.data, ML-1M '::' or CSV user,item,rating "
                        "(gz accepted), or 'synthetic'; default: ml-100k/u.data under "
                        "$FEDREC_DATA_DIR, else synthetic")
    p.add_argument("--algorithm", default="fedmc-admm", choices=registry.names())
    p.add_argument("--clients", type=int, help="number of tenants P (users split at random)")
    p.add_argument("--per-round", type=int, help="tenants per round K (0: all)")
    p.add_argument("--rounds", type=int, help="communication rounds T")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, init and sampling")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--threshold", type=float, default=3.5,
                   help="binary algorithms: a rating >= threshold is a positive (paper: 3.5)")
    p.add_argument("--json", type=Path, help="write config, per-round figures and results here")
    p.add_argument("--quiet", action="store_true", help="no per-round table")
    group = p.add_argument_group("algorithm options (default: the algorithm's recommended "
                                 "setting)")
    for fname, (typ, text) in sorted(_config_fields().items()):
        flag = "--" + fname.rstrip("_").replace("_", "-")
        group.add_argument(flag, dest=f"cfg_{fname}", type=_bool if typ is bool else typ,
                           default=None, help=text.replace("%", "%%"))
    add_privacy_arguments(p)
    add_dp_arguments(p, default="none")
    p.set_defaults(func=run)


def _config(alg, args: argparse.Namespace):
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    unknown = sorted(set(given) - set(alg.config.model_fields))
    if unknown:
        flags = ", ".join("--" + u.rstrip("_").replace("_", "-") for u in unknown)
        raise ValueError(f"{flags} not an option of {alg.name}")
    return alg.config(**given)


def _load(data: Path | None, seed: int) -> tuple[Ratings, str]:
    """The ratings to simulate on and a label for the report.

    ``--data synthetic``, or no ``--data`` on a machine without MovieLens, draws the
    synthetic generator's MovieLens-100k-sized set.
    """
    if data is None:
        base = data_dir()
        data = base / "ml-100k" / "u.data" if base is not None else Path("synthetic")
    if str(data) == "synthetic":
        return generate_ratings(943, 1682, 100_000, seed=seed), "synthetic(943x1682, 100000)"
    return load_ratings(data), str(data)


def _printer(rounds: int, quiet: bool):
    tty = sys.stderr.isatty()
    if not quiet:
        print(f"{'round':>5} {'objective':>12} {'test RMSE':>9} {'test MAE':>9} "
              f"{'sec':>7} {'uploads':>7}")

    def on_round(rec: RoundRecord) -> None:
        if not (math.isfinite(rec.objective) and math.isfinite(rec.test_rmse)):
            if tty:
                print(file=sys.stderr)
            raise ValueError(f"training diverged in round {rec.round} (objective "
                             f"{rec.objective}); lower the step size or change the "
                             "optimiser (see the algorithm's options with --help)")
        if tty:
            done = int(30 * rec.round / rounds)
            print(f"\r[{'#' * done}{'.' * (30 - done)}] {rec.round}/{rounds}", end="",
                  file=sys.stderr, flush=True)
        if not quiet:
            if tty:
                print("\r" + " " * 48 + "\r", end="", file=sys.stderr)
            print(f"{rec.round:>5} {rec.objective:>12.6g} {rec.test_rmse:>9.4f} "
                  f"{rec.test_mae:>9.4f} {rec.seconds:>7.3f} {rec.uploads:>7}", flush=True)
    return on_round


def run(args: argparse.Namespace) -> int:
    alg = registry.get(args.algorithm)
    cfg = _config(alg, args)
    unit = privacy_unit(args)
    run_cfg = {k: getattr(args, k) if getattr(args, k) is not None else alg.run_defaults[k]
               for k in _RUN_FLAGS}
    if args.rounds is None and "sweeps" in type(cfg).model_fields:
        run_cfg["rounds"] = cfg.sweeps + 1  # the sweeps, then every user re-solved on V
    ratings, data = _load(args.data, args.seed)
    fed = build_federation(ratings, run_cfg["clients"], args.seed, args.test_fraction)
    rating_fed = fed
    if alg.data_kind == "binary":
        fed = binarise(fed, args.threshold)
    per_round = run_cfg["per_round"] or fed.n_clients
    if unit == "user":
        privatizer = _user_privatizer(args, alg, cfg, fed)
        aggregator = privatizer.aggregate
    else:
        privatizer, aggregator = _privatizer(args, alg, cfg, fed, run_cfg["rounds"],
                                             per_round), None
    t0 = time.perf_counter()
    result = simulate(alg, cfg, fed, rounds=run_cfg["rounds"], per_round=per_round,
                      seed=args.seed, privatizer=privatizer, aggregator=aggregator,
                      on_round=_printer(run_cfg["rounds"], args.quiet))
    wall = time.perf_counter() - t0
    final = result.final
    print(f"{alg.name}: test RMSE {final.test_rmse:.4f}, MAE {final.test_mae:.4f} after "
          f"{final.round} rounds ({wall:.1f} s)")
    binary = None
    if alg.data_kind == "binary":
        binary = binary_report(alg, result, fed, seen=rating_fed.train).as_dict()
        print(f"binary (rating >= {args.threshold:g}): F1 {binary['f1']:.4f}, RMSD "
              f"{binary['rmsd']:.5f}, precision@10 {binary['precision_at_k']:.4f}, "
              f"recall@10 {binary['recall_at_k']:.4f}")
    if unit == "user":
        privacy = privatizer.report()
        print(f"privacy: unit user, placement {privacy['placement']}, epsilon max "
              f"{privacy['epsilon_max']:.4g} at delta {privacy['delta']:.3g} over "
              f"{len(privacy['releases'])} releases (noise multiplier "
              f"{privacy['noise_multiplier']:.4g})")
    else:
        privacy = privatizer.report(_upload_size(alg, cfg, fed, args.seed)) if privatizer \
            else {"mechanism": "none"}
    if unit == "tenant" and privatizer is not None:
        privacy["placement"] = "tenant"
        print(f"privacy: {privacy['mechanism']}, epsilon max over tenants "
              f"{privacy['epsilon_max']:.4g} at delta {privacy['delta']:.3g} "
              f"(unit: a tenant's whole rating block); stopped: {privacy['stopped'] or 'none'}")
    if args.json:
        report: dict[str, Any] = {
            "algorithm": alg.name, "config": cfg.model_dump(), "data": data,
            "seed": args.seed, "test_fraction": args.test_fraction, **run_cfg,
            "n_ratings": len(ratings), "n_items": fed.n_items,
            "rounds_detail": [r.as_dict() for r in result.history],
            "privacy": privacy, "binary": binary,
            "final": {"test_rmse": final.test_rmse, "test_mae": final.test_mae,
                      "objective": final.objective, "wall_seconds": wall},
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _upload_size(alg, cfg, fed, seed: int) -> int:
    """Values per upload (what the DP wrapper clips and noises), from one dry client step."""
    server, glob, locs = initialise(alg, cfg, fed.train[:1], seed)
    _, up = client_round(alg, cfg, 1, seed, 0, glob, locs[0], fed.train[0])
    return 1 if up is None else int(sum(a.size for a in up.arrays().values()))


def _user_privatizer(args, alg, cfg, fed):
    """The user-level privatizer/aggregator; refuses algorithms without per-user bounds."""
    bounds = registry.user_bounds(alg.name, cfg)
    if bounds is None:
        raise ValueError(f"--privacy user needs an algorithm whose uploads are sums of "
                         f"per-user bounded terms (dpals); {alg.name} has none")
    n_users = sum(b.n_users for b in fed.train)
    return user_privatizer_from_args(args, bounds, cfg.sweeps, fed.n_clients, n_users,
                                     args.seed)


def _privatizer(args, alg, cfg, fed, rounds: int, per_round: int):
    """The DP wrapper of every upload, or None; refuses a run over budget before it starts."""
    if args.dp == "none":
        return None
    plan = (sampling_plan(fed.n_clients, rounds, per_round, args.seed)
            if alg.select is default_select else None)
    n_users = sum(b.n_users for b in fed.train)
    return privatizer_from_args(args, fed.n_clients, rounds, args.seed, n_users=n_users,
                                plan=plan, n_entries=_upload_size(alg, cfg, fed, args.seed))
