"""Single-flight expiry for the per-process serving caches.

An entry is *fresh* for ``ttl`` seconds after it was checked against the database. The
first reader after that gets ``REFRESH`` and re-checks it; while that refresh is under
way (at most ``ttl`` seconds) the other readers get ``STALE_OK`` and keep serving the
cached value, so an expiry never sends every concurrent request to the database at once.
Nothing older than ``3 * ttl`` is ever served.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

FRESH, STALE_OK, REFRESH = "fresh", "stale-ok", "refresh"


class SingleFlight:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._claims: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def state(self, key: Hashable, checked: float, now: float) -> str:
        """FRESH, STALE_OK (someone is refreshing) or REFRESH (the caller must)."""
        age = now - checked
        if age < self.ttl:
            return FRESH
        with self._lock:
            claim = self._claims.get(key)
            if claim is not None and now - claim < self.ttl and age < 3 * self.ttl:
                return STALE_OK
            self._claims[key] = now
            return REFRESH

    def done(self, key: Hashable) -> None:
        """The refresh of ``key`` finished (or failed): release the claim."""
        with self._lock:
            self._claims.pop(key, None)
