"""``fedrec tune``'s search: validation carve-out of the training ratings only, the chosen
config never worse than the default on validation, the test ratings never read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from algorithms import registry, tuning
from algorithms.data import Federation, build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings
from algorithms.tuning import (
    couple_rank_and_lambda,
    draws,
    extended_space,
    rungs_of,
    tune,
    validation_federation,
)
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


def test_run_length_is_the_resource_and_the_choice_is_the_best_finalist(fed):
    """Rungs of 3, 9 and 27 rounds continue each survivor's run; the choice is the
    (config, rounds) with the lowest validation RMSE among the finalists' evaluations,
    and re-running that config from scratch for those rounds gives the same number."""
    res = tune(ALG, fed, rounds=27, per_round=3, seed=2, trials=9, budget_seconds=300)
    assert res.rungs == [3, 9, 27] and not res.cuts
    assert [r for r, _ in res.default.history] == [3, 9, 27]  # the default at every rung
    declared = res.trials[2]  # the declared anchor, also at every rung
    assert declared.params == ALG.config.search_anchors[0]
    assert [r for r, _ in declared.history] == [3, 9, 27]
    # 7 others: the best 3 go on to 9 rounds, the best 1 of those to 27
    assert sorted(len(t.history) for t in res.trials) == [1] * 4 + [2] * 2 + [3] * 3
    assert res.default in res.finalists and declared in res.finalists
    assert len(res.finalists) == 3
    assert all(t.history[-1][0] == 27 for t in res.finalists)
    every = [(v, r) for t in res.finalists for r, v in t.history]
    assert res.rmse == min(v for v, _ in every) and (res.rmse, res.rounds) in every
    assert (res.rounds, res.rmse) in res.best.history
    # the survivors of each rung are the best third of the others by validation RMSE
    others = [t for t in res.trials[1:] if t is not declared]
    first = sorted(others, key=lambda t: t.history[0][1])
    assert {id(t) for t in first[:3]} == {id(t) for t in others if len(t.history) > 1}
    second = sorted((t for t in others if len(t.history) > 1), key=lambda t: t.history[1][1])
    assert {id(second[0])} == {id(t) for t in others if len(t.history) > 2}
    again = simulate(ALG, res.config(ALG), validation_federation(fed, 2), rounds=res.rounds,
                     per_round=3, seed=2, evaluate_every=res.rounds)
    assert again.final.test_rmse == res.rmse
    for _, v in res.default.history:  # beats or ties the default at every run length
        assert res.rmse <= v


def test_rank_and_lambda_are_drawn_jointly_and_inner_steps_are_searched(fed):
    assert extended_space(ALG)["inner_steps"] == ("choice", [10, 20])
    assert "inner_steps" not in extended_space(registry.get("rfrec"))
    assert couple_rank_and_lambda([{"rank": 20, "lam": 1.5}, {"rank": 5, "lam": 3.0},
                                   {"gamma": 0.1}], 10) == \
        [{"rank": 20, "lam": 3.0}, {"rank": 5, "lam": 1.5}, {"gamma": 0.1}]
    # a per-rating (weighted-lambda) weight is not scaled with the rank
    assert couple_rank_and_lambda([{"rank": 20, "lam": 1.5, "lam_rating": 0.1}], 10) == \
        [{"rank": 20, "lam": 3.0, "lam_rating": 0.1}]
    res = tune(ALG, fed, rounds=3, per_round=3, seed=0, trials=12, budget_seconds=300)
    ridge = next(k for k in ("lam", "lam_rating") if k in ALG.config.search_space)
    lo, hi = ALG.config.search_space[ridge][1:]
    assert res.trials[1].params == {"inner_steps": 20}  # the default with 2N inner steps
    assert res.trials[2].params == ALG.config.search_anchors[0]  # the declared anchor
    assert ALG.config(**res.trials[2].params).lam == 5.0
    assert tuning.declared_anchors(registry.get("fedmavg")) == []
    lo_r, hi_r = ALG.config.search_space["lam_rating"][1:]
    for t in res.trials[3:]:
        per_rank_10 = t.params[ridge] * 10 / t.params["rank"]
        assert lo * 0.99 <= per_rank_10 <= hi * 1.01
        assert lo_r * 0.99 <= t.params["lam_rating"] <= hi_r * 1.01  # as drawn, any rank
        assert t.params["inner_steps"] in (10, 20)
    assert {t.params["rank"] for t in res.trials[3:]} == set(ALG.config.search_space["rank"][1])


class _Clock:
    """A fake wall clock: a round costs one second, ``spike`` seconds once the clock has
    passed ``after`` (a load spike the plan could not foresee)."""

    def __init__(self, monkeypatch, spike: float = 1.0, after: float = float("inf")):
        self.now = 0.0
        real = tuning.simulate

        def simulate_(alg, cfg, fed, *, rounds, start=None, **kw):
            cost = 1.0 if self.now < after else spike
            self.now += cost * (rounds - (start.round if start is not None else 0))
            res = real(alg, cfg, fed, rounds=rounds, start=start, **kw)
            for rec in res.history:
                rec.seconds = cost
            return res

        monkeypatch.setattr(tuning, "simulate", simulate_)
        monkeypatch.setattr(tuning.time, "perf_counter", lambda: self.now)


def test_plan_rounds():
    # 6 configs x 3, 3 continue 6 more, 2 continue 18 more
    assert tuning.plan_rounds([3, 9, 27], 6, 3) == 18 + 18 + 36
    assert tuning.plan_rounds([9, 27], 2, 3) == 18 + 36
    # two protected (the default, a declared anchor): 2 + ceil(4 / 3) = 4 continue, then
    # 2 + ceil(2 / 3) = 3
    assert tuning.plan_rounds([3, 9, 27], 6, 3, protected=2) == 18 + 24 + 54
    assert tuning.plan_rounds([9, 27], 2, 3, protected=2) == 18 + 36


def test_configs_are_dropped_and_a_rung_shortened_to_fit_the_budget(fed, monkeypatch):
    """Budget 40 s, rounds of 1 s. The default's 3-round probe leaves 37 s; the full plan
    would need (96 - 3) x 2 s (a draw counted twice the default's cost; the default and
    the declared anchor go on to every rung), and so would every pool down to the three
    anchors (default, default with 20 inner steps, the declared mixed-ridge point), on
    rungs of 9 and 27: the default's 6 more rounds and the others' 9 take 24 s, then all
    three (the protected two and the best other) x 1 s x 18 rounds = 54 s > the 13 s
    left, so the last rung is shortened to 9 + 13 // 3 = 13 rounds and ends the search at
    39 s."""
    _Clock(monkeypatch)
    res = tune(ALG, fed, rounds=27, per_round=3, seed=0, trials=6, budget_seconds=40)
    assert res.cuts == ["3 of 6 configs dropped before the search to fit the budget "
                        "(1 s per round)",
                        "rung 2 shortened from 27 to 13 rounds to fit the budget"]
    assert res.rungs == [9, 27] and len(res.trials) == 6
    assert [r for r, _ in res.default.history] == [3, 9, 13]
    assert len(res.trials[0].history) == 3
    assert [len(t.history) for t in res.trials[1:3]] == [2, 2]
    assert [len(t.history) for t in res.trials[3:]] == [0, 0, 0]
    assert res.trials[1].params == {"inner_steps": 20}
    assert res.seconds == 39 and res.finalists[0] is res.default
    assert len(res.finalists) == 3 and res.finalists[1] is res.trials[2]  # declared
    assert res.rmse == min(v for t in res.finalists for _, v in t.history)


def test_a_budget_spent_within_a_rung_stops_it_and_says_what_was_cut(fed, monkeypatch):
    """The probe (3 s) fits a 7 s budget, nothing else does: the three anchors remain, the
    default continues to the 9-round rung (9 s) and the others are never run."""
    _Clock(monkeypatch)
    res = tune(ALG, fed, rounds=27, per_round=3, seed=0, trials=6, budget_seconds=7)
    assert res.budget_exhausted and res.best is res.default
    assert res.cuts == ["3 of 6 configs dropped before the search to fit the budget "
                        "(1 s per round)",
                        "rung 1 (9 rounds): 2 of 3 configs not run (budget spent)",
                        "rungs of 27 rounds not run"]
    assert [len(t.history) for t in res.trials] == [2, 0, 0, 0, 0, 0]
    assert res.finalists == [res.default]


def test_a_rung_cut_short_keeps_its_unrun_configs_at_their_last_rung(fed, monkeypatch):
    """Budget 200 s: the plan is estimated at 3 + (96 - 3) x 2 s, so nothing is dropped;
    rung 1 takes 18 s, then a load spike makes rounds cost 11 s: rung 2 runs the default
    and the declared anchor (66 s each) and one survivor of the others (66 s), and the
    budget is spent before the other survivor, which stays a finalist at its 3-round
    evaluation."""
    _Clock(monkeypatch, spike=11.0, after=18.0)
    res = tune(ALG, fed, rounds=27, per_round=3, seed=0, trials=6, budget_seconds=200)
    assert res.cuts == ["rung 2 (9 rounds): 1 of 4 configs not run (budget spent)",
                        "rungs of 27 rounds not run"]
    assert [r for r, _ in res.default.history] == [3, 9] and len(res.finalists) == 4
    declared = res.trials[2]
    assert res.finalists[1] is declared and [r for r, _ in declared.history] == [3, 9]
    others = [t for t in res.trials[1:] if t is not declared]
    survivors = sorted(others, key=lambda t: t.history[0][1])[:2]
    assert {id(t) for t in res.finalists[2:]} == {id(t) for t in survivors}
    assert sorted(len(t.history) for t in survivors) == [1, 2]
    assert res.rmse == min(v for t in res.finalists for _, v in t.history)


def test_a_budget_spent_before_a_rung_runs_none_of_it(fed, monkeypatch):
    """A spike from the start of rung 1's draws (15 s a round): rung 1 ends at 3 + 5 x 45 =
    228 s, past the 200 s budget, so no later rung starts and the choice is among the
    default, the declared anchor and the two best of the others at 3 rounds."""
    _Clock(monkeypatch, spike=15.0, after=3.0)
    res = tune(ALG, fed, rounds=27, per_round=3, seed=0, trials=6, budget_seconds=200)
    assert res.cuts == ["rungs of 9, 27 rounds not run (budget spent)"]
    assert all(len(t.history) == 1 for t in res.trials)
    assert len(res.finalists) == 4 and res.default in res.finalists
    assert res.trials[2] in res.finalists  # the declared anchor
    assert res.rounds == 3 and res.rmse == min(t.rmse for t in res.finalists)


def test_rungs_of():
    assert rungs_of(300, 3, 9) == [33, 100, 300]
    assert rungs_of(27, 3, 10) == [1, 3, 9, 27]
    assert rungs_of(50, 3, 1) == [50]


def test_a_spent_budget_keeps_the_default(fed):
    res = tune(ALG, fed, rounds=9, per_round=3, seed=0, trials=5, budget_seconds=0)
    assert res.budget_exhausted and res.best is res.default
    assert [len(t.history) for t in res.trials] == [2, 0, 0, 0, 0]
    assert res.cuts[0].startswith("2 of 5 configs dropped before the search to fit the "
                                  "budget (")
    assert res.cuts[1:] == ["rung 1 (3 rounds): 2 of 3 configs not run (budget spent)",
                            "rungs of 9 rounds not run"]


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


def _csv(tmp_path):
    """The module's small synthetic ratings, and the CSV file holding them."""
    r = generate_ratings(150, 90, 4000, rank=3, noise=0.3, seed=4)
    data = tmp_path / "r.csv"
    data.write_text("user,item,rating\n" + "".join(
        f"{u},{i},{v}\n" for u, i, v in zip(r.users, r.items, r.values, strict=True)))
    return r, data


