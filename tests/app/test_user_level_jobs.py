"""User-level DP jobs through the API (SQLite, in-process pipeline).

Expected numbers come from independent computations: the simulator driving the same pure
privatizer on the job's own data, split and seed (the same releases and charges; the
noise is fresh and secret in both, so the numbers differ), and Google's dp-accounting for
epsilon.
"""

from __future__ import annotations

import dp_accounting
import pytest
import sqlalchemy as sa

from algorithms import registry
from algorithms.simulate import simulate
from app.training.models import LedgerEntry, TrainingJob
from privacy import user_level
from privacy.accountant import ORDERS, Event
from tests.training_helpers import federation_of, make_tenants, wait_job

CONFIG = {"rank": 3, "sweeps": 2}
ROUNDS = 3  # two releases, then a round that only refreshes the users




def submit(client, placement="central", epsilon=4.0, delta=1e-3, **overrides):
    body = {"algorithm": "dpals", "config": CONFIG, "rounds": ROUNDS, "seed": 5,
            "privacy": {"unit": "user", "placement": placement, "target_epsilon": epsilon,
                        "delta": delta}, **overrides}
    return client.post("/v1/admin/jobs", json=body)


def dp_accounting_epsilon(events: list[Event], delta: float) -> float:
    """The second accountant: dp-accounting's RDP on the same orders."""
    acc = dp_accounting.rdp.RdpAccountant(list(ORDERS))
    for ev in events:
        acc.compose(dp_accounting.GaussianDpEvent(ev.noise_multiplier))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("placement", ["central", "tenant"])
def test_user_level_job_equals_the_simulator_and_charges_each_release_once(env, placement):
    app, client = env
    tenants = make_tenants(client, n=3, allow_non_private=False)
    r = submit(client, placement)
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "completed", job
    assert job["dp"]["unit"] == "user" and job["dp"]["placement"] == placement

    # the same pure privatizer, driven by the simulator on the job's data, split and seed:
    # the same releases, but other noise (issue 29: the seed reproduces no privacy draw)
    fed, _ = federation_of(app, job["id"])
    alg = registry.get("dpals")
    cfg = alg.config(**CONFIG)
    spec = user_level.from_settings(job["dp"])
    assert (spec.releases, spec.n_users) == (2, sum(b.n_users for b in fed.train))
    priv = user_level.UserLevelPrivatizer(spec, registry.user_bounds("dpals", cfg),
                                          len(fed.train), seed=5)
    sim = simulate(alg, cfg, fed, rounds=ROUNDS, per_round=len(fed.train), seed=5,
                   privatizer=priv,
                   aggregator=priv.aggregate)
    report = client.get(f"/v1/admin/jobs/{job['id']}/report").json()
    curve = [c["test_rmse"] for c in report["curve"]]
    assert len(curve) == len(sim.history) and curve != [h.test_rmse for h in sim.history]

    # every tenant charged once per release, with the planned event of that release
    with app.state.sessions() as s:
        rows = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round,
                                   LedgerEntry.event)).all()
    planned = spec.schedule()
    assert sorted((t, k) for t, k, _ in rows) == sorted(
        (t, k) for t, _ in tenants for k in (1, 2))
    for _, k, e in rows:
        assert Event.from_list(e["event"]) == planned[k - 1]

    privacy = report["privacy"]
    assert (privacy["unit"], privacy["placement"], privacy["delta"]) == ("user", placement,
                                                                          1e-3)
    assert "curious coordinator" in privacy["adversary"] if placement == "tenant" else \
        "other tenants" in privacy["adversary"]
    assert len(privacy["releases"]) == 6
    expected = dp_accounting_epsilon(planned, 1e-3)
    for tid, _ in tenants:
        assert privacy["epsilon_per_tenant"][str(tid)] == pytest.approx(expected, rel=1e-9)
    assert expected <= 4.0 + 1e-9  # the noise was solved for the target
    assert f"epsilon {expected:.4g} at delta 0.001 for every user" in privacy["guarantee"]

    # attack (b) on the service: a second job, same seed and data, releases other noise
    again = wait_job(client, submit(client, placement).json()["id"])
    assert again["status"] == "completed", again
    other = client.get(f"/v1/admin/jobs/{again['id']}/report").json()
    assert [c["test_rmse"] for c in other["curve"]] != curve
    assert "key" not in str(again).lower().replace("idempotency_key", "")


