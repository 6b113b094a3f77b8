"""The web dashboard (server-rendered pages for operators and tenants) and the offline
API reference pages, installed on the API app by :func:`install_dashboard`."""

from __future__ import annotations

from fastapi import FastAPI

from app.dashboard.docs import install_docs


def install_dashboard(app: FastAPI) -> None:
    install_docs(app)
