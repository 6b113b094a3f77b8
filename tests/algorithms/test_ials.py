"""Federated iALS against the centralised reference, and dp-ials's per-user bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms import RatingBlock, registry
from algorithms import ials as I
from algorithms.centralised import fit_ials
from algorithms.data import Federation
from algorithms.simulate import simulate


def _federation(seed: int = 0, sizes=(5, 7, 6), n_items: int = 11) -> Federation:
    """Three tenants, 1..5 star ratings on about half the entries (every user rates)."""
    rng = np.random.default_rng(seed)
    train, uids, start = [], [], 0
    for m in sizes:
        mask = rng.random((m, n_items)) < 0.5
        mask[np.arange(m), rng.integers(0, n_items, m)] = True
        rows, cols = np.nonzero(mask)
        vals = rng.integers(1, 6, rows.size).astype(float)
        train.append(RatingBlock(rows, cols, vals, m, n_items))
        uids.append(np.arange(start, start + m))
        start += m
    return Federation(train, train, uids, np.arange(n_items), (1.0, 5.0))


def _pooled(fed: Federation) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    users, items, vals, offset = [], [], [], 0
    for b in fed.train:
        users.append(b.rows + offset)
        items.append(b.cols)
        vals.append(b.vals)
        offset += b.n_users
    return np.concatenate(users), np.concatenate(items), np.concatenate(vals), offset


@pytest.mark.parametrize("confidence,power", [(0.0, 1.0), (2.0, 1.0), (1.0, 0.5)])
def test_noise_free_federated_ials_equals_centralised_ials_on_the_pooled_data(
        confidence, power):
    cfg = I.IALSConfig(rank=3, sweeps=4, unobserved_weight=0.2, lam=0.05,
                       ridge_power=power, confidence=confidence, bias_coordinate=0.7)
    fed = _federation()
    alg = registry.get("ials")
    result = simulate(alg, cfg, fed, rounds=cfg.sweeps + 1, per_round=3, seed=3,
                      evaluate_every=0)
    users, items, vals, n_users = _pooled(fed)
    from algorithms.simulate import initialise
    _, glob0, _ = initialise(alg, cfg, fed.train, 3)
    x, v = fit_ials(users, items, I.confidences(vals, cfg), n_users, fed.n_items, glob0.V,
                    sweeps=cfg.sweeps, unobserved_weight=0.2, lam=0.05, ridge_power=power,
                    bias_coordinate=0.7)
    np.testing.assert_allclose(result.global_msg.V, v, atol=1e-8)
    # served factors: the centralised iALS's [x | beta] and [V ; z], z the standardised
    # log(1 + count) of the pooled training ratings
    fed_a = np.vstack([alg.factors(result.global_msg, s)[0] for s in result.local_states])
    _, fed_b = alg.factors(result.global_msg, result.local_states[0])
    counts = np.bincount(items, minlength=fed.n_items)
    lc = np.log1p(counts)
    np.testing.assert_allclose(fed_a, np.hstack([x, np.full((n_users, 1), I.DEFAULT_PRIOR)]),
                               atol=1e-8)
    np.testing.assert_allclose(fed_b, np.vstack([v, ((lc - lc.mean()) / lc.std())[None]]),
                               atol=1e-8)
    assert np.abs(v).max() > 1e-2  # a model, not the zero solution


def test_user_solve_minimises_the_users_loss():
    """The closed-form user solve is the argmin: perturbing any user's factor raises its
    loss (iALS loss with the Gramian over all items, frequency-scaled ridge)."""
    cfg = I.IALSConfig(rank=3, unobserved_weight=0.3, lam=0.1, confidence=1.0)
    b = _federation().train[0]
    rng = np.random.default_rng(1)
    v = rng.normal(size=(cfg.d, b.n_items))
    conf = I.confidences(b.vals, cfg)
    u = I.solve_users(v, b.rows, b.cols, conf, b.n_users, cfg)

    def loss(uu):
        x = np.hstack([uu, np.full((b.n_users, 1), cfg.bias_coordinate)])
        p = x @ v
        obs = conf @ (1 - p[b.rows, b.cols]) ** 2
        freq = np.bincount(b.rows, weights=conf, minlength=b.n_users)
        lam = cfg.lam * (freq + cfg.unobserved_weight * b.n_items)
        return obs + cfg.unobserved_weight * np.sum(p ** 2) + lam @ np.sum(uu ** 2, axis=1)

    base = loss(u)
    for _ in range(20):
        assert loss(u + 1e-3 * rng.normal(size=u.shape)) > base


def _upper(a):
    iu = np.triu_indices(a.shape[-1])
    return a[:, iu[0], iu[1]]


@pytest.mark.parametrize("seed,power,max_weight", [(0, 0.0, 10.0), (1, 0.5, 10.0),
                                                   (2, 1.0, 2.0), (3, 0.0, 1.0)])
def test_removing_any_user_moves_the_released_sums_by_at_most_the_declared_sensitivity(
        seed, power, max_weight):
    """Brute force over every user of a random block (random V and previous counts):
    removing the user changes A (item Grams and the Gramian row) and b by at most the
    sensitivities the privacy layer computes from :func:`user_bounds`."""
    from privacy.user_level import gram_sensitivity, rhs_sensitivity

    rng = np.random.default_rng(seed)
    cfg = I.DPIALSConfig(rank=3, max_ratings_per_user=3, user_factor_clip=0.8,
                         bias_coordinate=0.5, confidence=2.0, rare_item_power=power,
                         max_weight=max_weight)
    b = _federation(seed).train[1]
    v = rng.normal(0, 2.0, size=(cfg.d, b.n_items))
    counts = rng.uniform(0, 30, size=b.n_items)
    conf = I.confidences(b.vals, cfg)
    u = I.solve_users(v, b.rows, b.cols, conf, b.n_users, cfg)
    x = I.user_vectors(u, cfg)

    def sums(keep):
        w = I.released_weights(b.rows[keep], b.cols[keep], conf[keep], b.n_users, counts,
                               cfg)
        present = np.isin(np.arange(b.n_users), b.rows[keep])
        return I.item_sums(x[present], np.searchsorted(np.flatnonzero(present),
                                                       b.rows[keep]),
                           b.cols[keep], w, b.n_items)

    a, rhs = sums(np.arange(b.nnz))
    bounds = I.user_bounds(cfg)
    worst_g = worst_r = 0.0
    for user in range(b.n_users):
        a2, rhs2 = sums(np.flatnonzero(b.rows != user))
        worst_g = max(worst_g, float(np.linalg.norm(_upper(a) - _upper(a2))))
        worst_r = max(worst_r, float(np.linalg.norm(rhs - rhs2)))
    assert worst_g <= gram_sensitivity(bounds) + 1e-12
    assert worst_r <= rhs_sensitivity(bounds) + 1e-12
    assert gram_sensitivity(bounds) == pytest.approx(2 * (0.8 ** 2 + 0.5 ** 2))
    assert worst_g > 0.4 * gram_sensitivity(bounds)  # the bound is not vacuous


def test_released_weights_spend_the_budget_and_favour_rare_items():
    cfg = I.DPIALSConfig(max_ratings_per_user=4, rare_item_power=1.0, max_weight=100.0)
    rows = np.array([0, 0, 0, 1])
    cols = np.array([0, 1, 2, 0])
    counts = np.array([100.0, 10.0, 1.0])
    w = I.released_weights(rows, cols, np.ones(4), 2, counts, cfg)
    assert np.sum(w[:3] ** 2) == pytest.approx(4.0)
    assert w[2] > w[1] > w[0]
    assert w[3] == pytest.approx(2.0)  # one rating: the whole budget on it
    plain = I.released_weights(rows, cols, np.ones(4), 2, counts, I.IALSConfig())
    np.testing.assert_array_equal(plain, np.ones(4))


def test_counts_and_users_are_read_off_the_sums_without_noise():
    cfg = I.IALSConfig(rank=2, bias_coordinate=0.5, confidence=0.0)
    fed = _federation()
    b = fed.train[0]
    rng = np.random.default_rng(0)
    x = I.user_vectors(rng.normal(size=(b.n_users, 2)), cfg)
    a, rhs = I.item_sums(x, b.rows, b.cols, np.ones(b.nnz), b.n_items)
    _, counts = I.solve_items(a, rhs, 0.0, cfg)
    np.testing.assert_allclose(counts, np.bincount(b.cols, minlength=b.n_items))
    assert a[-1, -1, -1] == pytest.approx(0.25 * b.n_users)


def test_ials_is_not_user_level_without_bounds_and_dp_ials_is():
    assert I.user_bounds(I.IALSConfig()) is None
    assert registry.user_bounds("ials", I.IALSConfig()) is None
    bounds = registry.user_bounds("dp-ials", I.DPIALSConfig())
    assert bounds.max_ratings == I.DPIALSConfig().max_ratings_per_user + 1
    assert bounds.x_norm == pytest.approx(math.hypot(0.3, 0.01))
    with pytest.raises(ValueError, match="dp-ials needs"):
        I.DPIALSConfig(user_factor_clip=None)


def _two_tastes(seed: int = 0) -> Federation:
    """Two tenants; 300 users each like items 0..19 and 100 items 20..39 (so the popularity
    list is items 0..19 for everybody), each user rating 3 of their group's items: sparse,
    as real data, so the item ridge's ``w0 n_users`` term is large against the counts."""
    rng = np.random.default_rng(seed)
    train, uids = [], []
    for t in range(2):
        groups = np.repeat([0, 1], [300, 100])
        rows = np.repeat(np.arange(groups.size), 3)
        cols = np.concatenate([20 * g + rng.choice(20, 3, replace=False) for g in groups])
        vals = rng.integers(3, 6, rows.size).astype(float)
        train.append(RatingBlock(rows, cols, vals, groups.size, 40))
        uids.append(np.arange(t * groups.size, (t + 1) * groups.size))
    return Federation(train, train, uids, np.arange(40), (1.0, 5.0))


