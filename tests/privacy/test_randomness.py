"""Issue 29: privacy noise and privacy sampling come from secret, fresh randomness.

Each test replays an attack that worked while every draw derived from the (public) job
seed, and fails on that code: regenerating the secure-aggregation shares, differencing two
same-seed runs, combining runs at two epsilons, and shifting other users' cap and sample
draws by deleting one user.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from algorithms import RatingBlock, registry
from algorithms import dpals as D
from algorithms.data import build_federation
from algorithms.rng import derive_rng
from algorithms.simulate import initialise
from algorithms.synthetic import generate_ratings
from app.cli import main
from privacy import secagg
from privacy.distributed import SecureAggregationPrivatizer, integer_stds, pack
from privacy.randomness import (
    UserPRF,
    fresh_noise_generator,
    new_key,
    private_federation,
    process_key,
)
from privacy.user_level import AGGREGATE, UserLevelPrivatizer, UserLevelSpec

#: the stream the noise of client i in round k was drawn from before (seed, k, 3e6 + i),
#: and the central noise's (seed, k, 4): what an attacker holding the seed regenerates
OLD_CLIENT_NOISE, OLD_NOISE = 3_000_000, 4


def _uploads(cfg: D.DPALSConfig, n_clients: int = 4, seed: int = 0) -> dict[int, D.Upload]:
    fed = build_federation(generate_ratings(80, 30, 1500, rank=3, seed=seed), n_clients, 0)
    _, glob, locs = initialise(D.ALGORITHM, cfg, fed.train, 0)
    out = {}
    for i, block in enumerate(fed.train):
        _, up = D.client_step(glob, locs[i], block, cfg, np.random.default_rng(i))
        out[i] = up
    return out


def _spec(epsilon: float = 2.0, **kw) -> UserLevelSpec:
    return UserLevelSpec(epsilon=epsilon, delta=1e-5, n_users=1000, releases=2, **kw)


def test_fresh_generators_are_chacha20_with_independent_keys():
    a, b = fresh_noise_generator(), fresh_noise_generator()
    assert type(a.bit_generator).__name__ == "ChaCha"
    assert not np.array_equal(a.integers(0, 2 ** 62, 8), b.integers(0, 2 ** 62, 8))
    assert len(new_key()) == 32 and new_key() != new_key()
    assert process_key(("t", 1)) == process_key(("t", 1)) != process_key(("t", 2))
    assert "secret" in repr(UserPRF(new_key(), 0, ["a"]))


def test_coordinator_cannot_regenerate_the_secure_aggregation_noise():
    """Attack (a): the coordinator, holding the seed (it is in the job, the admin API and
    every manifest), regenerated every tenant's discrete Gaussian share and subtracted it:
    the noise-free sum came back exactly. Now the shares are fresh and secret."""
    cfg = D.DPALSConfig(rank=2, sweeps=2, release_centre=False)
    ups = _uploads(cfg)
    spec = _spec(placement="tenant", secure_aggregation=True)
    seed, round_ = 7, 1
    priv = SecureAggregationPrivatizer(spec, D.user_bounds(cfg), len(ups), seed)
    passed = {i: priv(u, i, round_) for i, u in ups.items()}
    noisy = pack(priv.aggregate(passed, round_)[AGGREGATE], priv.bounds)
    exact = sum(pack(u, priv.bounds) for u in ups.values())
    fp, n = priv.fp, len(ups)
    stds = integer_stds(spec, priv.bounds, ups[0], 0, secagg.threshold_for(n, 0.1), fp)
    regenerated = np.zeros_like(exact)
    for i in ups:  # the old derivation: one stream per (seed, round, client)
        rng = derive_rng(seed, round_, OLD_CLIENT_NOISE + i)
        at = 0
        for name, size in _block_sizes(ups[i], priv.bounds):
            regenerated[at:at + size] += secagg.discrete_gaussian((size,), stds[name], rng)
            at += size
    residual = noisy - regenerated / fp.scale - exact
    sigma = min(stds.values()) / fp.scale
    assert np.sqrt(np.mean(residual ** 2)) > sigma  # the noise is still there, all of it


def _block_sizes(upload, bounds) -> list[tuple[str, int]]:
    out = []
    for name in (*bounds.gram, *bounds.rhs, *bounds.centre):
        shape = np.shape(getattr(upload, name))
        size = (int(np.prod(shape[:-2])) * shape[-1] * (shape[-1] + 1) // 2
                if name in bounds.gram else int(np.prod(shape)))
        out.append((name, size))
    return out


def test_same_seed_and_data_release_different_noise():
    """Attack (b): two central runs with one seed, on data differing by one deleted user,
    had the same noise, so the difference of their first noisy sums was non-zero exactly
    on the victim's items. Now the noise differs everywhere."""
    cfg = D.DPALSConfig(rank=2, sweeps=2, release_centre=False)
    ups = _uploads(cfg)
    bounds = D.user_bounds(cfg)
    a = UserLevelPrivatizer(_spec(), bounds, len(ups), seed=0).aggregate(ups, 1)[AGGREGATE]
    b = UserLevelPrivatizer(_spec(), bounds, len(ups), seed=0).aggregate(ups, 1)[AGGREGATE]
    diff = a.A - b.A
    assert np.count_nonzero(np.abs(diff) > 0) == diff.size  # every entry, not a victim's
    seeded = derive_rng(0, 1, OLD_NOISE).standard_normal(8)
    assert not np.allclose((a.A - sum(u.A for u in ups.values())).ravel()[:8]
                           / D.user_bounds(cfg).x_norm, seeded)