def test_cli_prints_a_command_and_writes_a_config_simulate_takes(tmp_path, capsys):
    r, data = _csv(tmp_path)
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


def test_cli_config_carries_its_run_length_to_simulate(tmp_path, capsys):
    """`tune --json` writes the chosen rounds (a rung of --rounds 27 with eta 3) and the
    run; `simulate --config` with no run flags runs exactly that: the same test RMSE as
    the chosen config run for those rounds on the same split."""
    r, data = _csv(tmp_path)
    out = tmp_path / "tuned.json"
    assert main(["tune", "--data", str(data), "--clients", "6", "--per-round", "3",
                 "--rounds", "27", "--trials", "5", "--time-budget", "300",
                 "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    tuned = json.loads(out.read_text())
    assert tuned["rungs"] == [3, 9, 27] and tuned["max_rounds"] == 27
    assert tuned["rounds"] in tuned["rungs"] and tuned["cuts"] == []
    assert f"--rounds {tuned['rounds']} " in tuned["command"]
    finalists = [t for t in tuned["trials"] if t["finalist"]]
    assert tuned["validation_rmse"] == min(v for t in finalists for _, v in t["history"])
    assert tuned["cpu_seconds"] > 0 and "s CPU" in printed
    report = tmp_path / "run.json"
    assert main(["simulate", "--data", str(data), "--config", str(out), "--json",
                 str(report), "--quiet"]) == 0
    ran = json.loads(report.read_text())
    assert ran["rounds"] == len(ran["rounds_detail"]) == tuned["rounds"]
    fed = build_federation(r, 6, 0)
    want = simulate(ALG, ALG.config(**tuned["config"]), fed, rounds=tuned["rounds"],
                    per_round=3, seed=0, evaluate_every=tuned["rounds"]).final.test_rmse
    assert ran["final"]["test_rmse"] == pytest.approx(want, abs=1e-12)
    # a run flag on the command line still wins over the file's
    assert main(["simulate", "--data", str(data), "--config", str(out), "--rounds", "2",
                 "--json", str(report), "--quiet"]) == 0
    assert len(json.loads(report.read_text())["rounds_detail"]) == 2


def test_simulate_refuses_a_bad_run_length_in_a_config_file(tmp_path, capsys):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"algorithm": "fedmc-admm", "config": {}, "rounds": 0}))
    assert main(["simulate", "--data", "synthetic", "--config", str(path)]) == 2
    assert "rounds must be a whole number >= 1, not 0" in capsys.readouterr().err


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


