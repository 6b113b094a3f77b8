"""The web dashboard (server-rendered pages for operators and tenants) and the offline
API reference pages, installed on the API app by :func:`install_dashboard`."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from app.dashboard.docs import install_docs


def install_dashboard(app: FastAPI) -> None:
    """``/docs``, ``/redoc``, ``/dashboard/...`` (``/`` redirects there) and their files."""
    from app.dashboard import auth, routes

    install_docs(app)
    app.mount("/static/dashboard", StaticFiles(directory=str(Path(__file__).parent / "static")),
              name="dashboard-static")
    app.include_router(routes.root_router)
    app.include_router(routes.router)

    async def sign_in(request: Request, exc: auth.SignInRequired) -> RedirectResponse:
        return RedirectResponse("/dashboard/login", status_code=303)

    async def not_found(request: Request, exc: auth.PageNotFound):
        return routes.templates.TemplateResponse(
            request, "error.html", {"viewer": None, "detail": exc.detail}, status_code=404)

    app.add_exception_handler(auth.SignInRequired, sign_in)
    app.add_exception_handler(auth.PageNotFound, not_found)
