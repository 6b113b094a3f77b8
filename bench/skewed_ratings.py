"""Write the Amazon-like set of :func:`algorithms.synthetic.generate_skewed_ratings` as a
CSV for ``fedrec simulate --data``:

    python -m bench.skewed_ratings OUT.csv      # 29,997 users x 11,277 items, 60,000 ratings

as ``user,item,rating`` lines, and print its shape (:func:`algorithms.synthetic.describe`).
"""

from __future__ import annotations

import argparse

import numpy as np

from algorithms.synthetic import describe, generate_skewed_ratings

__all__ = ["generate_skewed_ratings", "main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="CSV file to write (user,item,rating)")
    p.add_argument("--users", type=int, default=29_997)
    p.add_argument("--items", type=int, default=11_277)
    p.add_argument("--ratings", type=int, default=60_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    r = generate_skewed_ratings(args.users, args.items, args.ratings, seed=args.seed)
    np.savetxt(args.out, np.column_stack([r.users, r.items, r.values]), fmt="%d,%d,%d")
    print(describe(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
