"""Install hints name our own distribution (was: `recsys` on the package index is an
unrelated project, so `pip install 'recsys[plot]'` installed someone else's code)."""

import re
import sys
from pathlib import Path

from recsys.extras import DISTRIBUTION, install_hint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TEXTS = sorted(
    [*(ROOT / "recsys").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), *ROOT.glob("*/README.md"), ROOT / "README.md"]
)


def test_the_hints_name_the_distribution_pyproject_builds():
    assert PROJECT["name"] == DISTRIBUTION != "recsys"
    assert install_hint("plot") == f"pip install '{DISTRIBUTION}[plot]'"


def test_every_extra_named_in_code_and_docs_exists():
    pattern = r"install_hint\(['\"]([a-z]+)['\"]\)|" + DISTRIBUTION + r"\[([a-z]+)\]"
    named = {a or b for path in TEXTS for a, b in re.findall(pattern, path.read_text())}
    assert named and named <= set(PROJECT["optional-dependencies"]), named - set(PROJECT["optional-dependencies"])


def test_no_hint_installs_the_other_project_or_needs_the_checkout():
    """Neither `pip install 'recsys[...]'` nor `pip install -e ".[extra]"` (which works only from
    the repository root) outside the development commands."""
    wrong = []
    for path in TEXTS:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"(?<![\w-])recsys\[\w+\]", line) or re.search(r"-e \"?\.\[(?!dev\])", line):
                wrong.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not wrong, "\n".join(wrong)
