"""The documentation site (mkdocs.yml, docs/) builds without a warning, its reference pages
are what docs/gen_reference.py writes from the code today, and the README stays a short
front page whose links lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.doc_pages import ROOT, doc_commands, doc_lines, doc_pages, section

REFERENCE = ROOT / "docs" / "reference"
GENERATED = ("cli.md", "configs.md", "api.md")


def test_the_reference_is_current(tmp_path):
    """Regenerated into a temporary folder, every generated page equals the committed one:
    a new option, config field or route without `python docs/gen_reference.py` fails."""
    subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), str(tmp_path)],
                   check=True, cwd=tmp_path, capture_output=True, text=True)
    for name in GENERATED:
        fresh, committed = (tmp_path / name).read_text(), (REFERENCE / name).read_text()
        assert fresh == committed, (f"docs/reference/{name} is stale: run "
                                    "`python docs/gen_reference.py` and commit the result")


def test_the_site_builds_without_a_warning(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page left out of the nav or a
    missing file fails the build (mkdocs.yml's `validation`)."""
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: pip install -e '.[dev]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and "WARNING" not in log, log
    assert (tmp_path / "site" / "reference" / "configs" / "index.html").exists()


def test_the_readme_is_a_short_front_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_no_page_points_at_the_shared_folder():
    """Papers are cited by title; data is reached through FEDREC_DATA_DIR."""
    for page in doc_pages():
        text = page.read_text()
        assert "../shared" not in text and "/work/shared" not in text, page



def test_no_code_fence_is_indented():
    """The site's Markdown (Python-Markdown's fenced_code) renders a fence only at the left
    margin: one indented under a list item shows as inline text with a stray "bash". A
    code block follows its list instead."""
    bad = [f"{page.relative_to(ROOT)}:{n}" for page in doc_pages()
           for n, line in enumerate(page.read_text().splitlines(), 1)
           if re.match(r"^\s+```", line)]
    assert not bad, "indented code fences (not rendered): " + ", ".join(bad)


def test_every_list_starts_after_a_blank_line():
    """Python-Markdown starts a list only after a blank line: a list right under a
    paragraph line runs into that paragraph as "- a - b" text on the site."""
    item = re.compile(r"^\s*([-*+]|\d+\.)\s+\S")
    bad = []
    for page in doc_pages():
        fence, prev = False, ""
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = not fence
            elif not fence and item.match(line) and prev.strip() and not (
                    item.match(prev) or prev.startswith(("|", "#", " "))):
                bad.append(f"{page.relative_to(ROOT)}:{n}")
            prev = line
    assert not bad, "lists without a blank line before them: " + ", ".join(bad)

def test_the_command_checks_read_every_page(tmp_path):
    """The tests that parse documented commands (tests/test_cli.py, tests/app/test_client.py)
    read README.md and every docs page: a command on a how-to page is among them."""
    budgets = (ROOT / "docs" / "how-to" / "budgets.md").read_text()
    on_page = [ln.strip() for ln in budgets.splitlines() if ln.startswith("fedrec admin ")]
    assert on_page and set(on_page) <= set(doc_lines(r"fedrec (admin|jobs|doctor)\b"))


def test_the_deployment_page_lists_every_setting_with_its_default():
    """The settings table of docs/how-to/deployment.md names every field of app/config.py's
    Settings (and the state cache, read from the environment by app/training/states.py),
    with the default the code has."""
    from app.config import Settings

    table = section("Configuration").split("| variable | default | meaning |", 1)[1]
    rows = {}
    for line in table.strip().splitlines()[1:]:
        if not line.startswith("|"):
            break
        names, default = [c.strip() for c in line.strip("|").split("|")][:2]
        rows[re.findall(r"`(FEDREC_\w+)`", names)[0]] = default
    fields = Settings.model_fields
    assert set(rows) == {"FEDREC_" + f.upper() for f in fields} | {"FEDREC_STATE_CACHE_MB"}
    for name, field in fields.items():
        shown, code = rows["FEDREC_" + name.upper()], field.default
        if code is None:
            assert shown in {"unset", "the broker URL"}, name
        elif isinstance(code, int | float):
            assert float(shown.split("`")[1]) == code, name
        else:
            assert shown == f"`{code}`", name


def test_every_documented_fedrec_command_parses(capsys):
    """Every `fedrec ...` command in a bash block of any page (README.md, docs/**/*.md) is
    accepted by the parsers as written (parsed, not run): serve, demo, agent and cluster
    too, beside the commands tests/test_cli.py checks in more depth."""
    import shlex

    from app.cli import parse

    commands = doc_commands()
    assert {shlex.split(c)[1] for c in commands} >= {"simulate", "tune", "admin", "jobs",
                                                     "doctor", "serve", "demo", "agent"}
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            assert parse(argv).func, command
        except SystemExit as exit_:  # --help prints and exits 0
            assert exit_.code == 0 and "--help" in argv, (command, capsys.readouterr().err)


def test_every_config_field_is_described():
    """The configs reference (and `fedrec simulate --algorithm X --help`) describe every
    field: a field without a description (Field(description=...) or an attribute
    docstring) fails here."""
    from algorithms import registry

    bare = [f"{name}.{field}" for name in registry.names()
            for field, info in registry.get(name).config.model_fields.items()
            if not (info.description or "").strip()]
    assert not bare, f"config fields without a description: {bare}"
