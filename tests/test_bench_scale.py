"""The scale benchmark at its --quick size, and the tenant-partitioned generator it uses."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from algorithms.synthetic import MOVIELENS_HISTOGRAM, generate_tenant_ratings

ROOT = Path(__file__).resolve().parents[1]


def _flat(tr):
    users = np.concatenate([tr.user_ids[t][b.rows] for t, b in enumerate(tr.blocks)])
    items = np.concatenate([b.cols for b in tr.blocks]).astype(np.int64)
    return users, items, np.concatenate([b.vals for b in tr.blocks])


def test_tenant_generator_counts_pairs_histogram_and_seed():
    tr = generate_tenant_ratings(600, 300, 24_000, 7, rank=4, seed=5)
    users, items, vals = _flat(tr)
    assert tr.n_ratings == len(vals) == 24_000
    assert len(tr.blocks) == 7 and sum(b.n_users for b in tr.blocks) == 600
    assert np.unique(users * 300 + items).size == 24_000  # distinct pairs
    assert users.min() == 0 and users.max() == 599 and items.max() < 300
    # user ids: disjoint contiguous ranges covering everyone, rows local to the tenant
    assert np.array_equal(np.concatenate(tr.user_ids), np.arange(600))
    assert np.bincount(users, minlength=600).min() >= 1
    shares = np.bincount(vals.astype(int), minlength=6)[1:] / len(vals)
    np.testing.assert_allclose(shares, MOVIELENS_HISTOGRAM / MOVIELENS_HISTOGRAM.sum(),
                               atol=0.005)
    pop = np.sort(np.bincount(items, minlength=300))[::-1]
    assert pop[:30].sum() > 0.3 * pop.sum()  # top 10% of items hold > 30% of ratings
    again = generate_tenant_ratings(600, 300, 24_000, 7, rank=4, seed=5)
    for a, b in zip(tr.blocks, again.blocks, strict=True):
        np.testing.assert_array_equal(a.rows, b.rows)
        np.testing.assert_array_equal(a.vals, b.vals)
    other = generate_tenant_ratings(600, 300, 24_000, 7, rank=4, seed=6)
    assert not np.array_equal(_flat(other)[2], vals)


def test_tenant_generator_fills_saturated_tenants_and_rejects_bad_sizes():
    tr = generate_tenant_ratings(20, 10, 190, 4, seed=0)  # 95% of all pairs
    users, items, _ = _flat(tr)
    assert tr.n_ratings == 190 and np.unique(users * 10 + items).size == 190
    with pytest.raises(ValueError, match="exceeds"):
        generate_tenant_ratings(3, 3, 10, 1)
    with pytest.raises(ValueError, match="n_tenants"):
        generate_tenant_ratings(3, 3, 5, 4)


def test_scale_benchmark_quick(tmp_path):
    from bench.scale import QUICK_SIZES, SHAPES

    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    run = subprocess.run([sys.executable, "-m", "bench.scale", "--quick", "--json", str(out),
                          "--png", str(png)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["quick"] is True
    wanted = [(s, n) for s in QUICK_SIZES for n in QUICK_SIZES[s]]
    assert [(r["shape"], r["n_ratings"]) for r in doc["sizes"]] == wanted
    for r in doc["sizes"]:
        users, items, full = SHAPES[r["shape"]]
        assert r["n_items"] == items
        assert r["n_users"] == round(users * r["n_ratings"] / full)
        assert r["users_with_ratings"] == r["n_users"]
        assert 0 < r["items_rated"] <= items
        assert r["tenants"] == 100
        assert r["n_train"] == pytest.approx(0.8 * r["n_ratings"], abs=100)
        rs = r["round_s"]
        assert rs["rounds"] == 3 and len(rs["all"]) == 3
        assert 0 < rs["min"] <= rs["median"] and rs["first_round"] > 0
        assert rs["client_median"] > 0 and rs["server_median"] > 0
        assert all(v > 0 for v in r["setup_s"].values())
        m = r["rss_mb"]
        assert 0 < m["start"] < m["peak_setup"] <= m["peak"]
        assert m["peak_rounds"] is None or m["before_rounds"] <= m["peak_rounds"] <= m["peak"]
        assert r["profile_top"] and r["profile_top"][0]["cpu_tottime_s"] > 0
    slopes = doc["slopes"]["netflix"]
    assert slopes["sizes"] == len(QUICK_SIZES["netflix"])
    assert all(math.isfinite(slopes[k]) for k in ("round_median_s", "peak_rss_mb", "setup_s"))
    assert doc["slopes"]["ml10m"]["round_median_s"] is None  # one size: no fit
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
