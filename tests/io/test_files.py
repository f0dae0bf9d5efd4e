"""atomic_folder: a folder appears whole under its name, or not at all."""

from __future__ import annotations

import os

import pytest

from recsys.io.files import atomic_folder


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
