"""The README's quick-start commands are the ones CI runs."""

from pathlib import Path

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


def test_the_readme_threat_model_is_the_code_s():
    """The privacy section states the threat model of privacy/threat_model.py verbatim:
    unit, the table of adversaries by placement, and what is not covered."""
    from privacy import threat_model as tm

    text = (ROOT / "README.md").read_text()
    section = text.split("## Privacy", 1)[1].split("\n## ", 1)[0]
    assert tm.markdown_table() in section
    assert tm.UNIT_DETAIL in section
    assert tm.NOT_COVERED in section
    assert tm.LEDGER_UNIT in section
    assert "anyone who sees V, reports or recommendations" not in text


def test_the_demo_command_installs_fedrec_as_a_user_gets_it():
    """No development extras and no editable install before `fedrec demo` (CI runs the demo
    from the installed wheel: .ci/wheel_smoke.sh), and no placeholder to fill in."""
    install, demo = _quickstart_commands()[0].split(" && ")
    assert install == "pip install -c constraints.txt ." and demo == "fedrec demo"
    assert "bash .ci/wheel_smoke.sh" in (ROOT / ".ci" / "run").read_text().splitlines()
