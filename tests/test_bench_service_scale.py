"""`python -m bench service_scale --quick`: the Netflix-shaped service bench at 1/1000 of its
size (100,481 ratings, 480 users, the whole 17,770-item catalogue, 100 tenants) through the
real processes: uploaded through ``fedrec serve`` into PostgreSQL, a dpals and an ials job
each run by 1 and by 2 Celery workers on Redis, then top-10 lists served under wrk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_service_scale_at_a_thousandth_runs_every_phase_and_reports_sane_figures(
        tmp_path, postgres_admin, redis_test_url):
    if shutil.which("wrk") is None:
        if os.environ.get("CI"):
            pytest.fail("wrk is missing (bash .ci/setup installs it)")
        pytest.skip("wrk is not installed")
    run = subprocess.run(
        [sys.executable, "-m", "bench", "service_scale", "--quick", "--port", "8746",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=3000,
        env={**os.environ, "FEDREC_BENCH_REDIS": redis_test_url})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "service_scale_netflix_x0.001.json").read_text())
    assert result["quick"] and result["command"].startswith(
        "python -m bench service_scale --quick")
    assert result["shape"] == {"name": "netflix", "scale": 0.001, "users": 480,
                               "items": 17770, "ratings": 100481, "tenants": 100}

    upload = result["upload"]
    assert upload["rows_per_second"] > 0 and upload["csv_bytes"] > 100481 * 8
    api = upload["peak_rss_mib_per_process"]["api"]
    # serve's parent, its 2 workers (and multiprocessing's resource tracker)
    assert len(api) >= 3 and sum(20 < mib < 6000 for mib in api) >= 3
    assert upload["cpu_seconds"]["api"] > 0
    # the database holds every row (checked by the bench) and is larger than nothing
    assert upload["ratings_table_mib"] > 0 and upload["database_over_csv"] > 0.5

    jobs = result["jobs"]
    assert [(j["algorithm"], j["workers"]) for j in jobs] == [
        ("dpals", 1), ("dpals", 2), ("ials", 1), ("ials", 2)]
    for job in jobs:
        assert job["rounds"] >= 1 and job["job_wall_seconds"] > 0
        per_worker = job["peak_rss_mib_per_process"]["workers"]
        assert len(per_worker) == job["workers"] and all(mib > 20 for mib in per_worker)
        assert job["worker_cpu_seconds"] > 0
    # which worker ran which step changes no number of the model
    by_alg: dict[str, list[dict]] = {}
    for job in jobs:
        by_alg.setdefault(job["algorithm"], []).append(job["final"])
    assert by_alg["ials"][0] == by_alg["ials"][1]

    serving = result["serving"]
    assert serving["requests"] > 0 and serving["rps"] > 0
    assert serving["non_2xx"] == 0  # (a busy machine may time some out: not asserted)
    assert 0 < serving["p50_ms"] <= serving["p99_ms"]
    assert result["database_mib_at_end"] >= upload["database_mib"]
