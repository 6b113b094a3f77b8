"""Peak memory of the API process during rejected uploads at the row limit.

Run from the repository root::

    nice -n 10 python -m bench.upload_memory

For each scenario a fresh ``uvicorn --factory app.main:create_app`` (one process, SQLite in
a temporary directory) gets a tenant and a one-item catalogue, then receives the upload(s);
the server's ``VmHWM`` (peak resident set) and ``VmRSS`` are read from /proc before and
after. Scenarios: 2,000,000 CSV rows whose items are not in the catalogue (422, every row
offending), 2,000,001 CSV rows (413, over FEDREC_MAX_UPLOAD_ROWS), 1,500,000 JSON rows with
unknown items (2M JSON rows do not fit the 64 MiB body limit), and three of the first at
once from three tenants.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "upload-memory-benchmark-token-0123456789abcdef"
PORT = 8931


def csv_rows(n: int) -> bytes:
    """``n`` distinct (user, item) pairs: 50 users per 2,000 rows, 4,000 items."""
    return "".join(f"u{k // 40},i{k % 4000},{1 + k % 5}\n" for k in range(n)).encode()


def json_rows(n: int) -> bytes:
    rows = ",".join(f'{{"user":"u{k // 40}","item":"i{k % 4000}","rating":{1 + k % 5}}}'
                    for k in range(n))
    return ('{"ratings":[' + rows + "]}").encode()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) // 1024
    return out


def start(tmp: Path) -> subprocess.Popen:
    """One uvicorn process on a fresh SQLite database (the upload benchmark's launcher)."""
    from app.db import migrate
    from bench.upload_ratings import start_server

    url = f"sqlite:///{tmp}/mem.db"
    migrate(url)
    return start_server(url, TOKEN, PORT)


def tenant(client: httpx.Client, name: str) -> tuple[int, str]:
    tid = client.post("/v1/admin/tenants", json={"name": name, "privacy_budget": 1}).json()["id"]
    key = client.post(f"/v1/admin/tenants/{tid}/api-keys").json()["key"]
    return tid, key


def upload(tid: int, key: str, body: bytes, media: str) -> int:
    with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=600) as c:
        return c.post(f"/v1/tenants/{tid}/ratings", content=body, headers={
            "Authorization": f"Bearer {key}", "Content-Type": media}).status_code


def scenario(name: str, body: bytes, media: str, parallel: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start(Path(tmp))
        try:
            admin = httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
            admin.put("/v1/admin/items", json={"items": [{"key": "m1"}]}).raise_for_status()
            tenants = [tenant(admin, f"t{i}") for i in range(parallel)]
            upload(*tenants[0], b"u,m1,3\n", "text/csv")  # warm the code paths
            before = proc_status(server.pid)
            start_time = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                codes = list(pool.map(lambda t: upload(*t, body, media), tenants))
            seconds = time.perf_counter() - start_time
            time.sleep(1)
            after = proc_status(server.pid)
            print(json.dumps({"scenario": name, "status": codes, "seconds": round(seconds, 1),
                              "body_mb": round(len(body) / 2 ** 20, 1),
                              "rss_before_mb": before["VmRSS"], "peak_mb": after["VmHWM"],
                              "extra_peak_mb": after["VmHWM"] - before["VmRSS"],
                              "rss_after_mb": after["VmRSS"]}), flush=True)
        finally:
            server.terminate()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the scenario of this name")
    args = parser.parse_args()
    csv_2m = csv_rows(2_000_000)
    runs = [("csv-2M-unknown-items", csv_2m, "text/csv", 1),
            ("csv-2M+1-rows", csv_2m + b"u,i,3\n", "text/csv", 1),
            ("json-1.5M-unknown-items", json_rows(1_500_000), "application/json", 1),
            ("csv-2M-unknown-items-x3", csv_2m, "text/csv", 3)]
    for name, body, media, parallel in runs:
        if args.only in (None, name):
            scenario(name, body, media, parallel)


if __name__ == "__main__":
    main()
