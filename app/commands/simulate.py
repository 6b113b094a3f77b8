"""``fedrec simulate``: run a federated algorithm in-process on a ratings file."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from algorithms import registry
from algorithms.base import default_select
from algorithms.binary_metrics import binarise, binary_report
from algorithms.data import (
    Ratings,
    build_federation,
    check_rating_values,
    data_dir,
    default_clients,
    load_ratings,
    n_users_of,
)
from algorithms.presets import paper_config, paper_run
from algorithms.ranking import relevance_threshold
from algorithms.scale import with_public_scale
from algorithms.simulate import RoundRecord, client_round, initialise, simulate
from algorithms.synthetic import generate_ratings
from app.commands.evaluation import (
    add_evaluation_arguments,
    partition_summary,
    popularity_of,
    ranking_of,
)
from app.commands.output import RoundsBar, json_output
from privacy.cli import (
    add_dp_arguments,
    add_privacy_arguments,
    privacy_unit,
    privatizer_from_args,
    sampling_plan,
    user_privatizer_from_args,
)
from privacy.randomness import private_federation
from privacy.release import Release, cli_settings, release_of
from privacy.threat_model import UNIT, threat_model

_RUN_FLAGS = ("clients", "per_round", "rounds")
PRESETS = ("recommended", "paper")
#: one command-line spelling for fields two algorithms spell differently (FedMC-ADMM's
#: ``centre``, FedMAvg/FedMGS's ``center``); no other spelling is accepted
_FLAG_NAMES = {"center": "centre"}


def flag_of(field: str) -> str:
    """The command-line flag of config field ``field`` (``inner_steps`` -> ``--inner-steps``)."""
    field = _FLAG_NAMES.get(field, field)
    return "--" + field.rstrip("_").replace("_", "-")


def format_value(value: Any) -> str:
    """``value`` in the syntax its flag parses (tuples as ``lo,hi``, None as ``none``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _scalar(typ: type) -> tuple[Callable[[str], Any], str]:
    """Parser and metavar of a plain int / float / str / bool."""
    if typ is bool:
        return _bool, "{true,false}"
    names = {int: "N", float: "X", str: "TEXT"}

    def parse(text: str) -> Any:
        try:
            return typ(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if typ is int else 'a number'}, got {text!r}") from None
    return parse, names.get(typ, "VALUE")


def _tuple(items: tuple[type, ...]) -> tuple[Callable[[str], Any], str]:
    """A fixed-length tuple, written ``a,b``, ``[a, b]``, ``(a, b)`` or ``'a b'``."""
    parsers = [_scalar(t)[0] for t in items]

    def parse(text: str) -> tuple:
        body = text.strip()
        if body[:1] in "[(" and body[-1:] in "])":
            body = body[1:-1]
        parts = [t for t in re.split(r"[,\s]+", body.strip()) if t]
        if len(parts) != len(parsers):
            raise argparse.ArgumentTypeError(
                f"expected {len(parsers)} values as a,b (e.g. 0.5,5), got {text!r}")
        return tuple(f(t) for f, t in zip(parsers, parts, strict=True))
    return parse, ",".join("AB"[i] if len(items) == 2 else f"X{i + 1}"
                           for i in range(len(items)))


def converter(annotation: Any) -> tuple[Callable[[str], Any], str]:
    """Parser of one command-line value for a config field's type, and its metavar.

    Literals take their values, ``X | None`` also ``none``, tuples ``a,b``, and a union
    tries its members in order (RFRec's rating_range: ``lo,hi``, ``tenant`` or ``none``).
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        values = {format_value(v): v for v in args}

        def literal(text: str) -> Any:
            if text not in values:
                raise argparse.ArgumentTypeError(
                    f"expected one of {', '.join(values)}, got {text!r}")
            return values[text]
        return literal, "{" + ",".join(values) + "}"
    if origin is tuple:
        return _tuple(args)
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        members = [converter(a) for a in args if a is not type(None)]

        def union(text: str) -> Any:
            if nullable and text.lower() == "none":
                return None
            for parse, _ in members:
                try:
                    return parse(text)
                except argparse.ArgumentTypeError:
                    continue
            raise argparse.ArgumentTypeError(f"expected {metavar}, got {text!r}")
        metavar = "|".join([m.strip("{}") for _, m in members] + (["none"] if nullable else []))
        return union, metavar
    return _scalar(annotation)


def option_fields(cfg_cls: type) -> dict[str, Any]:
    """The config fields a user can set: all but single-valued Literals, which are fixed
    and informational (FedMGS' ``privacy_preserving=False``)."""
    return {name: f for name, f in cfg_cls.model_fields.items()
            if not (typing.get_origin(f.annotation) is typing.Literal
                    and len(typing.get_args(f.annotation)) == 1)}


def base_config(alg, preset: str):
    """The config a run starts from: the recommended defaults, or the paper preset's
    (:func:`algorithms.presets.paper_config`, what the paper's benchmark runs)."""
    return paper_config(alg.name) if preset == "paper" else alg.config()


def run_defaults(alg, preset: str) -> dict[str, int]:
    """Tenants, tenants per round and rounds when not given: the paper preset's run
    (:data:`algorithms.presets.PAPER_RUNS`; clients 0: one tenant per user) or the
    algorithm's recommended run."""
    entry = paper_run(alg.name) if preset == "paper" else None
    return entry.run() if entry is not None else dict(alg.run_defaults)


def _scan(args: list[str], flag: str, default: str) -> str:
    """The value of ``flag`` in raw arguments (before the full parser exists), else default."""
    value = default
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _add_algorithm_options(parser: argparse.ArgumentParser, args: list[str]) -> None:
    """Second phase: add the options of the ``--algorithm`` in ``args`` (default fedmc-admm).

    Options of the other algorithms are accepted only to refuse them by name.
    """
    if getattr(parser, "_fedrec_algorithm", None) is not None:
        return
    name = _scan(args, "--algorithm", DEFAULT_ALGORITHM)
    name = name if name in registry.names() else DEFAULT_ALGORITHM
    preset = _scan(args, "--preset", "recommended")
    preset = preset if preset in PRESETS else "recommended"  # a bad one fails in phase two
    alg = registry.get(name)
    base = base_config(alg, preset)
    parser._fedrec_algorithm = name
    _add_run_options(parser, alg, base, preset)
    group = parser.add_argument_group(
        f"options of --algorithm {name} (defaults: --preset {preset}; see another "
        "algorithm's with --algorithm NAME --help)")
    mine = set()
    for fname, f in option_fields(alg.config).items():
        parse, metavar = converter(f.annotation)
        text = " ".join((f.description or fname).split())
        # SUPPRESS: a field is in the namespace only when given (None is a value: "none")
        group.add_argument(flag_of(fname), dest=f"cfg_{fname}", type=parse, metavar=metavar,
                           default=argparse.SUPPRESS, help=f"{text} (default: "
                           f"{format_value(getattr(base, fname))})".replace("%", "%%"))
        mine.add(flag_of(fname))
    owners: dict[str, list[str]] = {}
    for other in registry.names():
        for fname in option_fields(registry.get(other).config):
            if flag_of(fname) not in mine:
                owners.setdefault(flag_of(fname), []).append(other)
    for flag, algs in owners.items():
        parser.add_argument(flag, dest=f"foreign_{flag[2:]}", action=_Foreign,
                            algorithm=name, owners=algs, help=argparse.SUPPRESS)


class _Foreign(argparse.Action):
    """An option of another algorithm: refused with a message naming both."""

    def __init__(self, option_strings, dest, algorithm: str, owners: list[str], **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.algorithm, self.owners = algorithm, owners

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} not an option of {self.algorithm} (it is an option "
                     f"of {', '.join(self.owners)})")


def _add_run_options(parser: argparse.ArgumentParser, alg, base, preset: str) -> None:
    """--clients, --per-round and --rounds, whose defaults are the preset's run."""
    defaults = run_defaults(alg, preset)
    rounds = (f"sweeps + 1 = {base.sweeps + 1}" if "sweeps" in type(base).model_fields else
              f"releases + 1 = {base.releases + 1}" if "releases" in type(base).model_fields
              else f"iterations = {base.iterations}" if "iterations" in type(base).model_fields
              else str(defaults["rounds"]))
    entry = paper_run(alg.name) if preset == "paper" else None
    g = parser.add_argument_group(
        f"run (defaults: {alg.name}'s recommended run)" if entry is None else
        f"run (defaults: the paper preset's, as `fedrec bench {entry.bench}`)",
        None if entry is None else
        f"The paper preset reproduces {entry.reproduces}: {entry.why}.".replace("%", "%%"))
    clients = "one per user" if defaults["clients"] == 0 else defaults["clients"]
    g.add_argument("--clients", type=int, metavar="P",
                   help=f"number of tenants P, users split at random (default: "
                        f"{clients}); data with fewer users: one tenant per user")
    g.add_argument("--per-round", type=int, metavar="K",
                   help=f"tenants per round K, 0: all (default: {defaults['per_round']})")
    g.add_argument("--rounds", type=int, metavar="T",
                   help=f"communication rounds T (default: {rounds})")


DEFAULT_ALGORITHM = "fedmc-admm"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a federation in-process on a ratings file",
                       description=__doc__)
    p.add_argument("--data", type=Path, default=None,
                   help="ratings file: MovieLens u.data, ML-1M '::' or CSV user,item,rating "
                        "(gz accepted; a relative path not found here is looked up under "
                        "$FEDREC_DATA_DIR), or 'synthetic' (default: ml-100k/u.data under "
                        "$FEDREC_DATA_DIR, else synthetic)")
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM, choices=registry.names(),
                   help=f"the algorithm; --help after it lists its options (default: "
                        f"{DEFAULT_ALGORITHM})")
    p.add_argument("--preset", choices=PRESETS, default="recommended",
                   help="starting config and run: 'recommended' (validated defaults) or "
                        "'paper' (what `fedrec bench` runs to reproduce the algorithm's "
                        "paper: its optimiser, settings, tenants and rounds, tuned for the "
                        "paper's data set, which --algorithm NAME --preset paper --help "
                        "names); options given override it (default: recommended)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="JSON config to start from (e.g. `fedrec tune --json`'s output, "
                        "or an object of config fields); options given override it "
                        "(default: none)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the split, initialisation and tenant selection "
                        "(default: 0); privacy noise and per-user sampling never derive "
                        "from it: two --privacy runs with one seed differ")
    p.add_argument("--test-fraction", type=float, default=0.2,
                   help="share of ratings held out for testing (default: 0.2)")
    p.add_argument("--threshold", type=float, default=None,
                   help="binary algorithms: a rating >= threshold is a positive (default: "
                        "62.5%% up the data's rating scale: 3.5 on 1-5 stars as in the "
                        "paper, 1 on 0/1 data, every rating of implicit (all-1) data)")
    add_evaluation_arguments(p)
    p.add_argument("--json", type=Path, metavar="FILE", nargs="?", const="-",
                   help="write config, per-round figures and results to FILE; alone or '-': to "
                        "stdout, the table going to stderr (default: none)")
    p.add_argument("--quiet", action="store_true", help="no per-round table")
    add_privacy_arguments(p)
    p.add_argument("--select-prior", type=float, default=0.0, metavar="FRACTION",
                   help="dp-ials with --privacy user: hold out FRACTION of each tenant's "
                        "training ratings, fit on the rest and choose the popularity "
                        "prior's weight on them by a charged DP selection (the config's "
                        "selection_share of the budget); each tenant then re-solves its "
                        "users on all its ratings (default: 0, the fixed popularity_prior)")
    add_dp_arguments(p, default="none")
    if hasattr(p, "late_options"):
        p.late_options = _add_algorithm_options
    else:  # a plain parser (not fedrec's CLI): the default algorithm's options
        _add_algorithm_options(p, [])
    p.set_defaults(func=run)


def _given(alg, args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the user set: options given, over a ``--config`` file's."""
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")}
    if getattr(args, "config", None) is not None:
        given = {**config_file(args.config, alg.name), **given}
    return given


def _config(alg, args: argparse.Namespace):
    """The run's config: the ``--preset`` with the given options replacing its fields.

    A value the config refuses is reported naming its flag.
    """
    given = _given(alg, args)
    preset = getattr(args, "preset", "recommended")
    try:
        return paper_config(alg.name, **given) if preset == "paper" else alg.config(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{flag_of(field)}: {msg}" if field else msg) from None


def config_run(path: Path) -> dict[str, int]:
    """The run a ``fedrec tune --json`` file was chosen with (its top-level ``clients``,
    ``per_round``, ``rounds``), for the flags not given; {} for a bare object of fields."""
    obj = json.loads(Path(path).read_text())  # config_file has vetted it
    if "config" not in obj:
        return {}
    run = {k: obj[k] for k in _RUN_FLAGS if k in obj}
    for k, v in run.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "per_round" else 1):
            raise ValueError(f"--config {path}: {k} must be a whole number >= "
                             f"{0 if k == 'per_round' else 1}, not {v!r}")
    return run


def config_file(path: Path, algorithm: str) -> dict[str, Any]:
    """Config fields from a JSON file: ``{"algorithm", "config": {...}}`` (what ``fedrec
    tune --json`` writes) or a bare object of fields."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--config {path}: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"--config {path}: expected a JSON object")
    if "config" in obj:
        if obj.get("algorithm", algorithm) != algorithm:
            raise ValueError(f"--config {path}: a config of {obj['algorithm']}, not of "
                             f"{algorithm}")
        obj = obj["config"]
    return dict(obj)


def resolve_data(data: Path) -> Path:
    """``data`` itself, or, for a relative path that does not exist here, the same path
    under $FEDREC_DATA_DIR (``--data ml-1m/ratings.dat`` works from any directory)."""
    base = data_dir()
    if not data.is_absolute() and not data.exists() and base is not None \
            and (base / data).exists():
        return base / data
    return data


def data_label(data: Path) -> str:
    """How a report names the data: the path under $FEDREC_DATA_DIR for a file there (the
    data set's name, e.g. ``ml-1m/ratings.dat``, not a machine's absolute path), else the
    path as given."""
    base = data_dir()
    if base is not None:
        try:
            return data.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            pass
    return str(data)


def load_data(data: Path | None, seed: int) -> tuple[Ratings, str]:
    """The ratings to simulate on and a label for the report (:func:`data_label`).

    ``--data synthetic``, or no ``--data`` on a machine without MovieLens, draws the
    synthetic generator's MovieLens-100k-sized set.
    """
    if data is None:
        base = data_dir()
        data = base / "ml-100k" / "u.data" if base is not None else Path("synthetic")
    if str(data) == "synthetic":
        return generate_ratings(943, 1682, 100_000, seed=seed), "synthetic(943x1682, 100000)"
    data = resolve_data(data)
    return load_ratings(data), data_label(data)


def _printer(rounds: int, quiet: bool, bar: RoundsBar):
    if not quiet:
        print(f"{'round':>5} {'objective':>12} {'test RMSE':>9} {'test MAE':>9} "
              f"{'sec':>7} {'uploads':>7}")

    def on_round(rec: RoundRecord) -> None:
        if not (math.isfinite(rec.objective) and math.isfinite(rec.test_rmse)):
            bar.close()
            raise ValueError(f"training diverged in round {rec.round} (objective "
                             f"{rec.objective}); lower the step size or change the "
                             "optimiser (see the algorithm's options with --help)")
        bar.update(rec.round, f"test RMSE {rec.test_rmse:.4f}")
        if not quiet:
            print(f"{rec.round:>5} {rec.objective:>12.6g} {rec.test_rmse:>9.4f} "
                  f"{rec.test_mae:>9.4f} {rec.seconds:>7.3f} {rec.uploads:>7}", flush=True)
    return on_round


def run(args: argparse.Namespace) -> int:
    with json_output(args.json) as write_json:
        return _run(args, write_json)


def _run(args: argparse.Namespace, write_json) -> int:
    alg = registry.get(args.algorithm)
    cfg = _config(alg, args)
    unit = privacy_unit(args)
    from_file = config_run(args.config) if getattr(args, "config", None) else {}
    defaults = run_defaults(alg, getattr(args, "preset", "recommended"))
    run_cfg = {k: getattr(args, k) if getattr(args, k) is not None
               else from_file.get(k, defaults[k]) for k in _RUN_FLAGS}
    if args.rounds is None and "rounds" in from_file:
        pass  # the run length the file was chosen with (fedrec tune)
    elif args.rounds is None and "sweeps" in type(cfg).model_fields:
        run_cfg["rounds"] = cfg.sweeps + 1  # the sweeps, then every user re-solved on V
    elif args.rounds is None and "releases" in type(cfg).model_fields:
        run_cfg["rounds"] = cfg.releases + 1  # the same for the user-level gradient methods
    elif args.rounds is None and "iterations" in type(cfg).model_fields:
        run_cfg["rounds"] = cfg.iterations  # RFRec's K (the paper's 100 with --preset paper)
    ratings, data = load_data(args.data, args.seed)
    if ratings.duplicates:
        print(f"note: {ratings.duplicates} (user, item) pair(s) rated more than once in "
              f"{data}; the last rating of each is used", file=sys.stderr)
    if alg.data_kind != "binary":
        check_rating_values(ratings)
    if args.clients is None and "clients" not in from_file and run_cfg["clients"] == 0:
        run_cfg["clients"] = n_users_of(ratings)  # the preset's one tenant per user
    elif args.clients is None and "clients" not in from_file:
        clients = default_clients(run_cfg["clients"], ratings)
        if clients < run_cfg["clients"]:
            print(f"note: {clients} users: {clients} tenants of one user each (fewer than "
                  f"{alg.name}'s default {run_cfg['clients']}; --clients sets it)",
                  file=sys.stderr)
        run_cfg["clients"] = clients
    fed = build_federation(ratings, run_cfg["clients"], args.seed, args.test_fraction,
                           partition=args.partition)
    rating_fed = fed
    # a public rating scale not given (DPALS, DP-FedMAvg, DP-FedMC-ADMM): the data's, as
    # the service takes the tenants' declared one
    cfg = with_public_scale(cfg, _given(alg, args), fed.scale)
    if alg.data_kind == "binary":
        threshold = (relevance_threshold(fed.scale) if args.threshold is None
                     else args.threshold)
        fed = binarise(fed, threshold)
        if not any(b.nnz for b in fed.train):
            raise ValueError(f"no training rating is >= {threshold:g} (ratings run from "
                             f"{rating_fed.scale[0]:g} to {rating_fed.scale[1]:g}): the "
                             "binary algorithms have no positive to learn; set --threshold")
    per_round = run_cfg["per_round"] or fed.n_clients
    selecting = _check_select_prior(args, unit, cfg)
    kind, fed, privatizer, aggregator = release_parts(args, unit, alg, cfg, fed,
                                                      run_cfg["rounds"], per_round)
    full_train, test = fed.train, fed.test
    if selecting:
        fed = _carved(fed, args.seed, args.select_prior)
    t0 = time.perf_counter()
    bar = RoundsBar(run_cfg["rounds"], alg.name)
    try:
        result = simulate(alg, cfg, fed, rounds=run_cfg["rounds"], per_round=per_round,
                          seed=args.seed, privatizer=privatizer, aggregator=aggregator,
                          on_round=_printer(run_cfg["rounds"], args.quiet, bar))
    finally:
        bar.close()
    selection = None
    if selecting:
        result, selection = _select_prior(alg, cfg, result, fed, full_train, test,
                                          privatizer, run_cfg["rounds"], args.seed)
        print(f"popularity prior: beta {selection['chosen']:g} chosen by the charged DP "
              f"selection (noise std {selection['noise_std']:.3g} on the candidates' "
              "validation NDCG sums)")
    wall = time.perf_counter() - t0
    final = result.final
    print(f"{alg.name}: test RMSE {final.test_rmse:.4f}, MAE {final.test_mae:.4f} after "
          f"{final.round} rounds ({wall:.1f} s)")
    ranking = ranking_of(alg, result, rating_fed, args)
    if unit in ("none", "user"):
        ranking["popularity"] = popularity_of(args, rating_fed, unit)
    binary = None
    if alg.data_kind == "binary":
        binary = binary_report(alg, result, fed, seen=rating_fed.train).as_dict()
        print(f"binary (rating >= {threshold:g}): F1 {binary['f1']:.4f}, RMSD "
              f"{binary['rmsd']:.5f}, precision@10 {binary['precision_at_k']:.4f}, "
              f"recall@10 {binary['recall_at_k']:.4f}")
    if unit == "user":
        privacy = privatizer.report()
        secure = " with secure aggregation" if privacy.get("secure_aggregation") else ""
        print(f"privacy: unit {UNIT}, placement {privacy['placement']}{secure}, epsilon max "
              f"{privacy['epsilon_max']:.4g} at delta {privacy['delta']:.3g} over "
              f"{len(privacy['releases'])} releases (noise multiplier "
              f"{privacy['noise_multiplier']:.4g})")
    else:
        privacy = privatizer.report(_upload_size(alg, cfg, fed, args.seed)) if privatizer \
            else {"mechanism": "none", "private": False,
                  "threat_model": threat_model("central", private=False)}
    if selection is not None:
        privacy["selection"] = selection
    if kind is Release.SECURE_SUM:
        privacy["secure_aggregation"] = {"rounds": aggregator.rounds}
        print("secure aggregation (no noise): the server step saw only each round's sum")
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
            "privacy": privacy, "binary": binary, "ranking": ranking,
            "partition": partition_summary(rating_fed, args.partition),
            "final": {"test_rmse": final.test_rmse, "test_mae": final.test_mae,
                      "objective": final.objective, "wall_seconds": wall},
        }
        write_json(report)
    return 0


def _check_select_prior(args: argparse.Namespace, unit: str, cfg) -> bool:
    """Whether the run chooses dp-ials' prior weight by the DP selection; ValueError naming
    ``--select-prior`` where it does not apply."""
    fraction = getattr(args, "select_prior", 0.0) or 0.0
    if fraction == 0:
        return False
    if not 0 < fraction < 1:
        raise ValueError(f"--select-prior must be in (0, 1), got {fraction!r}")
    if unit != "user" or not getattr(cfg, "popularity_prior", 0) > 0 \
            or getattr(cfg, "max_ratings_per_user", None) is None:
        raise ValueError("--select-prior applies to dp-ials (popularity_prior > 0) with "
                         "--privacy user")
    return True


def _carved(fed, seed: int, fraction: float):
    """``fed`` with each tenant's training ratings split into (fit, carve-out): the fit
    part as ``train``, the carve-out as ``test`` (what the selection scores)."""
    import dataclasses

    from algorithms.tuning import validation_split

    parts = [validation_split(b, seed, i, fraction) for i, b in enumerate(fed.train)]
    return dataclasses.replace(fed, train=[p[0] for p in parts], test=[p[1] for p in parts])


def _select_prior(alg, cfg, result, carved, full_train, test, privatizer, rounds: int,
                  seed: int):
    """(the result with dp-ials' prior weight chosen by :func:`privacy.selection.
    choose_prior`, charged to the run's ledger, and every tenant's users re-solved on all
    its training ratings against the released model (local, nothing released); the
    selection's record).

    The rounds ran on the fit part with the carve-out as their test blocks, so their
    errors are the carve-out's; the last round's record is replaced by the final model's
    errors on the real test split (``test``), which is what the run reports."""
    import dataclasses

    from algorithms.simulate import evaluate
    from privacy.selection import choose_prior

    parts = list(zip(result.local_states, carved.train, carved.test,
                     [carved.scale] * carved.n_clients, strict=True))
    glob, record = choose_prior(privatizer.spec, privatizer.ledger, result.global_msg, parts,
                                range(carved.n_clients), rounds + 1, seed)
    states = [alg.client_step(glob, st, b, cfg, None)[0]
              for st, b in zip(result.local_states, full_train, strict=True)]
    rmse, mae = evaluate(alg, glob, states, test, carved.scale)
    last = dataclasses.replace(result.history[-1], test_rmse=rmse, test_mae=mae)
    return dataclasses.replace(result, global_msg=glob, local_states=states,
                               history=[*result.history[:-1], last]), record


def _upload_size(alg, cfg, fed, seed: int) -> int:
    """Values per upload (what the DP wrapper clips and noises), from one dry client step."""
    server, glob, locs = initialise(alg, cfg, fed.train[:1], seed)
    _, up = client_round(alg, cfg, 1, seed, 0, glob, locs[0], fed.train[0])
    return 1 if up is None else int(sum(a.size for a in up.arrays().values()))


def release_parts(args: argparse.Namespace, unit: str, alg, cfg, fed, rounds: int,
                  per_round: int):
    """(release, federation, privatizer, aggregator) of a run: the release
    :func:`privacy.release.release_of` decides for the flags (``unit`` from
    :func:`privacy.cli.privacy_unit`), built for the in-process engine. The user unit
    gives the federation its per-user caps and samples from a fresh secret."""
    kind = release_of(cli_settings(unit, getattr(args, "placement", None),
                                   getattr(args, "secure_aggregation", False)))
    if kind.user_level:
        fed = private_federation(fed)
        privatizer = _user_privatizer(args, alg, cfg, fed, rounds)
        return kind, fed, privatizer, privatizer.aggregate
    if kind is Release.SECURE_SUM:
        from privacy.distributed import SecureSum

        return kind, fed, None, SecureSum(args.seed, dropout_tolerance=args.dropout_tolerance
                                          if args.dropout_tolerance is not None else 0.1)
    if kind is Release.TENANT:
        return kind, fed, _privatizer(args, alg, cfg, fed, rounds, per_round), None
    return kind, fed, None, None


def _user_privatizer(args, alg, cfg, fed, rounds: int):
    """The user-level privatizer/aggregator; refuses algorithms without per-user bounds."""
    bounds = registry.user_bounds(alg.name, cfg)
    if bounds is None:
        raise ValueError(f"--privacy user needs an algorithm whose uploads are sums of "
                         f"per-user bounded terms (dpals, dp-fedmavg, dp-fedmc-admm, dp-ials); "
                         f"{alg.name} has none")
    n_users = sum(b.n_users for b in fed.train)
    share = cfg.selection_share if getattr(args, "select_prior", 0.0) else 0.0
    return user_privatizer_from_args(args, bounds, registry.user_releases(cfg, rounds),
                                     fed.n_clients, n_users, args.seed, share)


def _privatizer(args, alg, cfg, fed, rounds: int, per_round: int):
    """The DP wrapper of every upload, or None; refuses a run over budget before it starts."""
    if args.dp == "none":
        return None
    plan = (sampling_plan(fed.n_clients, rounds, per_round, args.seed)
            if alg.select is default_select else None)
    n_users = sum(b.n_users for b in fed.train)
    return privatizer_from_args(args, fed.n_clients, rounds, args.seed, n_users=n_users,
                                plan=plan, n_entries=_upload_size(alg, cfg, fed, args.seed))
