"""The framework floor of ``bench.recommend_load``: a bare FastAPI app that computes the
same top-10 as fedrec's recommendation route from in-memory factors, with no database, no
authentication and no caches to check.

Run by the benchmark as ``uvicorn --factory bench._floor_app:create_app --workers 2``;
``FEDREC_FLOOR_DATA`` names an ``.npz`` written by the benchmark: the factors ``a``
(users x r) and ``b`` (r x items) fedrec serves, the catalogue ids, keys and titles of
``b``'s columns, the user keys of ``a``'s rows, and each user's rated item ids (CSR).
Never imported by the product.
"""

from __future__ import annotations

import os

import numpy as np
from fastapi import FastAPI, HTTPException

from algorithms.recommend import top_k


def create_app() -> FastAPI:
    with np.load(os.environ["FEDREC_FLOOR_DATA"], allow_pickle=False) as z:
        a, b = z["a"], np.ascontiguousarray(z["b"])
        item_ids, item_keys = z["item_ids"], z["item_keys"].tolist()
        titles, users = z["titles"].tolist(), z["users"].tolist()
        ptr, rated_ids = z["rated_ptr"], z["rated_ids"]
    index = {u: i for i, u in enumerate(users)}
    rated = {u: rated_ids[ptr[i]:ptr[i + 1]] for i, u in enumerate(users)}
    app = FastAPI()

    @app.get("/v1/tenants/{tenant_id}/users/{user_key}/recommendations")
    async def recommendations(tenant_id: int, user_key: str, k: int = 10) -> dict:
        row = index.get(user_key)
        if row is None:
            raise HTTPException(404, "User not found")
        scores = a[row] @ b
        seen = rated[user_key]
        exclude = np.flatnonzero(np.isin(item_ids, seen)) if seen.size else None
        idx, vals = top_k(scores, k, exclude, 0)
        vals = np.clip(vals, 1.0, 5.0)
        data = [{"item": item_keys[i], "title": titles[i], "score": v}
                for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]
        return {"user": user_key, "source": "model", "job_id": 1, "data": data, "k": k,
                "offset": 0}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app
