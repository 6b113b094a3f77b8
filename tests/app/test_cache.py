from app.cache import FRESH, REFRESH, STALE_OK, SingleFlight
from app.security import KeyCache


def test_one_reader_refreshes_while_the_others_serve_and_nothing_is_served_too_old():
    f = SingleFlight(ttl=1.0)
    assert f.state("t", checked=10.0, now=10.5) == FRESH
    assert f.state("t", checked=10.0, now=11.2) == REFRESH  # the first reader past the TTL
    assert f.state("t", checked=10.0, now=11.3) == STALE_OK  # the others, meanwhile
    assert f.state("t", checked=10.0, now=12.3) == REFRESH  # the refresher took too long
    f.done("t")
    assert f.state("t", checked=10.0, now=12.4) == REFRESH
    assert f.state("t", checked=10.0, now=12.5) == STALE_OK
    assert f.state("t", checked=10.0, now=13.1) == REFRESH  # never older than 3 x TTL


def test_a_failed_verification_is_never_served_from_memory():
    cache = KeyCache(ttl=1.0)
    cache.put("h", "tenant", now=0.0)
    assert cache.get("h", now=0.5) == "tenant"
    assert cache.get("h", now=1.5) is None  # this caller re-verifies
    assert cache.get("h", now=1.6) == "tenant"  # others keep serving meanwhile
    cache.drop("h")  # the key was revoked
    assert cache.get("h", now=1.7) is None
