"""``fedrec agent``: a tenant's side of a federation, run on the tenant's own machine.

The agent reads the tenant's ratings (a CSV/TSV/JSON file or a SQL query), validates them
with the upload API's rules (:mod:`algorithms.ingest`, pure), joins the training jobs its tenant
is enrolled in as an agent, runs the client step and the tenant-placed privacy locally, and
sends only the privatised upload. U_i, the rating blocks and the tenant's own privacy ledger
stay in its state directory; it refuses to transmit past its own budget, and serves its
users' recommendations from its own factors.

Imports only the pure layers (algorithms, privacy) and the client (:mod:`fedrec`) with
httpx: none of the server's modules (``app``, ``worker``), no FastAPI, SQLAlchemy models or
Celery (SQLAlchemy is imported only for ``--sql-url``); the upload rules it shares with
the API (algorithms.ingest, algorithms.readers) live below both (tests/test_layers.py).
"""
