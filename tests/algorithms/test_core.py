"""Messages, rating blocks, seeded streams, data loading and the simulation driver."""

from __future__ import annotations

import dataclasses
import gzip
import io

import numpy as np
import pytest

from algorithms import Algorithm, AlgorithmConfig, Message, RatingBlock, messages_equal
from algorithms.data import build_federation, load_ratings
from algorithms.rng import client_rng, derive_rng, sample_clients
from algorithms.simulate import evaluate, simulate


@dataclasses.dataclass(frozen=True)
class _Msg(Message):
    a: np.ndarray
    b: np.ndarray | None
    k: int
    name: str
    flag: bool
    x: float


def test_message_round_trip_is_bit_exact():
    m = _Msg(np.array([[1.0, np.nan], [-0.0, 1e-300]]), None, 3, "é", True, 0.1)
    back = Message.from_bytes(m.to_bytes())
    assert type(back) is _Msg and messages_equal(m, back)
    assert back.a.dtype == np.float64 and back.b is None and back.name == "é"
    assert m.nbytes() == 32


def test_message_refuses_unserialisable_field():
    with pytest.raises(TypeError, match=r"_Msg.name: cannot serialise"):
        _Msg(np.zeros(1), None, 1, ["list"], False, 0.0).to_bytes()  # type: ignore[arg-type]


def test_messages_equal_sees_one_bit():
    a = _Msg(np.array([1.0]), None, 1, "", False, 0.0)
    assert not messages_equal(a, a.replace(a=np.array([np.nextafter(1.0, 2.0)])))
    assert not messages_equal(a, a.replace(k=2))


def test_rating_block_validates_and_builds_csr():
    b = RatingBlock([0, 1, 1], [2, 0, 2], [1.0, 2.0, 3.0], 2, 3)
    np.testing.assert_array_equal(b.csr.toarray(), [[0, 0, 1], [2, 0, 3]])
    np.testing.assert_array_equal(b.rated_items, [0, 2])
    with pytest.raises(ValueError, match="column index out of range"):
        RatingBlock([0], [3], [1.0], 1, 3)
    with pytest.raises(ValueError, match="ratings must be finite"):
        RatingBlock([0], [0], [np.nan], 1, 3)


def test_streams_are_independent_and_reproducible():
    a = derive_rng(1, 2, 3).random(4)
    np.testing.assert_array_equal(a, derive_rng(1, 2, 3).random(4))
    assert not np.array_equal(a, derive_rng(1, 3, 2).random(4))
    assert not np.array_equal(client_rng(1, 2, 0).random(4), client_rng(1, 2, 1).random(4))
    s = sample_clients(np.random.default_rng(0), 100, 10)
    assert len(set(s.tolist())) == 10 and np.all(np.diff(s) > 0)
    np.testing.assert_array_equal(sample_clients(np.random.default_rng(0), 5, 9), np.arange(5))


@pytest.mark.parametrize("text, sep", [
    ("1\t10\t4\t881250949\n2\t10\t3\t1\n", "tab"),
    ("1::10::4\n2::10::3\n", "colons"),
    ("user,item,rating\n1,10,4\n2,10,3\n", "csv with header"),
])
def test_load_ratings_formats(tmp_path, text, sep):
    path = tmp_path / "r.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
    r = load_ratings(path)
    np.testing.assert_array_equal(r.users, [1, 2])
    np.testing.assert_array_equal(r.items, [10, 10])
    np.testing.assert_array_equal(r.values, [4.0, 3.0])


def _toy_ratings(n_users=40, n_items=9, seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(n_users), n_items)
    items = np.tile(np.arange(n_items) * 10, n_users)
    keep = rng.random(users.size) < 0.6
    from algorithms.data import Ratings
    return Ratings(users[keep] + 1000, items[keep], rng.integers(1, 6, keep.sum()).astype(float))


def test_federation_partitions_users_and_splits_ratings():
    r = _toy_ratings()
    fed = build_federation(r, 4, seed=0)
    assert fed.n_clients == 4 and fed.n_items == 9 and fed.scale == (1.0, 5.0)
    all_users = np.concatenate(fed.user_ids)
    assert sorted(all_users.tolist()) == sorted(set(r.users.tolist()))  # disjoint cover
    n_train = sum(b.nnz for b in fed.train)
    n_test = sum(b.nnz for b in fed.test)
    assert n_train + n_test == len(r) and n_test == round(0.2 * len(r))
    # every stored triple is a real one, mapped back through the id tables
    real = set(zip(r.users.tolist(), r.items.tolist(), r.values.tolist(), strict=True))
    for blocks in (fed.train, fed.test):
        for i, b in enumerate(blocks):
            got = zip(fed.user_ids[i][b.rows].tolist(), fed.item_ids[b.cols].tolist(),
                      b.vals.tolist(), strict=True)
            assert set(got) <= real
    again = build_federation(r, 4, seed=0)
    assert all(np.array_equal(a.vals, b.vals) for a, b in zip(fed.test, again.test, strict=True))


