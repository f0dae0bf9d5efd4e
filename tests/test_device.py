"""recsys.device.to_device: numpy arrays in, tensors out, without torch's warnings."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
