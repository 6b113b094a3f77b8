"""``/docs`` (Swagger UI) and ``/redoc`` from the files of the installed ``fastapi-offline``
package, so the API reference works on a machine without internet (FastAPI's own pages
load their scripts from a CDN)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_STATIC = "/static/docs"


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and ``/redoc``; the app must be built with ``docs_url=None``."""
    assets = files("fastapi_offline") / "static"
    app.mount(DOCS_STATIC, StaticFiles(directory=str(assets)), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            swagger_js_url=f"{root}{DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_STATIC}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}",
                              title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOCS_STATIC}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOCS_STATIC}/favicon.png",
                              with_google_fonts=False)
