"""The dashboard's pages: sign-in, operator pages (tenants, jobs, a job, start a job,
health) and tenant pages (its data, budget, report and curve, recommendation preview).

Pages call the service layer the API calls (:mod:`app.services`: job creation with its
dry run, cancel and resume, readiness), never a route function nor the API over HTTP. A
tenant signed in sees only its own pages: any other tenant's page, and every operator
page, is a 404 (never a 403).
"""

from __future__ import annotations

import datetime as dt
import hmac
from pathlib import Path
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Form, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from algorithms import registry
from app.dashboard import auth, charts, data
from app.deps import client_of, get_session, refuse_if_locked_out
from app.models import Tenant, User
from app.problems import ApiError
from app.services import jobs as job_service
from app.services.health import broker_state, database_state
from app.training import reports
from app.training.curves import job_chart, mean_baselines
from app.training.models import TrainingJob
from app.training.schemas import JobCreate
from app.training.serving import UnknownUser, recommend

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
router = APIRouter(prefix="/dashboard", include_in_schema=False)
root_router = APIRouter(include_in_schema=False)
Db = Annotated[Session, Depends(get_session)]
ACTIVE = ("queued", "running")


def _iso(value: dt.datetime | None) -> str:
    if value is None:
        return ""
    if value.tzinfo is None:  # SQLite returns naive datetimes; they are stored in UTC
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat(timespec="seconds")


templates.env.filters["iso"] = _iso
templates.env.filters["eps"] = data.epsilon_text
templates.env.filters["privacy_words"] = data.settings_words
templates.env.filters["named"] = lambda ids, names: (
    ", ".join(names.get(i, str(i)) for i in ids) if len(ids) <= 4 else f"{len(ids)} tenants")


def get_viewer(request: Request, session: Db) -> auth.Viewer:
    return auth.viewer(request, session)


ViewerDep = Annotated[auth.Viewer, Depends(get_viewer)]


def operator(viewer: ViewerDep) -> auth.Viewer:
    """Operator pages: a tenant gets the same 404 as for a page that does not exist."""
    if not viewer.is_admin:
        raise auth.PageNotFound()
    return viewer


OperatorDep = Annotated[auth.Viewer, Depends(operator)]


def _page(request: Request, name: str, viewer: auth.Viewer | None, status: int = 200,
          **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {"viewer": viewer, **context},
                                      status_code=status)


def _tenant_for(session: Session, viewer: auth.Viewer, tenant_id: int) -> Tenant:
    if not viewer.is_admin and viewer.tenant.id != tenant_id:
        raise auth.PageNotFound("Tenant not found")
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise auth.PageNotFound("Tenant not found")
    return tenant


# --- sign-in -------------------------------------------------------------------------------

@root_router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/dashboard", status_code=303)


@router.get("")
def dashboard_home(viewer: ViewerDep) -> RedirectResponse:
    target = "/dashboard/tenants" if viewer.is_admin else f"/dashboard/tenants/{viewer.tenant.id}"
    return RedirectResponse(target, status_code=303)


def _login_page(request: Request, error: str | None = None, status: int = 200) -> HTMLResponse:
    token = auth.new_login_csrf()
    response = _page(request, "login.html", None, status, csrf=token, error=error)
    response.set_cookie(auth.LOGIN_CSRF_COOKIE, token, max_age=3600,
                        **auth.cookie_options(request))
    return response


@router.get("/login")
def login_form(request: Request) -> HTMLResponse:
    return _login_page(request)


