"""``fedrec agent run | recommend | forget | status``: the tenant agent's command line."""

from __future__ import annotations

import argparse
import json
import math
import sys


def register(sub) -> None:
    parser = sub.add_parser("agent", help="run a tenant agent: train where the data is",
                            description="A tenant's agent: its ratings, U_i and privacy "
                                        "ledger never leave its machine.")
    cmds = parser.add_subparsers(dest="agent_command", required=True, metavar="ACTION")
    run = cmds.add_parser("run", help="take part in the jobs this tenant is an agent of")
    run.add_argument("--config", help="a JSON file of these options (e.g. written by "
                                      "'fedrec agent-demo'); the command line wins")
    run.add_argument("--coordinator", help="the service's URL")
    run.add_argument("--tenant-id", type=int, help="the tenant's id (as the admin created it)")
    run.add_argument("--api-key", help="the tenant's API key")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--data", help="ratings file: CSV/TSV (MovieLens u.data) or JSON, as "
                                    "the upload API takes them")
    src.add_argument("--sql-url", help="SQLAlchemy URL of the tenant's database")
    run.add_argument("--sql-query", help="with --sql-url: SELECT user, item, rating[, time]")
    run.add_argument("--state-dir", help="where U_i, the ledger and the rating blocks are "
                                         "kept")
    run.add_argument("--epsilon-max", type=float, default=None,
                     help="this tenant's own budget (required the first time; 'inf' allowed)")
    run.add_argument("--delta", type=float, default=None, help="its delta (default 1e-5)")
    run.add_argument("--allow-non-private", action="store_true",
                     help="accept jobs that send uploads without a DP guarantee")
    run.add_argument("--poll", type=float, default=20.0, help="long-poll seconds")
    run.add_argument("--until-done", action="store_true",
                     help="exit once every job joined has ended")
    run.set_defaults(func=_run)
    rec = cmds.add_parser("recommend", help="a user's top-k from the local factors")
    rec.add_argument("user")
    rec.add_argument("--state-dir", required=True)
    rec.add_argument("--k", type=int, default=10)
    rec.add_argument("--job", type=int, default=None, help="default: the latest joined")
    rec.set_defaults(func=_recommend)
    forget = cmds.add_parser(
        "forget", help="forget a user: their ratings, rows and serving, in every job",
        description="Removes the user from every joined job's blocks, local state and "
                    "serving, and keeps them out of jobs joined later although the data "
                    "source still has their ratings; --undo records a new consent.")
    forget.add_argument("user")
    forget.add_argument("--state-dir", required=True)
    forget.add_argument("--undo", action="store_true",
                        help="the user consented again: jobs joined from now on train on "
                             "their ratings (jobs joined before keep them out)")
    forget.set_defaults(func=_forget)
    status = cmds.add_parser("status", help="the agent's ledger and jobs")
    status.add_argument("--state-dir", required=True)
    status.set_defaults(func=_status)


def _run(args) -> int:
    import httpx

    from agent import data
    from agent.client import Coordinator, Refused
    from agent.run import Agent
    from agent.state import AgentState
    from privacy.ledger import Budget

    _merge_config(args)
    if args.sql_url and not args.sql_query:
        raise ValueError("--sql-url needs --sql-query")
    coord = Coordinator(args.coordinator, args.tenant_id, args.api_key)
    budget = None
    if args.epsilon_max is not None:
        budget = Budget(args.epsilon_max, args.delta, args.allow_non_private)
    state = AgentState.open(args.state_dir, str(coord.tenant_id), budget)
    if args.data:
        def source(scale):
            return data.read_file(args.data, scale)
    else:
        def source(scale):
            return data.read_sql(args.sql_url, args.sql_query, scale)
    agent = Agent(coord, state, source)
    try:
        return agent.run(until_done=args.until_done, poll=args.poll)
    except KeyboardInterrupt:
        return 130
    except httpx.TransportError as exc:
        raise ValueError(f"the coordinator at {args.coordinator} does not answer ({exc}); "
                         "the state directory is intact: run again to resume") from None
    except Refused as exc:
        raise ValueError(f"the coordinator refused: {exc}") from None


REQUIRED = ("coordinator", "tenant_id", "api_key", "state_dir")


def _merge_config(args) -> None:
    """Options missing on the command line from ``--config``; refuse what is still missing."""
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
        for name, value in config.items():
            name = name.replace("-", "_")
            if getattr(args, name, None) in (None, False):
                setattr(args, name, value)
    missing = [f"--{n.replace('_', '-')}" for n in REQUIRED if getattr(args, n) is None]
    if not (args.data or args.sql_url):
        missing.append("--data or --sql-url")
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    if args.delta is None:
        args.delta = 1e-5


def _recommend(args) -> int:
    from agent.run import recommend

    for row in recommend(args.state_dir, args.user, args.k, args.job):
        print(f"{row['item']}\t{row['score']:.4f}\t{row['title'] or ''}".rstrip())
    return 0


def _forget(args) -> int:
    from pathlib import Path

    from agent import forget

    if not (Path(args.state_dir) / "agent.json").exists():
        raise ValueError(f"no agent state in {args.state_dir}")
    with forget.locked(args.state_dir):
        if args.undo:
            if not forget.undo(args.state_dir, args.user):
                print(f"user {args.user!r} was not forgotten: nothing to undo")
                return 0
            print(f"user {args.user!r} may be trained on again by jobs joined from now on")
            return 0
        new, removed = forget.forget(args.state_dir, args.user)
    if not new and not removed:
        print(f"user {args.user!r} was forgotten already: nothing to do")
    else:
        print(f"forgot user {args.user!r}: {removed} ratings removed from the joined jobs")
    return 0


def _status(args) -> int:
    from pathlib import Path

    from privacy.ledger import Ledger

    state = json.loads((Path(args.state_dir) / "agent.json").read_text())
    ledger = Ledger.from_dict(state["ledger"])
    spent = ledger.spent(state["account"])
    budget = ledger.budget(state["account"])
    eps = "infinity" if math.isinf(spent.epsilon) else f"{spent.epsilon:.4g}"
    print(json.dumps({"tenant": state["account"], "epsilon_spent": eps,
                      "epsilon_max": budget.epsilon_max, "delta": budget.delta,
                      "rounds_charged": ledger.rounds(state["account"]),
                      "jobs": {j: {k: r[k] for k in ("local_round", "done", "late")}
                               | {"charged_rounds": sorted(map(int, r["charged"]))}
                               for j, r in state["jobs"].items()}}, indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fedrec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fedrec agent: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