def test_a_user_level_job_serves_recommendations_from_the_private_model(env):
    """(lists "model": the private model serves whatever it scores against popularity)"""
    _, client = env
    (tid, key), _ = make_tenants(client, n=2, allow_non_private=False)
    job = wait_job(client, submit(client, lists="model").json()["id"])
    assert job["status"] == "completed", job
    recs = client.get(f"/v1/tenants/{tid}/users/u0/recommendations?k=5",
                      headers={"Authorization": f"Bearer {key}"}).json()
    assert recs["source"] == "model" and recs["job_id"] == job["id"], recs
    assert len(recs["data"]) == 5


def test_central_placement_stages_bounded_sums_and_charges_only_at_aggregation(
        env, monkeypatch):
    """The client step stores the tenant's bounded (un-noised) sum and charges nothing;
    the charge is made in the aggregation step's transaction, which noises the sum."""
    from app.training import pipeline
    from app.training.models import RoundUpload

    app, client = env
    make_tenants(client, n=2, allow_non_private=False)
    seen: list[tuple[int, int]] = []
    original = pipeline.TASKS[pipeline.TASK_AGGREGATE]

    def spy(sessions, dispatch, job_id, round_):
        with sessions() as s:
            staged = s.scalar(sa.select(sa.func.count()).select_from(RoundUpload))
            charged = s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry))
            seen.append((staged, charged))
        original(sessions, dispatch, job_id, round_)

    monkeypatch.setitem(pipeline.TASKS, pipeline.TASK_AGGREGATE, spy)
    job = wait_job(client, submit(client).json()["id"])
    assert job["status"] == "completed"
    # round 1: two bounded sums staged, nothing charged yet; round 2: two more charges later
    assert seen[0] == (2, 0) and seen[1] == (2, 2), seen


@pytest.mark.parametrize("body, status, message", [
    ({"algorithm": "fedmc-admm", "config": {}}, 422,
     "invalid privacy.unit: fedmc-admm cannot protect a user"),
    ({"privacy": {"unit": "user", "target_epsilon": 4.0, "delta": 0.5}}, 422,
     "invalid privacy.delta: delta must be below 1 / number of users"),
    ({"dp": {"mechanism": "none"}}, 422, "give either privacy (user-level DP) or dp"),
])
def test_bad_user_level_requests_are_refused_naming_the_field(env, body, status, message):
    app, client = env
    make_tenants(client, n=2, allow_non_private=False)
    r = submit(client, **body)
    assert r.status_code == status, r.text
    assert r.json()["detail"].startswith(message), r.json()
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TrainingJob)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)) == 0


def test_a_user_level_job_over_budget_is_409_and_charges_nothing(env):
    app, client = env
    (tid, _), _ = make_tenants(client, n=2, budget=1.0, allow_non_private=False)
    r = submit(client, epsilon=8.0)
    assert r.status_code == 409, r.text
    assert r.json()["detail"].startswith(f"privacy budget exceeded: tenant {tid} would spend")
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TrainingJob)) == 0


@pytest.mark.parametrize("privacy", ["user", "tenant"])
def test_a_dry_run_projects_each_tenants_spend_and_creates_nothing(env, privacy):
    app, client = env
    tenants = make_tenants(client, n=2, budget=50.0, allow_non_private=False)
    if privacy == "user":
        r = client.post("/v1/admin/jobs?dry_run=true", json={
            "algorithm": "dpals", "config": CONFIG, "rounds": ROUNDS, "seed": 5,
            "privacy": {"unit": "user", "target_epsilon": 4.0, "delta": 1e-3}})
    else:
        r = client.post("/v1/admin/jobs?dry_run=true", json={
            "algorithm": "fedmc-admm", "config": {"rank": 3}, "rounds": 4, "seed": 5,
            "dp": {"mechanism": "gaussian", "noise_multiplier": 2.0}})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["dry_run"] is True
    if privacy == "user":  # the same noise a real job solves, projected at the budget delta
        spec = user_level.from_settings(plan["privacy"])
        expected = dp_accounting_epsilon(spec.schedule(), 1e-5)
    else:  # 4 rounds, both tenants every round
        expected = dp_accounting_epsilon([Event("gaussian", 2.0)] * 4, 1e-5)
    for tid, _ in tenants:
        t = plan["tenants"][str(tid)]
        assert t["epsilon_spent"] == 0.0 and t["epsilon_max"] == 50.0
        assert t["epsilon_after"] == pytest.approx(expected, rel=1e-9)
    with app.state.sessions() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TrainingJob)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)) == 0
    over = client.post("/v1/admin/jobs?dry_run=true", json={
        "algorithm": "dpals", "config": CONFIG, "rounds": ROUNDS,
        "privacy": {"unit": "user", "target_epsilon": 80.0, "delta": 1e-3}})
    assert over.status_code == 409  # a dry run refuses what the job would be refused