@router.post("/login")
def login(request: Request, session: Db, secret: Annotated[str, Form()] = "",
          csrf: Annotated[str, Form()] = "") -> Response:
    expected = request.cookies.get(auth.LOGIN_CSRF_COOKIE)
    if not expected or not csrf or not hmac.compare_digest(expected, csrf):
        return _login_page(request, "The form expired; please sign in again.", 403)
    try:
        refuse_if_locked_out(request)
    except ApiError as exc:
        page = _login_page(request, exc.detail, exc.status_code)
        page.headers.update(exc.headers)
        return page
    try:
        tenant = auth.check_secret(request, session, secret.strip())
    except HTTPException as exc:
        request.app.state.sign_ins.failed(client_of(request))
        return _login_page(request, exc.detail, 401)
    target = "/dashboard/tenants" if tenant is None else f"/dashboard/tenants/{tenant.id}"
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(auth.COOKIE, auth.session_cookie(request, secret.strip()),
                        max_age=auth.SESSION_SECONDS, **auth.cookie_options(request))
    response.delete_cookie(auth.LOGIN_CSRF_COOKIE, path="/")
    return response


@router.post("/logout")
def logout(request: Request, viewer: ViewerDep, session: Db,
           csrf: Annotated[str, Form()] = "") -> RedirectResponse:
    auth.check_csrf(viewer, csrf)
    auth.revoke(request, session)
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(auth.COOKIE, path="/")
    return response


# --- operator ------------------------------------------------------------------------------

@router.get("/tenants")
def tenants_page(request: Request, viewer: OperatorDep, session: Db) -> HTMLResponse:
    tenants = data.all_tenants(session)
    ids = [t.id for t in tenants]
    return _page(request, "tenants.html", viewer, tenants=tenants,
                 counts=data.counts(session), budgets=data.budgets(session, ids),
                 last_jobs=data.last_jobs(session, ids))


@router.get("/jobs")
def jobs_page(request: Request, viewer: OperatorDep, session: Db) -> HTMLResponse:
    jobs = list(session.scalars(sa.select(TrainingJob).order_by(TrainingJob.id.desc())
                                .limit(100)))
    names = dict(session.execute(sa.select(Tenant.id, Tenant.name)).all())
    return _page(request, "jobs.html", viewer, jobs=jobs, names=names,
                 refresh=any(j.status in ACTIVE for j in jobs))


def _job(session: Session, job_id: int) -> TrainingJob:
    job = session.get(TrainingJob, job_id)
    if job is None:
        raise auth.PageNotFound("Training job not found")
    return job


@router.get("/jobs/new")
def new_job_form(request: Request, viewer: OperatorDep, session: Db) -> HTMLResponse:
    return _job_form(request, viewer, session, {})


def _job_form(request: Request, viewer: auth.Viewer, session: Session, form: dict,
              plan: dict | None = None, error: str | list | None = None,
              status: int = 200) -> HTMLResponse:
    tenants = data.all_tenants(session)
    return _page(request, "job_new.html", viewer, status, tenants=tenants,
                 algorithms=registry.names(), form=form, plan=plan, error=error,
                 kinds={a: registry.model_kind(a) for a in registry.names()},
                 budgets=data.budgets(session, [t.id for t in tenants]))


def _number(form: dict, field: str, kind=float, default=None):
    raw = (form.get(field) or "").strip()
    if not raw and default is not None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{LABELS[field]}: {raw!r} is not a "
                         f"{'whole ' if kind is int else ''}number") from None


LABELS = {"rounds": "Rounds", "seed": "Seed", "epsilon": "Target epsilon", "delta": "Delta",
          "noise_multiplier": "Noise multiplier", "clip": "Clip bound"}


def _job_body(form: dict) -> dict:
    """The ``POST /admin/jobs`` body the form describes; ValueError names a bad field."""
    body: dict[str, Any] = {"algorithm": form.get("algorithm") or None,
                            "rounds": _number(form, "rounds", int),
                            "seed": _number(form, "seed", int, 0)}
    if form.get("tenant_ids"):
        body["tenant_ids"] = [int(t) for t in form["tenant_ids"]]
    privacy = form.get("privacy", "user")
    if privacy == "user":
        body["privacy"] = {"unit": "user", "placement": form.get("placement", "central"),
                           "target_epsilon": _number(form, "epsilon"),
                           "delta": _number(form, "delta", float, 1e-6)}
    elif privacy == "tenant":
        body["dp"] = {"mechanism": form.get("mechanism", "gaussian"),
                      "noise_multiplier": _number(form, "noise_multiplier"),
                      "clip": _number(form, "clip", float, 1.0)}
    else:
        body["dp"] = {"mechanism": "none"}
        body["allow_not_private"] = True
    return body


