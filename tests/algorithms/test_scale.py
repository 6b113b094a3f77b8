"""Rating-scale normalisation (algorithms.scale) and the block's declared scale."""

from __future__ import annotations

import io

import numpy as np
import pytest

from algorithms import fedmavg, fedmc_admm, fedmgs
from algorithms.base import predict
from algorithms.block import RatingBlock
from algorithms.data import build_federation
from algorithms.simulate import simulate
from algorithms.synthetic import generate_ratings


def test_block_scale_round_trips_and_old_blocks_still_load():
    block = RatingBlock([0, 1], [1, 0], [0.5, 4.5], 2, 3, (0.5, 5))
    again = RatingBlock.from_bytes(block.to_bytes())
    assert again.scale == (0.5, 5.0)
    assert again.subset(np.array([True, False])).scale == (0.5, 5.0)
    # a block stored before the field existed: no "scale" array in the archive
    buf = io.BytesIO()
    np.savez_compressed(buf, rows=block.rows, cols=block.cols, vals=block.vals,
                        shape=np.array(block.shape, dtype=np.int64))
    old = RatingBlock.from_bytes(buf.getvalue())
    assert old.scale is None
    np.testing.assert_array_equal(old.vals, block.vals)


def test_bad_scale_is_refused():
    with pytest.raises(ValueError, match="scale must be"):
        RatingBlock([0], [0], [1.0], 1, 1, (5.0, 1.0))


def test_federation_blocks_carry_the_data_scale():
    r = generate_ratings(40, 30, 500, seed=0)
    r = type(r)(r.users, r.items, r.values * 2 - 10)   # 1..5 -> -8..0
    fed = build_federation(r, 4, seed=0)
    assert fed.train[0].scale == fed.test[0].scale == fed.scale == (-8.0, 0.0)


@pytest.mark.parametrize("alg,cfg", [
    (fedmc_admm.ALGORITHM, fedmc_admm.FedMCADMMConfig(rank=4, kernel="numpy")),
    (fedmavg.ALGORITHM, fedmavg.FedMAvgConfig(rank=4)),
    (fedmgs.ALGORITHM, fedmgs.FedMGSConfig(rank=4)),
])
def test_predictions_scale_with_the_ratings(alg, cfg):
    """Ratings times c on a scale times c: every step sees the same numbers, so the
    predictions are exactly c times the 1-5 run's (no setting depends on the scale)."""
    r = generate_ratings(60, 40, 900, seed=1)
    c = 2.5
    runs = []
    for factor in (1.0, c):
        rr = type(r)(r.users, r.items, r.values * factor)
        fed = build_federation(rr, 3, seed=0)
        res = simulate(alg, cfg, fed, rounds=5, per_round=3, seed=0, evaluate_every=5)
        t = fed.test[0]
        runs.append((res, predict(alg, res.global_msg, res.local_states[0], t.rows, t.cols)))
    (base, p1), (scaled, pc) = runs
    np.testing.assert_allclose(pc, c * p1, rtol=1e-9, atol=1e-9)
    assert scaled.final.test_rmse == pytest.approx(c * base.final.test_rmse, rel=1e-9)


def test_a_state_stored_before_units_keeps_training_on_raw_ratings():
    """Old local states load with scale_unit 1: their client steps must not start dividing
    the ratings by a unit derived from the block (the state's own unit rules)."""
    r = generate_ratings(30, 20, 300, seed=2)
    block = build_federation(type(r)(r.users, r.items, r.values * 2), 1, seed=0).train[0]
    cfg = fedmc_admm.FedMCADMMConfig(rank=3, kernel="numpy")
    _, glob = fedmc_admm.init_server(block.n_items, 1, cfg, np.random.default_rng(0))
    new = fedmc_admm.init_client(block, glob, cfg, np.random.default_rng(1))
    assert new.scale_unit == 2.0
    old = fedmc_admm.LocalState.from_bytes(new.to_bytes())
    old = fedmc_admm.LocalState(old.U, old.W, old.Y, 2.0 * old.mean, old.rank)  # no unit
    raw = block.with_scale((2.0, 6.0))  # unit 1: the raw ratings, as before units
    got, _ = fedmc_admm.client_step(glob, old, block, cfg, None)
    want, _ = fedmc_admm.client_step(glob, old, raw, cfg, None)
    np.testing.assert_array_equal(got.U, want.U)
    np.testing.assert_array_equal(got.W, want.W)


def test_ridge_scale_is_the_rating_variance_in_units_over_movielens():
    from algorithms.scale import ridge_scale_of

    rng = np.random.default_rng(4)
    vals = rng.uniform(-10.0, 10.0, 500)
    block = RatingBlock(np.arange(500) % 20, np.arange(500) % 37, vals, 20, 37, (-10.0, 10.0))
    # unit 5 (a spread of 20 over 4): the variance of vals / 5 over 1.1257^2, shrunk
    # toward 1 by a prior worth 200 ratings (500 / 700 of the way in logarithms)
    want = (np.mean((vals / 5 - np.mean(vals / 5)) ** 2) / 1.1257**2) ** (500 / 700)
    assert ridge_scale_of(block, 5.0) == pytest.approx(want, rel=1e-12)
    assert ridge_scale_of(block, 1.0) == pytest.approx(8.0)  # clipped at 8
    assert ridge_scale_of(block, 1000.0) == pytest.approx(0.125)  # and at 1/8
    one = RatingBlock(np.array([0]), np.array([0]), np.array([3.0]), 1, 1)
    flat = RatingBlock(np.array([0, 1]), np.array([0, 0]), np.array([3.0, 3.0]), 2, 1)
    assert ridge_scale_of(one, 1.0) == ridge_scale_of(flat, 1.0) == 1.0
    # a tenant of 3 users, one of whom rates everything 5: 40 ratings, spread 0.63 stars;
    # unshrunk its ridge fell to 0.31x (it overfitted), now 0.82x
    few = np.r_[np.full(14, 5.0), np.tile([4.0, 5.0, 4.0, 5.0, 5.0, 3.0, 5.0, 4.0], 4)
                [:26]]
    small = RatingBlock(np.arange(40) % 3, np.arange(40), few, 3, 40, (1.0, 5.0))
    raw = np.var(few) / 1.1257**2
    assert raw < 0.32
    assert ridge_scale_of(small, 1.0) == pytest.approx(raw ** (40 / 240), rel=1e-12)


def test_fedmc_admm_tenant_ridge_follows_its_own_spread():
    """Doubling a tenant's spread within the same declared scale quadruples its ridge, as
    far as its 400 ratings carry against the prior of 200 (4 ** (400 / 600))."""
    rng = np.random.default_rng(5)
    rows, cols = rng.integers(0, 30, 400), rng.integers(0, 40, 400)
    base = rng.normal(0.0, 1.0, 400)
    cfg = fedmc_admm.FedMCADMMConfig()
    states = []
    for spread in (3.0, 6.0):
        block = RatingBlock(rows, cols, spread * base, 30, 40, (-10.0, 10.0))
        _, glob = fedmc_admm.init_server(40, 1, cfg, np.random.default_rng(0))
        states.append(fedmc_admm.init_client(block, glob, cfg, np.random.default_rng(0)))
    assert states[1].ridge_scale == pytest.approx(4 ** (400 / 600) * states[0].ridge_scale,
                                                  rel=1e-12)