# A toy algorithm: the global message is the item means of the uploads; clients upload
# their own column sums and counts (fine for a driver test, not for privacy).
@dataclasses.dataclass(frozen=True)
class _G(Message):
    v: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Up(Message):
    s: np.ndarray


class _Cfg(AlgorithmConfig):
    rank: int = 1


def _toy() -> Algorithm:
    return Algorithm(
        name="toy", config=_Cfg,
        init_server=lambda n, p, cfg, rng: (_G(np.zeros(n)), _G(np.zeros(n))),
        init_client=lambda block, g, cfg, rng: _G(np.ones(block.n_users)),
        client_step=lambda g, loc, block, cfg, rng: (
            loc, _Up(np.bincount(block.cols, block.vals, block.n_items) + rng.random())),
        server_step=lambda s, ups, cfg, rng: (s, _G(np.mean([u.s for u in ups.values()], 0)
                                                    if ups else s.v)),
        factors=lambda g, loc: (loc.v[:, None], g.v[None, :]),
        objective=lambda g, loc, block, cfg: 0.0,
    )


def test_simulate_calls_privatizer_and_honours_refusals():
    fed = build_federation(_toy_ratings(), 4, seed=1)
    seen = []

    def privatizer(up, client, round_):
        seen.append((round_, client))
        return None if client == 0 else up.replace(s=up.s * 0)

    res = simulate(_toy(), _Cfg(), fed, rounds=3, per_round=2, seed=5, privatizer=privatizer)
    assert [r for r, _ in seen] == [1, 1, 2, 2, 3, 3]
    for rec, rnd in zip(res.history, (1, 2, 3), strict=True):
        clients = [c for r, c in seen if r == rnd]
        assert rec.participants == 2 and rec.uploads == 2 - clients.count(0)
    assert np.all(res.global_msg.v == 0)


def test_evaluate_clips_to_scale_and_counts_every_entry():
    fed = build_federation(_toy_ratings(), 2, seed=1)
    alg = _toy()
    glob = _G(np.full(fed.n_items, 9.0))
    locs = [_G(np.ones(b.n_users)) for b in fed.test]
    rmse, mae = evaluate(alg, glob, locs, fed.test, (1.0, 5.0))
    vals = np.concatenate([b.vals for b in fed.test])
    assert rmse == pytest.approx(np.sqrt(np.mean((5.0 - vals) ** 2)))
    assert mae == pytest.approx(np.mean(np.abs(5.0 - vals)))


def test_block_bytes_round_trip_and_tenant_splits():
    from algorithms.data import federation_from_tenants

    b = RatingBlock([0, 1, 1, 2, 2], [2, 0, 2, 1, 3], [1.0, 2.5, 3.0, 4.0, 5.0], 3, 4)
    back = RatingBlock.from_bytes(b.to_bytes())
    assert back.shape == (3, 4)
    for name in ("rows", "cols", "vals"):
        np.testing.assert_array_equal(getattr(back, name), getattr(b, name))
    fed = federation_from_tenants([b, back], [np.arange(3), np.arange(3)], np.arange(4),
                                  seed=3, test_fraction=0.4)
    assert [t.nnz for t in fed.test] == [2, 2] and [t.nnz for t in fed.train] == [3, 3]
    # tenant streams differ, and the split is a partition of each block
    for tr, te in zip(fed.train, fed.test, strict=True):
        got = sorted(zip(np.r_[tr.rows, te.rows].tolist(), np.r_[tr.cols, te.cols].tolist(),
                         strict=True))
        assert got == sorted(zip(b.rows.tolist(), b.cols.tolist(), strict=True))


def test_a_message_of_an_algorithm_not_yet_imported_is_read_and_others_are_refused():
    """A process that never ran an algorithm (the API deleting a user) still reads its
    stored states; a payload naming a module outside the algorithms package is refused
    without importing it."""
    import json
    import subprocess
    import sys

    code = ("import sys, numpy as np\n"
            "from algorithms.messages import Message\n"
            "assert 'algorithms.fedmc_admm' not in sys.modules\n"
            "m = Message.from_bytes(sys.stdin.buffer.read())\n"
            "print(type(m).__module__, m.U.shape)\n")
    from algorithms import fedmc_admm

    state = fedmc_admm.LocalState(U=np.ones((3, 2)), W=np.zeros((4, 2)),
                                  Y=np.zeros((4, 2)), mean=3.0, rank=2)
    out = subprocess.run([sys.executable, "-c", code], input=state.to_bytes(),
                         capture_output=True, check=True)
    assert out.stdout.decode().split() == ["algorithms.fedmc_admm", "(3,", "2)"]
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(
        {"type": "os.path.Evil", "scalars": {}}).encode(), dtype=np.uint8))
    with pytest.raises(ValueError, match="unknown message type 'os.path.Evil'"):
        Message.from_bytes(buf.getvalue())
