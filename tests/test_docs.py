"""The README stays a front door: short, its two commands true to CI, its numbers on the results page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")


def fresh_machine_commands() -> list[str]:
    """The command lines of the README's first code block (the two commands for a fresh machine)."""
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block, "README.md: no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code: what the reader takes as claims."""
    return re.sub(r"`[^`]*`", " ", re.sub(r"```.*?```", " ", text, flags=re.S))


def test_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_two_fresh_machine_commands_use_different_environments():
    commands = fresh_machine_commands()
    assert len(commands) == 2, commands
    venvs = [re.match(r"python3 -m venv (\S+) && \. (\S+)/bin/activate", c) for c in commands]
    assert all(venvs), commands
    for match in venvs:
        assert match.group(1) == match.group(2), f"creates {match.group(1)} but activates {match.group(2)}"
    assert venvs[0].group(1) != venvs[1].group(1), "the test command would reuse the first command's venv"


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = fresh_machine_commands()[1]
    assert test_command.endswith("python -m pytest"), test_command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci, f".ci/run: does not run {test_command!r} as one line"


def test_every_decimal_the_readme_quotes_is_on_the_results_page():
    text = re.sub(r"Python ≥ [\d.]+", " ", prose(README))
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", text))
    assert numbers, "README.md quotes no measured number: the pattern is broken"
    missing = sorted(n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", RESULTS))
    assert not missing, f"docs/results.md lacks {missing}, which README.md quotes"
