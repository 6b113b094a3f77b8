"""The ``fedrec`` command line: simulate's report equals the library's numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from algorithms import registry
from algorithms.data import build_federation, load_ratings
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from app.cli import main


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
    assert report["privacy"] == {"mechanism": "none"}
    table = capsys.readouterr().out
    assert f"{sim.final.test_rmse:9.4f}" in table


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
    code = main(["simulate", "--data", str(ratings_csv), "--algorithm", "rfrec",
                 "--beta", "3"])
    assert code == 2
    assert "--beta not an option of rfrec" in capsys.readouterr().err


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
    assert out.count("epsilon spent    5.000, budget remaining") == 2  # each real tenant
    assert "unit: user; placement: central" in out
    assert "Sample recommendations (from the private model):" in out and "(model)" in out
    assert "(from job 1, the most recent snapshot)" in out  # the private job is job 1
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
    assert report["final"]["test_rmse"] == sim.final.test_rmse
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