def test_cli_tunes_by_validation_ndcg(tmp_path, capsys):
    """`tune --metric ndcg` chooses the config and run length with the highest validation
    NDCG@10 among the finalists, and says so; every figure is an NDCG in [0, 1]."""
    _, data = _csv(tmp_path)
    out = tmp_path / "tuned.json"
    assert main(["tune", "--data", str(data), "--clients", "6", "--per-round", "3",
                 "--rounds", "9", "--trials", "4", "--metric", "ndcg", "--json", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    tuned = json.loads(out.read_text())
    assert tuned["metric"] == "ndcg" and "validation_rmse" not in tuned
    assert "best: validation NDCG@10" in printed
    finalists = [t for t in tuned["trials"] if t["finalist"]]
    values = [v for t in tuned["trials"] for _, v in t["history"]]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert tuned["validation_ndcg"] == max(v for t in finalists for _, v in t["history"])
    assert tuned["validation_ndcg"] >= tuned["default_validation_ndcg"]


def test_tune_by_ndcg_scores_the_carve_out_lists(fed):
    """The loss a search by NDCG minimises is 1 - NDCG@10 of algorithms.ranking on the
    validation carve-out, computed on the trained model."""
    from algorithms.ranking import ranking_report

    alg = registry.get("fedmc-admm")
    res = tune(alg, fed, rounds=3, per_round=2, trials=1, metric="ndcg")
    val = tuning.validation_federation(fed, 0)
    sim = simulate(alg, alg.config(), val, rounds=res.rounds, per_round=2, seed=0,
                   evaluate_every=res.rounds)
    want = ranking_report(alg, sim.global_msg, sim.local_states, val.train, val.test,
                          val.scale, k=10).ndcg_at_k
    assert res.metric == "ndcg" and res.value == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="metric must be one of"):
        tune(alg, fed, rounds=3, per_round=2, trials=1, metric="mae")
