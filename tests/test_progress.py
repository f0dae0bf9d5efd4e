"""Progress bars: drawn on a terminal when asked, silent otherwise (pipes, logs, --quiet)."""

import io
import sys

import pytest

from recsys.cli import main
from recsys.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _draw(monkeypatch, stream, enabled: bool) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    with progress_bar(10, "work", enabled=enabled, unit="users") as bar:
        bar.update(4)
        bar.update(6)
    return stream.getvalue()


def test_bar_draws_only_on_a_terminal_and_when_enabled(monkeypatch):
    shown = _draw(monkeypatch, Terminal(), enabled=True)
    assert "work" in shown and "/10 " in shown
    assert _draw(monkeypatch, Terminal(), enabled=False) == ""
    assert _draw(monkeypatch, io.StringIO(), enabled=True) == ""  # a pipe or a log file


@pytest.mark.parametrize(
    "command, label",
    [
        (["evaluate"], "evaluate"),
        (["index", "--factory", "HNSW16,Flat"], "index"),
        (["recommend", "--all", "--n", "3"], "recommend"),
    ],
)
def test_cli_commands_show_progress_unless_quiet(tiny_run, tmp_path, monkeypatch, command, label):
    args = [command[0], tiny_run, *command[1:]]
    if command[0] == "recommend":
        args += ["--out", str(tmp_path / "recs.csv")]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(args) == 0
    assert label in terminal.getvalue()
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(args + ["--quiet"]) == 0
    assert label not in quiet.getvalue()
