"""fedrec's Python client: :mod:`fedrec.client` (the service's HTTP API, typed).

It imports none of the server's modules (``app``, ``worker``): a tenant's machine or an
operator's laptop needs httpx and pydantic only.
"""
