"""The project's documentation as the tests read it: README.md and every page of the docs
site (``docs/**/*.md``), so that a command or example written on any page is checked
wherever it was moved to."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_pages() -> list[Path]:
    """README.md, then every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def doc_text() -> str:
    """Every page's text, one after the other (each page ends its own code blocks)."""
    return "\n\n".join(p.read_text() for p in doc_pages())


def doc_lines(pattern: str) -> list[str]:
    """Every line of every page (a backslash-continued line joined to the next) that matches
    ``pattern`` at its start after indentation, stripped; ```text blocks are left out: they
    show what a program printed (the generated --help pages), not commands to run."""
    text = re.sub(r"^```text\n.*?^```", "", doc_text(), flags=re.M | re.S)
    text = text.replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if re.match(r"\s*" + pattern, line)]


def doc_commands(program: str = "fedrec") -> list[str]:
    """Every command of ``program`` written in a ```bash block of any page: continuation
    lines joined, trailing comments dropped, and a line of several commands (``&&``, ``;``,
    ``|``, ``&``) cut into its commands."""
    commands = []
    for page in doc_pages():
        blocks = re.findall(r"^[ \t]*```bash\n(.*?)^[ \t]*```", page.read_text(),
                            flags=re.M | re.S)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = re.split(r"\s#", line, maxsplit=1)[0]
                for part in re.split(r"&&|;|\|\s|&\s*$", line):
                    part = part.strip()
                    if part.startswith(program + " "):
                        commands.append(part)
    return commands


def section(heading: str) -> str:
    """The text under the Markdown heading ``heading`` (any level) up to the next heading of
    the same or a higher level, on whichever page holds it; the test fails when no page or
    more than one holds it."""
    found = []
    for page in doc_pages():
        text = re.sub(r"^```.*?^```", lambda m: m[0].replace("#", "\0"), page.read_text(),
                      flags=re.M | re.S)  # no heading inside a code block
        m = re.search(r"^(#+) " + re.escape(heading) + r"[ \t]*$", text, re.M)
        if m:
            end = re.compile(rf"^#{{1,{len(m[1])}}} ", re.M).search(text, m.end())
            found.append(text[m.end():end.start() if end else len(text)].replace("\0", "#"))
    assert len(found) == 1, f"heading {heading!r} is on {len(found)} documentation pages"
    return found[0]