def test_dp_ials_defaults_learn_tastes_rather_than_popularity():
    """Without noise, dp-ials's default bounds and ridge still personalise: the minority's
    users get their own items on top, not the popular ones (a ridge too large for the
    counts drowns the factors and leaves the bias, i.e. the popularity list)."""
    fed = _two_tastes()
    alg = registry.get("dp-ials")
    cfg = alg.config(rank=4, sweeps=4)
    res = simulate(alg, cfg, fed, rounds=cfg.sweeps + 1, per_round=2, seed=1,
                   evaluate_every=0)
    own = []
    for block, state in zip(fed.train, res.local_states, strict=True):
        a, b = alg.factors(res.global_msg, state)
        scores = a @ b
        scores[block.rows, block.cols] = -np.inf
        own.append((np.argmax(scores, axis=1) >= 20) == (np.arange(block.n_users) >= 300))
    assert np.mean(np.concatenate(own)) > 0.95


@pytest.mark.parametrize("field,value", [("rank", 0), ("bias_coordinate", 0.0),
                                         ("unobserved_weight", -1.0), ("gram_shrink", 2.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError):
        I.IALSConfig(**{field: value})


def test_final_round_refreshes_users_without_uploading():
    cfg = I.IALSConfig(rank=2, sweeps=2)
    fed = _federation()
    alg = registry.get("ials")
    result = simulate(alg, cfg, fed, rounds=3, per_round=3, seed=0, evaluate_every=0)
    assert result.global_msg.sweep == 2
    assert result.history[-1].uploads == 0


def test_fused_kernels_agree_with_the_numpy_code():
    from algorithms import _user_kernels as UK

    assert UK.HAVE_NUMBA  # installed with the project: the kernels are what runs
    cfg = I.IALSConfig(rank=4, unobserved_weight=0.2, lam=0.3, ridge_power=0.7,
                       confidence=1.5, bias_coordinate=0.6)
    b = _federation(2, sizes=(9,), n_items=13).train[0]
    rng = np.random.default_rng(4)
    v = rng.normal(size=(cfg.d, b.n_items))
    conf = I.confidences(b.vals, cfg)
    np.testing.assert_allclose(I.solve_users(v, b.rows, b.cols, conf, b.n_users, cfg),
                               I.solve_users_numpy(v, b.rows, b.cols, conf, b.n_users, cfg),
                               rtol=1e-10, atol=1e-12)
    x = I.user_vectors(rng.normal(size=(b.n_users, 4)), cfg)
    for fused, plain in zip(I.item_sums(x, b.rows, b.cols, conf, b.n_items),
                            I.item_sums_numpy(x, b.rows, b.cols, conf, b.n_items),
                            strict=True):
        np.testing.assert_allclose(fused, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("placement,secure", [("central", False), ("tenant", True)])
def test_dp_ials_spends_what_dp_accounting_computes_for_its_releases(placement, secure):
    """Run dp-ials through the user-level privacy layer (central, and tenant placement
    with secure aggregation): two sweeps are two charged Gaussian releases per user, and
    dp-accounting's RDP accountant on the charged noise multipliers gives the reported
    epsilon, within the target."""
    import dp_accounting as dpa

    from privacy.accountant import ORDERS
    from privacy.distributed import SecureAggregationPrivatizer
    from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

    fed = _federation()
    cfg = I.DPIALSConfig(rank=2, sweeps=2, max_ratings_per_user=5)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-4, n_users=18, releases=2,
                         placement=placement, secure_aggregation=secure)
    cls = SecureAggregationPrivatizer if secure else UserLevelPrivatizer
    priv = cls(spec, I.user_bounds(cfg), fed.n_clients, seed=1)
    result = simulate(registry.get("dp-ials"), cfg, fed, rounds=3, per_round=3, seed=1,
                      privatizer=priv, aggregator=priv.aggregate, evaluate_every=0)
    report = priv.report()
    zs = [r["noise_multiplier"] for r in report["releases"]]
    assert len(zs) == 2 and [r["round"] for r in report["releases"]] == [1, 2]
    rdp = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    for z in zs:
        rdp.compose(dpa.GaussianDpEvent(z))
    assert rdp.get_epsilon(1e-4) == pytest.approx(report["epsilon_max"], rel=1e-6)
    assert 3.99 < report["epsilon_max"] <= 4.0
    assert np.all(np.isfinite(result.global_msg.V))


def test_prior_counts_move_by_at_most_their_declared_norm_when_a_user_is_removed():
    """dp-ials's prior counts are declared as a small-norm array of each release: removing
    any user moves the uploaded counts by at most sqrt(k_p) (the privacy layer's
    sensitivity of that array), and the array gets the configured share of the release."""
    from privacy.user_level import array_sensitivity, array_shares

    cfg = I.DPIALSConfig(rank=2, prior_items_per_user=2, prior_share=0.2)
    b = _federation(4).train[1]
    bounds = I.user_bounds(cfg)
    assert bounds.centre == ("pop",) and bounds.noise_fields["pop"] == "pop_noise"
    assert array_sensitivity(bounds, "pop") == pytest.approx(np.sqrt(2.0))
    assert array_shares(bounds)["pop"] == pytest.approx(0.2)
    glob = I.GlobalModel(V=I.initial_v(b.n_items, cfg, np.random.default_rng(0)), sweep=0,
                         counts=np.zeros(b.n_items))
    state = I.init_client(b, glob, cfg, np.random.default_rng(0))
    full = I.client_step(glob, state, b, cfg, np.random.default_rng(0))[1].pop
    worst = 0.0
    for user in range(b.n_users):
        keep = b.rows != user
        rest = RatingBlock(b.rows[keep], b.cols[keep], b.vals[keep], b.n_users, b.n_items)
        pop = I.client_step(glob, state, rest, cfg, np.random.default_rng(0))[1].pop
        worst = max(worst, float(np.linalg.norm(full - pop)))
    assert np.sqrt(2.0) - 1e-9 <= worst <= np.sqrt(2.0) + 1e-12  # users rate >= 2 items


def test_no_prior_releases_no_counts_and_serves_the_plain_ials_scores():
    cfg = I.DPIALSConfig(rank=2, popularity_prior=0.0)
    assert I.user_bounds(cfg).centre == ()
    fed = _federation()
    alg = registry.get("dp-ials")
    res = simulate(alg, cfg, fed, rounds=cfg.sweeps + 1, per_round=3, seed=0,
                   evaluate_every=0)
    assert res.global_msg.prior is None
    a, b = alg.factors(res.global_msg, res.local_states[0])
    assert a.shape[1] == b.shape[0] == cfg.d
    with pytest.raises(ValueError, match="popularity_prior"):
        I.IALSConfig(popularity_prior=-1.0)
    with pytest.raises(ValueError, match="prior_share"):
        I.DPIALSConfig(prior_share=1.0)


def test_prior_orders_the_list_where_the_factors_know_little():
    """The popularity prior's row ranks items by their released counts: with a zero user
    factor and beta > 0 the served list is the popularity list; beta 0 leaves the item
    bias alone."""
    n = 6
    counts = np.array([5.0, 50.0, 0.0, 20.0, 1.0, 50.0])
    glob = I.GlobalModel(V=np.zeros((2, n)), sweep=1, counts=counts,
                         prior=I.popularity_row(counts), prior_weight=0.5)
    state = I.LocalState(U=np.zeros((1, 1)), bias_coordinate=1.0)
    a, b = I.factors(glob, state)
    assert list(np.argsort(-(a @ b)[0], kind="stable")) == [1, 5, 3, 0, 4, 2]
    assert I.popularity_row(counts).std() == pytest.approx(1.0)
    np.testing.assert_array_equal(I.popularity_row(np.full(n, 3.0)), np.zeros(n))


def test_prior_chosen_on_a_carve_out_follows_the_data():
    """choose_prior_weight picks a large beta where the choices are popularity only (the
    skewed synthetic set: items drawn regardless of the user) and a small one where users
    have tastes (two groups with their own items); the chosen beta lifts ials's NDCG on
    the skewed set's carve-out to the popularity list's level."""
    from algorithms.data import build_federation, split_block
    from bench.skewed_ratings import generate_skewed_ratings

    def carve(fed):
        rng = np.random.default_rng(5)
        parts = [split_block(b, 0.2, rng) for b in fed.train]
        return Federation([p[0] for p in parts], [p[1] for p in parts], fed.user_ids,
                          fed.item_ids, fed.scale)

    def chosen(fed, cfg):
        alg = registry.get("ials")
        res = simulate(alg, cfg, fed, rounds=cfg.sweeps + 1, per_round=fed.n_clients,
                       seed=0, evaluate_every=0)
        return I.choose_prior_weight(res.global_msg, res.local_states, fed.train, fed.test,
                                     [fed.scale] * fed.n_clients)

    skewed = carve(build_federation(generate_skewed_ratings(
        n_users=1500, n_items=300, n_ratings=6000, seed=1), 4, 0, 0.2))
    beta, scores = chosen(skewed, I.IALSConfig(rank=8, sweeps=4))
    pop = sum(np.bincount(t.cols, minlength=skewed.n_items) for t in skewed.train)
    from algorithms.ranking import RankingReport, RankingSums, relevance_threshold, tenant_ranking
    total = RankingSums(skewed.n_items)
    for tr, te in zip(skewed.train, skewed.test, strict=True):
        total = total.add(tenant_ranking(np.ones((tr.n_users, 1)), pop[None, :].astype(float),
                                         tr, te, relevance_threshold(skewed.scale)))
    pop_ndcg = RankingReport.from_sums(total, 10, None).ndcg_at_k
    assert beta >= 1.0
    assert scores[beta] > 1.3 * scores[0.0]
    assert scores[beta] >= 0.97 * pop_ndcg
    tastes = _two_tastes()
    tastes = carve(Federation(tastes.train, tastes.train, tastes.user_ids, tastes.item_ids,
                              tastes.scale))
    beta, scores = chosen(tastes, I.IALSConfig(rank=4, sweeps=4))
    assert beta <= 0.1 and scores[beta] > scores[10.0]


def _noisy_counts_model(counts: np.ndarray, factor: np.ndarray, noise_std: float,
                        t: float = 3.0) -> I.GlobalModel:
    """A rank-1 model whose released prior counts ``counts`` carry noise of standard
    deviation ``noise_std`` (set by server_step from the uploads' pop_noise, as the
    privatizer leaves it), item j's factor ``factor[j]`` and a zero item bias."""
    n = counts.size
    cfg = I.DPIALSConfig(rank=1, count_gate=t, popularity_prior=0.0)
    state = I.ServerState(V=np.zeros((2, n)), sweep=0, counts=np.zeros(n))
    # two tenants' uploads whose noise adds in quadrature to noise_std
    half = noise_std / np.sqrt(2.0)
    ups = {i: I.Upload(A=np.tile(np.eye(2), (n + 1, 1, 1)), b=np.zeros((n, 2)),
                       gram_noise=1.0, rhs_noise=1.0, pop=counts / 2, pop_noise=half)
           for i in range(2)}
    new, glob = I.server_step(state, ups, cfg, None)
    assert new.pop_noise == pytest.approx(noise_std)
    return glob.replace(V=np.vstack([factor, np.zeros(n)]))


def _top10(glob: I.GlobalModel) -> list[int]:
    a, b = I.factors(glob, I.LocalState(U=np.ones((1, 1)), bias_coordinate=1.0))
    return list(np.argsort(-(a @ b)[0], kind="stable")[:10])


def test_an_item_whose_released_count_is_within_the_noise_needs_a_far_larger_score():
    """Items 0-9 counted far above the noise (1000 against s = 10) with factor score 1;
    items 10-18 likewise at 0.5; item 19's released count is 5 (half a standard deviation:
    indistinguishable from an item nobody chose). Unweighted, its factor score 2 would top
    the list; weighted by g = 5 / (5 + 3 * 10) = 1/7 it scores 2/7 and stays out. It
    enters only with a factor score above the rule's bound, (n + t s) / n = 7 times the
    10th best weighted score (1000 / 1030). Without noise nothing is weighted."""
    counts = np.r_[np.full(19, 1000.0), 5.0]
    factor = np.r_[np.ones(10), np.full(9, 0.5), 2.0]
    glob = _noisy_counts_model(counts, factor, 10.0)
    np.testing.assert_allclose(glob.item_weight, np.r_[np.full(19, 1000 / 1030), 1 / 7])
    assert 19 not in _top10(glob)
    assert _top10(glob.replace(item_weight=None))[0] == 19  # what the noise alone did
    bound = 7 * 1000 / 1030
    assert 19 not in _top10(glob.replace(V=np.vstack([np.r_[factor[:19], 0.99 * bound],
                                                       np.zeros(20)])))
    assert _top10(glob.replace(V=np.vstack([np.r_[factor[:19], 1.01 * bound],
                                            np.zeros(20)])))[0] == 19
    # a negative noisy count reads as 0: no factor score at all
    assert I.count_weights(np.array([-3.0, 0.0, 30.0]), 10.0, 3.0) == pytest.approx(
        [0.0, 0.0, 0.5])
    assert I.count_weights(counts, 0.0, 3.0) is None  # no noise: plain ials scores
    assert I.count_weights(counts, 10.0, 0.0) is None  # count_gate 0: off
    with pytest.raises(ValueError, match="count_gate"):
        I.DPIALSConfig(count_gate=-1.0)


def test_dp_runs_weight_items_by_their_noisy_counts_and_plain_ials_does_not():
    """Through the privacy layer the count noise the privatizer reports reaches the model's
    item weights (each in [0, 1)) with count_gate > 0; a noise-free ials run has none, nor
    a DP run with the default (off)."""
    from privacy.user_level import UserLevelPrivatizer, UserLevelSpec

    assert I.DPIALSConfig().count_gate == 0.0
    fed = _federation()
    cfg = I.DPIALSConfig(rank=2, sweeps=2, max_ratings_per_user=5, count_gate=3.0)
    spec = UserLevelSpec(epsilon=4.0, delta=1e-4, n_users=18, releases=2)
    priv = UserLevelPrivatizer(spec, I.user_bounds(cfg), fed.n_clients, seed=1)
    res = simulate(registry.get("dp-ials"), cfg, fed, rounds=3, per_round=3, seed=1,
                   privatizer=priv, aggregator=priv.aggregate, evaluate_every=0)
    assert res.server_state.pop_noise > 0
    g = res.global_msg.item_weight
    assert g is not None and np.all((g >= 0) & (g < 1))
    np.testing.assert_allclose(g, I.count_weights(
        res.server_state.pop_sum / res.server_state.pop_weight, res.server_state.pop_noise,
        3.0))
    off = I._global(res.server_state, cfg.model_copy(update={"count_gate": 0.0}))
    assert off.item_weight is None
    plain = simulate(registry.get("ials"), I.IALSConfig(rank=2, sweeps=2), fed, rounds=3,
                     per_round=3, seed=1, evaluate_every=0)
    assert plain.global_msg.item_weight is None and plain.server_state.pop_noise == 0
