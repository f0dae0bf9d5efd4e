"""A write that finds no room (ENOSPC, EDQUOT) is one DiskFull line naming the path, however the
writer reported it, and leaves the old file (or nothing), never a cut one."""

from __future__ import annotations

import errno
import io
import os
import pickle

import numpy as np
import pytest
import torch

from recsys.io.files import (
    DiskFull,
    atomic_folder,
    atomic_torch_save,
    atomic_write,
    atomic_write_text,
    full_disk,
    save_npy,
)


class FillsUp(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, room: int = 100, code: int = errno.ENOSPC) -> None:
        self.room, self.code = room, code

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(self.code, os.strerror(self.code))
        self.room -= len(data)
        return len(data)


def test_torch_s_runtime_error_over_the_os_error_is_a_full_disk():
    with pytest.raises(RuntimeError) as raised:
        torch.save({"w": torch.zeros(1000)}, FillsUp())
    full = full_disk(raised.value, "/runs/x/model.pt")
    assert str(full) == "/runs/x/model.pt: no space left on device; free some space and run it again"
    assert full.errno == errno.ENOSPC


def test_duckdb_s_message_is_a_full_disk():
    """DuckDB's IOException carries only the system's text (checked on a real 600 KB tmpfs too)."""
    err = RuntimeError('IO Error: Could not write file "/d/.ds.tmp-1/spill/raw/0.parquet": No space left on device')
    assert str(full_disk(err, "/d/ds")) == "/d/ds: no space left on device; free some space and run it again"


@pytest.mark.skipif(not hasattr(errno, "EDQUOT"), reason="no EDQUOT on this system")
def test_a_spent_quota_is_a_full_disk_too():
    full = full_disk(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), "/home/u/out.csv")
    assert str(full).startswith("/home/u/out.csv: disk quota exceeded; ")


def test_other_errors_and_ctrl_c_are_not():
    assert full_disk(OSError(errno.EACCES, "Permission denied")) is None
    assert full_disk(RuntimeError("bad")) is None
    assert full_disk(KeyboardInterrupt()) is None


def test_the_innermost_path_is_kept_and_advice_replaced():
    inner = full_disk(OSError(errno.ENOSPC, "x"), "/runs/x/model.pt")
    assert full_disk(inner, "/runs/x") is inner  # nothing to change
    try:
        raise RuntimeError("wrapped") from inner
    except RuntimeError as err:
        resumed = full_disk(err, "/runs/x", "resume it")
    assert str(resumed) == "/runs/x/model.pt: no space left on device; resume it"
    back = pickle.loads(pickle.dumps(resumed))  # from a tune worker process
    assert type(back) is DiskFull and str(back) == str(resumed)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_save_npy_reports_a_full_disk():
    """np.save to a file name writes with numpy's tofile, which on a full disk said only "8016
    requested and 2016 written" (a 64 KB tmpfs) and on /dev/full nothing at all."""
    for n in (1000, 1_000_000):
        with pytest.raises(OSError) as raised:
            save_npy("/dev/full", np.arange(n))
        assert str(full_disk(raised.value, "/data/ds")).startswith("/data/ds: no space left on device")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_torch_s_writer_on_a_real_full_device_is_a_full_disk():
    """torch raises the OSError itself or its RuntimeError over it (as on a full tmpfs)."""
    with pytest.raises((RuntimeError, OSError)) as raised, open("/dev/full", "wb", buffering=0) as f:
        torch.save({"w": torch.zeros(100_000)}, f)
    assert str(full_disk(raised.value, "/runs/x/model.pt")).startswith("/runs/x/model.pt: no space left on device")


def test_atomic_torch_save_keeps_the_old_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    atomic_torch_save({"step": 1}, path)
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real(obj, FillsUp()))
    with pytest.raises(DiskFull, match=rf"^{path}: no space left on device; free some space and run it again$"):
        atomic_torch_save({"step": 2, "w": torch.zeros(1000)}, path)
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_atomic_write_leaves_nothing_when_there_was_nothing(tmp_path):
    def half(f):
        f.write(b"user,item\n")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(DiskFull, match="out.csv: no space left on device"):
        atomic_write(tmp_path / "out.csv", half)
    assert not any(tmp_path.iterdir())
    atomic_write_text(tmp_path / "best.toml", "whole\n")  # and a write with room still works
    assert (tmp_path / "best.toml").read_text() == "whole\n"


def test_atomic_folder_names_the_folder_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "ds"
    with atomic_folder(target) as tmp:
        (tmp / "a.npy").write_bytes(b"old")
    with pytest.raises(DiskFull, match=rf"^{target}: no space left on device"), atomic_folder(target) as tmp:
        (tmp / "a.npy").write_bytes(b"ha")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "a.npy"))
    assert (target / "a.npy").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]
