"""The package order, read from every module's imports (function-level ones included).

    algorithms  <-  privacy  <-  app  <-  worker   <-  cli (app/cli.py, app/commands/)
                            ^--------  agent  <-------'
    fedrec (the client) imports none of the server's packages; the lab (bench/) is above all.

A package may import only those below it; the tenant agent runs where the data is, so it
imports neither ``app`` nor ``worker`` (what it shares with the upload API lives below
both). A module never imports an underscore module or name of another package, nor an
underscore name of another module: what is shared is public.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("algorithms", "privacy", "app", "worker", "agent", "fedrec")
LAB = "bench"
MAY_IMPORT = {
    "algorithms": set(),
    "privacy": {"algorithms"},
    "app": {"algorithms", "privacy"},
    "worker": {"algorithms", "privacy", "app"},
    "agent": {"algorithms", "privacy", "fedrec"},
    "fedrec": set(),
    "cli": {"algorithms", "privacy", "app", "worker", "agent", "fedrec"},
    LAB: {*PRODUCT, "cli"},
}


def layer_of(path: Path, root: Path) -> str:
    """The layer of a source file: its top-level package, but the command line
    (``app/cli.py``, ``app/commands/``) is a layer of its own above app, worker and agent."""
    rel = path.relative_to(root)
    if rel.parts[:2] in (("app", "cli.py"), ("app", "commands")):
        return "cli"
    return rel.parts[0]


def layer_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] not in MAY_IMPORT:
        return None
    if parts[:2] in (["app", "cli"], ["app", "commands"]):
        return "cli"
    return parts[0]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, tried again on CPython 3.11's "AST constructor recursion depth
    mismatch": 3.11 keeps the AST conversion's depth counter per process, so a parse on
    another thread at the same moment (numba's compiler parses source while a test's
    background round compiles its kernels) can make this one fail (python/cpython
    gh-106905, fixed in 3.12). Other SystemErrors, and a fifth failure, are raised."""
    for attempt in range(5):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == 4:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def imports(path: Path, root: Path):
    """``(line, module, name)`` for each name imported by ``path`` (``name`` None for
    ``import module``), relative imports resolved."""
    tree = parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            for alias in node.names:
                yield node.lineno, module, alias.name


def is_module(dotted: str, root: Path) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def sources(*packages: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in packages for p in (root / pkg).rglob("*.py"))


def violations(files: list[Path], targets: set[str] | None = None,
               root: Path = ROOT) -> list[str]:
    """Every import of a module above the importer's layer (limited to ``targets`` layers
    when given) and every import of another package's or module's underscore name."""
    found = []
    for path in files:
        rel, layer, own = path.relative_to(root), layer_of(path, root), module_name(path, root)
        for line, module, name in imports(path, root):
            target = layer_of_module(module)
            if target is None:
                continue
            where = f"{rel}:{line} imports {module}{'.' + name if name else ''}"
            if target != layer and target not in MAY_IMPORT[layer] and (
                    targets is None or target in targets):
                found.append(f"{where}: {layer} may not import {target}")
            if targets is not None:
                continue
            dotted = module.split(".") + ([name] if name and name != "*" else [])
            other_package = dotted[0] != own.split(".")[0]
            if other_package and any(private(p) for p in dotted[1:]):
                found.append(f"{where}: an underscore module or name of another package")
            elif (not other_package and name and private(name) and module != own
                  and not is_module(f"{module}.{name}", root)):
                found.append(f"{where}: another module's underscore name")
    return found


def test_every_package_imports_only_those_below_it() -> None:
    product = sources(*PRODUCT)
    assert len(product) > 100  # the walk found the tree
    bad = [v for v in violations(product) if not v.split(" imports ")[1].startswith(
        (f"{LAB}.", f"{LAB}:"))]  # the lab: the test below
    assert not bad, "imports against the package order:\n" + "\n".join(bad)


def test_no_handler_calls_another_handler() -> None:
    """Route modules are imported by the application that mounts them (app/main.py) and
    by nothing else: the dashboard, the command line and other routes call the use cases
    of app/services instead."""
    bad = []
    for path in sources(*PRODUCT):
        rel = path.relative_to(ROOT)
        for line, module, name in imports(path, ROOT):
            dotted = module if module.startswith("app.routes.") or not name else \
                f"{module}.{name}"
            if (dotted.startswith("app.routes.") and is_module(dotted, ROOT)
                    and rel != Path("app/main.py")):
                bad.append(f"{rel}:{line} imports the route module {dotted}")
    assert not bad, "\n".join(bad)


def test_the_product_never_imports_the_lab() -> None:
    bad = violations(sources(*PRODUCT), targets={LAB})
    assert not bad, "the product imports the lab:\n" + "\n".join(bad)


def test_the_lab_imports_no_underscore_module_of_the_product() -> None:
    bad = [v for v in violations(sources(LAB)) if "underscore" in v and f" {LAB}." not in v]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_each_kind_of_violation(tmp_path) -> None:
    """Each rule fails on a module that breaks it (so the tests above can fail)."""
    for pkg in ("algorithms", "app", "app/commands", "agent"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "algorithms" / "_hidden.py").write_text("def _seed():\n    pass\n")
    (tmp_path / "algorithms" / "base.py").write_text(
        "from algorithms import _hidden\n"  # allowed: an underscore module of its own package
        "from algorithms._hidden import _seed\n"
        "def f():\n    from app import models\n")  # a function-level climb counts too
    (tmp_path / "app" / "x.py").write_text("from algorithms._hidden import seed\n"
                                           "from .commands import demo\n"
                                           "from app.y import _helper\n")
    (tmp_path / "agent" / "run.py").write_text("import app.ingest\n")
    found = violations(sources("algorithms", "app", "agent", root=tmp_path), root=tmp_path)
    assert found == [
        "agent/run.py:1 imports app.ingest: agent may not import app",
        "algorithms/base.py:2 imports algorithms._hidden._seed: another module's underscore name",
        "algorithms/base.py:4 imports app.models: algorithms may not import app",
        "app/x.py:1 imports algorithms._hidden.seed: an underscore module or name of another "
        "package",
        "app/x.py:2 imports app.commands.demo: app may not import cli",
        "app/x.py:3 imports app.y._helper: another module's underscore name",
    ]
