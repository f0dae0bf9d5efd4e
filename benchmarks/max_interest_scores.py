"""Public ``recsys.kernels.max_interest_scores`` (Triton, no ``[B, K, S]`` product) against its
PyTorch twin (einsum + amax, eager and ``torch.compile``d), bf16, CUDA.

The shapes are the training step's with ``train.negative_readout = "max"``: B users x K interests x
d against the batch's S = 10 B shared negatives (batch 128 and 1024, K = 4, d = 64) and a
catalogue-sized S for the full softmax. Each method's forward and forward+backward (gradients of
interests and items) are timed launched call by call and replayed from a CUDA graph
(``timing.py``), after a check against an fp64 reference; the two ratio tables come last.

    python benchmarks/max_interest_scores.py [--shapes 1024x4x64x10240,...]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from recsys.kernels import max_interest_scores

from timing import launch_and_graph_ms, shape_ratios  # benchmarks/ is on sys.path when run as a script

SHAPES = [(128, 4, 64, 1280), (1024, 4, 64, 10240), (1024, 8, 64, 10240), (256, 4, 64, 100000)]  # B, K, d, S
BASELINES = ["twin", "compile-twin"]
Method = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def methods() -> dict[str, Method]:
    def ours(v, e):
        return max_interest_scores(v, e)

    def twin(v, e):
        return max_interest_scores(v, e, backend="torch")

    return {"ours": ours, "twin": twin, "compile-twin": torch.compile(twin, dynamic=False)}


def bench_shape(batch: int, k: int, d: int, s: int) -> dict[str, dict[str, float]]:
    """``{method: {"fwd" | "fb" + " launch" | " graph": ms, "err": max |error|}}`` at one shape."""
    g = torch.Generator(device="cuda").manual_seed(0)
    v = torch.randn(batch, k, d, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
    e = (torch.randn(s, d, device="cuda", generator=g) / d**0.5).bfloat16().requires_grad_()
    grad = torch.randn(batch, s, device="cuda", generator=g)
    ref = torch.einsum("bkd,sd->bks", v.double(), e.double()).amax(dim=1)
    rows = {}
    for name, fn in methods().items():
        t0 = time.time()
        row: dict[str, float] = {"err": (fn(v, e).double() - ref).abs().max().item()}  # also compiles
        for mode, body in (
            ("fwd", lambda fn=fn: fn(v.detach(), e.detach())),
            ("fb", lambda fn=fn: torch.autograd.grad(fn(v, e), (v, e), grad)),
        ):
            for timing, ms in launch_and_graph_ms(body, f"{name} {mode}").items():
                row[f"{mode} {timing}"] = ms
        print(
            f"  {name:13s} {time.time() - t0:5.1f} s  " + "  ".join(f"{key} {val:.4g}" for key, val in row.items()),
            flush=True,
        )
        rows[name] = row
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES), help="BxKxdxS,...")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/max_interest_scores.py needs a CUDA GPU")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; B x K x d x S, bf16")
    # as in multi_interest.py: the first shape a process measures can fail every method's
    # forward+backward CUDA-graph capture, so a small shape goes first and its numbers are dropped
    bench_shape(64, 2, 64, 256)
    results = []
    for shape in [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]:
        print("x".join(map(str, shape)), flush=True)
        results.append((shape, bench_shape(*shape)))
    for timing in ("launch", "graph"):
        print(shape_ratios(results, timing, BASELINES))


if __name__ == "__main__":
    main()
