"""Issue 58: a training run that stops before its end says how to go on. Ctrl-C and a full disk
print the `recsys train --resume` command when a checkpoint exists; a run killed outright (kill -9:
its folder keeps a checkpoint and no test metrics, its lock is free) is mentioned, with that
command, when the same unnamed command runs again."""

from __future__ import annotations

import errno
import os
import shlex

import pytest
import torch

from recsys.cli import main
from recsys.run import RunDir
from tests.conftest import TINY_TRAIN_OVERRIDES

SHORT = [*TINY_TRAIN_OVERRIDES, "train.max_steps=6", "train.eval_every=2", "train.log_every=2"]


def _train_args(tmp_path) -> list[str]:
    return ["train", *(a for o in [*SHORT, f"output_dir={tmp_path / 'runs'}"] for a in ("--set", o)), "--quiet"]


class _Killed(BaseException):
    """What kill -9 leaves, in process: the run stops where it is, nothing of it runs after."""


def _stop_at_checkpoint(monkeypatch, number: int, stop: BaseException) -> None:
    """The run's checkpoint write ``number`` (1 = the first) raises ``stop`` instead of writing."""
    real = RunDir.save_checkpoint
    calls = []

    def save_checkpoint(self, state):
        calls.append(state["step"])
        if len(calls) == number:
            raise stop
        real(self, state)

    monkeypatch.setattr(RunDir, "save_checkpoint", save_checkpoint)


def _fill_up_at_checkpoint(monkeypatch, number: int) -> None:
    """``torch.save`` of the run's checkpoint ``number`` writes a few bytes, then finds the disk full."""
    real = torch.save
    calls = []

    def save(obj, f, *args, **kwargs):
        if ".model.pt." in getattr(f, "name", ""):  # the temporary file beside model.pt
            calls.append(obj["step"])
            if len(calls) == number:
                f.write(b"PK\x03\x04")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def _runs(tmp_path) -> list[RunDir]:
    return [RunDir(p) for p in sorted((tmp_path / "runs").iterdir())]


def test_ctrl_c_prints_the_resume_command_which_resumes(tmp_path, monkeypatch, capsys):
    """Was: `recsys train: interrupted`, though a checkpoint existed."""
    _stop_at_checkpoint(monkeypatch, 2, KeyboardInterrupt())
    assert main(_train_args(tmp_path)) == 130
    (run,) = _runs(tmp_path)
    err = capsys.readouterr().err.strip()
    resume = f"recsys train --resume {shlex.quote(str(run.path))}"
    assert err == f"recsys train: interrupted; its checkpoint of step 2 resumes it: {resume}"
    monkeypatch.undo()
    command = shlex.split(err.split("resumes it: ", 1)[1])
    assert command[:2] == ["recsys", "train"] and main([*command[1:], "--quiet"]) == 0
    assert run.is_finished() and run.load_checkpoint()["step"] == 6


def test_ctrl_c_before_the_first_checkpoint_says_only_interrupted(tmp_path, monkeypatch, capsys):
    _stop_at_checkpoint(monkeypatch, 1, KeyboardInterrupt())
    assert main(_train_args(tmp_path)) == 130
    assert capsys.readouterr().err.strip() == "recsys train: interrupted"
    assert _runs(tmp_path) == []  # it had nothing to resume


def test_a_full_disk_names_the_file_and_the_resume_command(tmp_path, monkeypatch, capsys):
    """Was: a torch RuntimeError traceback chained from OSError 28, or `[Errno 28]` naming no file."""
    _fill_up_at_checkpoint(monkeypatch, 2)
    assert main(_train_args(tmp_path)) == 2
    (run,) = _runs(tmp_path)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"recsys train: error: {run.path}/model.pt: no space left on device; free some space; its checkpoint of "
        f"step 2 resumes it: recsys train --resume {run.path}"
    )
    assert not [p.name for p in run.path.iterdir() if p.name.endswith(".tmp")]
    assert run.load_checkpoint()["step"] == 2  # the last whole checkpoint, still whole


def test_a_full_disk_before_the_first_checkpoint_says_to_start_again(tmp_path, monkeypatch, capsys):
    _fill_up_at_checkpoint(monkeypatch, 1)
    assert main(_train_args(tmp_path)) == 2
    assert capsys.readouterr().err.strip().endswith("no space left on device; free some space and start the run again")
    assert _runs(tmp_path) == []


def test_the_same_command_after_a_kill_mentions_the_resumable_run(tmp_path, monkeypatch, capsys):
    """Was: a new run started beside the killed one, which was never mentioned."""
    _stop_at_checkpoint(monkeypatch, 2, _Killed())
    with pytest.raises(_Killed):
        main(_train_args(tmp_path))
    monkeypatch.undo()
    (killed,) = _runs(tmp_path)
    assert killed.has_checkpoint() and not killed.is_finished()
    capsys.readouterr()

    killed.claim()  # while its process still runs, it is not one to resume
    try:
        assert main(_train_args(tmp_path)) == 0
    finally:
        killed.release()
    assert "stopped before its end" not in capsys.readouterr().err

    assert main(_train_args(tmp_path)) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("recsys: warning:")]
    assert warnings == [
        f"recsys: warning: {killed.path} holds a run of this config that stopped before its end; its checkpoint "
        f"of step 2 resumes it: recsys train --resume {killed.path} (this starts a new run)"
    ]
    assert len(_runs(tmp_path)) == 3 and all(run.is_finished() for run in _runs(tmp_path) if run.path != killed.path)


def test_another_config_s_stopped_run_is_not_mentioned(tmp_path, monkeypatch, capsys):
    _stop_at_checkpoint(monkeypatch, 2, _Killed())
    with pytest.raises(_Killed):
        main(_train_args(tmp_path))
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*_train_args(tmp_path), "--set", "train.lr=0.002"]) == 0
    assert "stopped before its end" not in capsys.readouterr().err
