"""What job creation holds in memory (``python -m bench.job_memory`` measures the process's
peak at 10M ratings): the dry round's discarded server state, the written round-0 server
state and a written tenant's block are let go, and freed heap pages go back to the system."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

from algorithms.block import RatingBlock
from app.training import dry_round, jobs
from app.training.jobs import JobSpec, create_job
from tests.training_helpers import CONFIG, make_tenants

RELEASE = r"""
import numpy as np
from app.training.jobs import release_memory

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) * 1024

big = np.ones(16 << 20, np.uint8)
del big  # glibc raises its mmap threshold to 16 MiB: the 1 MiB arrays below use the heap
held = [np.ones(1 << 20, np.uint8) for _ in range(200)]
tail = np.ones(1 << 20, np.uint8)  # above them on the heap: free() cannot trim the top
del held
before = rss()
assert release_memory()
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or jobs._MALLOC_TRIM is None,
                    reason="glibc's malloc_trim")
def test_release_memory_gives_freed_heap_pages_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True,
                         check=True)
    released = int(out.stdout.split()[-1])
    assert released > 150 << 20, released  # of the 200 MiB freed in the heap's middle


def test_the_block_kept_after_the_dry_round_drops_the_rounds_views():
    rng = np.random.default_rng(0)
    block = RatingBlock(rng.integers(0, 50, 400), rng.integers(0, 30, 400),
                        rng.uniform(1, 5, 400), 50, 30, (1.0, 5.0))
    block.csr, block.csc, block.compact  # noqa: B018 - what a client step caches
    kept = jobs._without_views(block)
    assert not {"csr", "csc", "compact", "rated_items"} & set(vars(kept))
    assert all(getattr(kept, a) is getattr(block, a) for a in ("rows", "cols", "vals"))
    assert kept.to_bytes() == block.to_bytes()


def test_job_creation_lets_go_of_server_states_it_no_longer_needs(env, monkeypatch):
    """The dry round's new server state (FedMC-ADMM's tenants x items x (rank + 1) C) is
    gone before its evaluation, and the round-0 server state once it is written: neither
    is alive while a later tenant's block is read."""
    app, client = env
    make_tenants(client, n=3)
    seen: dict[str, weakref.ref] = {}
    alive: dict[str, list[bool]] = {"copy at evaluation": [], "server at read": []}

    def initialise_server(*args, **kwargs):
        server, glob = real["initialise_server"](*args, **kwargs)
        seen["server"] = weakref.ref(server)
        return server, glob

    def server_round(*args, **kwargs):
        out = real["server_round"](*args, **kwargs)
        seen["copy"] = weakref.ref(out[0])
        return out

    def tenant_errors(*args, **kwargs):
        gc.collect()
        alive["copy at evaluation"].append(seen["copy"]() is not None)
        return real["tenant_errors"](*args, **kwargs)

    def tenant_block(*args, **kwargs):
        gc.collect()
        alive["server at read"].append(seen["server"]() is not None)
        return real["_tenant_block"](*args, **kwargs)

    where = {"initialise_server": jobs, "server_round": dry_round,
             "tenant_errors": dry_round, "_tenant_block": jobs}
    real = {name: getattr(module, name) for name, module in where.items()}
    for name, f in [("initialise_server", initialise_server), ("server_round", server_round),
                    ("tenant_errors", tenant_errors), ("_tenant_block", tenant_block)]:
        monkeypatch.setattr(where[name], name, f)
    with app.state.sessions() as s:
        tids = [t["id"] for t in client.get("/v1/admin/tenants").json()["data"]]
        job = create_job(s, JobSpec("fedmc-admm", tids, 2, 0, 5, CONFIG, {"mechanism": "none"}))
        assert job.id
    assert alive["copy at evaluation"] == [False]
    # the first read feeds the dry round (which needs the server state); the others follow
    # the state's write
    assert alive["server at read"] == [True, False, False]
