"""``fedrec demo --serve`` prints the dashboard's URL and sign-in secrets that work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sign_in(base: str, secret: str) -> tuple[httpx.Response, httpx.Client]:
    client = httpx.Client(base_url=base, timeout=30)
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/dashboard/login").text)[1]
    return client.post("/dashboard/login", data={"secret": secret, "csrf": csrf}), client


@pytest.mark.slow
def test_demo_serve_prints_a_working_dashboard_url_and_tokens(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "demo", "--tenants", "2", "--rounds", "3",
         "--synthetic-ratings", "3000", "--epsilon", "5", "--serve"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C to stop." in line:
                break
        out = "".join(lines)
        assert "Ctrl-C to stop." in out, out[-3000:]
        base = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+)/dashboard", out)[1]
        token = re.search(r"operator with the admin token: (\S+)", out)[1]
        name, key = re.search(r"or as tenant (\S+) with its key: (\S+)", out).groups()

        response, client = _sign_in(base, token)
        assert response.status_code == 303
        assert response.headers["location"] == "/dashboard/tenants"
        page = client.get("/dashboard/tenants")
        assert page.status_code == 200 and name in page.text
        client.close()

        response, client = _sign_in(base, key)
        assert response.status_code == 303
        own = client.get(response.headers["location"])
        assert own.status_code == 200 and f"<h1>{name}</h1>" in own.text
        assert client.get("/dashboard/jobs").status_code == 404
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
