"""The wheel carries every file the product reads at run time (a non-editable install,
as the Dockerfile's `pip install .`, serves the dashboard and runs the migrations), and only
the packages the product is made of. CI also runs the installed wheel against the real
services (.ci/wheel_smoke.sh)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the packages a `pip install fedrec` puts in site-packages; the lab (bench/) stays in the
#: source checkout (`python -m bench`)
PACKAGES = {"app", "worker", "algorithms", "privacy", "migrations", "agent", "fedrec"}

pytestmark = pytest.mark.slow


def source_tree() -> list[str]:
    """The repository's files, tracked or new, without ignored ones (build/, caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    return [name for name in listed if name and (ROOT / name).is_file()]


def clean_copy(dest: Path) -> Path:
    """The source tree alone: a left-over build/ folder would hand setuptools files that
    the package data no longer names."""
    for name in source_tree():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("dist")
    src = clean_copy(tmp_path_factory.mktemp("src"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(src)],
                   check=True, capture_output=True, timeout=300)
    (path,) = out.glob("fedrec-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_holds_every_file_of_the_product_packages(wheel):
    names = set(wheel.namelist())
    wanted = {n for n in source_tree() if n.split("/", 1)[0] in PACKAGES}
    missing = sorted(wanted - names)
    assert not missing, f"not in the wheel (pyproject.toml package-data): {missing}"


def test_the_wheel_holds_the_dashboard_and_the_migrations(wheel):
    names = set(wheel.namelist())
    for needed in ("app/dashboard/static/dashboard.css", "app/dashboard/templates/base.html",
                   "migrations/script.py.mako", "migrations/env.py"):
        assert needed in names, needed
    assert [n for n in names if n.startswith("migrations/versions/0001")]


def test_the_wheel_installs_only_the_product_packages(wheel):
    top = {n.split("/", 1)[0] for n in wheel.namelist()}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == PACKAGES
    assert not [n for n in wheel.namelist() if n.startswith("bench/")], "the lab is shipped"
    (info,) = dist_info
    assert f"{info}/licenses/LICENSE" in wheel.namelist() or f"{info}/LICENSE" in \
        wheel.namelist()


def test_the_product_imports_nothing_from_the_lab():
    """bench/ is not installed, so no product module may import it."""
    import re

    lab = re.compile(r"^\s*(from|import)\s+bench(\.|\s|$)", re.M)
    offenders = [name for name in source_tree() if name.endswith(".py")
                 and name.split("/", 1)[0] in PACKAGES and lab.search((ROOT / name).read_text())]
    assert not offenders, offenders


def test_the_dockerfile_copies_what_the_wheel_is_built_from():
    """`pip install .` in the image builds the wheel from the copied files only."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    copied = {w.rstrip("/").removeprefix("./") for line in
              (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")
              for w in line.split()[1:-1]}
    needed = PACKAGES | {"pyproject.toml", project["readme"], *project["license-files"]}
    assert needed <= copied, f"the Dockerfile does not copy {sorted(needed - copied)}"
