"""`python -m bench.mixed_load --quick`: the mixed load runs end to end against real
PostgreSQL, Redis, a Celery worker and ``fedrec serve --workers 2``, and its per-type
figures are computed from wrk's records (checked here on a hand-made record file)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.mixed_load import figures

ROOT = Path(__file__).resolve().parents[1]


def _require(what: str, ok: bool) -> None:
    if not ok:
        if os.environ.get("CI") or os.environ.get("FEDREC_REQUIRE_SERVICES"):
            pytest.fail(f"{what} is missing; the mixed-load benchmark needs it", pytrace=False)
        pytest.skip(f"{what} is missing")


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    except OSError:
        return False
    return True


@pytest.mark.integration
def test_quick_mixed_load_serves_both_types_without_errors(tmp_path):
    _require("PostgreSQL at 127.0.0.1:5432", _reachable(5432))
    _require("Redis at 127.0.0.1:6379", _reachable(6379))
    _require("wrk", shutil.which("wrk") is not None)
    out = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "bench.mixed_load", "--quick", "--json",
                          str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert json.loads(run.stdout[run.stdout.index("{"):]) == summary
    recs, ups, total = summary["recommendations"], summary["uploads"], summary["total"]
    assert recs["requests"] > 0 and ups["requests"] > 0
    assert recs["errors"] == ups["errors"] == total["errors"] == 0, summary
    assert set(recs["statuses"]) == {"200"} and set(ups["statuses"]) == {"200"}
    assert total["requests"] == recs["requests"] + ups["requests"]
    assert 0.0 < total["upload_share"] < 0.5
    assert 0 < recs["p50_ms"] <= recs["p99_ms"] <= recs["max_ms"]
    # paced: a Poisson stream at the offered 100 requests/s, not the closed loop's hundreds
    assert summary["offered_rps"] == 100.0
    assert 50 < total["rps"] < 130, total
    job = summary["job"]
    assert job["running_throughout"] and job["statuses"] == ["running"], job
    assert job["round_at_end"] >= job["round_at_start"] >= 1


def test_figures_are_per_type_percentiles_rates_and_errors():
    rng = np.random.default_rng(3)
    rec_us, up_us = rng.uniform(100, 9000, 300), rng.uniform(5000, 90000, 40)
    lines = ["summary 2000000 342 0 1 0 2 0"]  # 2 s; one read error
    lines += [f"1 200 {v:.1f}" for v in rec_us]
    lines += ["1 404 1500.0"]
    lines += [f"2 200 {v:.1f}" for v in up_us] + ["2 422 7000.0"]
    fig = figures("\n".join(lines) + "\n")
    rec_all = np.r_[np.round(rec_us, 1), 1500.0] / 1000
    up_all = np.r_[np.round(up_us, 1), 7000.0] / 1000
    assert fig["recommendations"]["requests"] == 301 and fig["uploads"]["requests"] == 41
    assert fig["recommendations"]["rps"] == 150.5 and fig["uploads"]["rps"] == 20.5
    assert fig["recommendations"]["p99_ms"] == round(float(np.percentile(rec_all, 99)), 2)
    assert fig["uploads"]["p50_ms"] == round(float(np.percentile(up_all, 50)), 2)
    assert fig["uploads"]["max_ms"] == round(float(up_all.max()), 2)
    assert fig["recommendations"]["errors"] == 1 and fig["uploads"]["errors"] == 1
    assert fig["recommendations"]["statuses"] == {"200": 300, "404": 1}
    assert fig["socket_errors"] == {"connect": 0, "read": 1, "write": 0, "timeout": 0}
    assert fig["total"]["errors"] == 3 and fig["total"]["requests"] == 342
    assert fig["total"]["upload_share"] == round(41 / 342, 4)