@router.post("/jobs/new")
async def create_job(request: Request, viewer: OperatorDep, session: Db) -> Response:
    raw = await request.form()
    auth.check_csrf(viewer, raw.get("csrf"))
    form = {k: raw.get(k) for k in raw if k != "tenant_ids"}
    form["tenant_ids"] = raw.getlist("tenant_ids")
    try:
        body = JobCreate(**_job_body(form))
    except (ValidationError, ValueError) as exc:
        msg = ([f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
               if isinstance(exc, ValidationError) else str(exc))
        return _job_form(request, viewer, session, form, error=msg, status=422)
    dry_run = form.get("action") != "start"
    try:  # on a thread: the dry round (or, with a broker, the wait for a worker's answer)
        # must not hold up this process's event loop and every other request on it
        result = await run_in_threadpool(job_service.create_job, session,
                                         request.app.state.settings, request.app, body,
                                         dry_run=dry_run)
    except HTTPException as exc:
        return _job_form(request, viewer, session, form, error=exc.detail,
                         status=exc.status_code)
    except RequestValidationError as exc:
        return _job_form(request, viewer, session, form,
                         error=[e["msg"] for e in exc.errors()], status=422)
    if dry_run:
        plan = result.model_dump(mode="json")
        names = {str(t.id): t.name for t in data.all_tenants(session)}
        return _job_form(request, viewer, session, form, plan={**plan, "names": names})
    return RedirectResponse(f"/dashboard/jobs/{result.job.id}", status_code=303)


DONE = {"cancel": "Cancel requested: the job stops after its current round.",
        "resume": "Resume requested: the next round was sent again."}


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: int, viewer: OperatorDep, session: Db) -> HTMLResponse:
    return _job_page(request, job_id, viewer, session)


def _job_page(request: Request, job_id: int, viewer: auth.Viewer, session: Session,
              message: str | None = None, status: int = 200) -> HTMLResponse:
    job = _job(session, job_id)
    report = reports.privacy_of_job(session, job)
    names = dict(session.execute(sa.select(Tenant.id, Tenant.name)).all())
    rmse = job_chart(session, job, "test_rmse", report=report)
    mae = job_chart(session, job, "test_mae", report=report)
    rounds = reports.curve(session, job.id)
    ranking = reports.final_ranking(rounds)
    done = DONE.get(request.query_params.get("done", ""))
    return _page(request, "job.html", viewer, status, job=job, report=report, names=names,
                 rmse=charts.line_chart(rmse), mae=charts.line_chart(mae),
                 reference=rmse.reference_job_id, baselines=mean_baselines(session, job),
                 last=rounds[-1] if rounds else None, sentences=data.plain_privacy(report),
                 ranking=ranking.get("overall"), ranking_per_tenant=ranking.get("per_tenant", {}),
                 popularity=(ranking.get("popularity") or {}).get("overall"),
                 models=reports.models_of(session, job),
                 refresh=job.status in ACTIVE and message is None, message=message or done)


@router.post("/jobs/{job_id}/{action}")
def job_action(request: Request, job_id: int, action: str, viewer: OperatorDep, session: Db,
               csrf: Annotated[str, Form()] = "") -> Response:
    """Cancel or resume through the service the admin API calls too."""
    auth.check_csrf(viewer, csrf)
    _job(session, job_id)
    calls = {"cancel": lambda: job_service.cancel(session, job_id),
             "resume": lambda: job_service.resume_job(session, request.app, job_id)}
    if action not in calls:
        raise auth.PageNotFound()
    try:
        calls[action]()
    except HTTPException as exc:
        session.rollback()
        return _job_page(request, job_id, viewer, session, message=exc.detail,
                         status=exc.status_code)
    return RedirectResponse(f"/dashboard/jobs/{job_id}?done={action}", status_code=303)


