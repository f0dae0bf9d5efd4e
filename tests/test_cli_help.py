"""`recsys CMD --help` explains every option (issue 43: `--split` had no help text)."""

import argparse

import pytest

from recsys.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, prefix: str = "recsys"):
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


def test_every_option_of_every_command_has_help():
    missing = [
        f"{command} {'/'.join(action.option_strings) or action.dest}"
        for command, parser in _commands(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()
    ]
    assert not missing, missing


@pytest.mark.parametrize("command", ["evaluate", "inspect"])
def test_split_says_what_it_chooses(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--split {test,valid} which held-out users to" in text
