"""The DP choice of a served hyper-parameter (privacy.selection): charged before use,
refused over budget, per-user sensitivity, accounting against dp-accounting, fresh noise,
and that it picks the popularity prior's weight the data call for (algorithms.ials)."""

from __future__ import annotations

import json

import dp_accounting as dpa
import numpy as np
import pytest

import privacy.selection as S
from algorithms import ials as I
from algorithms import registry
from algorithms.block import RatingBlock
from algorithms.simulate import simulate
from privacy.accountant import ORDERS, spend
from privacy.ledger import Budget, BudgetExceeded, Ledger, check_schedule
from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

GRID = (0.0, 0.1, 1.0, 10.0)


def spec(**kw) -> UserLevelSpec:
    args = dict(epsilon=8.0, delta=1e-6, n_users=6000, releases=2, selection_share=0.05)
    args.update(kw)
    return UserLevelSpec(**args)


def open_ledger(sp: UserLevelSpec, tenants=(0, 1, 2), poor=()) -> Ledger:
    """Each tenant with the spec's budget, those in ``poor`` with too little for any
    release."""
    return Ledger.open({t: Budget(0.01 if t in poor else sp.epsilon, sp.delta)
                        for t in tenants})


def scores_of(n_tenants: int = 3, k: int = 4, users: int = 50) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t: rng.uniform(0, users / 2, k) for t in range(n_tenants)}


def test_selection_share_is_its_share_of_the_budget_and_the_plan_meets_it():
    sp = spec()
    events = sp.planned_events()
    assert len(events) == 3 and sp.schedule() == events[:2]
    assert sp.selection_event() == events[-1]
    # at q = 1 RDP is 1 / (2 z^2) per order: the selection's share of the sum is exactly s
    inv = [1 / e.noise_multiplier ** 2 for e in events]
    assert inv[-1] / sum(inv) == pytest.approx(0.05)
    assert spend(events, sp.delta).epsilon == pytest.approx(8.0, rel=1e-5)
    assert spec(selection_share=0.0).selection_event() is None
    with pytest.raises(ValueError, match="sample_rate 1"):
        spec(sample_rate=0.5)


@pytest.mark.parametrize(("epsilon", "share"), [(1.0, 0.05), (8.0, 0.2)])
def test_job_total_with_the_selection_matches_dp_accounting(epsilon, share):
    sp = spec(epsilon=epsilon, selection_share=share)
    rdp = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)
    for ev in sp.planned_events():
        rdp.compose(dpa.GaussianDpEvent(ev.noise_multiplier))
        pld.compose(dpa.GaussianDpEvent(ev.noise_multiplier))
    assert rdp.get_epsilon(sp.delta) == pytest.approx(epsilon, rel=1e-5)
    assert pld.get_epsilon(sp.delta) <= epsilon
    # what the ledger holds after a whole run: the sweeps and the selection, at the target
    ledger = open_ledger(sp, [0])
    for r, ev in enumerate(sp.planned_events()):
        ledger.charge(0, ev, r + 1)
    assert spend(ledger.history(0), sp.delta).epsilon == pytest.approx(
        rdp.get_epsilon(sp.delta), rel=1e-6)


def test_the_budget_check_plans_the_selection():
    sp = spec()
    tight = Ledger.open({0: Budget(8.0, sp.delta)})
    for r, ev in enumerate(sp.schedule()):  # spent by an earlier job: the sweeps' events
        tight.charge(0, ev, r + 1)
    check_schedule(Ledger.open({0: Budget(8.0, sp.delta)}), [0], sp.planned_events())
    with pytest.raises(BudgetExceeded):
        check_schedule(tight, [0], sp.planned_events())


@pytest.mark.parametrize("placement", ["central", "tenant", "secure"])
def test_charged_before_use_and_refused_over_budget(placement, monkeypatch):
    sp = (spec(placement="tenant", secure_aggregation=True) if placement == "secure" else
          spec(placement=placement))
    ledger = open_ledger(sp, poor=(2,))
    charges_seen = []
    real = S.gaussian_release if placement != "secure" else S.secagg.discrete_gaussian

    def watched(*args, **kw):  # noise is drawn only after the accounts were checked
        charges_seen.append({t: len(ledger.history(t)) for t in (0, 1)})
        return real(*args, **kw)

    monkeypatch.setattr(S, "gaussian_release", watched)
    monkeypatch.setattr(S.secagg, "discrete_gaussian", watched)
    users = dict.fromkeys(range(3), 50)
    chosen, record = S.select(sp, GRID, scores_of(), users, ledger, 4, 0.03, seed=1)
    assert chosen in GRID and record["tenants_charged"] == 2
    assert set(record["refused"]) == {"2"} and "budget" in record["refused"]["2"]
    assert [ev for ev in ledger.history(0) if ev == sp.selection_event()]
    assert ledger.rounds(0) == [4] and ledger.rounds(2) == []
    if placement == "secure":  # each tenant is charged before its own input is noised
        assert charges_seen[0] == {0: 1, 1: 1}
    elif placement == "central":
        assert charges_seen == [{0: 0, 1: 0}]  # noised inside charged_release, then charged
    else:  # each tenant's own release, in turn: checked, noised, charged
        assert charges_seen == [{0: 0, 1: 0}, {0: 1, 1: 0}]
    # tenant placement sums the charged tenants' own noise (2 here)
    want = sp.selection_event().noise_multiplier * S.sensitivity(len(GRID))
    assert record["noise_std"] == pytest.approx(want * (2 ** 0.5 if placement == "tenant"
                                                         else 1.0))
    # nobody can pay: nothing released, the default kept
    broke = open_ledger(sp, poor=(0, 1, 2))
    chosen, record = S.select(sp, GRID, scores_of(), users, broke, 4, 0.03, seed=1)
    assert chosen == 0.03 and record["noisy_ndcg_sums"] is None


