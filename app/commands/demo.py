"""``fedrec demo``: the whole product on embedded defaults, through its own HTTP API.

Creates tenants (MovieLens 100k users split among them when a path is given, else the
synthetic generator), uploads their ratings as CSV, trains the default job with user-level
differential privacy (each user protected, noise added once to the tenants' bounded sums)
through the real pipeline: a ranking model (dp-ials) that serves the lists, shown with a
most-popular list's precision and NDCG on the same held-out split, and a rating model
(DPALS) whose RMSE curve is printed beside the same model without noise; then the privacy
report and sample recommendations, each naming the model that produced it. The noise-free
comparison trains on copies of the tenants ("<name>-noise-free") that opted in to
non-private training, so the real tenants never send anything without a guarantee.
``--serve`` keeps the API running afterwards, serving the private model. Every call goes
through the Python client, :mod:`fedrec.client`.
"""

from __future__ import annotations

import argparse
import io
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.data import Ratings, load_ratings
from algorithms.synthetic import generate_ratings
from app.commands.output import spend_line
from fedrec.client import ApiError, Client, Job, JobReport

TENANT_NAMES = ["northwind", "contoso", "fabrikam", "globex", "initech", "umbrella",
                "hooli", "stark", "wayne", "acme"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole product end to end on embedded defaults",
                       description=__doc__)
    p.add_argument("data", nargs="?", type=Path,
                   help="ratings file (e.g. MovieLens 100k's ml-100k/u.data); default: synthetic")
    p.add_argument("--tenants", type=int, default=5, help="number of tenants (2..10)")
    p.add_argument("--synthetic-ratings", type=int, default=100_000,
                   help="size of the synthetic set when no file is given (943 users, "
                        "1,682 items, as MovieLens 100k)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the job (default: the algorithm's recommended number)")
    p.add_argument("--per-round", type=int, default=0, help="tenants per round (0: all)")
    p.add_argument("--privacy", choices=["user", "tenant", "none"], default="user",
                   help="unit protected: user (each person's ratings; default), tenant (a "
                        "tenant's whole block, through --dp), or none")
    p.add_argument("--placement", choices=["central", "tenant"], default="central",
                   help="user unit: noise added once to the sum (central) or by each tenant")
    p.add_argument("--algorithm", default=None,
                   help="one model instead of the default job (for the user unit: dp-ials "
                        "for the lists and dpals for the ratings; fedmc-admm otherwise)")
    p.add_argument("--dp", choices=["gaussian", "laplace"], default="gaussian",
                   help="tenant unit: the mechanism")
    p.add_argument("--epsilon", type=float, default=8.0,
                   help="epsilon of the private job (the noise is solved for it)")
    p.add_argument("--delta", type=float, default=1e-6,
                   help="delta of the user-level guarantee (tenant unit: 1e-5)")
    p.add_argument("--clip", type=float, default=None,
                   help="tenant unit: clip bound of each upload (default: calibrated)")
    p.add_argument("--budget", type=float, default=None,
                   help="each tenant's epsilon_max (default: twice --epsilon)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--database-url", default="sqlite:///./fedrec-demo.db",
                   help="a fresh SQLite file by default (recreated on every run)")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--serve", action="store_true", help="keep the API running afterwards")
    p.set_defaults(func=run)


def item_titles(path: Path | None) -> dict[int, str]:
    """MovieLens titles beside the ratings file, when present (items.tsv or movies.dat)."""
    if path is None:
        return {}
    out: dict[int, str] = {}
    tsv, dat = path.parent / "items.tsv", path.parent / "movies.dat"
    if tsv.is_file():
        for line in tsv.read_text(encoding="latin-1").splitlines()[1:]:
            f = line.split("\t")
            if len(f) >= 2 and f[0].isdigit():
                out[int(f[0])] = f[1]
    elif dat.is_file():
        for line in dat.read_text(encoding="latin-1").splitlines():
            f = line.split("::")
            if len(f) >= 2 and f[0].isdigit():
                out[int(f[0])] = f[1]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(settings, port: int):
    import uvicorn

    from app.main import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread


def _csv(users: np.ndarray, items: np.ndarray, values: np.ndarray) -> bytes:
    buf = io.StringIO()
    buf.write("user,item,rating\n")
    for u, i, v in zip(users.tolist(), items.tolist(), values.tolist(), strict=True):
        buf.write(f"u{u},{i},{v:g}\n")
    return buf.getvalue().encode()


