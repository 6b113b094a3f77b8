"""``fedrec agent-demo``: a coordinator whose tenants are all agents, on embedded defaults.

Starts the API (SQLite in ``--dir``, the pipeline in-process unless a broker is
configured), creates the item catalogue of the ratings file, one tenant and API key per
agent, splits the ratings by user among them into ``--dir/agent-N.csv`` (the ratings the
agents keep; nothing is uploaded), writes each agent's options to ``--dir/agent-N.json``,
creates a training job with the agents as its tenants, and prints the job's progress
round by round until it ends (then keeps serving unless ``--exit-when-done``).

Run the agents with ``fedrec agent run --config DIR/agent-N.json``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from pathlib import Path

import numpy as np

from algorithms import registry
from algorithms.data import data_dir, load_ratings
from fedrec.client import ApiError, Client


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent-demo", help="a coordinator for tenant agents, with its tenants "
                                          "and job set up", description=__doc__)
    p.add_argument("data", nargs="?", type=Path,
                   help="ratings file (default: MovieLens 100k u.data under FEDREC_DATA_DIR)")
    p.add_argument("--dir", type=Path, default=Path("fedrec-agents"),
                   help="where the database, the agents' files and configs go")
    p.add_argument("--agents", type=int, default=2, help="number of agent tenants (2..10)")
    p.add_argument("--privacy", choices=["user", "tenant"], default="user",
                   help="user: the default job (dp-ials, the ranking model that serves "
                        "the lists, and DPALS, the rating model), each user protected, every "
                        "agent noising its own upload (placement tenant; default); tenant: "
                        "FedMC-ADMM, each agent's whole block protected")
    p.add_argument("--epsilon", type=float, default=8.0,
                   help="user unit: the job's target epsilon (delta 1e-6)")
    p.add_argument("--noise-multiplier", type=float, default=1.0,
                   help="tenant unit: Gaussian noise of each agent's upload")
    p.add_argument("--rounds", type=int, default=None,
                   help="default: each model's recommended number; FedMC-ADMM 20")
    p.add_argument("--epsilon-max", type=float, default=None,
                   help="each agent's own budget (written to its config; default twice "
                        "--epsilon, or 100 for the tenant unit)")
    p.add_argument("--round-seconds", type=float, default=120.0,
                   help="how long a round waits for the agents")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exit-when-done", action="store_true",
                   help="stop serving once the job ends")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.commands.demo import TENANT_NAMES, item_titles, start_server
    from app.config import Settings
    from app.db import migrate

    if not 2 <= args.agents <= len(TENANT_NAMES):
        raise ValueError(f"--agents must be 2..{len(TENANT_NAMES)}")
    path = args.data
    if path is None:
        base = data_dir()
        if base is None:
            raise ValueError("give a ratings file (no MovieLens under FEDREC_DATA_DIR)")
        path = base / "ml-100k" / "u.data"
    ratings = load_ratings(path)
    args.rounds_default = args.rounds is None
    if args.rounds is None:
        args.rounds = (registry.get("dpals").run_defaults["rounds"] if args.privacy == "user"
                       else 20)
    if args.epsilon_max is None:
        args.epsilon_max = 2 * args.epsilon if args.privacy == "user" else 100.0
    out = args.dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    db = out / "coordinator.db"
    db.unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    migrate(url)
    token = secrets.token_urlsafe(32)
    server, thread = start_server(Settings(database_url=url, admin_token=token), args.port)
    base_url = f"http://127.0.0.1:{args.port}"
    api = Client(base_url, token=token, timeout=120)
    titles = item_titles(path)
    items = np.unique(ratings.items)
    api.put_items({"key": str(i), "title": titles.get(int(i))} for i in items.tolist())
    users = np.unique(ratings.users)
    owner = dict(zip(users.tolist(), np.random.default_rng(args.seed).integers(
        0, args.agents, users.size).tolist(), strict=True))
    tenant_of = np.array([owner[u] for u in ratings.users.tolist()])
    lo, hi = float(ratings.values.min()), float(ratings.values.max())
    tenant_ids = []
    for t in range(args.agents):
        name = TENANT_NAMES[t]
        tid = api.create_tenant(name, args.epsilon_max, rating_min=lo, rating_max=hi).id
        key = api.create_api_key(tid, "agent").key
        mine = tenant_of == t
        csv = out / f"agent-{t + 1}.csv"
        with csv.open("w") as f:
            f.write("user,item,rating\n")
            for u, i, v in zip(ratings.users[mine].tolist(), ratings.items[mine].tolist(),
                               ratings.values[mine].tolist(), strict=True):
                f.write(f"{u},{i},{v:g}\n")
        config = {"coordinator": base_url, "tenant_id": tid, "api_key": key,
                  "data": str(csv), "state_dir": str(out / f"state-{t + 1}"),
                  "epsilon_max": args.epsilon_max,
                  "delta": 1e-6 if args.privacy == "user" else 1e-5}
        (out / f"agent-{t + 1}.json").write_text(json.dumps(config, indent=1))
        tenant_ids.append(tid)
        print(f"tenant {tid} ({name}): {int(mine.sum())} ratings of "
              f"{len({u for u, o in owner.items() if o == t})} users in {csv.name}; "
              f"agent options in agent-{t + 1}.json", flush=True)
    body = {"rounds": args.rounds, "seed": args.seed, "tenant_ids": tenant_ids,
            "agents": tenant_ids, "round_seconds": args.round_seconds}
    if args.privacy == "user":  # the default job: dp-ials for lists, dpals for ratings
        body.pop("rounds") if args.rounds_default else None
        body.update(privacy={"unit": "user", "placement": "tenant",
                             "target_epsilon": args.epsilon, "delta": 1e-6})
        what = (f"the default job (dp-ials, the ranking model that serves the lists, and "
                f"DPALS, the rating model, at epsilon {args.epsilon / 2:g} each), users "
                f"protected at epsilon {args.epsilon:g} (delta 1e-6), each agent noising its "
                "own upload")
    else:
        body.update(algorithm="fedmc-admm", config={"rank": 10},
                    dp={"mechanism": "gaussian", "noise_multiplier": args.noise_multiplier})
        what = (f"FedMC-ADMM, each agent's block protected (Gaussian, noise multiplier "
                f"{args.noise_multiplier:g})")
    try:
        created = api.create_job(**body)
    except ApiError as exc:
        raise ValueError(f"the job was refused ({exc.code}): {exc.detail}") from None
    job_ids = [created.id] + ([created.pair_job_id] if created.pair_job_id else [])
    print(f"job {', '.join(map(str, job_ids))}: {what}; waiting for the agents "
          f"(fedrec agent run --config {args.dir}/agent-N.json)", flush=True)
    try:
        for job_id in job_ids:
            _follow(api, job_id)
        if args.exit_when_done:
            time.sleep(10)  # the agents fetch the final global message
        else:
            print(f"serving on {base_url} (Ctrl-C to stop)", flush=True)
            thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        api.close()
        server.should_exit = True
        thread.join(10)
    return 0


def _follow(api: Client, job_id: int) -> None:
    """Print each round of the job as it closes, then its privacy spend and which model
    serves the lists (agents evaluate and serve on their own machines)."""
    seen = 0
    while True:
        state = api.job(job_id)
        if state.current_round > seen:
            for k in range(seen + 1, state.current_round):  # closed between polls
                print(f"{state.algorithm} round {k}/{state.rounds} done", flush=True)
            seen = state.current_round
            m = state.latest_metrics or {}
            missed = m.get("missed_deadline")
            print(f"{state.algorithm} round {seen}/{state.rounds} done in "
                  f"{m.get('seconds', 0):.2f} s"
                  + (f"; missed the deadline: {missed}" if missed else ""), flush=True)
        if state.finished:
            report = api.job_report(job_id)
            print(f"job {job_id} ({state.algorithm}, {state.model_kind} model) {state.status}; "
                  f"epsilon per tenant {report.privacy.get('epsilon_per_tenant')} (at delta "
                  f"{report.privacy.get('delta')})", flush=True)
            lists = report.models.get("lists") or {}
            if lists.get("job_id") == job_id:
                print(f"lists: {lists.get('served_by')} ({lists.get('reason')}); each agent "
                      "serves its users from its own factors ('fedrec agent recommend')",
                      flush=True)
            return
        time.sleep(0.5)
