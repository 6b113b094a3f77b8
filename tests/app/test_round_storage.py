"""How a job's states are stored between tasks (app.training.states): per-client server
parts rewritten only when changed, local states versioned and committed by pointer, and
blobs a worker holds never fetched again (their digests are read instead)."""

from __future__ import annotations

import json

import numpy as np
import sqlalchemy as sa

from algorithms import Message, registry
from algorithms.simulate import simulate
from app.db import downgrade, migrate
from app.training import pipeline, states
from app.training.jobs import JobSpec, create_job
from app.training.models import (
    JobClient,
    JobLocalState,
    JobRound,
    JobServerPart,
    RoundUpload,
    TrainingJob,
)
from tests.training_helpers import CONFIG, federation_of, make_tenants

BLOBS = ("job_local_states.state", "job_server_parts.part", "job_clients.train_block",
         "job_clients.test_block", "training_jobs.global_msg")


def _job(app, client, n=4, rounds=3, per_round=2):
    make_tenants(client, n=n)
    with app.state.sessions() as s:
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        return create_job(s, JobSpec("fedmc-admm", tids, rounds, per_round, 5, CONFIG,
                                     {"mechanism": "none"},
                           validation_fraction=0)).id


def _round(app, job_id: int, round_: int) -> list[str]:
    """Run round ``round_`` task by task; returns the SELECT statements it sent."""
    seen: list[str] = []
    engine = app.state.sessions.kw["bind"]

    def record(conn, cursor, statement, *args):
        seen.append(statement.lower())

    dispatch = pipeline.InlineDispatcher(app.state.sessions)
    dispatch.send(pipeline.TASK_START, job_id, round_)
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        while dispatch._queue:
            task, args = dispatch._queue.popleft()
            if task == pipeline.TASK_START and args[1] != round_:
                break  # the next round: not this one
            pipeline.TASKS[task](app.state.sessions, dispatch, *args)
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return [q for q in seen if q.lstrip().startswith("select")]


def _parts(s, job_id: int) -> dict[int, str]:
    return dict(s.execute(sa.select(JobServerPart.client_index, JobServerPart.digest)
                          .where(JobServerPart.job_id == job_id)).all())


def test_a_round_rewrites_the_parts_of_the_tenants_that_uploaded_and_no_other(env):
    app, client = env
    job_id = _job(app, client, n=4, rounds=3, per_round=2)
    for k in (1, 2, 3):
        with app.state.sessions() as s:
            before = _parts(s, job_id)
        _round(app, job_id, k)
        with app.state.sessions() as s:
            after = _parts(s, job_id)
            sampled = s.get(JobRound, (job_id, k)).participants
        assert len(after) == 4
        assert {i for i in after if after[i] != before[i]} == set(sampled)
    fed, job = federation_of(app, job_id)
    alg = registry.get("fedmc-admm")
    sim = simulate(alg, alg.config(**CONFIG), fed, rounds=3, per_round=2, seed=5)
    states.clear_caches()  # rebuilt from the rows alone
    with app.state.sessions() as s:
        stored = states.load_server(s, s.get(TrainingJob, job_id))
        assert stored.to_bytes() == sim.server_state.to_bytes()
        shared = Message.from_bytes(s.get(TrainingJob, job_id).server_state)
        assert shared.C.shape[0] == 0  # the job row holds no client's part
        locals_ = states.committed_states(s, job_id)
    assert locals_ == [m.to_bytes() for m in sim.local_states]