def _setup(admin: Client, ratings: Ratings, titles: dict[int, str], n_tenants: int,
           budget: float, seed: int, noise_free: bool = False) -> list[dict[str, Any]]:
    """Items, tenants, keys and uploads, all through the API (:mod:`fedrec.client`).
    ``noise_free``: the copies for the comparison job, which opt in to non-private
    training."""
    items = np.unique(ratings.items)
    admin.put_items({"key": str(i), "title": titles.get(int(i))} for i in items.tolist())
    users = np.unique(ratings.users)
    owner = dict(zip(users.tolist(), np.random.default_rng(seed).integers(0, n_tenants,
                                                                          users.size).tolist(),
                     strict=True))
    tenant_of = np.array([owner[u] for u in ratings.users.tolist()])
    tenants = []
    for t in range(n_tenants):
        created = admin.create_tenant(
            TENANT_NAMES[t] + ("-noise-free" if noise_free else ""), budget,
            rating_min=float(ratings.values.min()), rating_max=float(ratings.values.max()),
            allow_non_private=noise_free)
        key = admin.create_api_key(created.id, name="demo").key
        mine = tenant_of == t
        with Client(admin.base_url, token=key, timeout=120) as tenant:
            tenant.upload_ratings(created.id, csv=_csv(
                ratings.users[mine], ratings.items[mine], ratings.values[mine]))
        tenants.append({"id": created.id, "name": created.name, "key": key,
                        "n": int(mine.sum()), "first_user": f"u{ratings.users[mine][0]}"})
        if not noise_free:
            print(f"  tenant {created.name:<10} id {created.id}: "
                  f"{int(mine.sum()):>6} ratings uploaded")
    return tenants


def _train(admin: Client, args: argparse.Namespace, privacy: dict[str, Any],
           tenants: list[dict[str, Any]], algorithm: str | None
           ) -> tuple[JobReport, JobReport | None]:
    """Run one job, or the default pair (``algorithm`` None); returns (the rating model's
    report, the ranking model's report or None)."""
    body = {"algorithm": algorithm} if algorithm else {}
    if args.rounds is not None:
        body["rounds"] = args.rounds
    try:
        job = admin.create_job(per_round=args.per_round, seed=args.seed,
                               tenant_ids=[t["id"] for t in tenants], **body, **privacy)
    except ApiError as exc:
        raise ValueError(f"job refused ({exc.status} {exc.code}): {exc.detail}") from None
    reports = [_wait(admin, job)]
    if job.pair_job_id is not None:
        reports.append(_wait(admin, admin.job(job.pair_job_id)))
    kinds = {r.job.model_kind: r for r in reports}
    return kinds.get("rating", reports[0]), kinds.get("ranking")


def _wait(admin: Client, job: Job) -> JobReport:
    shown = [0]

    def progress(state: Job) -> None:  # one line per round, none skipped or repeated
        for k in range(shown[0] + 1, state.current_round + 1):
            print(f"  {state.algorithm} round {k}/{state.rounds}", flush=True)
        shown[0] = max(shown[0], state.current_round)

    job = admin.wait_job(job.id, poll=0.5, on_poll=progress)
    if job.status != "completed":
        raise ValueError(f"job {job.id} {job.status}: {job.error}")
    return admin.job_report(job.id)


def _print_lists(report: JobReport) -> None:
    """Which model serves the lists, its precision and NDCG@10 beside popularity's on the
    same held-out split, and why."""
    lists = report.models.get("lists") or {}
    print(f"\nLists (top 10 on the held-out split; k = 10): {lists.get('algorithm')} "
          f"({lists.get('model_kind')} model, job {lists.get('job_id')}) against a "
          "most-popular list")
    for name, r in ((lists.get("algorithm"), report.ranking), ("popularity", report.popularity)):
        if r is not None and r.ndcg_at_k is not None:
            print(f"  {name:<12} P@10 {r.precision_at_k:.4f}  NDCG@10 {r.ndcg_at_k:.4f}  "
                  f"({r.users_ranked} users)")
    print(f"  served: {lists.get('served_by')}: {lists.get('reason')}")


