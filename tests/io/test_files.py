"""atomic_folder: a folder appears whole under its name, or not at all; one_at_a_time: one
process (or thread) at a time prepares it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from recsys.io.files import atomic_folder, one_at_a_time


def test_a_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "ds"
    with atomic_folder(target) as tmp:
        (tmp / "a.npy").write_bytes(b"old")
    with atomic_folder(target) as tmp:
        assert not target.joinpath("b.npy").exists() and tmp != target
        (tmp / "b.npy").write_bytes(b"new")
    assert sorted(p.name for p in target.iterdir()) == ["b.npy"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # nothing left beside it


def test_an_error_keeps_the_old_folder_and_leaves_nothing(tmp_path):
    target = tmp_path / "ds"
    with atomic_folder(target) as tmp:
        (tmp / "a.npy").write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_folder(target) as tmp:
        (tmp / "a.npy").write_bytes(b"half")
        raise RuntimeError("killed")
    assert (target / "a.npy").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_remains_of_a_dead_process_are_removed(tmp_path):
    dead = tmp_path / ".ds.tmp-999999999"  # no such process
    alive = tmp_path / f".ds.tmp-{os.getppid()}"  # a running process: maybe still writing
    for folder in (dead, alive):
        folder.mkdir()
    with atomic_folder(tmp_path / "ds") as tmp:
        (tmp / "a.npy").write_bytes(b"x")
    assert not dead.exists() and alive.exists()


def test_one_at_a_time_makes_the_second_wait_for_the_first_and_leaves_nothing(tmp_path):
    """Three workers (flock holds between two opens of the file in one process too): each enters
    only after the one before it has left, and the lock file is gone afterwards."""
    target, order = tmp_path / "ds", []

    def work(name: str) -> None:
        with one_at_a_time(target):
            order.append(f"{name} in")
            time.sleep(0.2)
            order.append(f"{name} out")

    workers = [threading.Thread(target=work, args=(name,)) for name in "abc"]
    for worker in workers:
        worker.start()
        time.sleep(0.05)
    for worker in workers:
        worker.join()
    entered = [step.split()[0] for step in order[::2]]  # b and c wait together: either may go first
    assert entered[0] == "a" and sorted(entered) == ["a", "b", "c"]
    assert order == [step for name in entered for step in (f"{name} in", f"{name} out")]
    assert list(tmp_path.iterdir()) == []
