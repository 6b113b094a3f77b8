"""Scale: seconds per FedMC-ADMM round and peak memory vs the number of ratings.

Synthetic ratings (:func:`algorithms.synthetic.generate_tenant_ratings`) drawn straight
into 100 tenants, split 80/20 per tenant (:func:`algorithms.data.federation_from_tenants`,
seed 0), FedMC-ADMM at rank 13, N = 10, 10 tenants per round, the recommended settings
otherwise. Each size runs in a fresh subprocess so that its peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``) is its own; the child resets the kernel's RSS
high-water mark (``/proc/self/clear_refs``) after set-up, so the peak of the rounds is
measured separately from the peak of generation and set-up.

Shapes: ``netflix`` keeps 17,770 items and scales the users with the ratings (480,189
users at 100,480,507 ratings, Netflix's figures); ``ml10m`` keeps 10,677 items (69,878
users at 10,000,054 ratings, MovieLens 10M's). Per size: set-up (generate, split, CSR/CSC
views of every tenant, initial states), one warm-up round (numba's cached compilation
loads), ``--rounds`` timed rounds (client and server work, evaluation excluded; wall and
thread CPU time), then one round under cProfile.

    nice -n 10 python -m bench.scale                   # default sizes, < 10 minutes
    python -m bench.scale --quick --json /tmp/s.json   # small sizes, < 1 minute
    python -m bench.scale --shape ml10m --sizes 1000000,10000054
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.round_speed import wait_for_idle

ROOT = Path(__file__).resolve().parents[1]
#: (users, items, ratings) of the full shapes; smaller sizes scale the users only
SHAPES = {"netflix": (480_189, 17_770, 100_480_507), "ml10m": (69_878, 10_677, 10_000_054)}
DEFAULT_SIZES = {"netflix": [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_480_507],
                 "ml10m": [10_000_054]}
QUICK_SIZES = {"netflix": [50_000, 100_000, 200_000, 400_000], "ml10m": [100_000]}
TENANTS, PER_ROUND, RANK, SEED = 100, 10, 13, 0


def shape_for(shape: str, n_ratings: int) -> tuple[int, int]:
    """(users, items) of ``shape`` at ``n_ratings``: the full shape's items, users scaled."""
    users, items, full = SHAPES[shape]
    return max(TENANTS, round(users * n_ratings / full)), items


