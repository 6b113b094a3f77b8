"""The coordinator's agent routes over HTTP (httpx), with retries on outages.

Error answers are read as :class:`fedrec.client.ApiError` does (the problem document's
status, code, detail and errors); :class:`Refused` is one."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from fedrec.client import ApiError


class Refused(ApiError):
    """The coordinator refused (4xx, or a 5xx that outlasted the retries): ``status``,
    the problem's ``code`` and ``detail``; raised by the agent itself with no code."""

    def __init__(self, status: int, detail: str, code: str = "refused",
                 errors: list | None = None, problem: dict | None = None) -> None:
        super().__init__(status, code, detail, errors, problem)
        self.args = (f"{status}: {detail}",)

    @classmethod
    def of(cls, response: httpx.Response) -> Refused:
        err = ApiError.from_response(response)
        return cls(err.status, err.detail, err.code, err.errors, err.problem)


class Coordinator:
    """Calls the tenant-agent routes with the tenant's API key.

    ``http`` is any httpx-compatible client (a ``fastapi.testclient.TestClient`` in tests);
    network errors and 5xx answers are retried with backoff for ``patience`` seconds.
    """

    def __init__(self, url: str | None, tenant_id: int, api_key: str,
                 http: httpx.Client | None = None, patience: float = 120.0) -> None:
        self.http = http or httpx.Client(base_url=url, timeout=httpx.Timeout(90.0))
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.patience = patience
        self.tenant_id = int(tenant_id)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        end, delay = time.monotonic() + self.patience, 0.2
        headers = {**self.headers, **kwargs.pop("headers", {})}
        while True:
            try:
                res = self.http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError:
                if time.monotonic() >= end:
                    raise
            else:
                if res.status_code < 500:
                    if res.status_code >= 400:
                        raise Refused.of(res)
                    return res
                if time.monotonic() >= end:
                    raise Refused.of(res)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _jobs(self) -> str:
        return f"/v1/tenants/{self.tenant_id}/agent/jobs"

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", self._jobs()).json()["data"]

    def forgotten(self, after: int) -> dict[str, Any]:
        """The users the tenant asked the coordinator to forget after version ``after``."""
        return self._call("GET", f"/v1/tenants/{self.tenant_id}/agent/forgotten",
                          params={"after": after}).json()

    def manifest(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"{self._jobs()}/{job_id}").json()

    def round(self, job_id: int, wait: float = 0.0, after: int = 0) -> dict[str, Any]:
        return self._call("GET", f"{self._jobs()}/{job_id}/round",
                          params={"wait": wait, "after": after}).json()

    def global_msg(self, job_id: int) -> tuple[int, str, bytes]:
        """(completed rounds, job status, global message bytes)."""
        res = self._call("GET", f"{self._jobs()}/{job_id}/global")
        return int(res.headers["Fedrec-Round"]), res.headers["Fedrec-Status"], res.content

    def upload(self, job_id: int, round_: int, data: bytes, charge: list | None
               ) -> dict[str, Any]:
        headers = {"Content-Type": "application/octet-stream"}
        if charge is not None:
            headers["Fedrec-Charge"] = json.dumps(charge)
        return self._call("PUT", f"{self._jobs()}/{job_id}/rounds/{round_}/upload",
                          content=data, headers=headers).json()

    def decline(self, job_id: int, round_: int, reason: str) -> dict[str, Any]:
        return self._call("POST", f"{self._jobs()}/{job_id}/rounds/{round_}/decline",
                          json={"reason": reason}).json()

    def secagg(self, job_id: int, round_: int, wait: float = 0.0, after: str | None = None
               ) -> dict[str, Any]:
        """The round's secure-aggregation phase (long-polls while it is ``after``)."""
        params: dict[str, Any] = {"wait": wait}
        if after is not None:
            params["after"] = after
        return self._call("GET", f"{self._jobs()}/{job_id}/rounds/{round_}/secagg",
                          params=params).json()

    def secagg_post(self, job_id: int, round_: int, phase: str, message: Any,
                    charge: list | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"message": message}
        if charge is not None:
            body["charge"] = charge
        return self._call("POST", f"{self._jobs()}/{job_id}/rounds/{round_}/secagg/{phase}",
                          json=body).json()

