"""`recsys CMD --help` explains every option (was: `--split` had no help text)."""

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


def test_recsys_config_lists_every_key_as_a_file_config_takes_back(tmp_path, capsys):
    """Was: the config's keys could not be listed from the command line."""
    import sys

    from recsys.config import Config, load_config

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    assert main(["config", "--set", "model.dim=32", "--model", "sasrec"]) == 0
    text = capsys.readouterr().out
    listed = tomllib.loads(text)

    def keys(d, prefix=""):
        return {k2 for k, v in d.items() for k2 in (keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k])}

    assert keys(listed) == keys(Config().to_dict())
    assert listed["model"]["dim"] == 32 and listed["model"]["name"] == "sasrec"
    (tmp_path / "c.toml").write_text(text)
    given = load_config(None, ["model.dim=32", "model.name=sasrec"])
    assert load_config([tmp_path / "c.toml"]) == given  # the config as given: the data decides what is automatic
    assert listed["model"]["dropout"] == -1 and listed["train"]["predict_at"] == "auto"


@pytest.mark.parametrize("model", ["comirec_sa", "sasrec", "youtube_dnn", "mind"])
def test_recsys_config_says_the_rule_beside_each_automatic_key(capsys, model):
    """A newcomer reading `recsys config` sees what each automatic value will become, with the
    model's own values (its width, its cap rule), and a key set by hand carries no rule."""
    from recsys.config import AUTOMATIC
    from recsys.models.spec import spec_for

    assert main(["config", "--model", model, "--set", "train.lr=0.002"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ruled = {line.split(" = ")[0] for line in lines if "  # automatic: " in line}
    assert ruled == {key.split(".")[1] for key in AUTOMATIC} - {"lr"}
    dim = next(line for line in lines if line.startswith("dim = "))
    assert f"# automatic: {spec_for(model).automatic.dim}" in dim
    assert next(line for line in lines if line.startswith("lr = ")) == "lr = 0.002"
    cap = next(line for line in lines if line.startswith("score_cap = "))
    assert ("ln(median history)" in cap) == (model == "comirec_sa")
