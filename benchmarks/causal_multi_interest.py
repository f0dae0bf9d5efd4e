"""Public ``recsys.kernels.causal_multi_interest`` (Triton: a blockwise scan, no ``[B, K, L, L]``
weights) against its PyTorch twin (the masked ``[B, K, L, L]`` softmax, eager and
``torch.compile``d), bf16 ``h`` and fp32 scores, CUDA.

The shapes are dense multi-interest training's: B sequences x L positions x K interests x d, with
lengths uniform in [1, L]. Each method's forward and forward+backward (gradients of ``h`` and the
scores) are timed launched call by call and replayed from a CUDA graph (``timing.py``), after a check
of the forward against an fp64 reference; the two ratio tables come last. ``--sweep`` times the
kernels' launch configurations instead (forward scan, and the backward's gradient kernel), to choose
the defaults in ``recsys/kernels/causal_multi_interest/triton.py``.

    python benchmarks/causal_multi_interest.py [--shapes 1024x50x4x64,...] [--sweep]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from recsys.kernels.causal_multi_interest import causal_multi_interest, causal_multi_interest_ref
from recsys.kernels.causal_multi_interest import triton as kernel

from timing import graph_ms_or_nan, launch_and_graph_ms, shape_ratios  # benchmarks/ is on sys.path as a script

SHAPES = [(1024, 50, 4, 64), (256, 200, 8, 64), (1024, 200, 4, 64)]  # B, L, K, d
BASELINES = ["twin", "compile-twin"]
SWEEP_FORWARD = [kernel.LaunchConfig(t, w, s) for t in (16, 32, 64) for w in (4, 8) for s in (1, 2)]
SWEEP_BACKWARD = [kernel.LaunchConfig(t, w, 2) for t in (16, 32, 64) for w in (4, 8)]
Method = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def methods() -> dict[str, Method]:
    def ours(h, scores, lengths):
        return causal_multi_interest(h, scores, lengths)

    def twin(h, scores, lengths):
        return causal_multi_interest(h, scores, lengths, backend="torch")

    return {"ours": ours, "twin": twin, "compile-twin": torch.compile(twin, dynamic=False)}


def problem(batch: int, seq_len: int, k: int, d: int) -> tuple[torch.Tensor, ...]:
    """``(h [B, L, d] bf16, scores [B, L, K] fp32, lengths [B], grad [B, L, K, d] bf16)`` on CUDA."""
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(batch, seq_len, d, device="cuda", generator=g).bfloat16().requires_grad_()
    scores = (3 * torch.randn(batch, seq_len, k, device="cuda", generator=g)).requires_grad_()
    lengths = torch.randint(1, seq_len + 1, (batch,), device="cuda", generator=g)
    grad = torch.randn(batch, seq_len, k, d, device="cuda", generator=g).bfloat16()
    return h, scores, lengths, grad


def bench_shape(batch: int, seq_len: int, k: int, d: int) -> dict[str, dict[str, float]]:
    """``{method: {"fwd" | "fb" + " launch" | " graph": ms, "err": max |error|}}`` at one shape."""
    # every shape and mode recompiles the one twin function: past dynamo's limit of 8 the
    # compiled twin would silently run eagerly
    torch._dynamo.reset()
    h, scores, lengths, grad = problem(batch, seq_len, k, d)
    # no autograd graph from the leaves: one kept alive across the captures pins their gradient
    # accumulators to the default stream, which invalidates a backward's capture on another stream
    ref = causal_multi_interest_ref(h.detach().double(), scores.detach().double(), lengths)
    rows = {}
    for name, fn in methods().items():
        t0 = time.time()
        with torch.no_grad():  # a forward check (and the compile) that leaves no autograd graph behind
            row: dict[str, float] = {"err": (fn(h, scores, lengths).double() - ref).abs().max().item()}
        for mode, body in (
            ("fwd", lambda fn=fn: fn(h.detach(), scores.detach(), lengths)),
            ("fb", lambda fn=fn: torch.autograd.grad(fn(h, scores, lengths), (h, scores), grad)),
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


def sweep_shape(batch: int, seq_len: int, k: int, d: int) -> None:
    """CUDA-graph ms of the forward scan and of the backward's gradient kernel (with the delta pass at
    its default) at every configuration of the sweep; the defaults are marked."""
    h, scores, lengths, grad = (t.detach() for t in problem(batch, seq_len, k, d))
    _, lse = kernel.forward(h, scores, lengths)
    runs = [
        ("forward", cfg, kernel.forward_config(d), lambda cfg=cfg: kernel.forward(h, scores, lengths, cfg))
        for cfg in SWEEP_FORWARD
    ]
    runs += [
        (
            "backward",
            cfg,
            kernel.backward_config(d, h.dtype),
            lambda cfg=cfg: kernel.backward(h, scores, lengths, lse, grad, cfg),
        )
        for cfg in SWEEP_BACKWARD
    ]
    for what, cfg, default, fn in runs:
        mark = "  (default)" if cfg == default else ""
        label = f"{what} T={cfg.block_t} w{cfg.num_warps} s{cfg.num_stages}"
        print(f"  {label:28s} {graph_ms_or_nan(fn, label):.4f} ms{mark}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES), help="BxLxKxd,...")
    parser.add_argument("--sweep", action="store_true", help="time the kernels' launch configurations instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/causal_multi_interest.py needs a CUDA GPU")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if any(len(s) != 4 for s in shapes):
        raise SystemExit(f"--shapes: each shape is BxLxKxd, got {args.shapes!r}")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; B x L x K x d, h bf16, scores fp32")
    if args.sweep:
        for shape in shapes:
            print("x".join(map(str, shape)), flush=True)
            sweep_shape(*shape)
        return
    # as in multi_interest.py: the first shape a process measures can fail every method's
    # forward+backward CUDA-graph capture, so a small shape goes first and its numbers are dropped
    bench_shape(64, 20, 2, 64)
    results = []
    for shape in shapes:
        print("x".join(map(str, shape)), flush=True)
        results.append((shape, bench_shape(*shape)))
    for timing in ("launch", "graph"):
        print(shape_ratios(results, timing, BASELINES))


if __name__ == "__main__":
    main()
