"""CPU seconds of one grid release (exact discrete noise) against numpy's float sampler.

    python -m bench.sampler_speed --sizes 100000 133416 1000000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from privacy.gaussian import gaussian_release
from privacy.laplace import laplace_release


def cpu(fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``fn()``."""
    t0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - t0, time.perf_counter() - w0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 3_706 * 36, 1_000_000])
    args = ap.parse_args(argv)
    rng = np.random.default_rng()
    for n in args.sizes:
        x = rng.standard_normal(n)
        g = cpu(lambda x=x: gaussian_release(x, 2.5, rng, 1.0))
        lap = cpu(lambda x=x: laplace_release(x, 2.5, rng, 1.0))
        f = cpu(lambda n=n: rng.normal(0.0, 2.5, n))
        print(f"{n:>9} entries: gaussian_release {g[0]:.2f} s CPU ({g[1]:.2f} s wall), "
              f"laplace_release {lap[0]:.2f} s CPU ({lap[1]:.2f} s wall), "
              f"rng.normal {f[0]:.3f} s CPU", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
