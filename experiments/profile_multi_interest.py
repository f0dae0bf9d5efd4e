"""GPU time per kernel of the public ``multi_interest`` forward+backward, from ``torch.profiler``.

Inputs follow ``bench_multi_interest.py`` (bf16, d = 64, hidden 256, lengths uniform in [L/4, L],
positions on). For each shape it prints, per CUDA kernel, the mean device time per
forward+backward call, for ours and for ``torch.compile`` of the twin: where the time goes.

    python experiments/profile_multi_interest.py [--shapes 4096x50x4,1024x200x8,128x20x4]
"""

from __future__ import annotations

import argparse

import torch
from bench_multi_interest import SHAPES, forward_backward, make_inputs, ours, twin  # experiments/ on sys.path
from gpu_timing import kernel_table, print_kernel_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    args = parser.parse_args()
    compiled = torch.compile(twin, dynamic=False)
    for shape in args.shapes.split(","):
        batch, seq_len, k = map(int, shape.split("x"))
        inputs = make_inputs(batch, seq_len, k, 64, 256, False, 0)
        for name, method in (("ours", ours), ("compile-twin", compiled)):
            body = forward_backward(method)
            print_kernel_table(f"{name} f+b at B={batch} L={seq_len} K={k}", kernel_table(lambda: body(inputs)))


if __name__ == "__main__":
    main()
