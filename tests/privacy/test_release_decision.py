"""One decision of which release privacy settings apply (:func:`privacy.release.release_of`),
and its four askers agreeing with it for every combination of algorithm, privacy unit,
placement, mechanism and secure aggregation that the code accepts:

* ``fedrec simulate`` (:func:`app.commands.simulate.release_parts`): the privatizer and
  aggregator it builds for the in-process engine;
* the service's release of a hosted upload and of a round
  (:func:`privacy.release.release_upload`, :func:`privacy.release.release_round`,
  :func:`app.training.secure.enabled`);
* ``fedrec agent`` (:meth:`agent.run.Agent._release`);
* the coordinator's expected charge of an agent's upload
  (:func:`app.training.agents.expected_charge`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import types

import numpy as np
import pytest

from agent.run import Agent
from algorithms import registry
from algorithms.data import build_federation
from algorithms.messages import messages_equal
from algorithms.scale import with_public_scale
from algorithms.simulate import client_round, initialise
from algorithms.synthetic import generate_ratings
from app.commands.simulate import release_parts
from app.training import agents, pipeline, secure
from privacy import release as R
from privacy import user_level
from privacy.cli import add_dp_arguments, add_privacy_arguments, privacy_unit
from privacy.distributed import SecureAggregationPrivatizer, SecureSum
from privacy.ledger import Budget, Ledger
from privacy.randomness import fresh_noise_generator, private_federation
from privacy.user_level import UserLevelPrivatizer
from privacy.wrapper import DPPrivatizer, n_entries

N_CLIENTS, ROUNDS, SEED = 3, 2, 4


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    p.add_argument("--seed", type=int, default=SEED)
    add_dp_arguments(p, default="none")
    return add_privacy_arguments(p)


def _flags(unit, mechanism, placement, secure_aggregation) -> list[str]:
    argv = [] if unit is None else ["--privacy", unit]
    argv += [] if mechanism is None else ["--dp", mechanism]
    argv += [] if placement is None else ["--placement", placement]
    return argv + (["--secure-aggregation"] if secure_aggregation else [])


COMBOS = list(itertools.product(
    registry.names(), (None, "none", "tenant", "user"), (None, "laplace", "gaussian",
                                                          "bernoulli"),
    (None, "central", "tenant"), (False, True)))


@functools.cache
def _federation(name: str):
    alg = registry.get(name)
    ratings = generate_ratings(60, 30, 900, rank=3, seed=1, min_per_user=5)
    fed = build_federation(ratings, N_CLIENTS, SEED)
    if alg.data_kind == "binary":
        from algorithms.binary_metrics import binarise
        from algorithms.ranking import relevance_threshold

        fed = binarise(fed, relevance_threshold(fed.scale))
    return alg, with_public_scale(alg.config(), set(), fed.scale), fed


def _accepted(name, unit, mechanism, placement, secure_aggregation):
    """(release, args, parts) of the flags, or None when the code refuses them."""
    args = _parser().parse_args(_flags(unit, mechanism, placement, secure_aggregation))
    try:
        chosen = privacy_unit(args)
        alg, cfg, fed = _federation(name)
        kind = R.release_of(R.cli_settings(chosen, args.placement, args.secure_aggregation))
        return kind, release_parts(args, chosen, alg, cfg, fed, ROUNDS, N_CLIENTS)
    except ValueError:
        return None


def _settings(kind: R.Release, privatizer, cli: dict) -> dict:
    """What a stored job with the same privacy would carry as ``job.dp``."""
    if kind.user_level:
        return user_level.to_settings(privatizer.spec)
    if kind is R.Release.TENANT:
        return privatizer.spec.model_dump()
    return cli


def _upload(name: str, fed, user: bool):
    alg, cfg, _ = _federation(name)
    blocks = private_federation(fed).train if user else fed.train
    _, glob, locs = initialise(alg, cfg, blocks, SEED)
    return client_round(alg, cfg, 1, SEED, 0, glob, locs[0], blocks[0])[1]


def _ledger() -> Ledger:
    return Ledger.open({0: Budget(math.inf, 1e-6, allow_not_private=True)})


def test_the_decision_reads_stored_and_run_settings():
    tenant = {"mechanism": "gaussian", "noise_multiplier": 1.0}
    assert R.release_of(tenant) is R.Release.TENANT  # stored tenant settings omit the unit
    assert R.release_of({**tenant, "unit": "tenant"}) is R.Release.TENANT
    assert R.release_of({"mechanism": "none"}) is R.Release.TENANT  # charged infinity
    assert R.release_of(None) is R.Release.PLAIN
    assert R.release_of(R.cli_settings("none")) is R.Release.PLAIN
    assert R.release_of(R.cli_settings("none", None, True)) is R.Release.SECURE_SUM
    assert R.release_of(R.cli_settings("user")) is R.Release.USER_CENTRAL
    assert R.release_of(R.cli_settings("user", "tenant")) is R.Release.USER_TENANT
    assert R.release_of(R.cli_settings("user", "tenant", True)) is R.Release.USER_SECURE
    with pytest.raises(ValueError, match="placement 'tenant'"):
        R.release_of({"unit": "user", "placement": "central", "secure_aggregation": True})
    with pytest.raises(ValueError, match="tenant unit"):
        R.release_of({"mechanism": "gaussian", "secure_aggregation": True})
    with pytest.raises(ValueError, match="unknown privacy unit"):
        R.release_of({"unit": "item"})


#: what ``fedrec simulate`` builds for each release: (privatizer type, aggregator type)
BUILT = {R.Release.PLAIN: (type(None), type(None)),
         R.Release.SECURE_SUM: (type(None), SecureSum),
         R.Release.TENANT: (DPPrivatizer, type(None)),
         R.Release.USER_TENANT: (UserLevelPrivatizer, types.MethodType),
         R.Release.USER_CENTRAL: (UserLevelPrivatizer, types.MethodType),
         R.Release.USER_SECURE: (SecureAggregationPrivatizer, types.MethodType)}


@pytest.mark.parametrize("name", registry.names())
def test_every_asker_agrees_with_the_decision(name, monkeypatch):
    monkeypatch.setattr(pipeline, "_job_releases", lambda *a, **k: 0)
    seen = set()
    for _, unit, mechanism, placement, sa in (c for c in COMBOS if c[0] == name):
        found = _accepted(name, unit, mechanism, placement, sa)
        if found is None:
            continue
        kind, (kind_cli, fed, privatizer, aggregator) = found
        case = (name, unit, mechanism, placement, sa, kind)
        seen.add(kind)
        # fedrec simulate builds the decided release
        assert kind_cli is kind, case
        assert isinstance(privatizer, BUILT[kind][0]), case
        assert isinstance(aggregator, BUILT[kind][1]), case
        if kind.user_level:
            assert privatizer.spec.placement == ("central" if kind is R.Release.USER_CENTRAL
                                                 else "tenant"), case
            assert privatizer.spec.secure_aggregation == (kind is R.Release.USER_SECURE)
        dp = _settings(kind, privatizer, R.cli_settings(privacy_unit_of(unit, mechanism),
                                                         placement, sa))
        assert R.release_of(dp) is kind, case  # the stored form decides the same
        assert secure.enabled(dp) == (kind is R.Release.USER_SECURE), case
        assert R.central(dp) == (kind is R.Release.USER_CENTRAL), case
        alg, cfg, _ = _federation(name)
        upload = _upload(name, fed, kind.user_level)
        assert upload is not None, case
        if mechanism == "bernoulli" and not all(
                np.isin(a, (0, 1)).all() for a in upload.arrays().values()):
            continue  # XOR noise is refused for uploads that are not Boolean
        expected = R.expected_event(dp, 0, n_entries(upload), alg.privacy_preserving)
        # the service's hosted release
        ledger = _ledger()
        sent, event, refused = R.release_upload(dp, name, cfg, upload, 0, ledger,
                                                fresh_noise_generator(), 1, 0,
                                                alg.privacy_preserving)
        assert refused is None, case
        per_upload = kind in (R.Release.TENANT, R.Release.USER_TENANT, R.Release.USER_SECURE)
        assert event == (expected if per_upload else None), case
        assert ledger.history(0) == ([expected] if per_upload else []), case
        noised = kind is R.Release.USER_TENANT or (kind is R.Release.TENANT
                                                   and dp["mechanism"] != "none")
        assert messages_equal(sent, upload) != noised, case
        # ... and of the round: central placement charges the sum's contributors
        round_ledger = _ledger()
        received, charged, _ = R.release_round(dp, name, cfg, {0: sent}, round_ledger, 0,
                                               fresh_noise_generator(), 1)
        assert charged == ({0: expected} if kind is R.Release.USER_CENTRAL else {}), case
        assert (user_level.AGGREGATE in received) == (kind is R.Release.USER_CENTRAL), case
        # fedrec agent's own release
        me = types.SimpleNamespace(state=types.SimpleNamespace(account=0, ledger=_ledger()))
        manifest = {"privacy": dp, "privacy_preserving": alg.privacy_preserving}
        a_release = Agent._release(me, manifest, {"releases": 0}, alg, cfg)
        a_sent = a_release(upload, 0, 1)
        assert (a_release.event, a_release.refused) == (event, None), case
        assert messages_equal(a_sent, upload) != noised, case
        # the coordinator's expected charge of an agent's upload
        job = types.SimpleNamespace(id=1, dp=dp, algorithm=name)
        if expected is None:
            with pytest.raises(agents.AgentRefused):
                agents.expected_charge(None, job, 0, upload)
        else:
            assert agents.expected_charge(None, job, 0, upload) == expected, case
    kinds = {R.Release.PLAIN, R.Release.SECURE_SUM, R.Release.TENANT}
    bounds = registry.user_bounds(name, _federation(name)[1])
    if bounds is not None:
        kinds |= {R.Release.USER_TENANT, R.Release.USER_CENTRAL}
    if bounds is not None and not bounds.clipped:
        kinds.add(R.Release.USER_SECURE)
    assert kinds <= seen, (name, seen)


def privacy_unit_of(unit, mechanism) -> str:
    """The unit :func:`privacy.cli.privacy_unit` resolves the flags to."""
    return unit or ("tenant" if mechanism not in (None, "none") else "none")


def test_secure_aggregation_is_decided_for_an_algorithm_that_supports_it():
    found = _accepted("dpals", "user", None, "tenant", True)
    assert found is not None and found[0] is R.Release.USER_SECURE
    assert _accepted("dp-fedmavg", "user", None, "tenant", True) is None  # clipped sums


def test_the_decision_is_what_release_upload_dispatches_on(monkeypatch):
    """A changed decision changes every asker: patching release_of re-routes the release."""
    dp = {"mechanism": "gaussian", "noise_multiplier": 1.0}
    monkeypatch.setattr(R, "release_of", lambda _: R.Release.PLAIN)
    alg, cfg, fed = _federation("fedmavg")
    upload = _upload("fedmavg", fed, False)
    sent, event, _ = R.release_upload(dp, "fedmavg", cfg, upload, 0, _ledger(),
                                      np.random.default_rng(), 1)
    assert event is None and sent is upload
    assert R.expected_event(dp, 0, n_entries(upload)) is None