def test_scores_beyond_the_users_bound_are_refused():
    sp = spec()
    with pytest.raises(ValueError, match="per-user"):
        S.select(sp, GRID, {0: np.array([0.0, 1.0, 2.0, 51.0])}, {0: 50}, open_ledger(sp),
                 4, 0.03)


def test_fresh_noise_not_seeded(monkeypatch):
    sp = spec(epsilon=1.0)
    calls = []
    real = S.fresh_noise_generator
    monkeypatch.setattr(S, "fresh_noise_generator", lambda: calls.append(1) or real())
    scores = scores_of()
    users = dict.fromkeys(range(3), 50)
    first = S.release_central(sp, scores, users, open_ledger(sp), 4)[0]
    second = S.release_central(sp, scores, users, open_ledger(sp), 4)[0]
    assert len(calls) == 2 and not np.allclose(first, second)
    total = np.sum(list(scores.values()), axis=0)
    sigma = sp.selection_event().noise_multiplier * 2.0  # sqrt(K = 4)
    assert np.all(np.abs(first - total) < 8 * sigma)
    one = S.release_secure(sp, scores, users, open_ledger(sp), 4, seed=7)[0]
    two = S.release_secure(sp, scores, users, open_ledger(sp), 4, seed=7)[0]
    assert not np.allclose(one, two) and np.all(np.abs(one - total) < 8 * sigma * 1.1)


# -- the popularity prior's weight of dp-ials ------------------------------------------

def blocks(kind: str, seed: int = 0):
    """(fit, carve-out) ratings of 300 users over 60 items in one tenant. "popular": every
    user rates items by a shared popularity law only (popularity is the best list);
    "taste": two groups of users each rate only their own half of the catalogue, with
    flat popularity inside it (a factor model's data, popularity no help)."""
    rng = np.random.default_rng(seed)
    n_users, n_items = 300, 60
    rows, cols = [], []
    pop = 1.0 / np.arange(1, n_items + 1) ** 1.2
    for u in range(n_users):
        if kind == "popular":
            p = pop / pop.sum()
        else:
            p = np.zeros(n_items)
            half = slice(0, 30) if u % 2 else slice(30, 60)
            p[half] = 1.0
            # the other half's items are the popular ones, globally
            p = p / p.sum()
        items = rng.choice(n_items, 12, replace=False, p=p)
        rows += [u] * 12
        cols += list(items)
    rows, cols = np.array(rows), np.array(cols)
    vals = np.full(rows.size, 5.0)
    held = np.zeros(rows.size, dtype=bool)
    held[2::4] = True
    mk = lambda m: RatingBlock(rows[m], cols[m], vals[m], n_users, n_items, (1.0, 5.0))  # noqa: E731
    return mk(~held), mk(held)


def chosen_beta(kind: str, epsilon: float = 8.0) -> float:
    from algorithms.data import Federation

    fit, valid = blocks(kind)
    fed = Federation([fit], [valid], [np.arange(fit.n_users)], np.arange(fit.n_items),
                     (1.0, 5.0))
    cfg = registry.get("dp-ials").config(rank=4, max_ratings_per_user=12,
                                         selection_share=0.2)
    sp = UserLevelSpec(epsilon=epsilon, delta=1e-4, n_users=fit.n_users,
                       releases=cfg.sweeps, selection_share=cfg.selection_share)
    priv = UserLevelPrivatizer(sp, registry.user_bounds("dp-ials", cfg), 1, 0)
    res = simulate(registry.get("dp-ials"), cfg, fed, rounds=cfg.sweeps + 1, per_round=1,
                   seed=0, privatizer=priv, aggregator=priv.aggregate, evaluate_every=0)
    scores = {0: I.prior_scores(res.global_msg, res.local_states[0], fit, valid, (1.0, 5.0),
                                GRID)}
    beta, record = S.select(sp, GRID, scores, {0: fit.n_users}, priv.ledger,
                            cfg.sweeps + 2, cfg.popularity_prior)
    assert spend(priv.ledger.history(0), sp.delta).epsilon <= epsilon * (1 + 1e-6)
    return beta, scores[0]