def _print_curves(private: JobReport, reference: JobReport | None) -> None:
    print("\nTest RMSE per round, all tenants (the private job, and the same job without "
          "noise):")
    curve = private.curve
    ref = {r.round: r for r in reference.curve} if reference else {}
    rows = curve[:: max(1, len(curve) // 10)]
    rows += [curve[-1]] if rows[-1] is not curve[-1] else []
    for row in rows:
        other = ref.get(row.round)
        extra = f"   without noise {other.test_rmse:.4f}" if other else ""
        print(f"  round {row.round:>4}  RMSE {row.test_rmse:.4f}  MAE "
              f"{row.test_mae:.4f}{extra}")


def _print_privacy(report: JobReport, tenants: list[dict[str, Any]]) -> None:
    priv = report.privacy
    print(f"\nPrivacy: {priv['guarantee']}")
    if not priv.get("private"):
        return
    unit = priv["unit"] if priv["unit"] == "user" else "tenant (a tenant's whole block)"
    print(f"  unit: {unit}; placement: {priv.get('placement', 'tenant')}")
    if "adversary" in priv:
        print(f"  adversary: {priv['adversary']}")
    print(f"  delta {priv['delta']}, accounting: {priv['accounting']}")
    for t in tenants:  # fresh tenants: their lifetime spend is this run's (both models)
        print(f"  {t['name']:<10} {spend_line(priv['lifetime'][str(t['id'])])}")
    print(f"  ({priv['note']})")


def _print_recommendations(base_url: str, tenants: list[dict[str, Any]]) -> None:
    print("\nSample recommendations (from the private models):")
    for t in tenants[:3]:
        with Client(base_url, token=t["key"]) as tenant:
            r = tenant.recommendations(t["id"], t["first_user"], k=5)
        who = f"{r.model}, a {r.model_kind} model" if r.source == "model" else r.source
        print(f"  {t['name']} / {r.user} ({who}):")
        if t is tenants[0]:
            print(f"  (from job {r.job_id})" if r.job_id is not None
                  else f"  ({r.reason or 'cold start'})")
        for rec in r.data:
            print(f"    {rec.score:5.2f}  {rec.title or rec.item}")


def _privacy_body(args: argparse.Namespace, ratings: Ratings) -> dict[str, Any]:
    """The job body's privacy part for ``--privacy`` (sets the default algorithm too)."""
    from algorithms import registry

    if args.algorithm is None and args.privacy != "user":
        args.algorithm = "fedmc-admm"
    if args.rounds is None and args.algorithm is not None:  # DPALS: its sweeps and a
        # refresh; the others: 30 (seconds); the default job: each model's own
        args.rounds = (registry.get(args.algorithm).run_defaults["rounds"]
                       if args.algorithm.startswith("dp") else 30)
    if args.privacy == "user":
        return {"privacy": {"unit": "user", "placement": args.placement,
                            "target_epsilon": args.epsilon, "delta": args.delta}}
    if args.privacy == "none":
        return {"dp": {"mechanism": "none"}}
    from privacy.accountant import noise_for_epsilon

    z = noise_for_epsilon(args.dp, args.epsilon, 1e-5, args.rounds)
    return {"dp": {"mechanism": args.dp, "noise_multiplier": round(z, 6),
                   "clip": round(args.clip or _demo_clip(ratings, args.tenants), 4)}}


def _demo_clip(ratings: Ratings, n_tenants: int) -> float:
    """A clip bound near the typical norm of an upload (FedMC-ADMM's W_i, Y_i): the median
    measured on ML-100k with 100 tenants by ``python -m bench.privacy_utility`` was 18.4,
    this gives 18.3."""
    return float(np.sqrt(np.unique(ratings.items).size / n_tenants))


def run(args: argparse.Namespace) -> int:
    from app.config import Settings
    from app.db import migrate

    if not 2 <= args.tenants <= len(TENANT_NAMES):
        raise ValueError(f"--tenants must be between 2 and {len(TENANT_NAMES)}")
    if args.database_url.startswith("sqlite:///./"):
        Path(args.database_url.removeprefix("sqlite:///")).unlink(missing_ok=True)
    ratings = load_ratings(args.data) if args.data else generate_ratings(
        943, 1682, args.synthetic_ratings, seed=args.seed)
    token = secrets.token_urlsafe(32)
    settings = Settings(database_url=args.database_url, admin_token=token, broker_url=None)
    migrate(settings.database_url)
    port = args.port or _free_port()
    server, thread = start_server(settings, port)
    base = f"http://127.0.0.1:{port}"
    print(f"fedrec API on {base} (docs: {base}/docs), database {args.database_url}")
    with Client(base, token=token, timeout=120) as api:
        print(f"Uploading {len(ratings)} ratings for {args.tenants} tenants through the API:")
        titles = item_titles(args.data)
        budget = args.budget or 2 * args.epsilon
        tenants = _setup(api, ratings, titles, args.tenants, budget, args.seed)
        privacy = _privacy_body(args, ratings)
        what = args.algorithm or "the default job (dp-ials for lists, dpals for ratings)"
        print(f"Training {what}, {args.rounds or 'recommended'} rounds, {privacy}:")
        report, ranking = _train(api, args, privacy, tenants, args.algorithm)
        if ranking is not None:
            _print_lists(ranking)
        _print_recommendations(base, tenants)  # the private models' lists
        reference = None
        if args.privacy != "none":
            print("\nTraining the same job without noise on copies of the tenants that opted "
                  "in to non-private training (the real tenants never do):")
            copies = _setup(api, ratings, titles, args.tenants, budget, args.seed,
                            noise_free=True)
            reference, _ = _train(api, args, {"dp": {"mechanism": "none"}, "lists": "model"},
                                  copies, report.job.algorithm)
        _print_curves(report, reference)
        _print_privacy(report, tenants)
        if reference is not None:
            cost = report.curve[-1].test_rmse / reference.curve[-1].test_rmse - 1
            print(f"\nPrivacy cost: noise raised the final test RMSE by {100 * cost:.1f}% "
                  f"at epsilon {args.epsilon:g}. See BENCHMARKS.md (user-level DP) for the "
                  "measured trade-off at every epsilon.")
    if args.serve:
        print(f"\nServing on {base}; admin token: {token}\nTenant keys: " +
              ", ".join(f"{t['name']}={t['key']}" for t in tenants))
        print(f"\nDashboard: {base}/dashboard\n  sign in as the operator with the admin "
              f"token: {token}\n  or as tenant {tenants[0]['name']} with its key: "
              f"{tenants[0]['key']}\nCtrl-C to stop.")
        try:
            thread.join()
        except KeyboardInterrupt:
            pass
    server.should_exit = True
    thread.join(timeout=10)
    return 0
