"""recsys.device: the one choice of device (a GPU that is not there is one line naming the setting),
and to_device (numpy arrays in, tensors out, without torch's warnings)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recsys.api import Run
from recsys.cli import main
from recsys.config import ConfigError
from recsys.device import model_device, resolve_device

from conftest import TINY_RUN_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
TINY_DATA = [a for o in TINY_RUN_OVERRIDES if not o.startswith(("name=", "train.")) for a in ("--set", o)]

# torch says "The given NumPy array is not writable" once per process and then stays silent,
# so the check runs in a fresh interpreter where nothing has triggered it yet
CHECK = """
import warnings
import numpy as np
import torch
from recsys.device import to_device

frozen = np.arange(6, dtype=np.int64)
frozen.setflags(write=False)
np.save("clicks.npy", np.arange(6, dtype=np.int64))
arrays = (frozen, np.broadcast_to(np.int64(5), (1,)), np.load("clicks.npy", mmap_mode="r"))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tensors = to_device(arrays, torch.device("cpu"))
assert not caught, [str(w.message) for w in caught]
for a, x in zip(arrays, tensors):
    assert x.tolist() == a.tolist()
    x.fill_(-1)  # writable tensors, not views of the read-only arrays
    assert (a >= 0).all()
"""


def test_read_only_arrays_convert_without_a_warning(tmp_path):
    """Was: torch's non-writable-array warning in the CLI's output and the server log (from
    ``np.broadcast_to`` views and memory-mapped dataset arrays)."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: pretend this machine has ``n`` CUDA devices (0: none)."""

    def pretend(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return pretend


def test_resolve_device_picks_or_names_the_setting(gpus):
    gpus(0)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(torch.device("cpu"), "train.device") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"^train\.device: 'cuda' asks for a GPU, but .*use 'auto' or 'cpu'$"):
        resolve_device("cuda", "train.device")
    with pytest.raises(ConfigError, match=r"^--device: 'tpu' is not a device \(auto, cpu, cuda or cuda:N\)$"):
        resolve_device("tpu", "--device")
    gpus(2)
    assert resolve_device("auto", index=1) == torch.device("cuda", 1)  # a process's local rank
    assert resolve_device("cuda:0", index=1) == torch.device("cuda", 0)  # an explicit GPU wins
    assert resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ConfigError, match=r"^device: 'cuda:3' asks for GPU 3, but 2 are visible$"):
        resolve_device("cuda:3")


def test_model_device():
    assert model_device(torch.nn.Identity()) == torch.device("cpu")
    assert model_device(torch.nn.Linear(2, 2).to("meta")) == torch.device("meta")


def test_a_gpu_on_a_machine_without_one_is_one_line_naming_the_key(gpus, tmp_path, capsys, tiny_run):
    """Was: ``train.device=cuda`` without CUDA ended in a RuntimeError traceback."""
    gpus(0)
    out = tmp_path / "runs"
    assert main(["train", *TINY_DATA, "--set", "train.device=cuda", "--set", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("recsys train: error: train.device: 'cuda' asks for a GPU") and "\n" not in err
    assert not out.exists()  # refused before a run directory is made
    with pytest.raises(ConfigError, match=r"^device: 'cuda' asks for a GPU"):
        Run.load(tiny_run, device="cuda")
    assert main(["serve", tiny_run, "--device", "cuda"]) == 2
    assert "recsys serve: error: --device: 'cuda' asks for a GPU" in capsys.readouterr().err
