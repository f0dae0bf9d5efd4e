"""The README stays a front door: short, its two commands true to CI, its numbers on the results page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# the measured claims: the results page and the tables behind the defaults
RESULTS = "\n".join((ROOT / "docs" / name).read_text(encoding="utf-8") for name in ("results.md", "defaults.md"))


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


def test_every_decimal_the_readme_quotes_is_on_the_results_pages():
    text = re.sub(r"Python ≥ [\d.]+", " ", prose(README))
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", text))
    assert numbers, "README.md quotes no measured number: the pattern is broken"
    missing = sorted(n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", RESULTS))
    assert not missing, f"docs/results.md and docs/defaults.md lack {missing}, which README.md quotes"


def readme_python() -> str:
    """The README's Python snippet (its ```python block)."""
    block = re.search(r"```python\n(.*?)```", README, re.S)
    assert block, "README.md: no ```python block"
    return block.group(1)


def test_the_readme_python_snippet_uses_the_quick_starts_columns_and_the_cli_examples_ids():
    """Was: the snippet failed on the Quick start's own CSV (no column overrides) and asked for
    user "17" where the CLI example asks for "c17"."""
    code = readme_python()
    quick_start = re.search(r'^C="(.*)"$', README, re.M)
    assert quick_start, "README.md: the Quick start's C=... line moved"
    for assignment in quick_start.group(1).split("--set "):
        if assignment.strip():
            key, value = assignment.strip().split("=")
            assert f'"{key}": "{value}"' in code, key
    served = re.search(r'POST /recommend \{"user": "(\w+)"', README)
    assert served and f'users=["{served.group(1)}"' in code


def test_the_readme_python_snippet_runs_on_a_quick_start_csv(tmp_path, monkeypatch):
    """Runs the snippet as written (training shortened) on a clicks.csv with the Quick start's
    columns and ids like the CLI example's."""
    import numpy as np
    import pandas as pd
    import pytest

    import recsys

    from conftest import TINY_RUN_OVERRIDES

    pytest.importorskip("onnx", reason="the snippet exports to ONNX (the export extra)")
    rng = np.random.default_rng(0)
    users = np.repeat([f"c{u}" for u in range(200)], 12)
    items = [f"p{i}" for i in rng.integers(0, 180, len(users))]
    items[:3] = ["p50", "p172", "p9"]
    frame = pd.DataFrame({"customer_id": users, "product_id": items, "ts": np.arange(len(users))})
    monkeypatch.chdir(tmp_path)
    frame.to_csv("clicks.csv", index=False)
    real_fit = recsys.fit
    short = [o for o in TINY_RUN_OVERRIDES if o.startswith(("model.", "train.", "data.max_len"))]

    def fit(clicks, *, overrides, **kwargs):
        more = dict(o.split("=", 1) for o in [*short, f"output_dir={tmp_path / 'runs'}"])
        return real_fit(clicks, overrides=[f"{k}={v}" for k, v in {**overrides, **more}.items()], log=None, **kwargs)

    monkeypatch.setattr(recsys, "fit", fit)
    names: dict = {}
    exec(compile(readme_python(), "README.md", "exec"), names)
    assert set(names["run"].recommend(users=["c17", "c42"], n=10)["user"]) == {"c17", "c42"}
    assert names["interests"].shape[0] == 1 and (tmp_path / "export").is_dir()
