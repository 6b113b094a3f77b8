"""RFRec / RFRecF communication rounds to the paper's stop criterion (the RFRec paper, Fig. 2).

Sec. 4.3: communication stops when ||V_{t+1} - V_t|| / ||V_t|| <= eps_0, at most 200
communication rounds. The paper gives no eps_0; the authors' notebook plots the criterion
against 0.01 (``--eps``, default 0.01). V_t is the global V_bar after its t-th update (every
iteration for RFRec; every aggregation, i.e. zeta turning from 0 to 1, for RFRecF, since
V_bar does not change in between). Communication rounds as Definition 3.8 / Lemma 3.9:
two per iteration for RFRec (upload and broadcast); one per change of zeta for RFRecF.
A run that has not met the criterion by the 200th communication round counts as 200
(marked "not reached" in the result file, as FCF in the paper).

Fig. 2 is a plot without printed numbers, so the rows have no paper figure; the paper's
claim is the ordering (RFRecF needs fewer rounds than RFRec). Default: ML-100k, the
``ours`` settings (bench/rfrec_common.py), 3 seeds. ``--quick``: 30 communication rounds.
"""

from __future__ import annotations

import numpy as np

from bench import _experiment
from bench import rfrec_common as C

EXPERIMENT = "RFRec/RFRecF communication rounds to ||dV||/||V|| <= eps vs the paper's Fig. 2"
NEEDS_DATA = True
NAME = "rfrec_rounds"


class _Stop(Exception):
    """Raised from the round callback once the criterion is met or the cap reached."""


def trace(method: str, data: str, seed: int, eps: float, cap: int, variant: str) -> dict:
    """Criterion per V_bar update with its communication round; where it stopped."""
    state = {"prev_zeta": 0, "comms": 0, "v": None, "it": 0}
    curve: list[tuple[int, float]] = []
    result = {"reached": False}

    def on_global(g) -> None:
        state["it"] += 1
        zeta = g.zeta_prev  # the coin of the iteration just run
        if method == "rfrec":
            state["comms"] += 2
            updated = True
        else:
            state["comms"] += int(zeta != state["prev_zeta"])
            updated = zeta == 1 and state["prev_zeta"] == 0
            state["prev_zeta"] = zeta
        if updated:
            if state["v"] is not None:
                rel = float(np.linalg.norm(g.v_bar - state["v"]) / np.linalg.norm(state["v"]))
                curve.append((state["comms"], rel))
                if rel <= eps:
                    result["reached"] = True
                    raise _Stop
            state["v"] = g.v_bar.copy()
        if state["comms"] >= cap:
            raise _Stop

    try:
        C.run(method, variant, data, seed, rounds=10 * cap, evaluate_every=10 * cap,
              on_global=on_global)
    except _Stop:
        pass
    return {"rounds": min(state["comms"], cap), "iterations": state["it"],
            "reached": result["reached"], "curve": curve}


def plot(traces: dict, eps: float, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, color in (("rfrec", "tab:blue"), ("rfrecf", "tab:orange")):
        for i, t in enumerate(traces[method]):
            if not t["curve"]:
                continue
            x, y = zip(*t["curve"], strict=True)
            ax.plot(x, y, color=color, alpha=0.7,
                    label=f"{C.METHOD[method]}" if i == 0 else None)
    ax.axhline(eps, ls=":", color="k", label=f"eps_0 = {eps}")
    ax.set_yscale("log")
    ax.set_xlabel("communication rounds")
    ax.set_ylabel("||V_t+1 - V_t|| / ||V_t||")
    ax.set_title("Stop criterion against communication rounds (Fig. 2)")
    ax.legend()
    _experiment.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = _experiment.parser(NAME, __doc__)
    ap.add_argument("--data", choices=["ml-100k", "ml-1m"], default="ml-100k")
    ap.add_argument("--eps", type=float, default=0.01, help="eps_0 of the stop criterion")
    ap.add_argument("--variant", choices=["ours", "paper"], default="ours")
    args = ap.parse_args(argv)
    cap = 30 if args.quick else 200
    traces = {m: [] for m in ("rfrec", "rfrecf")}
    for method in traces:
        for seed in range(args.seeds):
            t = trace(method, args.data, seed, args.eps, cap, args.variant)
            traces[method].append(t)
            print(f"{method} seed {seed}: {t['rounds']} communication rounds, "
                  f"{t['iterations']} iterations, reached {t['reached']}", flush=True)
    rows = []
    for method, ts in traces.items():
        missed = sum(not t["reached"] for t in ts)
        note = "Fig. 2 prints no numbers; paper's claim: RFRecF < RFRec"
        if missed:
            note += f"; {missed} run(s) not reached, counted as {cap}"
        what = (f"{C.DATA[args.data]}, {C.METHOD[method]}, {args.variant}, "
                f"eps_0 = {args.eps}, cap {cap}")
        rows.append(_experiment.comparison(what, "communication rounds", None,
                                           [t["rounds"] for t in ts], note=note))
    stem = NAME if (args.data, args.variant) == ("ml-100k", "ours") else \
        f"{NAME}_{args.data}_{args.variant}"
    path = C.write(args.out, NAME, stem, argv, args.quick,
                                    {"data": args.data, "eps": args.eps, "cap": cap,
                                     "variant": args.variant, "traces": traces,
                                     "comparisons": rows})
    plot(traces, args.eps, args.out / f"{stem}.png")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
