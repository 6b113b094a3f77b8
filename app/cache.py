"""Single-flight expiry with a hard bound for the per-process serving caches.

An entry read from the database at time ``checked`` (taken *before* the read began) may be
served until ``checked + ttl`` and never after, so a change committed at time T (a key
revoked, a user forgotten, a new snapshot) is seen by every process for every request that
starts after T + ttl. To keep requests from waiting on the database, the entry is renewed
ahead of its expiry: from ``ttl / 2`` on, the first reader gets ``REFRESH`` and re-checks
it in the background while the others keep serving it (``STALE_OK``). Under steady traffic
an entry is therefore renewed before it expires; after an idle spell it is ``EXPIRED`` and
the reader must re-check it before answering.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable

FRESH, STALE_OK, REFRESH, EXPIRED = "fresh", "stale-ok", "refresh", "expired"


class SingleFlight:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._claims: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def state(self, key: Hashable, checked: float, now: float) -> str:
        """FRESH, STALE_OK (someone is refreshing), REFRESH (the caller must, in the
        background) or EXPIRED (too old to serve: re-check before answering)."""
        age = now - checked
        if age >= self.ttl:
            return EXPIRED
        if age < self.ttl / 2:
            return FRESH
        with self._lock:
            claim = self._claims.get(key)
            if claim is not None and now - claim < self.ttl / 2:
                return STALE_OK
            self._claims[key] = now
            return REFRESH

    def done(self, key: Hashable) -> None:
        """The refresh of ``key`` finished (or failed): release the claim."""
        with self._lock:
            self._claims.pop(key, None)


class Coalesced:
    """Concurrent identical re-checks of one process's event loop, run once: the first
    caller starts ``fn`` in the threadpool, later callers with the same key await the same
    outcome (result or exception) until it is done.

    On a loaded machine the background renewal can fall behind and a cache entry expire;
    without this, every request arriving then re-read the database in its own threadpool
    call, and the extra load made the next renewal later still.
    """

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future] = {}

    async def run(self, key: Hashable, fn):
        from starlette.concurrency import run_in_threadpool

        future = self._running.get(key)
        if future is None:
            future = asyncio.ensure_future(run_in_threadpool(fn))
            self._running[key] = future
            future.add_done_callback(lambda _done: self._running.pop(key, None))
        return await asyncio.shield(future)
