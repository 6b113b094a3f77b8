"""The README's quick-start commands are the ones CI runs; the documented threat model is
the code's."""

from pathlib import Path

from tests.doc_pages import doc_text

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command():
    commands = _quickstart_commands()
    assert len(commands) == 2, commands
    test_command = commands[1]
    assert "pytest" in test_command
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_the_documented_threat_model_is_the_code_s():
    """The privacy page states the threat model of privacy/threat_model.py verbatim:
    unit, the table of adversaries by placement, and what is not covered."""
    from privacy import threat_model as tm

    text = (ROOT / "docs" / "explanation" / "privacy.md").read_text()
    assert tm.markdown_table() in text
    assert tm.UNIT_DETAIL in text
    assert tm.NOT_COVERED in text
    assert tm.LEDGER_UNIT in text
    assert "anyone who sees V, reports or recommendations" not in doc_text()


def test_the_demo_command_installs_fedrec_as_a_user_gets_it():
    """No development extras and no editable install before `fedrec demo` (CI runs the demo
    from the installed wheel: .ci/wheel_smoke.sh), and no placeholder to fill in."""
    install, demo = _quickstart_commands()[0].split(" && ")
    assert install == "pip install -c constraints.txt ." and demo == "fedrec demo"
    assert "bash .ci/wheel_smoke.sh" in (ROOT / ".ci" / "run").read_text().splitlines()
