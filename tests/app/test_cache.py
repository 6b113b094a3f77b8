from app.cache import EXPIRED, FRESH, REFRESH, STALE_OK, SingleFlight
from app.security import KeyCache


def test_one_reader_refreshes_ahead_while_the_others_serve_and_nothing_expired_is_served():
    f = SingleFlight(ttl=1.0)
    assert f.state("t", checked=10.0, now=10.4) == FRESH
    assert f.state("t", checked=10.0, now=10.6) == REFRESH  # half-way: renew in background
    assert f.state("t", checked=10.0, now=10.7) == STALE_OK  # the others, meanwhile
    f.done("t")  # the refresh failed: the next reader past half-way tries again
    assert f.state("t", checked=10.0, now=10.8) == REFRESH
    assert f.state("t", checked=10.0, now=11.0) == EXPIRED  # at the TTL, whatever happens
    assert f.state("t", checked=10.0, now=70.0) == EXPIRED
    assert SingleFlight(ttl=0.0).state("t", checked=10.0, now=10.0) == EXPIRED


def test_a_key_is_never_served_from_memory_past_the_ttl_nor_after_a_failed_check():
    cache = KeyCache(ttl=1.0)
    cache.put("h", "tenant", now=0.0)
    assert cache.get("h", now=0.4) == "tenant"
    assert cache.lookup("h", now=0.6) == ("tenant", True)  # this caller re-verifies aside
    assert cache.lookup("h", now=0.7) == ("tenant", False)  # others keep serving meanwhile
    assert cache.lookup("h", now=1.0) == (None, True)  # expired: verify before answering
    assert cache.lookup("h", now=60.0) == (None, True)  # the idle process
    assert cache.get("h", now=60.0) is None
    cache.put("h", "tenant", now=60.0)
    cache.drop("h")  # the key was revoked
    assert cache.get("h", now=60.1) is None