def test_a_committed_round_keeps_one_version_per_tenant_and_a_round_in_flight_two(env):
    app, client = env
    job_id = _job(app, client, n=4, rounds=2, per_round=2)
    _round(app, job_id, 1)
    dispatch = pipeline.InlineDispatcher(app.state.sessions)
    pipeline.TASKS[pipeline.TASK_START](app.state.sessions, dispatch, job_id, 2)
    clients = [args for task, args in dispatch._queue if task == pipeline.TASK_CLIENT]
    for args in clients:
        pipeline.TASKS[pipeline.TASK_CLIENT](app.state.sessions, dispatch, *args)
    with app.state.sessions() as s:
        versions = s.execute(sa.select(JobLocalState.client_index, JobLocalState.round)
                             .where(JobLocalState.job_id == job_id)).all()
        committed = dict(s.execute(sa.select(JobClient.client_index, JobClient.state_round)
                                   .where(JobClient.job_id == job_id)).all())
    staged = {args[2] for args in clients}
    assert sorted(versions) == sorted([(i, committed[i]) for i in range(4)]
                                      + [(i, 2) for i in staged])
    assert all(committed[i] <= 1 for i in range(4))  # round 2 is not committed yet
    pipeline.TASKS[pipeline.TASK_AGGREGATE](app.state.sessions, dispatch, job_id, 2)
    with app.state.sessions() as s:
        rows = s.execute(sa.select(JobClient.client_index, JobClient.state_round,
                                   JobClient.state_digest).where(JobClient.job_id == job_id)
                         ).all()
        versions = dict(((c, r), d) for c, r, d in s.execute(
            sa.select(JobLocalState.client_index, JobLocalState.round, JobLocalState.digest)
            .where(JobLocalState.job_id == job_id)))
    assert len(versions) == 4  # superseded versions deleted with the commit
    for c, r, d in rows:
        assert versions[(c, r)] == d
        assert (r == 2) == (c in staged)


def test_a_worker_reads_digests_not_the_blobs_it_holds(env):
    app, client = env
    job_id = _job(app, client, n=4, rounds=3, per_round=2)
    _round(app, job_id, 1)  # warms this process's copies
    warm = _round(app, job_id, 2)
    assert not [q for q in warm if any(b in q for b in BLOBS)], warm
    assert any("job_server_parts.digest" in q for q in warm)
    states.clear_caches()  # a fresh worker must fetch them all
    pipeline._BLOCKS.clear()
    cold = _round(app, job_id, 3)
    for blob in BLOBS:
        assert any(blob in q for q in cold), blob


def test_a_copy_changed_in_the_database_is_refetched_by_its_digest(env):
    """Another worker (or a forgotten user's scrub) rewrote a part and a local state: the
    digests differ from this process's, so its copies are not used."""
    app, client = env
    job_id = _job(app, client, n=3, rounds=2, per_round=3)
    _round(app, job_id, 1)
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        held = states.load_server(s, job)
        jc = s.get(JobClient, (job_id, 1))
        local = states.load_locals(s, job_id, [jc])[1]
        part = held.C[1] + 1.0
        blob = states._part(held.replace(C=np.stack([held.C[0], part, held.C[2]])), 1)
        s.execute(sa.update(JobServerPart).where(JobServerPart.job_id == job_id,
                                                 JobServerPart.client_index == 1)
                  .values(part=blob, digest=states.digest(blob)))
        changed = local.replace(U=local.U + 1.0).to_bytes()
        s.execute(sa.update(JobLocalState).where(
            JobLocalState.job_id == job_id, JobLocalState.client_index == 1,
            JobLocalState.round == jc.state_round)
            .values(state=changed, digest=states.digest(changed)))
        jc.state_digest = states.digest(changed)
        s.commit()
    with app.state.sessions() as s:
        now = states.load_server(s, s.get(TrainingJob, job_id))
        assert np.array_equal(now.C[1], part) and np.array_equal(now.C[0], held.C[0])
        again = states.load_locals(s, job_id, [s.get(JobClient, (job_id, 1))])[1]
        assert np.array_equal(again.U, local.U + 1.0)


def test_migration_0010_converts_a_running_job_both_ways(env, tmp_path):
    app, client = env
    job_id = _job(app, client, n=3, rounds=4, per_round=2)
    _round(app, job_id, 1)
    _round(app, job_id, 2)
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        server = states.load_server(s, job).to_bytes()
        locals_ = states.committed_states(s, job_id)
        url = str(s.get_bind().url)
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0009")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        old = conn.execute(sa.text("SELECT local_state FROM job_clients WHERE job_id = :j "
                                   "ORDER BY client_index"), {"j": job_id}).scalars().all()
        full = conn.execute(sa.text("SELECT server_state FROM training_jobs WHERE id = :j"),
                            {"j": job_id}).scalar()
    engine.dispose()
    assert [bytes(b) for b in old] == locals_
    assert bytes(full) == server
    migrate(url)
    states.clear_caches()
    with app.state.sessions() as s:
        job = s.get(TrainingJob, job_id)
        assert states.load_server(s, job).to_bytes() == server
        assert states.committed_states(s, job_id) == locals_
    _round(app, job_id, 3)  # and the job carries on
    with app.state.sessions() as s:
        assert s.get(TrainingJob, job_id).current_round == 3