def test_a_job_that_names_no_privacy_protects_users_at_epsilon_8(env):
    """The default is the useful unit: users at epsilon 8, delta 1e-6 (the default job's
    two models at 4 each; DPALS alone at 8); an algorithm that cannot bound a user falls
    back to the tenant unit's default noise."""
    _, client = env
    make_tenants(client, n=2, allow_non_private=False)
    r = client.post("/v1/admin/jobs", json={"algorithm": "dpals", "config": CONFIG,
                                             "rounds": ROUNDS})
    assert r.status_code == 202, r.text
    dp = r.json()["dp"]
    assert (r.json()["algorithm"], dp["unit"], dp["placement"], dp["epsilon"], dp["delta"]) \
        == ("dpals", "user", "central", 8.0, 1e-6)
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "completed", job
    pair = client.post("/v1/admin/jobs", json={"rounds": ROUNDS})
    assert pair.status_code == 202, pair.text
    first = wait_job(client, pair.json()["id"])
    second = wait_job(client, first["pair_job_id"])
    for one, name in ((first, "dp-ials"), (second, "dpals")):
        dp = one["dp"]
        assert (one["algorithm"], dp["unit"], dp["placement"], dp["epsilon"], dp["delta"]) \
            == (name, "user", "central", 4.0, 1e-6)
    other = client.post("/v1/admin/jobs", json={"algorithm": "fedmc-admm", "config": {"rank": 2},
                                             "rounds": 1})
    assert other.status_code == 202, other.text
    assert (other.json()["dp"]["mechanism"], other.json()["dp"]["unit"]) == ("gaussian", "tenant")


def test_the_lifetime_budget_says_which_unit_it_covers(env):
    """Once a user-level release is charged, a tenant's lifetime spend is a bound for its
    users, not for its whole block: the report says so; a tenant-unit-only tenant says
    "tenant"."""
    _, client = env
    (a, _), (b, _) = make_tenants(client, n=2, allow_non_private=False)
    dp_job = client.post("/v1/admin/jobs", json={
        "algorithm": "fedmc-admm", "config": {"rank": 2}, "rounds": 1, "tenant_ids": [a, b],
        "dp": {"mechanism": "gaussian", "noise_multiplier": 5.0}}).json()
    assert wait_job(client, dp_job["id"])["status"] == "completed"
    lifetime = client.get(f"/v1/admin/jobs/{dp_job['id']}/report").json()["privacy"]["lifetime"]
    assert lifetime[str(a)]["unit"] == lifetime[str(b)]["unit"] == "tenant"
    user_job = submit(client, tenant_ids=[a])
    assert wait_job(client, user_job.json()["id"])["status"] == "completed"
    lifetime = client.get(f"/v1/admin/jobs/{dp_job['id']}/report").json()["privacy"]["lifetime"]
    assert (lifetime[str(a)]["unit"], lifetime[str(b)]["unit"]) == ("user", "tenant")


def test_a_user_level_job_takes_the_tenants_declared_scale_as_its_public_scale(env):
    """DPALS's centre and rating clip (and so the per-user sensitivity) come from the
    tenants' declared scale, not from the 1-5 default: on a 0-10 scale nothing is clipped
    away. A scale given in the config is kept."""
    _, client = env
    make_tenants(client, n=2, allow_non_private=False, rating_min=0.0, rating_max=10.0)
    job = wait_job(client, submit(client).json()["id"])
    assert job["status"] == "completed", job
    assert (job["config"]["scale_min"], job["config"]["scale_max"]) == (0.0, 10.0)
    given = submit(client, config={**CONFIG, "scale_min": 1.0, "scale_max": 5.0}).json()
    assert (given["config"]["scale_min"], given["config"]["scale_max"]) == (1.0, 5.0)
    assert wait_job(client, given["id"])["status"] == "completed"


