"""The ``fedrec`` command line: simulate's report equals the library's numbers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from algorithms import registry
from algorithms.data import build_federation, load_ratings
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from app.cli import main
from app.commands import simulate as sim_cmd
from tests.doc_pages import doc_lines, doc_text, section


@pytest.fixture
def ratings_csv(tmp_path):
    r = generate_ratings(120, 60, 2400, rank=3, seed=4)
    path = tmp_path / "r.csv"
    rows = "\n".join(f"{u},{i},{v:g}" for u, i, v in zip(r.users, r.items, r.values,
                                                          strict=True))
    path.write_text("user,item,rating\n" + rows + "\n")
    return path


def test_simulate_json_matches_the_library(tmp_path, ratings_csv, capsys):
    out = tmp_path / "run.json"
    code = main(["simulate", "--data", str(ratings_csv), "--algorithm", "fedmc-admm",
                 "--clients", "6", "--per-round", "3", "--rounds", "3", "--rank", "4",
                 "--seed", "2", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    alg = registry.get("fedmc-admm")
    fed = build_federation(load_ratings(ratings_csv), 6, 2)
    sim = simulate(alg, alg.config(rank=4), fed, rounds=3, per_round=3, seed=2)
    assert [r["test_rmse"] for r in report["rounds_detail"]] == [h.test_rmse for h in
                                                                 sim.history]
    assert report["config"]["rank"] == 4 and report["clients"] == 6
    assert report["final"]["test_rmse"] == sim.final.test_rmse
    assert report["privacy"]["mechanism"] == "none"
    assert report["privacy"]["private"] is False
    assert {r["epsilon"] for r in report["privacy"]["threat_model"]["adversaries"]} == {
        "infinity"}
    table = capsys.readouterr().out
    assert f"{sim.final.test_rmse:9.4f}" in table


def test_simulate_json_dash_writes_the_report_alone_to_stdout(tmp_path, ratings_csv, capsys):
    """``--json -``: stdout is one JSON document (the file's), the table goes to stderr."""
    argv = ["simulate", "--data", str(ratings_csv), "--clients", "4", "--rounds", "2",
            "--rank", "3", "--seed", "1"]
    assert main(argv + ["--json", str(tmp_path / "run.json")]) == 0
    capsys.readouterr()
    assert main(argv + ["--json", "-"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    written = json.loads((tmp_path / "run.json").read_text())
    report["final"].pop("wall_seconds"), written["final"].pop("wall_seconds")
    for r in report["rounds_detail"] + written["rounds_detail"]:
        r.pop("seconds")
    assert report == written
    assert "test RMSE" in out.err and f"{report['final']['test_rmse']:9.4f}" in out.err


def test_tune_json_dash_writes_the_choice_alone_to_stdout(ratings_csv, capsys):
    assert main(["tune", "--data", str(ratings_csv), "--clients", "4", "--rounds", "2",
                 "--trials", "2", "--json", "-"]) == 0
    out = capsys.readouterr()
    chosen = json.loads(out.out)
    assert chosen["algorithm"] == "fedmc-admm" and len(chosen["trials"]) >= 2
    assert chosen["command"] in out.err and "best: validation RMSE" in out.err


def test_tune_records_the_data_set_by_its_name_under_the_data_dir(tmp_path, ratings_csv,
                                                                   monkeypatch, capsys):
    """Given as an absolute path under $FEDREC_DATA_DIR, the data are recorded as the path
    under it (not the machine's absolute path), and the recorded command runs from any
    directory: a relative --data not found here is looked up under $FEDREC_DATA_DIR."""
    monkeypatch.setenv("FEDREC_DATA_DIR", str(tmp_path))
    (tmp_path / "set").mkdir()
    data = tmp_path / "set" / "r.csv"
    ratings_csv.rename(data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["tune", "--data", str(data), "--clients", "4", "--rounds", "2",
                 "--trials", "2", "--json", "-", "--quiet"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["data"] == "set/r.csv"
    assert str(tmp_path) not in json.dumps(chosen)
    assert chosen["command"].startswith("fedrec simulate --data set/r.csv ")
    out = tmp_path / "run.json"
    assert main(["simulate", "--data", "set/r.csv", "--clients", "4", "--rounds", "1",
                 "--rank", "2", "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["data"] == "set/r.csv"
    outside = tmp_path.parent / f"{tmp_path.name}-outside.csv"  # not under the data dir
    outside.write_text(data.read_text())
    try:
        assert main(["simulate", "--data", str(outside), "--clients", "4", "--rounds", "1",
                     "--rank", "2", "--quiet", "--json", str(out)]) == 0
        assert json.loads(out.read_text())["data"] == str(outside)
    finally:
        outside.unlink()
    assert main(["simulate", "--data", "set/nope.csv", "--rounds", "1"]) == 2


def test_simulate_with_dp_reports_epsilon_per_tenant(tmp_path, ratings_csv):
    out = tmp_path / "dp.json"
    assert main(["simulate", "--data", str(ratings_csv), "--clients", "4", "--per-round", "2",
                 "--rounds", "4", "--rank", "3", "--dp", "gaussian", "--dp-epsilon", "5",
                 "--json", str(out), "--quiet"]) == 0
    priv = json.loads(out.read_text())["privacy"]
    assert priv["mechanism"] == "gaussian" and priv["delta"] == pytest.approx(1e-5)
    assert 0 < priv["epsilon_max"] <= 5.0
    assert "whole rating block" in priv["unit"]


def test_simulate_rejects_an_option_of_another_algorithm(ratings_csv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--data", str(ratings_csv), "--algorithm", "rfrec", "--beta", "3"])
    assert exit_.value.code == 2
    assert "--beta not an option of rfrec (it is an option of fedmc-admm, dp-fedmc-admm)" in \
        capsys.readouterr().err


def test_simulate_reports_a_missing_file(tmp_path, capsys):
    assert main(["simulate", "--data", str(tmp_path / "nope.csv"), "--rounds", "1"]) == 2
    assert "nope.csv" in capsys.readouterr().err


def test_synthetic_data_when_asked(tmp_path):
    out = tmp_path / "s.json"
    assert main(["simulate", "--data", "synthetic", "--rounds", "1", "--quiet",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["data"].startswith("synthetic") and report["n_ratings"] == 100_000
    assert np.isfinite(report["final"]["test_rmse"])


def test_simulate_binary_algorithm_reports_the_papers_metrics(tmp_path, ratings_csv):
    from algorithms.binary_metrics import binarise, binary_report

    out = tmp_path / "felb.json"
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "felb",
                 "--clients", "4", "--rounds", "3", "--rank", "3", "--quiet",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())["binary"]
    alg = registry.get("felb")
    fed = build_federation(load_ratings(ratings_csv), 4, 0)
    res = simulate(alg, alg.config(rank=3), binarise(fed, 3.5), rounds=3,
                   per_round=alg.run_defaults["per_round"] or 4, seed=0)
    want = binary_report(alg, res, binarise(fed, 3.5), seen=fed.train).as_dict()
    assert got == want


def test_simulate_stops_with_a_clear_error_when_training_diverges(ratings_csv, capsys):
    code = main(["simulate", "--data", str(ratings_csv), "--algorithm", "rfrec",
                 "--clients", "4", "--rounds", "40", "--alpha", "50", "--optimizer", "gd",
                 "--link", "identity", "--quiet"])
    assert code == 2
    assert "training diverged in round" in capsys.readouterr().err


def test_demo_runs_the_whole_product_on_embedded_defaults(tmp_path):
    """The README's first command, as a real process (it serves HTTP on a free port)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "demo", "--tenants", "2", "--rounds", "3",
         "--synthetic-ratings", "6000", "--epsilon", "5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "6000 ratings for 2 tenants" in out
    # the default job: dp-ials (job 1) for the lists and dpals (job 2) for the ratings, at
    # 2.5 each. Each real tenant: the job's request, the same spend at the budget's delta,
    # and the budget, which reconciles (remaining = budget - spent at the budget's delta)
    # and composes both jobs
    lines = re.findall(r"requested ([\d.]+), spent ([\d.]+) at delta 1e-06 = ([\d.]+) at "
                       r"the budget's delta 1e-05; budget 10\.000: spent ([\d.]+), "
                       r"remaining ([\d.]+)", out)
    assert len(lines) == 2, out
    for requested, at_request, charged, spent, remaining in lines:
        assert float(requested) == 2.5 and float(at_request) == 2.5
        assert float(charged) < 2.5 and float(charged) < float(spent) <= 5.0
        assert abs(float(spent) + float(remaining) - 10.0) < 2e-3
    assert "the same noise has a smaller epsilon at a larger delta" in out
    assert "unit: user; placement: central" in out
    assert "dp-ials (ranking model, job 1) against a most-popular list" in out
    assert re.search(r"dp-ials +P@10 [0-9.]+ +NDCG@10 [0-9.]+", out)
    assert re.search(r"popularity +P@10 [0-9.]+ +NDCG@10 [0-9.]+", out)
    served = re.search(r"served: (dp-ials|popularity): (.*)", out)
    assert served is not None and "on the held-out split" in served.group(2)
    assert "Sample recommendations (from the private models):" in out
    if served.group(1) == "dp-ials":  # the ranking job's lists, not the newer dpals job's
        assert "(dp-ials, a ranking model)" in out and "(from job 1)" in out
    else:
        assert "(popularity)" in out and f"({served.group(2)})" in out
    assert "Privacy cost: noise raised the final test RMSE by" in out
    assert (tmp_path / "fedrec-demo.db").is_file()


def test_simulate_user_level_dp_reports_unit_placement_and_releases(tmp_path, ratings_csv):
    out = tmp_path / "user.json"
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "dpals",
                 "--clients", "4", "--rank", "3", "--sweeps", "2", "--privacy", "user",
                 "--epsilon", "4", "--delta", "1e-4", "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    priv = report["privacy"]
    assert (priv["unit"], priv["placement"], priv["delta"]) == ("user", "central", 1e-4)
    assert 3.99 < priv["epsilon_max"] <= 4.0
    assert [r["round"] for r in priv["releases"]] == [1, 2]  # two sweeps, then a refresh
    assert all(r["tenants"] == 4 for r in priv["releases"])
    assert "Renyi DP" in priv["accounting"]
    assert report["rounds"] == 3 and np.isfinite(report["final"]["test_rmse"])


@pytest.mark.parametrize("name,rate", [("dp-fedmavg", 1.0), ("dp-fedmc-admm", 0.5)])
def test_simulate_user_level_gradient_methods_match_the_library(tmp_path, ratings_csv, name,
                                                               rate):
    from privacy.user_level import UserLevelPrivatizer, plan

    out = tmp_path / "user.json"
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", name,
                 "--clients", "4", "--rank", "2", "--releases", "3", "--user-sample-rate",
                 str(rate), "--privacy", "user", "--epsilon", "4", "--delta", "1e-4",
                 "--seed", "1", "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    priv = report["privacy"]
    assert (priv["unit"], priv["placement"], priv["delta"]) == ("user", "central", 1e-4)
    assert 3.99 < priv["epsilon_max"] <= 4.0
    assert [r["round"] for r in priv["releases"]] == [1, 2, 3]  # then a refresh round
    assert priv["sample_rate"] == rate and priv["release_growth"] == 1.0
    assert priv["sensitivity"] == {"clipped": 2.0, "centre": pytest.approx(2 ** 0.5)}
    assert report["rounds"] == 4
    alg = registry.get(name)
    cfg = alg.config(rank=2, releases=3, user_sample_rate=rate)
    fed = build_federation(load_ratings(ratings_csv), 4, 1)
    bounds = registry.user_bounds(name, cfg)
    lib = UserLevelPrivatizer(plan({"epsilon": 4, "delta": 1e-4}, bounds, 120, 3), bounds,
                              4, 1)
    sim = simulate(alg, cfg, fed, rounds=4, per_round=4, seed=1, privatizer=lib,
                   aggregator=lib.aggregate)
    # the same releases and charges; the noise is fresh on each side (issue 29)
    assert [r["noise_multiplier"] for r in priv["releases"]] == [
        r["noise_multiplier"] for r in lib.report()["releases"]]
    assert priv["epsilon_max"] == lib.report()["epsilon_max"]
    assert report["final"]["test_rmse"] != sim.final.test_rmse


def test_simulate_tenant_placement_matches_the_library(tmp_path, ratings_csv):
    from algorithms import dpals
    from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

    out = tmp_path / "user.json"
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "dpals",
                 "--clients", "4", "--rank", "3", "--privacy", "user", "--placement",
                 "tenant", "--epsilon", "4", "--delta", "1e-4", "--seed", "1",
                 "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    cfg = dpals.DPALSConfig(rank=3)
    fed = build_federation(load_ratings(ratings_csv), 4, 1)
    spec = UserLevelSpec(epsilon=4, delta=1e-4, n_users=120, releases=4, placement="tenant")
    priv = UserLevelPrivatizer(spec, dpals.user_bounds(cfg), 4, 1)
    sim = simulate(dpals.ALGORITHM, cfg, fed, rounds=5, per_round=4, seed=1, privatizer=priv,
                   aggregator=priv.aggregate)
    assert report["privacy"]["releases"] == priv.report()["releases"]  # the same releases
    assert report["privacy"]["epsilon_max"] == priv.report()["epsilon_max"]
    assert report["final"]["test_rmse"] != sim.final.test_rmse  # other (fresh) noise
    assert report["privacy"]["placement"] == "tenant"


@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "fedmc-admm", "--privacy", "user"],
     "--privacy user needs an algorithm whose uploads are sums of per-user bounded terms"),
    (["--algorithm", "dpals", "--privacy", "user", "--delta", "0.1"],
     "delta must be below 1 / number of users = 0.00833"),
    (["--algorithm", "dpals", "--privacy", "user", "--epsilon", "0"],
     "--epsilon: Input should be greater than 0"),
    (["--algorithm", "dpals", "--privacy", "user", "--dp", "gaussian"],
     "--dp gaussian protects a tenant's whole block: it cannot be combined with --privacy"),
    (["--algorithm", "dpals", "--placement", "central"],
     "--placement applies to --privacy user only"),
    (["--algorithm", "dpals", "--privacy", "user", "--gram-share", "1.5"],
     "--gram-share: Input should be less than 1"),
    (["--algorithm", "dpals", "--privacy", "tenant", "--gram-share", "0.5"],
     "--gram-share applies to --privacy user only"),
])
def test_simulate_refuses_bad_privacy_options(ratings_csv, capsys, argv, message):
    code = main(["simulate", "--data", str(ratings_csv), "--clients", "4", "--quiet", *argv])
    assert code != 0
    assert message in capsys.readouterr().err


def test_privacy_tenant_is_the_dp_wrapper_with_epsilon(tmp_path, ratings_csv):
    out = tmp_path / "t.json"
    assert main(["simulate", "--data", str(ratings_csv), "--clients", "4", "--per-round", "2",
                 "--rounds", "3", "--rank", "3", "--privacy", "tenant", "--epsilon", "5",
                 "--json", str(out), "--quiet"]) == 0
    priv = json.loads(out.read_text())["privacy"]
    assert priv["mechanism"] == "gaussian" and 0 < priv["epsilon_max"] <= 5.0
    assert "whole rating block" in priv["unit"] and priv["placement"] == "tenant"


# --- the command line reaches every config field -------------------------------------------

def _text(value) -> str:
    """A value as a user types it (written here, independently of simulate's formatter)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _candidates(annotation, default) -> list:
    """Values of a field's type to try (the invalid ones are dropped by the caller)."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return list(args)
    if origin in (typing.Union, types.UnionType):
        return [c for a in args for c in ([None] if a is type(None)
                                          else _candidates(a, default))]
    if origin is tuple:
        return [(0.25, 0.75), (1.0, 10.0)]
    if annotation is bool:
        return [True, False]
    base = default if isinstance(default, int | float) and not isinstance(default, bool) \
        else 1
    if annotation is int:
        return [base + 1, base + 3, 1, 2]
    return [base * 2, base / 2, base + 1.5, 0.5, 0.25, 0.123, base * 1.01]


def _parse(argv: list[str]):
    from app.cli import build_parser

    return build_parser().parse_args(["simulate", *argv])


@pytest.mark.parametrize("name", registry.names())
def test_every_config_field_round_trips_through_the_cli(name):
    import typing

    alg = registry.get(name)
    cls = alg.config
    default = cls()
    checked = {}
    for field, info in cls.model_fields.items():
        if typing.get_origin(info.annotation) is typing.Literal and \
                len(typing.get_args(info.annotation)) == 1:
            continue  # fixed, informational (FedMGS' privacy_preserving=False)
        flag = "--" + {"center": "centre"}.get(field, field).replace("_", "-")
        for value in _candidates(info.annotation, getattr(default, field)):
            if value == getattr(default, field):
                continue
            for extra in ({}, {"link": "identity"}):  # rating_range none needs identity
                try:
                    want = cls(**{field: value, **extra})
                except ValueError:
                    continue
                argv = ["--algorithm", name, flag, _text(value)]
                for k, v in extra.items():
                    argv += ["--" + k, _text(v)]
                got = sim_cmd._config(alg, _parse(argv))
                assert got == want, (flag, value)
                assert getattr(got, field) == value, (flag, value)
                checked.setdefault(field, []).append(value)
                break
    settable = [f for f, i in cls.model_fields.items()
                if not (typing.get_origin(i.annotation) is typing.Literal
                        and len(typing.get_args(i.annotation)) == 1)]
    assert sorted(checked) == sorted(settable)  # every field got a non-default value
    if name in ("rfrec", "rfrecf"):  # every arm of the union
        assert {type(v) for v in checked["rating_range"]} == {tuple, type(None)}


@pytest.mark.parametrize("spelling", ["0.5,5", "[0.5, 5]", "0.5 5", "(0.5,5)"])
def test_rating_range_takes_a_pair_in_any_usual_spelling(spelling):
    cfg = sim_cmd._config(registry.get("rfrec"),
                          _parse(["--algorithm", "rfrec", "--rating-range", spelling]))
    assert cfg.rating_range == (0.5, 5.0) and cfg.link == "sigmoid"


@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "rfrec", "--rating-range", "0.5"],
     "argument --rating-range: expected A,B|tenant|none, got '0.5'"),
    (["--algorithm", "rfrec", "--link", "tanh"],
     "argument --link: expected one of identity, sigmoid, got 'tanh'"),
    (["--algorithm", "fedmavg", "--centre", "maybe"],
     "argument --centre: expected true or false, got 'maybe'"),
    (["--algorithm", "fedmavg", "--center", "true"],
     "unrecognized arguments: --center true"),
    (["--algorithm", "fedmc-admm", "--rank", "2.5"],
     "argument --rank: expected an integer, got '2.5'"),
])
def test_simulate_refuses_a_bad_value_naming_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        _parse(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_value_the_config_refuses_names_the_flag(ratings_csv, capsys):
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "rfrec",
                 "--alpha", "-1"]) == 2
    assert "fedrec simulate: error: --alpha: Input should be greater than 0" in \
        capsys.readouterr().err


@pytest.mark.parametrize("name", registry.names())
def test_preset_paper_starts_from_the_paper_preset(name):
    from algorithms.presets import PAPER_RUNS, paper_config

    alg = registry.get(name)
    assert sim_cmd._config(alg, _parse(["--algorithm", name])) == alg.config()
    paper = sim_cmd._config(alg, _parse(["--algorithm", name, "--preset", "paper"]))
    assert paper == paper_config(name)
    fields = PAPER_RUNS[name].fields if name in PAPER_RUNS else {}
    assert paper == alg.config.paper_settings(**fields)
    assert sim_cmd._config(alg, _parse(["--algorithm", name, "--preset", "paper",
                                        "--rank", "7"])) == paper_config(name, rank=7)


def test_preset_paper_differs_where_the_papers_do():
    from algorithms.fedmc_admm import FedMCADMMConfig
    from algorithms.rfrec import RFRecConfig

    cfg = sim_cmd._config(registry.get("rfrec"), _parse(["--algorithm", "rfrec",
                                                         "--preset", "paper"]))
    # the paper's values with the authors' optimiser: the printed GD step diverges
    assert (cfg.optimizer, cfg.link, cfg.alpha, cfg.iterations, cfg.bias) == (
        "adam", "sigmoid", 0.05, 100, False)
    assert RFRecConfig.paper_settings().optimizer == "gd"
    assert cfg != RFRecConfig()
    cfg = sim_cmd._config(registry.get("fedmc-admm"), _parse(["--preset", "paper"]))
    assert (cfg.rank, cfg.u_anchor) == (5, "local") != (FedMCADMMConfig().rank, "global")


def test_rfrec_iterations_are_the_default_rounds(tmp_path, ratings_csv):
    out = tmp_path / "r.json"
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "rfrec",
                 "--clients", "4", "--iterations", "3", "--rating-range", "1,5",
                 "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["rounds"] == 3 and len(report["rounds_detail"]) == 3
    assert report["config"]["rating_range"] == [1.0, 5.0]
    assert report["config"]["link"] == "sigmoid"
    assert np.isfinite(report["final"]["test_rmse"])


def _help(argv: list[str], capsys) -> str:
    """``simulate --help`` on one line, from its option list (the usage lines dropped)."""
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", *argv, "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    return text[text.index(" options: "):]


def _shown_default(text: str, flag: str) -> str:
    """The last "(default: X)" of ``flag``'s entry in one-line help text."""
    import re

    start = re.search(re.escape(flag) + r" [^-]", text)
    assert start, flag
    end = re.compile(r" --[a-z]").search(text, start.end())
    entry = text[start.start():end.start() if end else len(text)]
    return entry[entry.rindex("(default: ") + 10:].rsplit(")", 1)[0]


def _flags(name: str) -> set[str]:
    import typing

    return {"--" + {"center": "centre"}.get(f, f).replace("_", "-")
            for f, i in registry.get(name).config.model_fields.items()
            if not (typing.get_origin(i.annotation) is typing.Literal
                    and len(typing.get_args(i.annotation)) == 1)}


@pytest.mark.parametrize("name", registry.names())
def test_help_lists_only_the_chosen_algorithms_options_with_defaults(name, capsys):
    import re

    text = _help(["--algorithm", name], capsys)
    default = registry.get(name).config()
    others = set().union(*(_flags(n) for n in registry.names())) - _flags(name)
    for flag in others:
        assert not re.search(re.escape(flag) + r"(?![\w-])", text), flag
    for field in registry.get(name).config.model_fields:
        flag = "--" + {"center": "centre"}.get(field, field).replace("_", "-")
        if flag not in _flags(name):
            continue
        assert _shown_default(text, flag) == _text(getattr(default, field)), flag
    assert "--center" not in text  # one spelling: --centre
    for flag in ("--clients", "--per-round", "--rounds", "--seed", "--preset", "--dp ",
                 "--dp-clip", "--test-fraction", "--threshold"):
        start = text.index(flag)
        assert "default" in text[start:text.index(" --", start + 3)], flag


def test_help_shows_the_presets_values(capsys):
    text = _help(["--algorithm", "rfrec", "--preset", "paper"], capsys)
    assert "(default: adam)" in text and "(default: 0.05)" in text
    assert "--rounds T communication rounds T (default: iterations = 100)" in text
    assert "--clients P number of tenants P, users split at random (default: one per " \
        "user)" in text
    assert "as `fedrec bench rfrec_table2`" in text and "diverges" in text
    text = _help(["--algorithm", "rfrec"], capsys)
    assert "--clients P number of tenants P, users split at random (default: 200)" in text


# --- the documentation (README.md, docs/**/*.md) and --help agree ------------------------------


def _readme_table(header: str) -> list[list[str]]:
    lines = doc_text().splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _readme_value(text: str, like):
    if isinstance(like, bool):
        return {"on": True, "off": False}[text]
    if isinstance(like, int | float):
        return type(like)(float(text))
    return text


def test_readme_fedmc_admm_table_equals_the_configs_and_help(capsys):
    from algorithms.fedmc_admm import FedMCADMMConfig

    rows = _readme_table("| field | default (recommended) | paper_settings() | meaning |")
    rec, paper = FedMCADMMConfig(), FedMCADMMConfig.paper_settings()
    text = _help(["--algorithm", "fedmc-admm"], capsys)
    paper_text = _help(["--algorithm", "fedmc-admm", "--preset", "paper"], capsys)
    seen = []
    for fields, rec_text, paper_txt, _ in rows:
        names = [f.strip() for f in fields.split(",")]
        recs, papers = rec_text.split(","), paper_txt.split(",")
        recs, papers = recs * (len(names) // len(recs)), papers * (len(names) // len(papers))
        for f, r, p in zip(names, recs, papers, strict=True):
            assert _readme_value(r.strip(), getattr(rec, f)) == getattr(rec, f), f
            assert _readme_value(p.strip(), getattr(paper, f)) == getattr(paper, f), f
            flag = "--" + f.replace("_", "-")
            for shown, cfg in ((text, rec), (paper_text, paper)):
                assert _shown_default(shown, flag) == _text(getattr(cfg, f)), flag
            seen.append(f)
    assert sorted(seen) == sorted(FedMCADMMConfig.model_fields)


def test_readme_dp_options_equal_the_help(capsys):
    import re

    lines = doc_text().splitlines()
    start = lines.index("**Command line.** `fedrec simulate` takes these options:") + 1
    while not lines[start]:  # the blank line a Markdown list needs before it
        start += 1
    block = "\n".join(lines[start:lines.index("", start)])
    text = _help([], capsys)
    flags = re.findall(r"`(--[a-z-]+)", block)
    assert flags[0] == "--dp" and len(flags) >= 8
    for flag in flags:
        assert re.search(re.escape(flag) + r"(?![\w-])", text), flag
    choices, default = re.search(r"`--dp \{([a-z,]+)\}` \(default `([a-z]+)`", block).groups()
    assert f"--dp {{{choices}}}" in text
    assert f"(default: {default})" in text[text.index("--dp {"):]
    assert _parse([]).dp == default


def test_readme_simulate_commands_parse(tmp_path, monkeypatch):
    """Every `fedrec simulate` command of the documentation is accepted (parsed, not run);
    a `--config` file is what `fedrec tune --json` writes."""
    import json
    import shlex

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tuned.json").write_text(json.dumps(
        {"algorithm": "fedmc-admm", "config": {"lam": 2.5}}))
    commands = doc_lines("fedrec simulate ")
    assert len(commands) >= 3
    for command in commands:
        argv = shlex.split(command.split("#")[0])[2:]
        if "--help" in argv:
            continue
        args = _parse(argv)
        sim_cmd._config(registry.get(args.algorithm), args)


def test_readme_tune_commands_parse_and_tune_offers_only_searchable_algorithms(capsys):
    """Every `fedrec tune` command of the documentation parses; --help lists the algorithms that
    declare a search space, and an algorithm without one is refused by the parser."""
    import shlex

    from app.cli import build_parser

    commands = doc_lines("fedrec tune ")
    assert commands
    for command in commands:
        args = build_parser().parse_args(shlex.split(command.split("#")[0])[1:])
        assert args.command == "tune" and args.trials >= 1
    tunable = [n for n in registry.names() if getattr(registry.get(n).config, "search_space",
                                                      None)]
    assert {"fedmc-admm", "fedmavg", "rfrec", "rfrecf"} <= set(tunable)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--algorithm", "felb"])
    assert "invalid choice: 'felb'" in capsys.readouterr().err


def test_watch_rounds_sees_every_round_of_every_run_inside_it():
    from algorithms.simulate import watch_rounds

    alg = registry.get("fedmc-admm")
    fed = build_federation(generate_ratings(40, 20, 500, rank=2, seed=1), 3, 0)
    seen = []
    with watch_rounds(lambda k, n, rec: seen.append((k, n, rec))):
        first = simulate(alg, alg.config(rank=2), fed, rounds=2, per_round=3, seed=0)
        second = simulate(alg, alg.config(rank=2), fed, rounds=3, per_round=3, seed=1)
    simulate(alg, alg.config(rank=2), fed, rounds=1, per_round=3, seed=2)  # not watched
    assert [(k, n) for k, n, _ in seen] == [(1, 2), (2, 2), (1, 3), (2, 3), (3, 3)]
    assert [rec for *_, rec in seen] == first.history + second.history


def test_progress_bars_only_on_a_terminal(capsys, monkeypatch):
    """Off a terminal (logs, pipes, --json -) no bar is drawn; on one, the bench bar
    follows each run with its round and test RMSE, on stderr."""
    from app.commands import output

    alg = registry.get("fedmc-admm")
    fed = build_federation(generate_ratings(40, 20, 500, rank=2, seed=1), 3, 0)

    def two_runs():
        for seed in (0, 1):
            simulate(alg, alg.config(rank=2), fed, rounds=2, per_round=3, seed=seed)

    with output.runs_bar("bench x"):
        two_runs()
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.delenv("FEDREC_NO_PROGRESS", raising=False)
    with output.runs_bar("bench x"):
        two_runs()
    out = capsys.readouterr()
    assert out.out == "" and "bench x" in out.err and "run 2" in out.err
    monkeypatch.setenv("FEDREC_NO_PROGRESS", "1")
    assert output.RoundsBar(3).progress is None


def test_the_cli_lists_every_command_without_importing_it_and_the_help_lines_agree():
    """`fedrec --help` imports no command module (start-up in a fraction of a second), and
    its help lines are the ones the modules themselves register."""
    import argparse

    from app import cli

    def lines(parser):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {a.dest: a.help for a in sub._choices_actions}

    assert lines(cli.build_parser("")) == lines(cli.build_parser()) == {
        name: help_line for name, (_, help_line) in cli.COMMANDS.items()}
    code = ("import sys; from app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('numpy', 'sqlalchemy', 'algorithms', 'app.db', 'fastapi')"
            " if m in sys.modules]\nprint('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    assert out.strip().endswith("HEAVY []")
    assert cli.chosen_command(["--log-format", "json", "jobs", "list"]) == "jobs"
    assert cli.chosen_command(["simulate", "--help"]) == "simulate"
    assert cli.chosen_command(["-h"]) is None


# --- rating data unlike MovieLens (issue 17: "rating data you have not seen") -----------------

def _write(path, r, scale=lambda v: v):
    rows = "\n".join(f"{u},{i},{scale(v):g}" for u, i, v in zip(r.users, r.items, r.values,
                                                               strict=True))
    path.write_text(rows + "\n")
    return path


def test_simulate_takes_the_datas_scale_as_the_public_scale_unless_given(tmp_path):
    """On a 0-10 file DPALS's centre and clip come from 0-10, not the 1-5 default (its
    centre was 3, the bottom third of the scale); a scale given is kept."""
    path = _write(tmp_path / "r.csv", generate_ratings(120, 60, 2400, rank=3, seed=4),
                  lambda v: 2.5 * v - 2.5)
    out = tmp_path / "run.json"
    argv = ["simulate", "--data", str(path), "--algorithm", "dpals", "--clients", "4",
            "--quiet", "--json", str(out)]
    assert main(argv) == 0
    assert (json.loads(out.read_text())["config"]["scale_min"],
            json.loads(out.read_text())["config"]["scale_max"]) == (0.0, 10.0)
    assert main(argv + ["--scale-min", "1", "--scale-max", "5"]) == 0
    assert json.loads(out.read_text())["config"]["scale_max"] == 5.0


def test_simulate_binary_threshold_follows_the_datas_scale(tmp_path, capsys):
    """0/1 data: the default threshold is 62.5% up the scale, so the 1s are the positives
    (the fixed 3.5 made every rating a negative); no positive at all is a clear error."""
    r = generate_ratings(120, 60, 2400, rank=3, seed=4)
    path = _write(tmp_path / "b.csv", r, lambda v: float(v >= 4))
    out = tmp_path / "felb.json"
    argv = ["simulate", "--data", str(path), "--algorithm", "felb", "--clients", "4",
            "--rounds", "2", "--rank", "3", "--quiet", "--json", str(out)]
    assert main(argv) == 0
    assert "binary (rating >= 0.625)" in capsys.readouterr().out
    assert main(argv + ["--threshold", "3.5"]) == 2
    err = capsys.readouterr().err
    assert "no training rating is >= 3.5 (ratings run from 0 to 1)" in err


def test_simulate_on_fewer_users_than_the_default_tenants(tmp_path, capsys):
    r = generate_ratings(50, 40, 1200, rank=3, seed=4)
    path = _write(tmp_path / "small.csv", r)
    out = tmp_path / "run.json"
    assert main(["simulate", "--data", str(path), "--rounds", "2", "--quiet",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["clients"] == 50
    assert "50 tenants of one user each" in capsys.readouterr().err
    assert main(["simulate", "--data", str(path), "--clients", "60", "--rounds", "2",
                 "--quiet"]) == 2
    assert "clients must be between 1 and the number of users (50)" in \
        capsys.readouterr().err


def test_simulate_refuses_constant_ratings_and_notes_duplicates(tmp_path, capsys):
    path = tmp_path / "implicit.csv"
    path.write_text("".join(f"u{u},i{u % 7},1\n" for u in range(30)))
    assert main(["simulate", "--data", str(path), "--rounds", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "all 30 ratings are 1" in err and "Traceback" not in err
    r = generate_ratings(40, 30, 600, rank=3, seed=4)
    dup = _write(tmp_path / "dup.csv", r)
    dup.write_text(dup.read_text() + f"{r.users[0]},{r.items[0]},1\n")
    assert main(["simulate", "--data", str(dup), "--clients", "4", "--rounds", "1",
                 "--quiet"]) == 0
    assert "1 (user, item) pair(s) rated more than once" in capsys.readouterr().err


# --- habits: --version, global options anywhere, suggestions, --json alone ---------------------

def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    from app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedrec {version('fedrec')}"


@pytest.mark.parametrize("argv", [
    ["admin", "--url", "http://x:1", "--token", "T", "tenants", "list"],
    ["--url", "http://x:1", "admin", "tenants", "--token=T", "list"],
    ["admin", "tenants", "list", "--url", "http://x:1", "--token", "T"],
    ["--token", "T", "jobs", "--url=http://x:1", "list"],
])
def test_the_api_commands_options_are_accepted_anywhere(argv):
    from app.cli import parse

    args = parse(argv)
    assert (args.url, args.token, args.json) == ("http://x:1", "T", None)


@pytest.mark.parametrize("argv, want", [
    (["admin", "--json", "tenants", "show", "3"], "-"),
    (["admin", "tenants", "show", "3", "--json"], "-"),
    (["admin", "--json", "out.json", "tenants", "show", "3"], "out.json"),
    (["admin", "tenants", "show", "3", "--json", "-"], "-"),
    (["doctor", "--json"], "-"),
    (["doctor", "--json", "--timeout", "1"], "-"),
])
def test_json_alone_means_stdout(argv, want):
    from app.cli import parse

    assert str(parse(argv).json) == want


@pytest.mark.parametrize("argv, usage, hint", [
    (["simulate", "--roundz", "3"], "fedrec simulate", "--roundz (did you mean --rounds?)"),
    (["admin", "jobs", "create", "--epsilonn", "2"], "fedrec admin jobs create",
     "(did you mean --epsilon?)"),
    (["admin", "tenents", "list"], "fedrec admin", "(did you mean tenants?)"),
    (["simulat"], "fedrec", "(did you mean simulate?)"),
])
def test_mistakes_get_the_subcommands_usage_and_a_suggestion(argv, usage, hint, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {usage} "), err
    assert hint in err


def test_every_readme_command_of_the_api_cli_parses():
    """The documentation's `fedrec admin|jobs|doctor` lines are accepted as written (parsed,
    not run): the docs and the parsers agree on the options."""
    import shlex

    from app.cli import parse

    commands = [line.split("#")[0] for line in doc_lines(r"fedrec (admin|jobs|doctor)\b")]
    assert len(commands) >= 10
    for command in commands:
        assert parse(shlex.split(command)[1:]).func, command


def test_readme_and_help_describe_ranking_and_rating_models_alike(capsys):
    """`fedrec --help` ends with the two kinds of model; the documentation's section says the
    same sentences."""
    from app.cli import MODEL_KINDS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert MODEL_KINDS in text
    text = section("Ranking and rating models")
    assert MODEL_KINDS in " ".join(text.split("\n\n")[1].split())
    for name in ("ials", "dp-ials", "dpals", "fedmc-admm"):
        assert name in MODEL_KINDS
    from algorithms import registry

    assert {n for n in ("ials", "dp-ials") if registry.model_kind(n) == "ranking"} == {
        "ials", "dp-ials"}
    assert registry.model_kind("dpals") == registry.model_kind("fedmc-admm") == "rating"


def test_simulate_prints_popularity_beside_the_model_on_the_same_split(tmp_path, ratings_csv,
                                                                     capsys):
    from algorithms import popularity
    from algorithms.ranking import ranking_report

    out = tmp_path / "ials.json"
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "ials", "--clients",
                 "4", "--rank", "3", "--sweeps", "2", "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    fed = build_federation(load_ratings(ratings_csv), 4, 0)
    res = popularity.fit(fed)
    rep = ranking_report(popularity.ALGORITHM, res.global_msg, res.local_states, fed.train,
                         fed.test, fed.scale)
    pop = report["ranking"]["popularity"]
    assert pop["ndcg_at_k"] == rep.ndcg_at_k and pop["list"] == "popularity (exact counts)"
    assert "baseline popularity (exact counts): precision@10" in capsys.readouterr().out
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "dp-ials",
                 "--clients", "4", "--rank", "3", "--sweeps", "2", "--privacy", "user",
                 "--epsilon", "4", "--delta", "1e-4", "--json", str(out), "--quiet"]) == 0
    dp = json.loads(out.read_text())
    assert dp["ranking"]["popularity"]["list"].startswith("DP popularity (epsilon 4,")
    assert dp["ranking"]["popularity"]["list"].endswith("sqrt(100))")
    assert 3.99 < dp["privacy"]["epsilon_max"] <= 4.0  # the model's own budget, untouched
    # below epsilon 2 the baseline's k shrinks with epsilon (algorithms.popularity)
    assert main(["simulate", "--data", str(ratings_csv), "--algorithm", "dp-ials",
                 "--clients", "4", "--rank", "3", "--sweeps", "2", "--privacy", "user",
                 "--epsilon", "1", "--delta", "1e-4", "--json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["ranking"]["popularity"]["list"].endswith("sqrt(30))")
