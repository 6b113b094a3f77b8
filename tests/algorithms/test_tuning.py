"""``fedrec tune``'s search: validation carve-out of the training ratings only, the chosen
config never worse than the default on validation, the test ratings never read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from algorithms import registry
from algorithms.data import Federation, build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from algorithms.tuning import draws, tune, validation_federation
from app.cli import main

ALG = registry.get("fedmc-admm")


@pytest.fixture(scope="module")
def fed():
    return build_federation(generate_ratings(150, 90, 4000, rank=3, noise=0.3, seed=4), 6, 0)


def _poisoned(fed: Federation) -> Federation:
    bad = [b.with_values(np.full(b.nnz, 1e6)) for b in fed.test]
    return Federation(fed.train, bad, fed.user_ids, fed.item_ids, fed.scale)


def _key(res):
    return ([(t.params, t.history) for t in res.trials], res.best.params, res.best.rmse)


def test_carve_out_comes_from_the_training_ratings_only(fed):
    val = validation_federation(fed)
    def cells(b):
        return set(zip(b.rows.tolist(), b.cols.tolist(), strict=True))

    for tr, vt, vv, te in zip(fed.train, val.train, val.test, fed.test, strict=True):
        assert cells(vt) | cells(vv) == cells(tr)
        assert vt.nnz + vv.nnz == tr.nnz and vv.nnz == round(0.1 * tr.nnz)
        assert not cells(vv) & cells(te)


def test_chosen_config_beats_or_ties_the_default_and_ignores_the_test_set(fed):
    res = tune(ALG, fed, rounds=27, per_round=3, seed=0, trials=6, budget_seconds=120)
    assert not res.budget_exhausted
    assert res.best.rounds == res.default.rounds == 27
    assert res.best.rmse <= res.default.rmse
    # independently: both configs re-run on the carve-out give the reported numbers
    val = validation_federation(fed)
    for trial in (res.best, res.default):
        again = simulate(ALG, ALG.config(**trial.params), val, rounds=27, per_round=3,
                         seed=0, evaluate_every=27)
        assert again.final.test_rmse == trial.rmse
    # the test ratings replaced by nonsense, or dropped: the same search, number for number
    assert _key(tune(ALG, _poisoned(fed), rounds=27, per_round=3, seed=0, trials=6)) == _key(res)
    no_test = Federation(fed.train, [], fed.user_ids, fed.item_ids, fed.scale)
    assert _key(tune(ALG, no_test, rounds=27, per_round=3, seed=0, trials=6)) == _key(res)


def test_a_spent_budget_keeps_the_default(fed):
    res = tune(ALG, fed, rounds=9, per_round=3, seed=0, trials=5, budget_seconds=0)
    assert res.budget_exhausted and res.best is res.default
    assert [t.rounds for t in res.trials] == [1, 0, 0, 0, 0]


def test_draws_cover_every_range():
    space = {"lam": ("log", 0.1, 10.0), "rank": ("choice", [5, 10])}
    pts = draws(space, 8, np.random.default_rng(0))
    logs = np.log10([p["lam"] for p in pts])
    # one draw in each eighth of [-1, 1] (log scale)
    assert sorted(np.floor((logs + 1) * 4).astype(int).tolist()) == list(range(8))
    assert sorted(p["rank"] for p in pts) == [5] * 4 + [10] * 4


def test_an_algorithm_without_a_search_space_is_refused(fed):
    with pytest.raises(ValueError, match="felb declares no search space"):
        tune(registry.get("felb"), fed, rounds=2, per_round=2)


def test_cli_prints_a_command_and_writes_a_config_simulate_takes(tmp_path, capsys):
    r = generate_ratings(150, 90, 4000, rank=3, noise=0.3, seed=4)
    data = tmp_path / "r.csv"
    data.write_text("user,item,rating\n" + "".join(
        f"{u},{i},{v}\n" for u, i, v in zip(r.users, r.items, r.values, strict=True)))
    out = tmp_path / "tuned.json"
    assert main(["tune", "--data", str(data), "--clients", "6", "--per-round", "3",
                 "--rounds", "9", "--trials", "4", "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    tuned = json.loads(out.read_text())
    assert tuned["command"] in printed and tuned["command"].startswith("fedrec simulate")
    assert tuned["validation_rmse"] <= tuned["default_validation_rmse"]
    for field, value in tuned["changed"].items():
        assert f"--{field.replace('_', '-')} {value}" in tuned["command"]
    report = tmp_path / "run.json"
    assert main(["simulate", "--data", str(data), "--clients", "6", "--per-round", "3",
                 "--rounds", "3", "--config", str(out), "--json", str(report),
                 "--quiet"]) == 0
    assert json.loads(report.read_text())["config"] == ALG.config(**tuned["config"]).model_dump()
    assert "ranking" in json.loads(report.read_text())


def test_simulate_refuses_a_config_file_of_another_algorithm(tmp_path, capsys):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"algorithm": "rfrec", "config": {"lam": 3.0}}))
    assert main(["simulate", "--data", "synthetic", "--config", str(path)]) == 2
    assert "a config of rfrec, not of fedmc-admm" in capsys.readouterr().err
    path.write_text(json.dumps({"lam": -1.0, "rank": 0}))
    assert main(["simulate", "--data", "synthetic", "--config", str(path)]) == 2
    assert "rank must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["fedmavg", "rfrec", "rfrecf"])
def test_every_declared_space_tunes(fed, name):
    alg = registry.get(name)
    res = tune(alg, fed, rounds=9, per_round=6, seed=1, trials=4, budget_seconds=60)
    assert np.isfinite(res.default.rmse) and res.best.rmse <= res.default.rmse
    assert all(set(t.params) == set(alg.config.search_space) for t in res.trials[1:])
    res.config(alg)  # every draw is a valid config
