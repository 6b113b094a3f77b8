"""The lock (constraints.txt) pins every distribution fedrec[dev] installs, at the version
installed, and nothing else: a dependency added to pyproject.toml without refreshing the
lock, or an environment that drifted from it, fails here."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
REFRESH = "uv pip compile pyproject.toml --extra dev -c constraints.in -o constraints.txt" \
          " (docs/how-to/install.md)"


def locked() -> dict[str, str]:
    """{canonical name: version} of every ``name==version`` line of the lock."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
        assert m, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(m[1])] = m[2]
    return pins


def closure(root: str, extras: tuple[str, ...]) -> dict[str, set[str]]:
    """Every distribution that installing ``root[extras]`` requires here, with the extras
    asked of it: requirements walked through the installed metadata, markers evaluated
    for this interpreter and platform."""
    wanted: dict[str, set[str]] = {canonicalize_name(root): set(extras)}
    todo = [(root, extras)]
    while todo:
        name, asked = todo.pop()
        for spec in metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *asked)):
                continue
            key = canonicalize_name(req.name)
            new = set(req.extras) - wanted.get(key, set())
            if key not in wanted or new:
                wanted.setdefault(key, set()).update(req.extras)
                todo.append((req.name, tuple(sorted(wanted[key]))))
    return wanted


def matches(installed: str, pin: str) -> bool:
    """pip's reading of ``name==pin``: a pin without a local label (``1.2.0``) matches any
    build of that release (``1.2.0+cpu``)."""
    return SpecifierSet(f"=={pin}").contains(installed, prereleases=True)


#: what the accountant once imported (opacus) and what that pulled in: gigabytes, and on
#: Linux a CUDA build unless pinned to PyTorch's own index. privacy/rdp.py and
#: privacy/prv.py do the accounting now; nothing fedrec[dev] installs may bring them back.
HEAVY = {"torch", "opacus", "triton"}


def test_every_installed_requirement_is_locked_at_its_installed_version():
    pins = locked()
    needed = set(closure("fedrec", ("dev",)))
    needed.discard("fedrec")
    missing = sorted(n for n in needed if n not in pins)
    assert not missing, f"not in constraints.txt: {missing}; refresh it with `{REFRESH}`"
    drift = {n: (metadata.version(n), pins[n]) for n in needed
             if not matches(metadata.version(n), pins[n])}
    assert not drift, (f"installed != locked (installed, locked): {drift}; install with "
                       "`pip install -c constraints.txt -e \".[dev]\"`")


def test_the_lock_holds_nothing_fedrec_does_not_need():
    stale = sorted(set(locked()) - set(closure("fedrec", ("dev",))))
    assert not stale, f"constraints.txt pins {stale}, which fedrec[dev] does not require; " \
                      f"refresh it with `{REFRESH}`"


def test_the_lock_pins_public_releases():
    """Every pin names a release PyPI serves: no local label such as ``+cpu``, which only
    a vendor's own index serves."""
    labelled = {n: v for n, v in locked().items() if "+" in v}
    assert not labelled, f"constraints.txt pins local builds {labelled}; pin the release"
    assert matches("2.13.0+cpu", "2.13.0") and matches("2.13.0", "2.13.0")
    assert not matches("2.13.1", "2.13.0")


def test_neither_the_lock_nor_the_install_needs_torch():
    needed = set(closure("fedrec", ("dev",)))
    heavy = sorted(HEAVY & (needed | set(locked())) | {n for n in needed | set(locked())
                                                        if n.startswith("nvidia-")})
    assert not heavy, f"fedrec[dev] requires or the lock pins {heavy}"


def test_closure_follows_extras_and_markers():
    # celery[redis] must bring the redis client through kombu's own "redis" extra
    needed = closure("fedrec", ())
    assert "redis" in needed.get("kombu", set()) and "redis" in needed
    assert "pytest" not in needed and "pytest" in closure("fedrec", ("dev",))
