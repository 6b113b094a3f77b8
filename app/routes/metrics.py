"""Prometheus metrics (admin token required; see app/metrics.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.deps import errors, require_admin

router = APIRouter(tags=["operations"], dependencies=[Depends(require_admin)],
                   responses=errors(401, 429))


@router.get("/metrics", response_class=Response, responses={200: {
    "description": "Prometheus text format: request latency by route and status, uploads, "
                   "serving cache hits, jobs by status, round durations, epsilon per tenant.",
    "content": {"text/plain": {"schema": {"type": "string"}}}}})
def read_metrics(request: Request) -> Response:
    """The metrics of this API process and of the database (jobs, rounds, epsilon)."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