@pytest.mark.parametrize("name", ["dp-fedmavg", "dp-fedmc-admm"])
def test_gradient_methods_run_as_user_level_jobs_like_the_simulator(env, name):
    """The service accepts the user-level gradient methods with privacy unit user: the job
    plans their releases (not the rounds), matches the simulator driving the same pure
    privatizer, and charges every tenant the planned event of each release once."""
    app, client = env
    tenants = make_tenants(client, n=3, allow_non_private=False)
    config = {"rank": 2, "releases": 2}
    r = submit(client, algorithm=name, config=config)
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "completed", job
    fed, _ = federation_of(app, job["id"])
    alg = registry.get(name)
    cfg = alg.config(**{**config, **{k: job["config"][k] for k in ("scale_min", "scale_max")}})
    spec = user_level.from_settings(job["dp"])
    assert (spec.releases, spec.release_growth) == (2, 1.0)
    priv = user_level.UserLevelPrivatizer(spec, registry.user_bounds(name, cfg),
                                          len(fed.train), seed=5)
    sim = simulate(alg, cfg, fed, rounds=ROUNDS, per_round=len(fed.train), seed=5,
                   privatizer=priv, aggregator=priv.aggregate)
    report = client.get(f"/v1/admin/jobs/{job['id']}/report").json()
    curve = [c["test_rmse"] for c in report["curve"]]  # fresh noise: not the simulator's
    assert len(curve) == len(sim.history) and curve != [h.test_rmse for h in sim.history]
    assert priv.releases and all(r["noise_multiplier"] > 0 for r in priv.releases)
    with app.state.sessions() as s:
        rows = s.execute(sa.select(LedgerEntry.tenant_id, LedgerEntry.round)).all()
    assert sorted(rows) == sorted((t, k) for t, _ in tenants for k in (1, 2))
    assert report["privacy"]["epsilon_max"] == pytest.approx(
        dp_accounting_epsilon(spec.schedule(), 1e-3), rel=1e-9)


def test_a_spend_is_shown_at_the_requested_delta_beside_the_budgets(env):
    """Issue 31: a job asked for epsilon 4 at delta 1e-3 was listed by `tenants show` as
    its charge at the budget's delta (1e-5) alone, a different number; now both are shown,
    with the budget they reconcile with, and the sentence saying why they differ."""
    _, client = env
    (tid, _), _ = make_tenants(client, n=2, allow_non_private=False)
    job = wait_job(client, submit(client).json()["id"])
    assert job["status"] == "completed", job
    privacy = client.get(f"/v1/admin/tenants/{tid}").json()["privacy"]
    (spend,) = privacy["jobs"]
    planned = user_level.from_settings(job["dp"]).schedule()
    assert (spend["requested_epsilon"], spend["requested_delta"]) == (4.0, 1e-3)
    assert spend["epsilon_at_requested_delta"] == pytest.approx(
        dp_accounting_epsilon(planned, 1e-3), rel=1e-9)
    assert spend["budget_delta"] == privacy["delta"] == 1e-5
    assert spend["epsilon"] == pytest.approx(dp_accounting_epsilon(planned, 1e-5), rel=1e-9)
    assert spend["epsilon"] > spend["epsilon_at_requested_delta"]  # a smaller delta
    assert privacy["epsilon_spent"] == spend["epsilon"]
    assert privacy["epsilon_remaining"] == pytest.approx(privacy["epsilon_max"]
                                                         - spend["epsilon"])
    assert "smaller epsilon at a larger delta" in privacy["note"]
    report = client.get(f"/v1/admin/jobs/{job['id']}/report").json()["privacy"]
    this_job = report["lifetime"][str(tid)]["this_job"]
    assert this_job == {k: v for k, v in spend.items() if k != "job_id"}
    assert report["note"] == privacy["note"]


def test_rounds_a_release_bounded_algorithm_would_not_use_are_refused(env):
    """DPALS stops uploading after its sweeps (and one refresh round): ``rounds`` 10 with 2
    sweeps ran 7 silent rounds; now 422 naming rounds, and an omitted ``rounds`` is 3."""
    app, client = env
    make_tenants(client, n=2, allow_non_private=False)
    r = submit(client, rounds=10)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(
        "invalid rounds: 10 is more than dpals uses: its 2 sweeps (config.sweeps) upload in "
        "rounds 1-2 and round 3 re-solves the users"), r.json()
    body = {"algorithm": "dpals", "config": CONFIG, "seed": 5,
            "privacy": {"unit": "user", "target_epsilon": 4.0, "delta": 1e-3}}
    r = client.post("/v1/admin/jobs", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["rounds"] == ROUNDS