def test_migration_0012_gives_stored_jobs_the_fields_of_their_earlier_behaviour(env):
    """A FedMC-ADMM and a FedMAvg job stored before the new config fields get the values
    that keep their old behaviour; a config that has the fields keeps its own values."""
    app, client = env
    old_mc = _job(app, client, n=2)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        tids = s.get(TrainingJob, old_mc).tenant_ids
        old_avg, has = (create_job(s, JobSpec(name, tids, 3, 2, 5, {}, {"mechanism": "none"})
                                   ).id for name in ("fedmavg", "fedmc-admm"))
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0011")  # drops the fields (the earlier code refuses unknown ones)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for job_id, config in ((old_mc, CONFIG), (has, {**CONFIG, "lam_rating": 0.3,
                                                         "gamma_rating": 0.2})):
            conn.execute(sa.text("UPDATE training_jobs SET config = :c WHERE id = :j"),
                         {"c": json.dumps(config), "j": job_id})
        avg_before = json.loads(conn.execute(sa.text(
            "SELECT config FROM training_jobs WHERE id = :j"), {"j": old_avg}).scalar())
    engine.dispose()
    assert "bias" not in avg_before
    migrate(url)
    with app.state.sessions() as s:
        mc, avg = s.get(TrainingJob, old_mc).config, s.get(TrainingJob, old_avg).config
        assert mc == {**CONFIG, "lam_rating": 0.0, "gamma_rating": 0.0}
        assert avg == {**avg_before, "bias": False, "aggregate": "mean",
                       "curvature": "global"}
        assert s.get(TrainingJob, has).config == {**CONFIG, "lam_rating": 0.3,
                                                   "gamma_rating": 0.2}
    cfg = registry.get("fedmavg").config(**avg)  # what a resumed job now loads
    assert not cfg.bias and cfg.curvature == "global" and cfg.aggregate == "mean"


def _client_steps(app, job_id: int, round_: int) -> list[int]:
    """Run round ``round_``'s start and client steps, not its aggregate; the clients."""
    dispatch = pipeline.InlineDispatcher(app.state.sessions)
    pipeline.TASKS[pipeline.TASK_START](app.state.sessions, dispatch, job_id, round_)
    clients = [args for task, args in dispatch._queue if task == pipeline.TASK_CLIENT]
    dispatch._queue.clear()
    for args in clients:
        pipeline.TASKS[pipeline.TASK_CLIENT](app.state.sessions, dispatch, *args)
    return [args[2] for args in clients]


def _aggregate(app, job_id: int, round_: int) -> None:
    dispatch = pipeline.InlineDispatcher(app.state.sessions)
    pipeline.TASKS[pipeline.TASK_AGGREGATE](app.state.sessions, dispatch, job_id, round_)


def test_a_noise_free_upload_is_stored_once_in_the_staged_local_state(env):
    app, client = env
    job_id = _job(app, client, n=3, rounds=2, per_round=3)
    fed, job = federation_of(app, job_id)
    alg = registry.get("fedmc-admm")
    cfg = alg.config(**CONFIG)
    with app.state.sessions() as s:
        glob0 = Message.from_bytes(s.get(TrainingJob, job_id).global_msg)
        before = {c: Message.from_bytes(b) for c, b in enumerate(states.committed_states(
            s, job_id))}
    sampled = _client_steps(app, job_id, 1)
    assert sorted(sampled) == [0, 1, 2]
    with app.state.sessions() as s:
        rows = s.scalars(sa.select(RoundUpload).where(RoundUpload.job_id == job_id)).all()
        for row in rows:
            assert row.from_state == {"W": "W", "Y": "Y"}
            held = Message.from_bytes(row.upload)
            assert held.W.size == 0 and held.Y.size == 0  # the arrays are not repeated
            staged = Message.from_bytes(s.scalar(sa.select(JobLocalState.state).where(
                JobLocalState.job_id == job_id, JobLocalState.client_index == row.client_index,
                JobLocalState.round == 1)))
            assert staged.W.shape == glob0.V.shape
        states.clear_caches()  # a fresh worker: resolved from the stored versions
        uploads = states.load_uploads(s, job_id, 1, rows)
    for c in sampled:  # what the tenant computed, recomputed from its round-0 state
        _, upload = alg.client_step(glob0, before[c], fed.train[c], cfg, None)
        assert uploads[c].W.tobytes() == upload.W.tobytes()
        assert uploads[c].Y.tobytes() == upload.Y.tobytes()
    states.clear_caches()
    _aggregate(app, job_id, 1)
    sim = simulate(alg, cfg, fed, rounds=1, per_round=3, seed=5)
    with app.state.sessions() as s:
        assert states.load_server(s, s.get(TrainingJob, job_id)).to_bytes() == \
            sim.server_state.to_bytes()
        assert not s.scalars(sa.select(RoundUpload)).all()