def rss_now_mb() -> tuple[float, float]:
    """(current RSS, high-water mark since the last reset) in MB from /proc/self/status."""
    vals = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def peak_rss_mb() -> float:
    """Peak RSS of this process (``ru_maxrss``, KiB on Linux) in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def timed_round(alg, cfg, k, glob, server, locs, blocks):
    """One round of the round engine (:func:`algorithms.simulate.step`), timing clients and
    server apart."""
    from algorithms.simulate import PerClient, RoundState, step

    w0, c0 = time.perf_counter(), time.thread_time()
    st = step(PerClient(alg, cfg, SEED, PER_ROUND, blocks),
              RoundState(k - 1, glob, server, locs), k)
    w2, c2 = time.perf_counter(), time.thread_time()
    return (st.global_msg, st.server_state, st.local_states), {
        "wall_s": w2 - w0, "cpu_s": c2 - c0, "client_s": st.client_seconds,
        "server_s": st.seconds - st.client_seconds}


def profile_round(alg, cfg, k, states, blocks, top: int = 12) -> list[dict]:
    """cProfile of one round with this thread's CPU clock (so other processes' load does
    not count): the ``top`` functions by internal CPU time."""
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    timed_round(alg, cfg, k, *states, blocks)
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": nc, "cpu_tottime_s": tt,
             "cpu_cumtime_s": ct} for (f, line, name), (_cc, nc, tt, ct, _) in rows]


def child(shape: str, n_ratings: int, rounds: int, idle_load: float, max_wait: float) -> dict:
    """One size in this (fresh) process: set-up, warm-up, timed rounds, profiled round."""
    from algorithms import fedmc_admm as F
    from algorithms.data import federation_from_tenants
    from algorithms.simulate import initialise
    from algorithms.synthetic import generate_tenant_ratings

    n_users, n_items = shape_for(shape, n_ratings)
    rss_start = rss_now_mb()[0]
    t0 = time.perf_counter()
    tr = generate_tenant_ratings(n_users, n_items, n_ratings, TENANTS, seed=SEED)
    t1 = time.perf_counter()
    peak_generate = peak_rss_mb()
    fed = federation_from_tenants(tr.blocks, tr.user_ids, np.arange(n_items), SEED)
    del tr
    t2 = time.perf_counter()
    for b in fed.train:  # the simulator caches these views; build them all up front
        _ = b.csr, b.csc
    t3 = time.perf_counter()
    cfg = F.FedMCADMMConfig(rank=RANK)
    server, glob, locs = initialise(F.ALGORITHM, cfg, fed.train, SEED)
    t4 = time.perf_counter()
    rated = np.zeros(n_items, dtype=bool)
    users_with = 0
    for tr_b, te_b in zip(fed.train, fed.test, strict=True):
        rated[tr_b.cols] = rated[te_b.cols] = True
        users_with += np.union1d(tr_b.rows, te_b.rows).size
    data = {"n_users": sum(b.n_users for b in fed.train), "n_items": fed.n_items,
            "n_ratings": sum(b.nnz for b in fed.train) + sum(b.nnz for b in fed.test),
            "n_train": sum(b.nnz for b in fed.train), "users_with_ratings": users_with,
            "items_rated": int(rated.sum()), "tenants": fed.n_clients}
    peak_setup = peak_rss_mb()
    rss_before_rounds = rss_now_mb()[0]
    reset_ok = reset_peak_rss()
    states = (glob, server, locs)
    states, first = timed_round(F.ALGORITHM, cfg, 1, *states, fed.train)
    load = wait_for_idle(idle_load, max_wait)
    timings = []
    for k in range(2, rounds + 2):
        states, t = timed_round(F.ALGORITHM, cfg, k, *states, fed.train)
        timings.append(t)
    load_after = os.getloadavg()[0]
    profile = profile_round(F.ALGORITHM, cfg, rounds + 2, states, fed.train)
    rss_after, hwm_rounds = rss_now_mb()
    wall = [t["wall_s"] for t in timings]
    cpu = [t["cpu_s"] for t in timings]
    return {
        "shape": shape, **data,
        "setup_s": {"generate": t1 - t0, "split": t2 - t1, "views": t3 - t2,
                    "initialise": t4 - t3, "total": t4 - t0},
        "round_s": {"min": min(wall), "median": statistics.median(wall),
                    "cpu_min": min(cpu), "cpu_median": statistics.median(cpu),
                    "client_median": statistics.median(t["client_s"] for t in timings),
                    "server_median": statistics.median(t["server_s"] for t in timings),
                    "first_round": first["wall_s"], "rounds": len(wall), "all": wall},
        "rss_mb": {"start": rss_start, "peak_generate": peak_generate, "peak_setup": peak_setup,
                   "before_rounds": rss_before_rounds, "after_rounds": rss_after,
                   "peak_rounds": hwm_rounds if reset_ok else None,
                   "round_increment": hwm_rounds - rss_before_rounds if reset_ok else None,
                   "peak": peak_rss_mb() if not reset_ok else max(peak_setup, hwm_rounds)},
        "load_1min": {"before_rounds": load, "after_rounds": load_after},
        "profile_top": profile,
    }


def run_size(shape: str, n: int, rounds: int, idle_load: float, max_wait: float,
             timeout: float) -> dict:
    """Run :func:`child` in a fresh interpreter and return its record."""
    cmd = [sys.executable, "-m", "bench.scale", "--child", "--shape", shape, "--sizes", str(n),
           "--rounds", str(rounds), "--idle-load", str(idle_load), "--max-wait", str(max_wait)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"{shape} {n}: child failed\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def loglog_slope(x: list[float], y: list[float]) -> float | None:
    """Least-squares slope of log y on log x (None with fewer than two points)."""
    if len(x) < 2:
        return None
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def fits(records: list[dict]) -> dict:
    """Log-log slopes per shape: round time (median), peak RSS, round RSS, set-up time."""
    out = {}
    for shape in sorted({r["shape"] for r in records}):
        rs = sorted((r for r in records if r["shape"] == shape), key=lambda r: r["n_ratings"])
        n = [r["n_ratings"] for r in rs]
        out[shape] = {
            "sizes": len(rs),
            "round_median_s": loglog_slope(n, [r["round_s"]["median"] for r in rs]),
            "round_cpu_median_s": loglog_slope(n, [r["round_s"]["cpu_median"] for r in rs]),
            "setup_s": loglog_slope(n, [r["setup_s"]["total"] for r in rs]),
            "peak_rss_mb": loglog_slope(n, [r["rss_mb"]["peak"] for r in rs]),
            # between the two largest sizes, where fixed costs weigh least
            "round_cpu_median_s_top2": loglog_slope(
                n[-2:], [r["round_s"]["cpu_median"] for r in rs[-2:]]),
            "peak_rss_mb_top2": loglog_slope(n[-2:], [r["rss_mb"]["peak"] for r in rs[-2:]]),
        }
    return out


def plot(records: list[dict], slopes: dict, path: Path) -> None:
    """Log-log PNG: seconds per round and peak RSS vs ratings, with the fitted slopes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    for shape, marker in (("netflix", "o"), ("ml10m", "s")):
        rs = sorted((r for r in records if r["shape"] == shape), key=lambda r: r["n_ratings"])
        if not rs:
            continue
        n = np.array([r["n_ratings"] for r in rs], dtype=float)
        line = "-" if len(rs) > 1 else "none"
        series_t = [("round, median wall", [r["round_s"]["median"] for r in rs],
                     "round_median_s", "C0"),
                    ("round, median thread CPU", [r["round_s"]["cpu_median"] for r in rs],
                     "round_cpu_median_s", "C1"),
                    ("set-up (generate, split, views, init)", [r["setup_s"]["total"] for r in rs],
                     "setup_s", "C2")]
        series_m = [("peak RSS", [r["rss_mb"]["peak"] for r in rs], "peak_rss_mb", "C3"),
                    ("peak RSS of generation", [r["rss_mb"]["peak_generate"] for r in rs],
                     None, "C4"),
                    ("RSS added by the rounds", [max(r["rss_mb"]["round_increment"] or 0, 1)
                                                 for r in rs], None, "C5")]
        for ax, series, unit in ((ax_t, series_t, 1.0), (ax_m, series_m, 1 / 1024)):
            for label, y, key, colour in series:
                s = slopes[shape][key] if key else None
                y = np.array(y) * unit
                ax.loglog(n, y, marker=marker, linestyle=line, color=colour,
                          label=f"{shape}: {label}" + (f", slope {s:.2f}" if s is not None else ""))
                if s is not None:
                    fit = np.polyfit(np.log(n), np.log(y), 1)
                    ax.loglog(n, np.exp(np.polyval(fit, np.log(n))), color=colour,
                              linestyle=":", linewidth=1)
    ax_t.axhline(10, color="grey", linestyle=":", label="target 10 s / round")
    ax_m.text(0.01, 12e9 / 2**30, "target 12 GB", va="bottom", ha="left",
              transform=ax_m.get_yaxis_transform(), fontsize=7)
    ax_t.set(xlabel="ratings", ylabel="seconds",
             title="FedMC-ADMM, rank 13, 10 of 100 tenants per round")
    ax_m.axhline(12e9 / 2**30, color="grey", linestyle=":")
    ax_m.set(xlabel="ratings", ylabel="GiB", title="resident memory (RSS)")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(doc: dict) -> str:
    """The BENCHMARKS.md table of a scale.json document."""
    lines = ["| shape | ratings | users | items | set-up s (generate) | s/round min / median "
             "(wall) | s/round median (thread CPU) | client / server s (median wall) "
             "| peak RSS GiB (set-up / rounds) | 1-min load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["sizes"]:
        st, rs, m = r["setup_s"], r["round_s"], r["rss_mb"]
        rounds = f"{m['peak_rounds'] / 1024:.2f}" if m["peak_rounds"] is not None else "-"
        lines.append(
            f"| {r['shape']} | {r['n_ratings']:,} | {r['n_users']:,} | {r['n_items']:,} "
            f"| {st['total']:.1f} ({st['generate']:.1f}) | {rs['min']:.2f} / {rs['median']:.2f} "
            f"| {rs['cpu_median']:.2f} | {rs['client_median']:.2f} / {rs['server_median']:.2f} "
            f"| **{m['peak'] / 1024:.2f}** ({m['peak_setup'] / 1024:.2f} / {rounds}) "
            f"| {r['load_1min']['before_rounds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 1 minute)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="one shape only (default: the netflix sweep and the ml10m point)")
    ap.add_argument("--sizes", default=None, help="comma-separated rating counts")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per size")
    ap.add_argument("--idle-load", type=float, default=2.0)
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait for the load to drop before timing")
    ap.add_argument("--timeout", type=float, default=900.0, help="per size, seconds")
    ap.add_argument("--json", default=None, help="default bench/scale.json (none if --quick)")
    ap.add_argument("--png", default=None, help="default bench/scale.png (none if --quick)")
    ap.add_argument("--table", default=None, metavar="JSON",
                    help="print the markdown table of a result file and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.table:
        doc = json.loads(Path(args.table).read_text())
        print(markdown_table(doc))
        return doc
    rounds = args.rounds or (3 if args.quick else 5)
    max_wait = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 10.0)
    if args.child:
        rec = child(args.shape, int(args.sizes), rounds, args.idle_load, max_wait)
        print(json.dumps(rec))
        return rec
    table = QUICK_SIZES if args.quick else DEFAULT_SIZES
    shapes = [args.shape] if args.shape else list(table)
    plan = [(s, int(n)) for s in shapes
            for n in (args.sizes.split(",") if args.sizes else table[s])]
    start = time.perf_counter()
    records = []
    for shape, n in plan:
        rec = run_size(shape, n, rounds, args.idle_load, max_wait, args.timeout)
        records.append(rec)
        r, m = rec["round_s"], rec["rss_mb"]
        print(f"{shape:7s} {rec['n_ratings']:>11,} ratings {rec['n_users']:>7,} x "
              f"{rec['n_items']:,}: set-up {rec['setup_s']['total']:6.1f} s, round min "
              f"{r['min']:.3f} / median {r['median']:.3f} s (CPU {r['cpu_median']:.3f} s), "
              f"peak RSS {m['peak'] / 1024:.2f} GiB (rounds {m['peak_rounds'] / 1024:.2f}), "
              f"load {rec['load_1min']['before_rounds']:.2f}", flush=True)
    slopes = fits(records)
    given = sys.argv[1:] if argv is None else argv
    out = {"command": " ".join(["python -m bench.scale", *given]),
           "quick": args.quick, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version()},
           "config": {"tenants": TENANTS, "per_round": PER_ROUND, "rank": RANK,
                      "inner_steps": 10, "seed": SEED, "test_fraction": 0.2},
           "total_s": time.perf_counter() - start, "sizes": records, "slopes": slopes}
    for shape, s in slopes.items():
        print(f"{shape}: log-log slopes vs ratings: round {s['round_median_s']}, "
              f"set-up {s['setup_s']}, peak RSS {s['peak_rss_mb']}")
    print(f"total {out['total_s']:.0f} s")
    json_path = args.json or (None if args.quick else str(ROOT / "bench" / "scale.json"))
    png_path = args.png or (None if args.quick else str(ROOT / "bench" / "scale.png"))
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    if png_path:
        plot(records, slopes, Path(png_path))
    return out


if __name__ == "__main__":
    main()
