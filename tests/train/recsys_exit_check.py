"""``python -m recsys``, for the torchrun tests: a rank whose DistributedDataParallel wrapper is
still alive when the run leaves its process group exits with an error.

A reducer freed after its gloo group was destroyed aborts the process at exit now and then
("terminate called without an active exception"), so a flaky crash becomes a certain failure.
"""

import gc
import sys

import torch

from recsys.cli import main
from recsys.train import distributed

_leave = distributed.cleanup


def _checked_cleanup() -> None:
    gc.collect()
    alive = sum(isinstance(o, torch.nn.parallel.DistributedDataParallel) for o in gc.get_objects())
    if alive:
        raise SystemExit(f"{alive} DistributedDataParallel wrapper(s) alive when the process group is destroyed")
    _leave()


distributed.cleanup = _checked_cleanup

if __name__ == "__main__":
    sys.argv[0] = "recsys"
    raise SystemExit(main())
