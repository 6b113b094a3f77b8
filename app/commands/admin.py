"""``fedrec admin``: the admin API from the command line, on :mod:`fedrec.client`.

    fedrec admin tenants list | create NAME --budget EPS | show ID | patch ID ... | audit ID
    fedrec admin keys create TENANT [--name N] | list TENANT | revoke TENANT KEY
    fedrec admin items put FILE | list
    fedrec admin jobs create ... | list | show ID | cancel ID | resume ID | report ID | watch ID

The service's URL comes from --url (else FEDREC_URL, else http://127.0.0.1:8000), the
admin token from --token (else FEDREC_ADMIN_TOKEN). Answers print as a table; ``--json -``
writes the answer as JSON to stdout instead, ``--json FILE`` to a file. An error answer
prints its status, code and detail (and each field at fault) on stderr and exits 1.
``fedrec jobs watch ID`` is ``fedrec admin jobs watch ID``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"


def _common() -> argparse.ArgumentParser:
    """--url, --token and --json, accepted after every action (and, through
    :func:`app.cli.arrange`, anywhere on the line)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--url", default=None,
                   help=f"the service (default: FEDREC_URL, else {DEFAULT_URL})")
    p.add_argument("--token", default=None,
                   help="the admin token (default: FEDREC_ADMIN_TOKEN)")
    p.add_argument("--json", metavar="FILE", default=None, nargs="?", const="-",
                   help="write the answer as JSON to FILE (alone or '-': stdout, instead of "
                        "the table)")
    return p