def test_a_noisy_upload_is_stored_in_full(env):
    app, client = env
    make_tenants(client, n=2)
    with app.state.sessions() as s:
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        job_id = create_job(s, JobSpec("fedmc-admm", tids, 2, 2, 5, CONFIG,
                                       {"mechanism": "gaussian", "noise_multiplier": 2.0,
                                        "clip": 1.0})).id
    _client_steps(app, job_id, 1)
    with app.state.sessions() as s:
        rows = s.scalars(sa.select(RoundUpload).where(RoundUpload.job_id == job_id)).all()
        assert len(rows) == 2
        for row in rows:
            staged = Message.from_bytes(s.scalar(sa.select(JobLocalState.state).where(
                JobLocalState.job_id == job_id, JobLocalState.client_index == row.client_index,
                JobLocalState.round == 1)))
            sent = Message.from_bytes(row.upload)
            assert row.from_state is None
            assert sent.W.shape == staged.W.shape
            assert sent.W.tobytes() != staged.W.tobytes()  # the noise is in the upload only


def test_migration_0013_gives_a_staged_upload_its_arrays_back_and_the_round_completes(env):
    app, client = env
    job_id = _job(app, client, n=3, rounds=2, per_round=2)
    fed, _ = federation_of(app, job_id)
    sampled = _client_steps(app, job_id, 1)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        staged = {c: Message.from_bytes(s.scalar(sa.select(JobLocalState.state).where(
            JobLocalState.job_id == job_id, JobLocalState.client_index == c,
            JobLocalState.round == 1))) for c in sampled}
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0012")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        old = dict(conn.execute(sa.text("SELECT client_index, upload FROM round_uploads "
                                        "WHERE job_id = :j"), {"j": job_id}).all())
        columns = [c["name"] for c in sa.inspect(conn).get_columns("round_uploads")]
    engine.dispose()
    assert "from_state" not in columns and sorted(old) == sorted(sampled)
    for c, blob in old.items():  # what the code before this migration reads
        up = Message.from_bytes(bytes(blob))
        assert up.W.tobytes() == staged[c].W.tobytes() and up.Y.tobytes() == staged[c].Y.tobytes()
    migrate(url)
    states.clear_caches()
    _aggregate(app, job_id, 1)  # the round in flight completes from the full uploads
    alg = registry.get("fedmc-admm")
    sim = simulate(alg, alg.config(**CONFIG), fed, rounds=1, per_round=2, seed=5)
    with app.state.sessions() as s:
        assert s.get(TrainingJob, job_id).current_round == 1
        assert states.load_server(s, s.get(TrainingJob, job_id)).to_bytes() == \
            sim.server_state.to_bytes()
        assert states.committed_states(s, job_id) == [m.to_bytes() for m in sim.local_states]


