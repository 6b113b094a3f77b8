"""The aggregated-BMF baseline (the Felb paper, eqs. 11-13, Apx. B Alg. 2)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from algorithms import RatingBlock, messages_equal
from algorithms.binary_baseline import (
    ALGORITHM,
    BaselineGlobal,
    BaselineServer,
    BaselineUpload,
    BinaryBaselineConfig,
    aggregate,
    elbmf,
    logical_or,
    majority_vote,
    refit_u,
    rounded_average,
    server_step,
)
from algorithms.binary_metrics import reconstruction_quality
from algorithms.data import Federation
from algorithms.felb import boolean, boolean_product
from algorithms.simulate import simulate
from tests.algorithms import test_contract as contract

# one (k=1, n=5) coefficient row per client; column j is 1 at exactly j of the 4 clients
FOUR = np.array([[[0, 1, 1, 1, 1]], [[0, 0, 1, 1, 1]], [[0, 0, 0, 1, 1]], [[0, 0, 0, 0, 1]]],
                dtype=bool)


def test_eq11_rounded_average_ties_go_down():
    assert rounded_average(FOUR).tolist() == [[False, False, False, True, True]]
    assert rounded_average(FOUR[:3]).tolist() == [[False, False, True, True, True]]


def test_eq12_majority_vote_ties_go_up():
    assert majority_vote(FOUR).tolist() == [[False, False, True, True, True]]
    assert majority_vote(FOUR[:3]).tolist() == [[False, False, True, True, True]]


def test_eq13_logical_or():
    assert logical_or(FOUR).tolist() == [[False, True, True, True, True]]
    assert logical_or(FOUR[3:]).tolist() == [[False, False, False, False, True]]


def test_aggregate_reads_noisy_uploads_at_one_half():
    noisy = FOUR.astype(float) + np.where(FOUR, -0.3, 0.3)  # still on the right side of 1/2
    for how, fn in [("average", rounded_average), ("vote", majority_vote), ("or", logical_or)]:
        np.testing.assert_array_equal(aggregate(noisy, how), fn(FOUR))


def test_server_aggregates_the_first_uploads_only():
    cfg = BinaryBaselineConfig(rank=1, aggregation="or")
    ups = {i: BaselineUpload(FOUR[i].astype(float)) for i in range(4)}
    state, glob = server_step(BaselineServer(np.zeros((1, 5)), False), ups, cfg, None)
    assert glob.aggregated and glob.v_hat.tolist() == [[0.0, 1.0, 1.0, 1.0, 1.0]]
    later = {0: BaselineUpload(np.ones((1, 5)))}
    state2, glob2 = server_step(state, later, cfg, None)
    assert messages_equal(state2, state) and messages_equal(glob2, glob)


def _tiles(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 40 x 30 Boolean matrix U o V with two overlapping tiles; returns (A, U, V)."""
    u = np.zeros((40, 2), dtype=bool)
    u[:25, 0] = u[15:, 1] = True
    v = np.zeros((2, 30), dtype=bool)
    v[0, :18] = v[1, 12:] = True
    perm = np.random.default_rng(seed).permutation(40)
    return boolean_product(u, v)[perm], u[perm], v


def test_refit_recovers_the_features_against_the_true_coefficients():
    a, u_true, v = _tiles()
    cfg = BinaryBaselineConfig(rank=2, refit_iters=200)
    u0 = np.random.default_rng(1).uniform(0, 1, u_true.shape)
    u = refit_u(sp.csr_array(a.astype(float)), u0, v.astype(float), cfg)
    np.testing.assert_array_equal(boolean_product(boolean(u), v), a)


def test_local_elbmf_recovers_tiles():
    a, _, _ = _tiles(2)
    cfg = BinaryBaselineConfig(rank=3, local_iters=300)
    rng = np.random.default_rng(3)
    u, v = elbmf(sp.csr_array(a.astype(float)), rng.uniform(0, 1, (40, 3)),
                 rng.uniform(0, 1, (3, 30)), cfg)
    rec = boolean_product(boolean(u), boolean(v))
    assert (rec != a).mean() <= 0.02


def _federation() -> tuple[np.ndarray, Federation]:
    a, _, _ = _tiles(4)
    train, test, uids = [], [], []
    for rows in np.array_split(np.arange(40), 4):
        r, c = np.nonzero(a[rows])
        train.append(RatingBlock(r, c, np.ones(r.size), rows.size, 30))
        test.append(RatingBlock(r[:0], c[:0], np.ones(0), rows.size, 30))
        uids.append(rows)
    return a, Federation(train, test, uids, np.arange(30), (0.0, 1.0))


def test_federated_baseline_fits_aggregates_then_refits():
    a, fed = _federation()
    cfg = BinaryBaselineConfig(rank=3, local_iters=300)
    res1 = simulate(ALGORITHM, cfg, fed, rounds=1, per_round=4, seed=0)
    assert res1.global_msg.aggregated and res1.history[0].uploads == 4
    res2 = simulate(ALGORITHM, cfg, fed, rounds=2, per_round=4, seed=0)
    assert res2.history[1].uploads == 0  # the refit round sends nothing
    np.testing.assert_array_equal(res2.global_msg.v_hat, res1.global_msg.v_hat)
    f1, _ = reconstruction_quality(ALGORITHM, res2.global_msg, res2.local_states, fed.train)
    assert f1 >= 0.95


def test_before_aggregation_the_model_is_the_local_fit():
    _, fed = _federation()
    cfg = BinaryBaselineConfig(rank=3, local_iters=50)
    res = simulate(ALGORITHM, cfg, fed, rounds=1, per_round=4, seed=0)
    glob = BaselineGlobal(np.zeros((3, 30)), False)
    a, b = ALGORITHM.factors(glob, res.local_states[0])
    np.testing.assert_array_equal(b[:3], boolean(res.local_states[0].v))


def _contract_case():
    """The contract's binary federation with every fourth entry held out (so that test RMSE
    is defined) and a short local fit."""
    fed = contract._low_rank_federation(True)
    hold = [np.arange(b.nnz) % 4 == 0 for b in fed.train]
    fed = Federation([b.subset(~h) for b, h in zip(fed.train, hold, strict=True)],
                     [b.subset(h) for b, h in zip(fed.train, hold, strict=True)],
                     fed.user_ids, fed.item_ids, fed.scale)
    return ALGORITHM, BinaryBaselineConfig(rank=contract.RANK, local_iters=200), fed


@pytest.mark.parametrize("check", [
    contract.test_config_rejects_unknown_fields,
    contract.test_factor_shapes,
    contract.test_same_seed_same_bits_other_seed_other_bits,
    contract.test_messages_round_trip_through_bytes,
    contract.test_uploads_carry_no_ratings_or_indices,
    contract.test_upload_shapes_do_not_depend_on_which_entries_are_rated,
    contract.test_client_and_server_steps_do_not_mutate_arguments,
    contract.test_objective_decreases_on_low_rank_data,
], ids=lambda f: f.__name__)
def test_baseline_passes_the_shared_contract(check):
    check(_contract_case())