def register(sub: argparse._SubParsersAction) -> None:
    common = _common()
    p = sub.add_parser("admin", help="manage tenants, API keys, items and jobs over the API",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    res = p.add_subparsers(dest="resource", required=True, metavar="RESOURCE")

    tenants = res.add_parser("tenants", help="tenants: list, create, show, patch, audit")
    acts = tenants.add_subparsers(dest="action", required=True, metavar="ACTION")
    acts.add_parser("list", parents=[common], help="every tenant").set_defaults(
        func=_run(_tenants_list))
    create = acts.add_parser("create", parents=[common], help="a new tenant")
    create.add_argument("name")
    create.add_argument("--budget", type=float, required=True,
                        help="its privacy budget: total epsilon it may spend")
    _tenant_options(create, creating=True)
    create.add_argument("--idempotency-key", help="a retry with the same key returns the "
                                                  "tenant created the first time")
    create.set_defaults(func=_run(_tenants_create))
    show = acts.add_parser("show", parents=[common], help="one tenant with its privacy spend")
    show.add_argument("tenant_id", type=int)
    show.set_defaults(func=_run(_tenants_show))
    patch = acts.add_parser("patch", parents=[common],
                            help="change name, budget or opt-ins (recorded in the audit log)")
    patch.add_argument("tenant_id", type=int)
    patch.add_argument("--name")
    patch.add_argument("--budget", type=float, help="the new total epsilon")
    _tenant_options(patch, creating=False)
    patch.add_argument("--actor", help="who makes the change (for the audit log)")
    patch.set_defaults(func=_run(_tenants_patch))
    audit = acts.add_parser("audit", parents=[common], help="every change made to a tenant")
    audit.add_argument("tenant_id", type=int)
    audit.set_defaults(func=_run(_tenants_audit))

    keys = res.add_parser("keys", help="a tenant's API keys: create, list, revoke")
    acts = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = acts.add_parser("create", parents=[common],
                             help="issue a key (its secret is shown once)")
    create.add_argument("tenant_id", type=int)
    create.add_argument("--name", help="a label for the key")
    create.set_defaults(func=_run(_keys_create))
    lst = acts.add_parser("list", parents=[common], help="a tenant's keys (prefixes only)")
    lst.add_argument("tenant_id", type=int)
    lst.set_defaults(func=_run(_keys_list))
    revoke = acts.add_parser("revoke", parents=[common], help="revoke a key")
    revoke.add_argument("tenant_id", type=int)
    revoke.add_argument("key_id", type=int)
    revoke.set_defaults(func=_run(_keys_revoke))

    items = res.add_parser("items", help="the item catalogue: put, list")
    acts = items.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = acts.add_parser("put", parents=[common],
                          help="add or retitle items from a file: CSV 'key,title' (header "
                               "optional) or JSON [{\"key\", \"title\"}]")
    put.add_argument("file", type=Path)
    put.set_defaults(func=_run(_items_put))
    lst = acts.add_parser("list", parents=[common], help="a page of the catalogue")
    _page(lst)
    lst.set_defaults(func=_run(_items_list))

    tuning = res.add_parser("tuning", help="tuning jobs (hyper-parameter search on the "
                                           "stored training ratings): create, show")
    acts = tuning.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = acts.add_parser("create", parents=[common],
                             help="queue a search; every tenant must allow non-private "
                                  "training")
    create.add_argument("--algorithm", default="fedmc-admm",
                        help="fedmc-admm, fedmavg, rfrec or rfrecf (default: fedmc-admm)")
    create.add_argument("--tenants", type=_ids, default=None,
                        help="comma-separated tenant ids (default: all)")
    create.add_argument("--rounds", type=int, default=None,
                        help="rounds of the last rung (default: the algorithm's)")
    create.add_argument("--trials", type=int, default=9, help="configs drawn (default: 9)")
    create.add_argument("--budget-seconds", type=float, default=600.0,
                        help="start no trial after this long (default: 600)")
    create.add_argument("--seed", type=int, default=0, help="seed of the split and search")
    create.add_argument("--metric", choices=("rmse", "ndcg"), default=None,
                        help="choose by validation RMSE or NDCG@10 (default: ndcg for a "
                             "ranking model, else rmse)")
    create.add_argument("--wait", action="store_true",
                        help="wait for the search to end and show its choice")
    create.set_defaults(func=_run(_tuning_create))
    show = acts.add_parser("show", parents=[common],
                           help="status, trials and, once completed, the chosen config")
    show.add_argument("job_id", type=int)
    show.set_defaults(func=_run(_tuning_show))

    jobs = res.add_parser("jobs", help="training jobs: create, list, show, cancel, resume, "
                                       "report, watch")
    register_jobs(jobs, common)
    top = sub.add_parser("jobs", help="training jobs (as 'fedrec admin jobs')",
                         description="The same actions as 'fedrec admin jobs'.")
    register_jobs(top, common)


def _tenant_options(p: argparse.ArgumentParser, creating: bool) -> None:
    if creating:
        p.add_argument("--rating-min", type=float, default=1.0, help="(default: 1)")
        p.add_argument("--rating-max", type=float, default=5.0, help="(default: 5)")
    flag = argparse.BooleanOptionalAction
    p.add_argument("--auto-create-items", action=flag, default=None,
                   help="add unknown items to the catalogue on upload")
    p.add_argument("--allow-non-private", action=flag, default=None,
                   help="opt in to jobs without a DP guarantee")
    p.add_argument("--scheduled-retraining", action=flag, default=None,
                   help="consent to scheduled retraining")
    p.add_argument("--retrain-min-seconds", type=float, default=None,
                   help="least time between two scheduled retrainings")


def _page(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=100, help="page size (default: 100)")
    p.add_argument("--offset", type=int, default=0)


def register_jobs(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    acts = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = acts.add_parser(
        "create", parents=[common], help="start a training job",
        description="Start a training job. --body gives the whole JSON body (a file, or "
                    "'-' for stdin); the options given replace its fields. Without "
                    "--epsilon, --no-noise or a body's privacy/dp, the service chooses "
                    "the algorithm's default privacy.")
    create.add_argument("--body", help="the JSON body of POST /v1/admin/jobs ('-': stdin)")
    create.add_argument("--algorithm", help="e.g. dpals; omitted: the default job, dp-ials "
                                            "(ranking model, lists) and dpals (rating model, "
                                            "RMSE) created together")
    create.add_argument("--tenants", help="comma-separated tenant ids (default: all)")
    create.add_argument("--rounds", type=int)
    create.add_argument("--per-round", type=int, help="tenants per round (0: all)")
    create.add_argument("--seed", type=int)
    create.add_argument("--epsilon", type=float,
                        help="user-level DP: the target epsilon (noise solved for it)")
    create.add_argument("--delta", type=float, help="with --epsilon (default: 1e-6)")
    create.add_argument("--placement", choices=("central", "tenant"),
                        help="with --epsilon: noise once on the sum, or by each tenant")
    create.add_argument("--no-noise", action="store_true",
                        help="dp mechanism none (only tenants that opted in)")
    create.add_argument("--idempotency-key",
                        help="a retry with the same key and body returns the same job")
    create.add_argument("--dry-run", action="store_true",
                        help="only plan: each tenant's epsilon before and after")
    create.add_argument("--watch", action="store_true", help="then watch it (as 'watch')")
    create.set_defaults(func=_run(_jobs_create))
    lst = acts.add_parser("list", parents=[common], help="jobs, newest first")
    _page(lst)
    lst.set_defaults(func=_run(_jobs_list))
    for name, what, func in (("show", "a job's status and latest metrics", _jobs_show),
                             ("cancel", "stop a job after its current round", _jobs_cancel),
                             ("resume", "re-send an interrupted job's next round",
                              _jobs_resume),
                             ("report", "the curve, final figures and privacy spent",
                              _jobs_report)):
        p = acts.add_parser(name, parents=[common], help=what)
        p.add_argument("job_id", type=int)
        p.set_defaults(func=_run(func))
    watch = acts.add_parser(
        "watch", parents=[common], help="follow a job: rounds, RMSE and epsilon, live",
        description="Follow a job until it ends: a progress bar of its rounds with the "
                    "latest test RMSE and the epsilon spent (on a terminal; else a line per "
                    "round). Exit status 0 if it completed, 1 if it failed or was cancelled.")
    watch.add_argument("job_id", type=int)
    watch.add_argument("--interval", type=float, default=1.0,
                       help="seconds between polls (default: 1)")
    watch.set_defaults(func=_run(_jobs_watch))


# -- running -------------------------------------------------------------------------------

def _run(action):
    """The command's ``func``: the client from --url/--token, the action, and errors as
    messages (exit 1)."""

    def run(args: argparse.Namespace) -> int:
        import httpx

        from fedrec.client import ApiError, Client

        url = args.url or os.environ.get("FEDREC_URL") or DEFAULT_URL
        token = args.token or os.environ.get("FEDREC_ADMIN_TOKEN")
        if not token:
            raise ValueError("no admin token: give --token or set FEDREC_ADMIN_TOKEN")
        try:
            with Client(url, token=token) as client:
                return int(action(client, args) or 0)
        except ApiError as exc:
            print(f"fedrec: error {exc.status} {exc.code}: {exc.detail}", file=sys.stderr)
            for e in exc.errors:
                where = f"line {e['line']}, " if e.get("line") is not None else ""
                print(f"  {where}{e.get('field')}: {e.get('message')}", file=sys.stderr)
            return 1
        except httpx.TransportError as exc:
            print(f"fedrec: error: cannot reach the service at {url} ({exc})", file=sys.stderr)
            return 1
    return run


def emit(args: argparse.Namespace, answer: Any, table) -> None:
    """The answer as JSON (``--json``: '-' for stdout, else a file) or as ``table()``."""
    data = answer.model_dump(mode="json") if hasattr(answer, "model_dump") else answer
    if args.json:
        text = json.dumps(data, indent=2)
        if args.json == "-":
            print(text)
            return
        Path(args.json).write_text(text + "\n")
    table()


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Rows as aligned columns under a header (``-`` for none)."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if hasattr(value, "isoformat"):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def print_fields(fields: dict[str, Any]) -> None:
    width = max(map(len, fields))
    for name, value in fields.items():
        print(f"{name:<{width}}  {_cell(value)}")


# -- tenants -------------------------------------------------------------------------------

TENANT_COLUMNS = ["id", "name", "rating_min", "rating_max", "privacy_budget",
                  "allow_non_private", "created_at"]
OPT_INS = ("auto_create_items", "allow_non_private", "scheduled_retraining",
           "retrain_min_seconds")


def _tenants_list(client, args) -> None:
    page = client.tenants()
    emit(args, page, lambda: print_table([dict(t) for t in page.data], TENANT_COLUMNS))


def _tenants_create(client, args) -> None:
    extra = {k: getattr(args, k) for k in OPT_INS if getattr(args, k) is not None}
    tenant = client.create_tenant(args.name, args.budget, rating_min=args.rating_min,
                                  rating_max=args.rating_max,
                                  idempotency_key=args.idempotency_key, **extra)
    emit(args, tenant, lambda: print_fields(dict(tenant)))


def _show_tenant(tenant) -> None:
    fields = {k: v for k, v in dict(tenant).items() if k != "privacy"}
    p = tenant.privacy
    fields.update(epsilon_spent=p.epsilon_spent, epsilon_remaining=p.epsilon_remaining,
                  delta=p.delta, private=p.private, transmissions=p.transmissions)
    print_fields(fields)
    if p.jobs:
        print()
        print_table([spend_row(j) for j in p.jobs],
                    ["job_id", "requested", "spent_at_requested_delta",
                     "charged_at_budget_delta", "transmissions"])
        print(f"budget: epsilon {_cell(p.epsilon_max)} at delta {_cell(p.delta)}; "
              f"spent {_cell(p.epsilon_spent)}, remaining {_cell(p.epsilon_remaining)}")
        if p.note:
            print(p.note)


def spend_row(job) -> dict[str, Any]:
    """A job's spend as a table row: requested (epsilon at delta) beside the same spend at
    the delta asked for and at the budget's delta."""
    asked = "-" if job.requested_epsilon is None else f"{job.requested_epsilon:g}"
    delta = "-" if job.requested_delta is None else f"{job.requested_delta:g}"
    budget_delta = "" if job.budget_delta is None else f" (delta {job.budget_delta:g})"
    return {"job_id": job.job_id, "requested": f"{asked} at delta {delta}",
            "spent_at_requested_delta": job.epsilon_at_requested_delta,
            "charged_at_budget_delta": f"{_cell(job.epsilon)}{budget_delta}",
            "transmissions": job.transmissions}


def _tenants_show(client, args) -> None:
    tenant = client.tenant(args.tenant_id)
    emit(args, tenant, lambda: _show_tenant(tenant))


def _tenants_patch(client, args) -> None:
    changes = {k: getattr(args, k) for k in ("name", *OPT_INS) if getattr(args, k) is not None}
    if args.budget is not None:
        changes["privacy_budget"] = args.budget
    if not changes:
        raise ValueError("nothing to change: give --name, --budget or an opt-in option")
    tenant = client.update_tenant(args.tenant_id, actor=args.actor, **changes)
    emit(args, tenant, lambda: _show_tenant(tenant))


def _tenants_audit(client, args) -> None:
    log = client.tenant_audit(args.tenant_id)
    rows = [{"id": e.id, "at": e.at, "actor": e.actor,
             "changes": "; ".join(f"{k}: {v.get('old')} -> {v.get('new')}"
                                  for k, v in e.changes.items())} for e in log.data]
    emit(args, log, lambda: print_table(rows, ["id", "at", "actor", "changes"]))


# -- keys ----------------------------------------------------------------------------------

KEY_COLUMNS = ["id", "tenant_id", "prefix", "name", "created_at", "revoked_at"]


def _keys_create(client, args) -> None:
    key = client.create_api_key(args.tenant_id, args.name)

    def show() -> None:
        print_fields(dict(key))
        print("\nThe key is shown this once; only its hash is stored.", file=sys.stderr)
    emit(args, key, show)


def _keys_list(client, args) -> None:
    page = client.api_keys(args.tenant_id)
    emit(args, page, lambda: print_table([dict(k) for k in page.data], KEY_COLUMNS))


def _keys_revoke(client, args) -> None:
    key = client.revoke_api_key(args.tenant_id, args.key_id)
    emit(args, key, lambda: print_fields(dict(key)))


# -- items ---------------------------------------------------------------------------------

def read_items(path: Path) -> list[dict[str, Any]]:
    """Items from a JSON file (a list, or ``{"items": [...]}``) or a CSV/TSV of key and
    title (a ``key`` header row is skipped)."""
    import csv

    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json" or text.lstrip()[:1] in ("[", "{"):
        data = json.loads(text)
        data = data["items"] if isinstance(data, dict) else data
        if not isinstance(data, list) or not all(isinstance(i, dict) and "key" in i
                                                 for i in data):
            raise ValueError(f"{path}: expected a list of objects with a key")
        return data
    delimiter = "\t" if "\t" in text.split("\n", 1)[0] else ","
    items = []
    for n, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), 1):
        if not row or (n == 1 and row[0].strip().lower() == "key"):
            continue
        items.append({"key": row[0].strip(),
                      "title": row[1].strip() if len(row) > 1 and row[1].strip() else None})
    if not items:
        raise ValueError(f"{path}: no items")
    return items


def _items_put(client, args) -> None:
    done = client.put_items(read_items(args.file))
    emit(args, done, lambda: print(f"{done.upserted} item(s) added or updated"))


def _items_list(client, args) -> None:
    page = client.items(limit=args.limit, offset=args.offset)

    def show() -> None:
        print_table([dict(i) for i in page.data], ["id", "key", "title"])
        print(f"({len(page.data)} of {page.count})")
    emit(args, page, show)


# -- jobs ----------------------------------------------------------------------------------

JOB_COLUMNS = ["id", "status", "algorithm", "current_round", "rounds", "tenant_ids",
               "test_rmse", "created_at"]


def _job_row(job) -> dict[str, Any]:
    return {**dict(job), "test_rmse": (job.latest_metrics or {}).get("test_rmse")}


def job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of ``jobs create``: --body's JSON with the options given replacing it."""
    body: dict[str, Any] = {}
    if args.body:
        text = sys.stdin.read() if args.body == "-" else Path(args.body).read_text()
        body = json.loads(text)
        if not isinstance(body, dict):
            raise ValueError("--body: expected a JSON object")
    for name in ("algorithm", "rounds", "per_round", "seed"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.tenants:
        try:
            body["tenant_ids"] = [int(t) for t in args.tenants.split(",")]
        except ValueError:
            raise ValueError(f"--tenants: expected ids like 1,2,3, got {args.tenants!r}") \
                from None
    if args.epsilon is not None and args.no_noise:
        raise ValueError("give --epsilon or --no-noise, not both")
    if args.epsilon is not None:
        body.pop("dp", None)
        body["privacy"] = {"unit": "user", "target_epsilon": args.epsilon,
                           "delta": args.delta if args.delta is not None else 1e-6,
                           **({"placement": args.placement} if args.placement else {})}
    elif args.delta is not None or args.placement:
        raise ValueError("--delta and --placement go with --epsilon")
    if args.no_noise:
        body.pop("privacy", None)
        body["dp"] = {"mechanism": "none"}
    return body


def _jobs_create(client, args) -> int:
    body = job_body(args)
    if args.dry_run:
        plan = client.plan_job(**body)

        def show() -> None:
            print(f"dry run of {plan.algorithm}: nothing created")
            print_table([{"tenant": t, **dict(p)} for t, p in plan.tenants.items()],
                        ["tenant", "epsilon_spent", "epsilon_after", "epsilon_max", "delta"])
        emit(args, plan, show)
        return 0
    job = client.create_job(idempotency_key=args.idempotency_key, **body)
    if args.watch:
        if args.json != "-":
            print(f"job {job.id} created", file=sys.stderr)
        args.interval = 1.0
        args.job_id = job.id
        return _jobs_watch(client, args)
    emit(args, job, lambda: print_fields(_job_row(job)))
    return 0


def _jobs_list(client, args) -> None:
    page = client.jobs(limit=args.limit, offset=args.offset)
    emit(args, page, lambda: print_table([_job_row(j) for j in page.data], JOB_COLUMNS))


def _show_job(job) -> None:
    fields = _job_row(job)
    fields.pop("latest_metrics")
    for name in ("config", "dp", "stopped_tenants", "agents"):
        if fields.get(name) is not None:
            fields[name] = json.dumps(fields[name])
    print_fields(fields)


def _jobs_show(client, args) -> None:
    job = client.job(args.job_id)
    emit(args, job, lambda: _show_job(job))


def _jobs_cancel(client, args) -> None:
    job = client.cancel_job(args.job_id)
    emit(args, job, lambda: print(f"job {job.id} {job.status} (it stops after its "
                                  "current round)"))


def _jobs_resume(client, args) -> None:
    job = client.resume_job(args.job_id)
    emit(args, job, lambda: print(f"job {job.id} {job.status} from round "
                                  f"{job.current_round + 1}"))


def _jobs_report(client, args) -> None:
    report = client.job_report(args.job_id)

    def show() -> None:
        job = report.job
        print(f"job {job.id}: {job.algorithm}, {job.status}, {job.current_round}/"
              f"{job.rounds} rounds")
        print_table([dict(r) for r in report.curve],
                    ["round", "objective", "test_rmse", "test_mae", "uploads", "seconds"])
        privacy = report.privacy
        print(f"\nprivacy: {privacy.get('guarantee', privacy.get('mechanism'))}")
        for tenant, eps in (privacy.get("epsilon_per_tenant") or {}).items():
            lifetime = (privacy.get("lifetime") or {}).get(tenant)
            if lifetime and lifetime.get("this_job", {}).get("requested_delta") is not None:
                from app.commands.output import spend_line

                print(f"  tenant {tenant}: {spend_line(lifetime)}")
            else:
                print(f"  tenant {tenant}: epsilon {_cell(eps)}")
        if privacy.get("note") and privacy.get("private"):
            print(f"  ({privacy['note']})")
    emit(args, report, show)


def _epsilon(client, job_id: int) -> Any:
    """The largest epsilon a tenant of the job has spent so far (the report's)."""
    return client.job_report(job_id).privacy.get("epsilon_max")


def _jobs_watch(client, args) -> int:
    """Poll the job until it ends; a rich progress bar on a terminal, else a line a round.
    The final job is the answer (``--json``)."""
    job = client.job(args.job_id)
    live = sys.stderr.isatty() and args.json != "-"
    seen, eps = -1, None
    bar = task = None
    if live:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        bar = Progress(TextColumn(f"job {job.id} {{task.fields[status]}}"), BarColumn(),
                       MofNCompleteColumn(), TextColumn("{task.fields[metrics]}"),
                       TimeElapsedColumn(), console=Console(stderr=True))
        task = bar.add_task("rounds", total=job.rounds, status=job.status, metrics="")
        bar.start()
    try:
        while True:
            if job.current_round != seen:
                seen = job.current_round
                eps = _epsilon(client, job.id) if seen > 0 else eps
                metrics = _watch_line(job, eps)
                if bar is not None:
                    bar.update(task, completed=seen, status=job.status, metrics=metrics)
                elif seen > 0 and args.json != "-":
                    print(f"job {job.id} round {seen}/{job.rounds} {metrics}", flush=True)
            elif bar is not None:
                bar.update(task, status=job.status)
            if job.finished:
                break
            time.sleep(args.interval)
            job = client.job(args.job_id)
    finally:
        if bar is not None:
            bar.stop()
    end = f"job {job.id} {job.status}" + (f": {job.error}" if job.error else "")
    emit(args, job, lambda: print(end, flush=True))
    return 0 if job.status == "completed" else 1


def _watch_line(job, eps) -> str:
    m = job.latest_metrics or {}
    parts = []
    if m.get("test_rmse") is not None:
        parts.append(f"RMSE {m['test_rmse']:.4f}")
    if eps is not None:
        parts.append(f"epsilon {_cell(eps) if isinstance(eps, str) else f'{eps:.3g}'}")
    return "  ".join(parts)


# -- tuning jobs ---------------------------------------------------------------------------

def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ids, got {text!r}"
                                         ) from None


def _show_tuning(job) -> None:
    fields = {k: getattr(job, k) for k in (
        "id", "status", "algorithm", "tenant_ids", "rounds", "trials", "chosen_rounds",
        "validation_rmse",
        "default_validation_rmse", "budget_exhausted", "seconds", "error")}
    fields["trials_scored"] = len(job.scored)
    fields["config"] = None if job.config is None else json.dumps(job.config)
    fields["changed"] = None if job.changed is None else json.dumps(job.changed)
    print_fields(fields)


def _tuning_create(client, args) -> int:
    body = {"algorithm": args.algorithm, "trials": args.trials, "seed": args.seed,
            "budget_seconds": args.budget_seconds}
    if args.tenants is not None:
        body["tenant_ids"] = args.tenants
    if args.rounds is not None:
        body["rounds"] = args.rounds
    if args.metric is not None:
        body["metric"] = args.metric
    job = client.create_tuning_job(**body)
    if args.wait:
        job = client.wait_tuning_job(job.id)
    emit(args, job, lambda: _show_tuning(job))
    return 0 if job.status != "failed" else 1


def _tuning_show(client, args) -> None:
    job = client.tuning_job(args.job_id)
    emit(args, job, lambda: _show_tuning(job))
