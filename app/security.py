"""API keys and the admin token. Keys are random; only their SHA-256 is stored.

A key reads ``fk_<prefix>_<secret>``: the 12-character prefix is stored in clear and finds
the row, the SHA-256 of the whole key is compared in constant time. Keys carry 256 bits of
entropy, so a fast hash is enough (no password-stretching needed).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import math
import secrets
import threading
import time

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


#: headers on every response: no framing (clickjacking), no content sniffing, no referrer
#: beyond the origin, and a content policy that loads nothing from another host
BASE_HEADERS = [(b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
                (b"referrer-policy", b"same-origin")]
PAGE_POLICY = (b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
               b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")
#: the offline Swagger UI and ReDoc pages start themselves with an inline script
DOCS_POLICY = PAGE_POLICY.replace(b"default-src 'self';",
                                  b"default-src 'self'; script-src 'self' 'unsafe-inline';")
DOCS_PATHS = ("/docs", "/redoc")


def security_headers(path: str) -> list[tuple[bytes, bytes]]:
    """The security headers of a response to ``path`` (ASGI header pairs)."""
    policy = DOCS_POLICY if path in DOCS_PATHS else PAGE_POLICY
    return [*BASE_HEADERS, (b"content-security-policy", policy)]


class KeyCache:
    """Per-process cache of verified API keys: key hash -> (tenant, time of the check).

    A key is served from memory for at most ``ttl`` seconds after it was verified against
    the database (:mod:`app.cache`: renewed in the background from ``ttl / 2`` on, by one
    request while the others keep using it), so a revocation is refused by every process
    for every request starting ``ttl`` seconds after it committed, and at once by the
    process that made it (:meth:`forget`).
    """

    def __init__(self, ttl: float) -> None:
        from app.cache import SingleFlight

        self.ttl = ttl
        self._flight = SingleFlight(ttl)
        self._entries: dict[str, tuple[object, float]] = {}

    def get(self, key_hash: str, now: float) -> object | None:
        """The cached tenant, or None when the caller must verify the key (then ``put``
        or ``drop``)."""
        tenant, recheck = self.lookup(key_hash, now)
        return None if recheck else tenant

    def lookup(self, key_hash: str, now: float) -> tuple[object | None, bool]:
        """(cached tenant, or None when it is missing or expired; whether this caller
        should re-verify the key: before answering when the tenant is None, else in the
        background)."""
        from app.cache import EXPIRED, REFRESH

        hit = self._entries.get(key_hash)
        if hit is None:
            return None, True
        state = self._flight.state(key_hash, hit[1], now)
        if state == EXPIRED:
            return None, True
        return hit[0], state == REFRESH

    def put(self, key_hash: str, tenant: object, now: float) -> None:
        """Cache a verification that began at ``now`` (before the database was read)."""
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


class FailedSignIns:
    """Per-process bound on wrong secrets from one client: after ``limit`` failures within
    ``window`` seconds, every further attempt from that client (right or wrong) is refused
    until the oldest failure leaves the window. Guards the admin token and the dashboard
    sign-in against guessing; API keys carry 256 bits and are not limited this way."""

    def __init__(self, limit: int, window: float = 60.0) -> None:
        self.limit, self.window = limit, window
        self._lock = threading.Lock()
        self._failures: dict[str, collections.deque[float]] = {}

    def wait(self, client: str, now: float | None = None) -> int:
        """Seconds ``client`` must wait before its next attempt (0: it may try now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            recent = self._recent(client, now)
            if len(recent) < self.limit:
                return 0
            return max(1, math.ceil(recent[0] + self.window - now))

    def failed(self, client: str, now: float | None = None) -> None:
        """Count one wrong secret from ``client``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if len(self._failures) > 100_000:
                self._failures.clear()
            self._recent(client, now).append(now)

    def _recent(self, client: str, now: float) -> collections.deque[float]:
        recent = self._failures.setdefault(client, collections.deque())
        while recent and recent[0] <= now - self.window:
            recent.popleft()
        return recent
