"""The one place privacy randomness is created: fresh noise generators and the keyed
per-user draws of privacy sampling.

Differential privacy rests on randomness the adversary cannot know. The job seed is
stored, returned by the admin API and sent to every agent, so nothing a guarantee relies
on may derive from it: it governs the public, non-private draws only (initialisation, the
train/test split, tenant selection, :mod:`algorithms.rng`). Two kinds of privacy
randomness come from here instead:

* **noise** (:func:`fresh_noise_generator`): a ``numpy.random.Generator`` over ChaCha20
  (20 rounds; Bernstein, *ChaCha, a variant of Salsa20*) keyed with 256 fresh bits from
  :mod:`secrets`, created where the noise is added (one per release) and dropped after
  it. Its key is never stored, returned, logged or sent: two runs on the same seed and
  data draw unrelated noise, and the noise of a run at one epsilon is not a multiple of
  the noise of another. Exactly-once release comes from persisting the noisy release
  before it is used, never from drawing the same noise again.
* **per-user draws** (:class:`UserPRF`): which of a user's ratings enter the released
  sums (the per-user cap) and whether the user is in a release's Poisson sample. Each
  draw is a keyed pseudo-random function of (secret key, tenant, user id, purpose, round)
  (SHAKE256 of the key-prefixed, length-prefixed input, a keyed sponge: NIST SP 800-185
  builds KMAC the same way), so the draws of one user do not depend on which other users
  the tenant holds: deleting a user changes nobody else's cap or sample. The key is
  secret to whoever holds the tenant's ratings (the coordinator process for a hosted
  tenant, :func:`process_key`; the agent's own state for an agent).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import secrets
import threading
from collections.abc import Hashable, Sequence

import numpy as np
from randomgen import ChaCha

from algorithms.block import RatingBlock
from algorithms.data import Federation

#: bytes of a per-user PRF key
KEY_BYTES = 32

_PROCESS_KEYS: collections.OrderedDict[Hashable, bytes] = collections.OrderedDict()
_PROCESS_LOCK = threading.Lock()
_PROCESS_KEYS_MAX = 4096


def fresh_noise_generator() -> np.random.Generator:
    """A generator over ChaCha20 with a fresh 256-bit key from :mod:`secrets`: the only
    source of privacy noise (see the module docstring). The key lives only inside the
    returned generator."""
    return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=20))


def new_key() -> bytes:
    """A fresh secret key for :class:`UserPRF` (256 bits from :mod:`secrets`)."""
    return secrets.token_bytes(KEY_BYTES)


def process_key(scope: Hashable) -> bytes:
    """The per-user PRF key of ``scope`` (e.g. a hosted job) in this process: created
    fresh at its first use and kept in memory only (never in a database, log or message).
    Another process, or this one after a restart, holds another key: the draws stay
    per-user independent and secret, which is all the guarantee needs (every release is
    bounded for any subset of at most k ratings per user, and a persisted release is
    reused, never drawn again)."""
    with _PROCESS_LOCK:
        key = _PROCESS_KEYS.get(scope)
        if key is None:
            key = _PROCESS_KEYS[scope] = new_key()
            if len(_PROCESS_KEYS) > _PROCESS_KEYS_MAX:
                _PROCESS_KEYS.popitem(last=False)
        return key


def _field(value: object) -> bytes:
    """``value`` as a length-prefixed byte string (no two inputs encode alike)."""
    raw = value if isinstance(value, bytes) else str(value).encode()
    return len(raw).to_bytes(4, "little") + raw


def _uniforms(raw: bytes) -> np.ndarray:
    """Uniforms in [0, 1) from 8 bytes each (the top 53 bits of a little-endian word)."""
    return (np.frombuffer(raw, dtype="<u8") >> np.uint64(11)) * (1.0 / (1 << 53))


class UserPRF:
    """Keyed per-user draws of one tenant (implements :class:`algorithms.rng.UserDraws`).

    Parameters
    ----------
    key : bytes
        The secret key (at least 16 bytes), never stored by this object anywhere else.
    tenant : hashable
        The tenant (its id, or index in a simulation): part of every input.
    user_ids : sequence
        The external id of each local user row (its string form is the input), so a
        user's draws follow the user, not its row.
    """

    __slots__ = ("_prefix", "_users")

    def __init__(self, key: bytes, tenant: Hashable, user_ids: Sequence | np.ndarray
                 ) -> None:
        if len(key) < 16:
            raise ValueError("a UserPRF key needs at least 128 bits")
        self._prefix = b"fedrec-user-prf/v1" + _field(key) + _field(tenant)
        self._users = [_field(u) for u in np.asarray(user_ids).tolist()]

    def __repr__(self) -> str:  # never shows the key
        return f"UserPRF(<secret>, {len(self._users)} users)"

    def _stream(self, purpose: str, round_: int, row: int, count: int) -> bytes:
        return hashlib.shake_256(self._prefix + _field(purpose) + _field(int(round_))
                                 + self._users[row]).digest(8 * count)

    def user_uniforms(self, purpose: str, round_: int, n_users: int) -> np.ndarray:
        """One uniform in [0, 1) per local user row ``0 .. n_users - 1`` for
        (``purpose``, ``round_``), e.g. the Poisson sample of a release."""
        if n_users > len(self._users):
            raise ValueError(f"{n_users} users but ids for {len(self._users)}")
        return _uniforms(b"".join(self._stream(purpose, round_, u, 1)
                                  for u in range(n_users)))

    def rating_uniforms(self, purpose: str, rows: np.ndarray, cols: np.ndarray,
                        users: np.ndarray | None = None) -> np.ndarray:
        """One uniform per entry (``rows[t]``, ``cols[t]``): the user's p-th draw for its
        p-th rating in column order, so deleting another user (and the items only it
        rated, which renumbers columns monotonically) changes no draw. ``users``: only
        entries of these rows are drawn (the others get 0), e.g. the users with more
        ratings than a cap."""
        rows, cols = np.asarray(rows), np.asarray(cols)
        out = np.zeros(rows.shape[0])
        order = np.lexsort((cols, rows))
        bounds = np.searchsorted(rows[order], np.arange(len(self._users) + 1))
        wanted = np.unique(rows) if users is None else np.asarray(users)
        for u in wanted.tolist():
            idx = order[bounds[u]:bounds[u + 1]]
            if idx.size:
                out[idx] = _uniforms(self._stream(purpose, 0, u, idx.size))
        return out


def with_user_draws(block: RatingBlock, key: bytes, tenant: Hashable,
                    user_ids: Sequence | np.ndarray) -> RatingBlock:
    """``block`` carrying the tenant's secret
    per-user draws (:class:`UserPRF` of ``key``): what the user-level DP algorithms draw
    their per-user cap and Poisson sample from."""
    return block.with_user_draws(UserPRF(key, tenant, user_ids))


def private_federation(fed: Federation, key: bytes | None = None) -> Federation:
    """``fed`` with training blocks that carry secret per-user draws (tenant = its index,
    users = their external ids), under ``key`` or a fresh one: a simulation's privacy
    sampling then depends on no seed."""
    key = new_key() if key is None else key
    train = [with_user_draws(b, key, i, ids)
             for i, (b, ids) in enumerate(zip(fed.train, fed.user_ids, strict=True))]
    return dataclasses.replace(fed, train=train)
