"""API keys and the admin token. Keys are random; only their SHA-256 is stored.

A key reads ``fk_<prefix>_<secret>``: the 12-character prefix is stored in clear and finds
the row, the SHA-256 of the whole key is compared in constant time. Keys carry 256 bits of
entropy, so a fast hash is enough (no password-stretching needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "fk"
PREFIX_LENGTH = 12


def hash_key(key: str) -> str:
    """Hex SHA-256 of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> tuple[str, str, str]:
    """A new key as ``(full_key, prefix, key_hash)``."""
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    key = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    return key, prefix, hash_key(key)


def key_prefix(key: str) -> str | None:
    """The lookup prefix of a well-formed key, else None."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != PREFIX_LENGTH:
        return None
    return parts[1]


def same_secret(given: str, expected_hash_or_token: str, hashed: bool = True) -> bool:
    """Constant-time comparison of a presented secret with a stored hash or token."""
    candidate = hash_key(given) if hashed else given
    return hmac.compare_digest(candidate.encode(), expected_hash_or_token.encode())


class KeyCache:
    """Per-process cache of verified API keys: key hash -> (tenant, last check).

    A key is re-verified against the database about once every ``ttl`` seconds per process
    (by one request, while the others keep using it; see :mod:`app.cache`), so serving does
    not pay a query per request. A revocation is immediate in the process that made it
    (:meth:`forget`) and reaches the other processes within a few ``ttl``.
    """

    def __init__(self, ttl: float) -> None:
        from app.cache import SingleFlight

        self.ttl = ttl
        self._flight = SingleFlight(ttl)
        self._entries: dict[str, tuple[object, float]] = {}

    def get(self, key_hash: str, now: float) -> object | None:
        """The cached tenant, or None when the caller must verify the key (then ``put``
        or ``drop``)."""
        from app.cache import REFRESH

        hit = self._entries.get(key_hash)
        if hit is None or self._flight.state(key_hash, hit[1], now) == REFRESH:
            return None
        return hit[0]

    def lookup(self, key_hash: str, now: float) -> tuple[object | None, bool]:
        """(cached tenant or None, whether this caller should re-verify the key)."""
        from app.cache import REFRESH

        hit = self._entries.get(key_hash)
        if hit is None:
            return None, True
        return hit[0], self._flight.state(key_hash, hit[1], now) == REFRESH

    def put(self, key_hash: str, tenant: object, now: float) -> None:
        if self.ttl > 0:
            if len(self._entries) > 100_000:
                self._entries.clear()
            self._entries[key_hash] = (tenant, now)
        self._flight.done(key_hash)

    def drop(self, key_hash: str) -> None:
        """A verification failed: never serve this key from memory again."""
        self._entries.pop(key_hash, None)
        self._flight.done(key_hash)

    def forget(self) -> None:
        self._entries.clear()
