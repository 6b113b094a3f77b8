"""Tenant: export its trained model (``GET /v1/tenants/{id}/model``).

The tenant's latest serving snapshot as one NumPy ``.npz`` file (``numpy.load`` reads it;
no pickle), so a tenant can score offline or move its model elsewhere:

* ``user_keys`` (m,) and ``item_keys`` (n,): strings, the tenant's own users and the
  catalogue items the snapshot serves;
* ``user_factors`` (m, r) and ``item_factors`` (r, n): a user's score for the items is
  ``user_factors[u] @ item_factors``; with a ``link`` array (offset, spread) the served
  score is ``offset + spread * sigmoid(...)``;
* ``meta``: a JSON string with the job id, round, algorithm, the job's privacy settings
  and this format's version.

What it holds is the tenant's own: its users' factors, computed from its own ratings and
the item factors every tenant of the job received. No other tenant's users are in it.
"""

from __future__ import annotations

import io
import json

import numpy as np
from fastapi import APIRouter, Response, status

from app.deps import OwnTenantDep, SessionDep, errors
from app.problems import ApiError
from app.routes import API_PREFIX
from app.training.models import TrainingJob
from app.training.snapshots import latest_factors

router = APIRouter(prefix=API_PREFIX + "/tenants/{tenant_id}", tags=["tenant: recommendations"],
                   responses=errors(401, 404))

FORMAT_VERSION = 1
NPZ = "application/x-npz"
NO_MODEL = "No trained model yet: a training job has not published factors for this tenant"


def model_npz(factors, job: TrainingJob | None) -> bytes:
    """The export file of a serving snapshot (:class:`app.training.snapshots.ServingFactors`)."""
    users = sorted(factors.user_index, key=factors.user_index.get)
    meta = {"format_version": FORMAT_VERSION, "job_id": factors.job_id,
            "round": factors.round, "algorithm": None if job is None else job.algorithm,
            "privacy": None if job is None else job.dp}
    arrays = {"user_keys": np.array(users, dtype=str),
              "item_keys": np.array(factors.item_keys, dtype=str),
              "user_factors": factors.a, "item_factors": factors.b,
              "meta": np.array(json.dumps(meta))}
    if factors.link is not None:
        arrays["link"] = np.asarray(factors.link, dtype=np.float64)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


@router.get("/model", response_class=Response,
            responses={200: {"content": {NPZ: {"schema": {"type": "string",
                                                          "format": "binary"}}},
                             "description": "The tenant's model as a NumPy .npz file: "
                                            "user_keys, item_keys, user_factors, "
                                            "item_factors, meta (JSON) and, for a sigmoid "
                                            "link, link."}})
def read_model(tenant: OwnTenantDep, session: SessionDep) -> Response:
    """Download this tenant's latest trained model (its users' and the items' factors)."""
    factors = latest_factors(session, tenant.id)  # as of now, not the serving cache's
    if factors is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "no_model", NO_MODEL)
    body = model_npz(factors, session.get(TrainingJob, factors.job_id))
    return Response(body, media_type=NPZ, headers={
        "Content-Disposition": f'attachment; filename="tenant-{tenant.id}-model.npz"'})
