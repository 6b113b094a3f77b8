"""`python -m bench.scale_out` at a small size: a synthetic set uploaded through the API into
PostgreSQL, then one job run by 1 and by 2 real Celery worker processes on Redis, which
must give the same model (which worker runs which client step cannot change a number)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_scale_out_small_uploads_everything_and_two_workers_train_the_same_model(
        tmp_path, postgres_admin, redis_test_url):
    out = tmp_path / "scale_out.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "scale_out", "--quick", "--port", "8743",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "FEDREC_BENCH_REDIS": redis_test_url})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["quick"] and result["command"].startswith("python -m bench scale_out --quick")
    assert result["shape"] == {"ratings": 60000, "users": 1200, "items": 400, "tenants": 8}
    assert result["upload"]["rows_per_second"] > 0 and result["ratings_table_mib"] > 0
    one, two = result["runs"]
    assert (one["workers"], two["workers"]) == (1, 2)
    for r in (one, two):
        assert len(r["round_seconds"]) == len(r["test_rmse"]) == 3
        assert all(s > 0 for s in r["round_seconds"])
        assert r["peak_rss_mib"]["workers"] > 0 and r["peak_rss_mib"]["api"] > 0
    assert one["test_rmse"] == two["test_rmse"] and result["same_model"]
    assert one["test_rmse"][-1] < one["test_rmse"][0]  # it trained
