"""Claiming a run directory is atomic: two processes never train into one folder, and a live
run is never replaced or resumed by another process (was: two `recsys train` runs with one
name ended with one folder that was "not a run directory")."""

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recsys.run import RunDir, RunInUse, layout, load_run, new_run_dir

from conftest import TINY_RUN_OVERRIDES

REPO = Path(__file__).resolve().parents[2]
CONTEXT = multiprocessing.get_context("spawn")  # fresh interpreters: no lock inherited from the test process


def _claim(root: str, name: str, start: float, hold_s: float, results) -> None:
    """Wait until ``start``, claim ``root/name`` (``""``: an automatic name), hold it ``hold_s``."""
    time.sleep(max(0.0, start - time.time()))
    try:
        path = new_run_dir(root, name, model="m", dataset="d")
    except RunInUse as err:
        results.put(("in use", str(err)))
        return
    results.put(("claimed", str(path)))
    time.sleep(hold_s)


def _race(root: Path, name: str, processes: int, hold_s: float = 1.5) -> list[tuple[str, str]]:
    results = CONTEXT.Queue()
    start = time.time() + 2.0  # after every interpreter has started
    workers = [CONTEXT.Process(target=_claim, args=(str(root), name, start, hold_s, results)) for _ in range(processes)]
    for w in workers:
        w.start()
    outcome = [results.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    return outcome


def test_two_processes_claiming_one_name_at_once_get_one_folder_and_one_clear_line(tmp_path):
    outcome = sorted(_race(tmp_path, "same", 2))
    assert [kind for kind, _ in outcome] == ["claimed", "in use"]
    assert outcome[0][1] == str(tmp_path / "same")
    assert f"run directory {tmp_path / 'same'} is in use by a live run (pid " in outcome[1][1]
    assert "pick another name" in outcome[1][1]
    assert [p.name for p in tmp_path.iterdir()] == ["same"]  # no temporary folder left behind


def test_processes_claiming_automatic_names_at_once_get_one_folder_each(tmp_path):
    outcome = _race(tmp_path, "", 4, hold_s=0.0)
    paths = [path for kind, path in outcome]
    assert {kind for kind, _ in outcome} == {"claimed"} and len(set(paths)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).name for p in paths)


def test_a_live_run_is_never_replaced_and_a_dead_one_is(tmp_path):
    """Was: a second run started 0.5-2.5 s later replaced the first while it still trained."""
    results = CONTEXT.Queue()
    first = CONTEXT.Process(target=_claim, args=(str(tmp_path), "run", 0.0, 30.0, results))
    first.start()
    assert results.get(timeout=60) == ("claimed", str(tmp_path / "run"))
    RunDir(tmp_path / "run").append_metrics({"step": 10, "loss": 4.0})  # training, no checkpoint yet
    with pytest.raises(RunInUse, match=rf"in use by a live run \(pid {first.pid}\); pick another name"):
        new_run_dir(tmp_path, "run")
    with pytest.raises(RunInUse, match="wait for it to finish"):
        RunDir(tmp_path / "run").claim()  # nor resumed under it
    first.kill()  # killed before its first checkpoint: the OS drops its lock
    first.join(timeout=60)
    with pytest.warns(UserWarning, match="stopped before its first checkpoint"):
        assert new_run_dir(tmp_path, "run") == tmp_path / "run"
    assert [p.name for p in (tmp_path / "run").iterdir()] == [layout.LOCK]
    RunDir(tmp_path / "run").release()


@pytest.mark.slow
def test_two_train_commands_with_one_name_leave_one_intact_run(tmp_path):
    """The issue's reproduction: both `recsys train` started together with the same name."""
    overrides = [f for o in TINY_RUN_OVERRIDES if not o.startswith("name=") for f in ("--set", o)]
    command = [sys.executable, "-m", "recsys", "train", *overrides, "--set", "name=same", "--quiet"]
    command += ["--set", f"output_dir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outcome = sorted((p.wait(timeout=300), p.stderr.read()) for p in procs)
    assert [rc for rc, _ in outcome] == [0, 2], outcome
    loser = outcome[1][1].strip().splitlines()[-1]
    assert "in use by a live run" in loser or "exists; pick another name" in loser
    assert load_run(tmp_path / "same").cfg.name == "same"  # the winner's run, whole