def test_migration_0014_gives_stored_rfrec_jobs_the_fields_of_their_earlier_behaviour(env):
    """RFRec and RFRecF jobs stored before ``bias``, ``lam_u_rating`` and ``lam_v_rating``
    get the values that keep their old behaviour (no bias terms, no weighted ridge; a
    resumed job then fits its stored factors); a config that has the fields keeps them."""
    app, client = env
    make_tenants(client, n=2)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        old, old_f, has = (create_job(s, JobSpec(name, tids, 3, 2, 5, {"rank": 3},
                                                 {"mechanism": "none"},
                           validation_fraction=0)).id
                           for name in ("rfrec", "rfrecf", "rfrec"))
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0013")  # drops the fields (the earlier code refuses unknown ones)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        def config(job_id):
            return json.loads(conn.execute(sa.text(
                "SELECT config FROM training_jobs WHERE id = :j"), {"j": job_id}).scalar())
        before = {j: config(j) for j in (old, old_f, has)}
        mine = {**before[has], "bias": True, "lam_u_rating": 0.5, "lam_v_rating": 0.25}
        conn.execute(sa.text("UPDATE training_jobs SET config = :c WHERE id = :j"),
                     {"c": json.dumps(mine), "j": has})
    engine.dispose()
    assert not {"bias", "lam_u_rating", "lam_v_rating"} & set(before[old])
    migrate(url)
    earlier = {"bias": False, "lam_u_rating": 0.0, "lam_v_rating": 0.0}
    later = {"lr_final": 1.0, "lam_start": 1.0}  # migration 0016, on the way to head
    with app.state.sessions() as s:
        assert s.get(TrainingJob, old).config == {**before[old], **earlier, **later}
        assert s.get(TrainingJob, old_f).config == {**before[old_f], **earlier, **later}
        assert s.get(TrainingJob, has).config == {**mine, **later}
        stored = s.get(TrainingJob, old).config
    cfg = registry.get("rfrec").config(**stored)  # what a resumed job now loads
    assert not cfg.bias and cfg.lam_u_rating == 0 and cfg.lam_v_rating == 0
    assert registry.get("rfrec").config().bias  # the new default differs


def test_migration_0015_keeps_stored_dp_jobs_on_raw_ratings(env):
    """A DPALS / DP-FedMAvg job stored before ``normalise`` keeps raw ratings (its earlier
    behaviour, which differs from the new default on any scale but 1-5); a config that has
    the field keeps its value."""
    app, client = env
    make_tenants(client, n=2)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        old_als, old_avg, has = (
            create_job(s, JobSpec(name, tids, 3, 2, 5, {"rank": 2}, {"mechanism": "none"},
                           validation_fraction=0)).id
            for name in ("dpals", "dp-fedmavg", "dpals"))
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0014")  # drops the field (the earlier code refuses unknown ones)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        before = {j: json.loads(conn.execute(sa.text(
            "SELECT config FROM training_jobs WHERE id = :j"), {"j": j}).scalar())
            for j in (old_als, old_avg, has)}
        assert not any("normalise" in c for c in before.values())
        conn.execute(sa.text("UPDATE training_jobs SET config = :c WHERE id = :j"),
                     {"c": json.dumps({**before[has], "normalise": True}), "j": has})
    engine.dispose()
    migrate(url)
    with app.state.sessions() as s:
        for j, name in ((old_als, "dpals"), (old_avg, "dp-fedmavg")):
            config = s.get(TrainingJob, j).config
            later = {"release_centre", "centre_share", "lam_bias", "factor_min_ratings"}
            assert {k: v for k, v in config.items() if k not in later} == {
                **before[j], "normalise": False}  # (0017 adds its own fields)
            assert registry.get(name).config(**config).unit == 1.0
        assert s.get(TrainingJob, has).config["normalise"] is True


def test_migration_0016_keeps_stored_rfrec_jobs_on_a_constant_step_and_lambda(env):
    """RFRec and RFRecF jobs stored before ``lr_final`` and ``lam_start`` keep a constant
    step and lambda (their earlier behaviour; RFRec's default now grows lambda over the
    run); a config that has the fields keeps them."""
    app, client = env
    make_tenants(client, n=2)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        old, old_f, has = (create_job(s, JobSpec(name, tids, 3, 2, 5, {"rank": 3},
                                                 {"mechanism": "none"},
                           validation_fraction=0)).id
                           for name in ("rfrec", "rfrecf", "rfrec"))
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0015")  # drops the fields (the earlier code refuses unknown ones)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        before = {j: json.loads(conn.execute(sa.text(
            "SELECT config FROM training_jobs WHERE id = :j"), {"j": j}).scalar())
            for j in (old, old_f, has)}
        assert not any({"lr_final", "lam_start"} & set(c) for c in before.values())
        mine = {**before[has], "lr_final": 0.5, "lam_start": 0.25}
        conn.execute(sa.text("UPDATE training_jobs SET config = :c WHERE id = :j"),
                     {"c": json.dumps(mine), "j": has})
    engine.dispose()
    migrate(url)
    constant = {"lr_final": 1.0, "lam_start": 1.0}
    with app.state.sessions() as s:
        assert s.get(TrainingJob, old).config == {**before[old], **constant}
        assert s.get(TrainingJob, old_f).config == {**before[old_f], **constant}
        assert s.get(TrainingJob, has).config == mine
        stored = s.get(TrainingJob, old).config
    cfg = registry.get("rfrec").config(**stored)  # what a resumed job now loads
    assert cfg.lam_start == 1.0 and cfg.lr_final == 1.0
    assert registry.get("rfrec").config().lam_start < 1.0  # the new default differs