def test_noise_at_two_epsilons_is_not_proportional():
    """Attack (c): one job at epsilon 1 and at 8 drew the same standard normals, scaled;
    subtracting the right multiple of one noisy sum from the other left the noise-free
    sum. Now the two noises are independent."""
    cfg = D.DPALSConfig(rank=2, sweeps=2, release_centre=False)
    ups = _uploads(cfg)
    bounds = D.user_bounds(cfg)
    exact = sum(u.b for u in ups.values())
    noise = {}
    for eps in (1.0, 8.0):
        priv = UserLevelPrivatizer(_spec(eps), bounds, len(ups), seed=0)
        noise[eps] = (priv.aggregate(ups, 1)[AGGREGATE].b - exact) / priv.stds(0)["b"]
    corr = np.corrcoef(noise[1.0].ravel(), noise[8.0].ravel())[0, 1]
    assert abs(corr) < 0.5  # independent standard normals (old code: exactly 1)
    # the attacker's combination: (s8 n1 - s1 n8) / (s8 - s1) is not the exact sum
    assert not np.allclose(noise[1.0], noise[8.0])


def _ratings(n_users: int = 30, n_items: int = 25, seed: int = 3):
    """(user id, item, rating) triples: users with 2 to 25 ratings."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(n_users):
        items = rng.choice(n_items, size=int(rng.integers(2, n_items)), replace=False)
        out += [(1000 + u, int(j), float(rng.integers(1, 6))) for j in items]
    return out


def _block(triples, ids, key, n_items=25) -> RatingBlock:
    """The tenant's block over the users ``ids`` (rows in that order), with its secret
    per-user draws under ``key``."""
    row = {u: i for i, u in enumerate(ids)}
    kept = [(row[u], j, r) for u, j, r in triples if u in row]
    rows, cols, vals = (np.array(x) for x in zip(*kept, strict=True))
    block = RatingBlock(rows, cols, vals, len(ids), n_items, (1.0, 5.0))
    return block.with_user_draws(UserPRF(key, "tenant-a", [str(u) for u in ids]))


def _by_user(block: RatingBlock, ids, keep) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for t in keep:
        out.setdefault(ids[block.rows[t]], set()).add(int(block.cols[t]))
    return out


@pytest.mark.parametrize("name", ["dpals", "dp-fedmavg", "dp-fedmc-admm"])
def test_deleting_a_user_changes_no_other_users_cap_or_sample(name):
    """Attack (d): the cap and the Poisson sample were positional draws of the tenant's
    stream, so deleting one user re-indexed it and moved every later user's draws. Now
    each draw is keyed by the user's id: the other users' kept ratings and sample bits
    are the same with and without the victim."""
    triples, key = _ratings(), new_key()
    ids = sorted({u for u, _, _ in triples})
    victim = ids[3]
    rest = [u for u in ids if u != victim]
    full, gone = _block(triples, ids, key), _block(triples, rest, key)
    alg = registry.get(name)
    cfg = alg.config(rank=2, max_ratings_per_user=5, user_sample_rate=0.5)
    rng = np.random.default_rng(0)
    cap_full = _by_user(full, ids, D.capped(full, cfg, rng))
    cap_gone = _by_user(gone, rest, D.capped(gone, cfg, np.random.default_rng(99)))
    assert cap_gone == {u: cap_full[u] for u in rest}
    assert any(len(v) == 5 for v in cap_full.values())  # the cap bit
    for release in range(1, 4):
        s_full = D.sample_users(full, 0.5, release, rng)
        s_gone = D.sample_users(gone, 0.5, release, np.random.default_rng(release))
        np.testing.assert_array_equal(s_gone, s_full[[ids.index(u) for u in rest]])


@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_deleting_a_user_moves_a_dp_fedmavg_upload_by_at_most_its_bound(rate):
    """The sensitivity the noise is calibrated to: removing one user moves the clipped
    sums (G, H) by at most C in L2, at q = 1 and q = 0.5 (with positional draws, the
    other users' caps and samples shifted and moved them by several C)."""
    triples, key = _ratings(), new_key()
    ids = sorted({u for u, _, _ in triples})
    alg = registry.get("dp-fedmavg")
    cfg = alg.config(rank=2, max_ratings_per_user=5, user_sample_rate=rate, clip_norm=1.0,
                     release_centre=False)
    _, glob = alg.init_server(25, 1, cfg, np.random.default_rng(0))
    for victim in ids[:6]:
        rest = [u for u in ids if u != victim]
        sums = []
        for users in (ids, rest):
            block = _block(triples, users, key)
            state = alg.init_client(block, glob, cfg, np.random.default_rng(len(users)))
            _, up = alg.client_step(glob, state, block, cfg, np.random.default_rng(5))
            sums.append(np.concatenate([up.G.ravel(), up.H.ravel()]))
        assert np.linalg.norm(sums[0] - sums[1]) <= cfg.clip_norm + 1e-9


def test_the_prf_is_keyed_and_uniform():
    ids = [str(i) for i in range(4000)]
    a = UserPRF(new_key(), 0, ids).user_uniforms("sample", 1, 4000)
    b = UserPRF(new_key(), 0, ids).user_uniforms("sample", 1, 4000)
    assert not np.array_equal(a, b)  # another key, other draws
    assert abs(a.mean() - 0.5) < 0.02 and 0 <= a.min() and a.max() < 1
    key = new_key()
    same = UserPRF(key, 0, ids)
    np.testing.assert_array_equal(same.user_uniforms("sample", 1, 4000),
                                  UserPRF(key, 0, ids).user_uniforms("sample", 1, 4000))
    assert not np.array_equal(same.user_uniforms("sample", 2, 4000),
                              same.user_uniforms("sample", 1, 4000))  # per release
    assert not np.array_equal(UserPRF(key, 1, ids).user_uniforms("sample", 1, 4000),
                              same.user_uniforms("sample", 1, 4000))  # per tenant


def test_private_federation_keeps_the_ratings_and_attaches_keyed_draws():
    fed = build_federation(generate_ratings(40, 20, 600, rank=2, seed=1), 3, 0)
    priv = private_federation(fed)
    for a, b in zip(fed.train, priv.train, strict=True):
        assert a.user_draws is None and b.user_draws is not None
        np.testing.assert_array_equal(a.vals, b.vals)
        assert b.subset(b.rows >= 0).user_draws is b.user_draws  # kept by derived blocks
        assert b.with_values(b.vals).user_draws is b.user_draws
        assert RatingBlock.from_bytes(b.to_bytes()).user_draws is None  # never serialised


def _simulate_json(tmp_path, csv, name: str, extra: list[str]) -> dict:
    out = tmp_path / name
    assert main(["simulate", "--data", str(csv), "--algorithm", "dpals", "--clients", "3",
                 "--rank", "2", "--sweeps", "2", "--seed", "4", "--json", str(out),
                 "--quiet", *extra]) == 0
    return json.loads(out.read_text())


def test_cli_user_level_runs_differ_on_one_seed_runs_without_privacy_do_not(tmp_path):
    """``fedrec simulate --privacy user`` twice with one --seed gives different noisy
    results; ``--privacy none`` stays bit-identical."""
    r = generate_ratings(60, 30, 1200, rank=3, seed=2)
    csv = tmp_path / "r.csv"
    csv.write_text("user,item,rating\n" + "\n".join(
        f"{u},{i},{v}" for u, i, v in zip(r.users, r.items, r.values, strict=True)))
    dp = ["--privacy", "user", "--epsilon", "2", "--delta", "1e-4"]
    a = _simulate_json(tmp_path, csv, "a.json", dp)
    b = _simulate_json(tmp_path, csv, "b.json", dp)
    assert a["final"]["test_rmse"] != b["final"]["test_rmse"]
    assert a["privacy"]["epsilon_max"] == b["privacy"]["epsilon_max"]  # the same charge
    c = _simulate_json(tmp_path, csv, "c.json", ["--privacy", "none"])
    d = _simulate_json(tmp_path, csv, "d.json", ["--privacy", "none"])
    assert c["rounds_detail"] == [{**x, "seconds": y["seconds"]}
                                  for x, y in zip(d["rounds_detail"], c["rounds_detail"],
                                                  strict=True)]
    assert "user-prf" not in json.dumps(a) and "ChaCha" not in json.dumps(a)