@router.get("/health")
def health_page(request: Request, viewer: OperatorDep, session: Db) -> HTMLResponse:
    settings = request.app.state.settings
    database = database_state(request.app.state.engine)
    broker = broker_state(settings.broker_url)
    if not settings.broker_url:
        workers = "none needed: tasks run in the API process"
    elif broker != "ok":
        workers = "unknown: the broker is unreachable"
    else:
        try:
            replies = request.app.state.celery.control.ping(timeout=1.0) or []
            workers = (f"{len(replies)} answering: " + ", ".join(sorted(
                name for r in replies for name in r)) if replies else "none answering")
        except Exception as exc:  # noqa: BLE001 - reported on the page
            workers = f"unknown ({type(exc).__name__})"
    last = session.scalar(sa.select(sa.func.max(Tenant.last_retrained_at)))
    schedule = request.app.state.celery.conf.beat_schedule or {}
    return _page(request, "health.html", viewer, database=database, broker=broker,
                 workers=workers, beat=sorted(schedule), last_retrained=last,
                 broker_url=bool(settings.broker_url))


# --- tenant pages --------------------------------------------------------------------------

@router.get("/tenants/{tenant_id}")
def tenant_page(request: Request, tenant_id: int, viewer: ViewerDep,
                session: Db) -> HTMLResponse:
    tenant = _tenant_for(session, viewer, tenant_id)
    jobs = data.jobs_of_tenant(session, tenant.id)
    charged = data.charges_per_job(session, tenant.id)
    spends = []
    for job in jobs[:20]:
        rep = reports.privacy_of_job(session, job, [tenant.id])
        this_job = rep.get("lifetime", {}).get(str(tenant.id), {}).get("this_job", {})
        spends.append((job, (rep.get("epsilon_per_tenant") or {}).get(str(tenant.id)),
                       this_job.get("epsilon"), charged.get(job.id, 0)))
    latest = jobs[0] if jobs else None
    chart = sentences = None
    if latest is not None:
        report = reports.privacy_of_job(session, latest, [tenant.id])
        chart = charts.line_chart(job_chart(session, latest, "test_rmse", tenant.id, report))
        sentences = data.plain_privacy(report)
    hist = data.histogram(session, tenant.id)
    return _page(request, "tenant.html", viewer, tenant=tenant,
                 counts=data.counts(session, [tenant.id]).get(tenant.id, {}),
                 histogram=charts.histogram_chart(hist, f"Ratings of {tenant.name} by value"),
                 budget=data.budgets(session, [tenant.id]).get(tenant.id),
                 spends=spends, latest=latest, chart=chart, sentences=sentences,
                 refresh=latest is not None and latest.status in ACTIVE)


@router.get("/tenants/{tenant_id}/recommendations")
def recommendations_page(request: Request, tenant_id: int, viewer: ViewerDep, session: Db,
                         user: str = "", k: int = 10) -> HTMLResponse:
    tenant = _tenant_for(session, viewer, tenant_id)
    k = max(1, min(k, 50))
    ranked, error = None, None
    if user:
        try:
            ranked = recommend(session, request.app.state.factor_cache,
                               request.app.state.ratings_cache, tenant, user, k, 0, False)
        except UnknownUser:
            error = f"User {user!r} not found: no ratings and no factors in this tenant"
    users = session.scalars(sa.select(User.key).where(User.tenant_id == tenant.id)
                            .order_by(User.id).limit(20)).all()
    return _page(request, "recommendations.html", viewer, tenant=tenant, user=user, k=k,
                 ranked=ranked, error=error, users=users)