def test_migration_0017_keeps_stored_dp_jobs_on_the_public_centre(env):
    """DPALS / DP-FedMC-ADMM jobs stored before the released centre keep the public centre,
    the bias under lam_u and a factor for every user (and so the privacy plan they were
    accepted with: no centre arrays); a config that has the fields keeps its values."""
    app, client = env
    make_tenants(client, n=2)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        old_als, old_admm, has = (
            create_job(s, JobSpec(name, tids, 3, 2, 5, {"rank": 2}, {"mechanism": "none"},
                           validation_fraction=0)).id
            for name in ("dpals", "dp-fedmc-admm", "dpals"))
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0016")  # drops the fields (the earlier code refuses unknown ones)
    added = {"release_centre", "centre_share", "lam_bias", "factor_min_ratings"}
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        before = {j: json.loads(conn.execute(sa.text(
            "SELECT config FROM training_jobs WHERE id = :j"), {"j": j}).scalar())
            for j in (old_als, old_admm, has)}
        assert not any(added & set(c) for c in before.values())
        mine = {**before[has], "release_centre": True, "centre_share": 0.1, "lam_bias": 2.0,
                "factor_min_ratings": 4}
        conn.execute(sa.text("UPDATE training_jobs SET config = :c WHERE id = :j"),
                     {"c": json.dumps(mine), "j": has})
    engine.dispose()
    migrate(url)
    with app.state.sessions() as s:
        for j, name in ((old_als, "dpals"), (old_admm, "dp-fedmc-admm")):
            config = s.get(TrainingJob, j).config
            assert config == {**before[j], "release_centre": False, "centre_share": 0.02,
                              "lam_bias": None, "factor_min_ratings": 1}
            cfg = registry.get(name).config(**config)
            assert registry.user_bounds(name, cfg).centre == ()
            assert registry.user_bounds(name, registry.get(name).config()).centre == ("m",)
        assert s.get(TrainingJob, has).config == mine


def test_migration_0022_keeps_stored_ranking_jobs_without_the_popularity_prior(env):
    """ials / dp-ials jobs stored before the popularity prior keep beta 0 (their earlier
    lists, and for dp-ials the privacy plan it was accepted with: no count array in its
    releases); a config that has the field keeps its value."""
    app, client = env
    make_tenants(client, n=2)
    with app.state.sessions() as s:
        url = str(s.get_bind().url)
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        old_ials, old_dp, has = (
            create_job(s, JobSpec(name, tids, 3, 2, 5, {"rank": 2}, {"mechanism": "none"},
                                  validation_fraction=0)).id
            for name in ("ials", "dp-ials", "ials"))
    app.state.sessions.kw["bind"].dispose()
    downgrade(url, "0021")  # drops the field (the earlier code refuses unknown ones)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        before = {j: json.loads(conn.execute(sa.text(
            "SELECT config FROM training_jobs WHERE id = :j"), {"j": j}).scalar())
            for j in (old_ials, old_dp, has)}
        assert not any("popularity_prior" in c for c in before.values())
        mine = {**before[has], "popularity_prior": 0.5}
        conn.execute(sa.text("UPDATE training_jobs SET config = :c WHERE id = :j"),
                     {"c": json.dumps(mine), "j": has})
    engine.dispose()
    migrate(url)
    with app.state.sessions() as s:
        for j, name in ((old_ials, "ials"), (old_dp, "dp-ials")):
            config = s.get(TrainingJob, j).config
            assert config == {**before[j], "popularity_prior": 0.0}
            assert registry.get(name).config(**config).popularity_prior == 0.0
        assert registry.user_bounds("dp-ials", registry.get("dp-ials").config(
            **s.get(TrainingJob, old_dp).config)).centre == ()
        assert registry.get("dp-ials").config().popularity_prior > 0  # the new default
        assert s.get(TrainingJob, has).config == mine