def without_user(block: RatingBlock, u: int) -> RatingBlock:
    """``block`` with user u's row removed (the rows above it move down by one)."""
    m = block.rows != u
    rows = block.rows[m] - (block.rows[m] > u)
    return RatingBlock(rows, block.cols[m], block.vals[m], block.n_users - 1, block.n_items,
                       block.scale)


def test_sensitivity_one_user_moves_each_candidate_sum_by_at_most_one():
    """The selection is composed adaptively after the model's releases: its sensitivity is
    taken given the released global model, so the model stays fixed here. Given it, every
    other user's factors are that user's own solve against it (no other user's ratings
    enter them), so removing user u takes u's row out and leaves the other rows as they
    are; each candidate's sum then moves by u's own score, at most 1."""
    fit, valid = blocks("popular")
    cfg = registry.get("ials").config(rank=4, sweeps=2)
    from algorithms.data import Federation

    fed = Federation([fit], [valid], [np.arange(fit.n_users)], np.arange(fit.n_items),
                     (1.0, 5.0))
    res = simulate(registry.get("ials"), cfg, fed, rounds=3, per_round=1, seed=0,
                   evaluate_every=0)
    glob, state = res.global_msg, res.local_states[0]
    full = I.prior_scores(glob, state, fit, valid, (1.0, 5.0), GRID)
    assert np.all(full > 0)
    for u in range(0, fit.n_users, 7):  # remove user u: its own row of the tenant's users
        keep = np.flatnonzero(np.arange(fit.n_users) != u)
        fu, vu = without_user(fit, u), without_user(valid, u)
        without = I.prior_scores(glob, state.replace(U=state.U[keep]), fu, vu, (1.0, 5.0),
                                 GRID)
        assert np.all(np.abs(full - without) <= 1.0 + 1e-12)
        assert np.linalg.norm(full - without) <= S.sensitivity(len(GRID)) + 1e-12


def test_picks_a_large_beta_where_popularity_is_best_and_a_small_one_on_taste_data():
    beta, exact = chosen_beta("popular")
    assert beta >= 1.0, exact
    beta, exact = chosen_beta("taste")
    assert beta <= 0.1, exact


def test_simulate_select_prior_charges_the_selection_within_the_target(tmp_path, capsys,
                                                                      monkeypatch):
    from algorithms.synthetic import generate_ratings
    from app.cli import main

    r = generate_ratings(120, 60, 2400, rank=3, seed=4)
    data = tmp_path / "r.csv"
    data.write_text("user,item,rating\n" + "\n".join(
        f"{u},{i},{v:g}" for u, i, v in zip(r.users, r.items, r.values, strict=True)) + "\n")
    out = tmp_path / "run.json"
    args = ["simulate", "--data", str(data), "--algorithm", "dp-ials", "--clients", "4",
            "--rank", "4", "--quiet", "--privacy", "user", "--epsilon", "4",
            "--delta", "1e-4"]
    from algorithms import simulate as engine

    seen: list[tuple[int, float]] = []
    real_evaluate = engine.evaluate

    def spy(alg, glob, states, blocks, scale=None):
        rmse, mae = real_evaluate(alg, glob, states, blocks, scale)
        seen.append((sum(b.nnz for b in blocks), rmse))
        return rmse, mae

    monkeypatch.setattr(engine, "evaluate", spy)
    assert main([*args, "--select-prior", "0.2", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    # the reported final error is the chosen model's on the test split (20% of the
    # ratings), not the carve-out's the rounds were scored on
    assert run["final"]["test_rmse"] == seen[-1][1]
    assert seen[-1][0] == pytest.approx(0.2 * r.values.size, abs=2)
    privacy = run["privacy"]
    sel = privacy["selection"]
    assert sel["chosen"] in I.DP_PRIOR_GRID and sel["tenants_charged"] == 4
    assert len(sel["noisy_ndcg_sums"]) == len(I.DP_PRIOR_GRID)
    assert privacy["epsilon_max"] == pytest.approx(4.0, rel=1e-5)  # sweeps + selection
    assert privacy["epsilon_max"] <= 4.0 * (1 + 1e-9)
    capsys.readouterr()
    assert main(["simulate", "--data", str(data), "--algorithm", "dp-ials", "--clients", "4",
                 "--rank", "4", "--quiet", "--select-prior", "0.2"]) != 0
    assert "--select-prior applies to dp-ials" in capsys.readouterr().err
