"""Host (CPU) cost per call of the public kernels' launched forward and forward + backward.

Times ``recsys.kernels.attention`` (bf16, H = 2, D = 64, key lengths in [L/4, L], inputs requiring
grad as in training; also as ``recsys.nn.attention`` calls it, on views of one fused qkv projection
with the output reshaped for the output projection) and ``recsys.kernels.multi_interest`` (bf16
leaves h, W1, W2, P, as in ``bench_multi_interest.py``; also with fp32 W1, W2, P, the model's
parameters under bf16 autocast) called N times in a row with ``time.perf_counter``:

- ``--device cpu`` (the default without a GPU): no kernel runs. The first launch of each kernel
  "compiles" to a Triton ``CompiledKernel`` whose C launcher does nothing, so the timings are the
  Python, dispatcher, autograd and allocator work of the call path, the launch cache and Triton's
  Python launch path included, without the C launcher and the GPU.
  Shapes are tiny, so that the few torch ops of a call (allocations, a sum) cost their dispatch
  only, as a launched op costs the host on a GPU.
- ``--device cuda``: the kernels run; N calls are launched back to back and the clock stops after
  a synchronize, so a row is the launched cost per call (host-bound at small shapes).

A calibration row (a ``torch.add`` forward + backward on a tiny tensor) gives a scale between
machines. ``--out F.json`` saves the rows, ``--before F.json`` adds a before/after table;
``--profile NAME`` prints cProfile's top functions for one row (e.g. ``attention f+b``).

    python experiments/host_overhead.py --out /tmp/after.json --before /tmp/before.json
    python experiments/host_overhead.py --device cuda --attention 64x50   # small: host-bound on a GPU
    python experiments/host_overhead.py --device cuda --profile "multi-interest f+b"
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from collections.abc import Callable
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the compiled-kernel path is the one measured

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import CompiledKernel  # noqa: E402

import recsys.kernels.dispatch as dispatch  # noqa: E402
import recsys.kernels.triton_attention as attention_module  # noqa: E402
import recsys.kernels.triton_multi_interest as multi_interest_module  # noqa: E402
from recsys.kernels import attention, multi_interest  # noqa: E402
import recsys.kernels.launch as launch_module  # noqa: E402

CPU_SHAPES = {"attention": (8, 50), "multi-interest": (8, 20, 4)}  # tiny: torch ops cost their dispatch only
CUDA_SHAPES = {"attention": (4096, 50), "multi-interest": (128, 20, 4)}
HEADS, HEAD_DIM, D, HIDDEN = 2, 64, 64, 256


class _StubDriver:
    """Triton's active driver on a machine without a GPU: device 0, stream 0."""

    @staticmethod
    def get_current_device() -> int:
        return 0

    @staticmethod
    def get_current_stream(device: int) -> int:
        return 0


def _stub_compiled(fn) -> CompiledKernel:
    """A real ``CompiledKernel`` (so that launching it runs Triton's own Python launch path) whose
    C launcher ``run`` does nothing."""
    compiled = CompiledKernel.__new__(CompiledKernel)
    compiled.module, compiled.function, compiled.packed_metadata = "stub", 0, ()
    compiled.name, compiled.src, compiled._module_pid = fn.__name__, None, None
    compiled._run = _no_launch
    return compiled


def _no_launch(*args) -> None:
    return None


class _StubKernel:
    """Stands in for a ``@triton.jit`` kernel (or its autotuner, with the first config as the pick):
    its first launch returns a stub compiled kernel."""

    def __init__(self, kernel, tuned) -> None:
        self.arg_names = kernel.arg_names
        self.compiled = _stub_compiled(kernel.fn)
        configs = getattr(tuned, "configs", None)
        if configs:
            self.best_config = configs[0]

    def __getitem__(self, grid):
        return lambda *args, **meta: self.compiled


def _kernel_holders() -> list:
    """The modules' kernel holders (``Kernel``, or the ``Launcher`` of earlier versions): objects
    with a ``tuned`` autotuner slot and a ``slow_launches`` count."""
    found = []
    for module in (attention_module, multi_interest_module):
        for value in vars(module).values():
            items = value.values() if isinstance(value, dict) else [value]
            found += [x for x in items if hasattr(x, "tuned") and hasattr(x, "slow_launches")]
    return found


def stub_triton() -> None:
    """Route every kernel to a stub, give Triton and the launch cache a stub device and stream,
    and let the dispatcher take the Triton path on CPU."""
    for holder in _kernel_holders():
        attr = "fn" if hasattr(holder, "fn") else "kernel"
        stub = _StubKernel(getattr(holder, attr), holder.tuned)
        setattr(holder, attr, stub)
        holder.tuned = stub if holder.tuned is not None else None
    driver = _StubDriver()
    triton.runtime.driver.set_active(driver)
    launch_module._current_device = driver.get_current_device
    launch_module._current_stream = driver.get_current_stream
    dispatch.triton_available = lambda device: True


def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` under ``torch.no_grad()``: the forward as evaluation and serving call it."""
    def call():
        with torch.no_grad():
            return fn()

    return call


def attention_calls(device: str, batch: int, seq_len: int) -> dict[str, Callable[[], object]]:
    g = torch.Generator(device=device).manual_seed(0)
    shape = (batch, HEADS, seq_len, HEAD_DIM)
    q, k, v, do = (torch.randn(shape, device=device, generator=g).bfloat16() for _ in range(4))
    lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), device=device, generator=g)
    inputs = [t.requires_grad_() for t in (q, k, v)]

    def fwd():
        return attention(*inputs, key_lengths=lengths)

    # as nn.attention calls it: q, k, v views of one [B, L, 3, H, D] projection, the output
    # reshaped to [B, L, H D] for the output projection
    qkv = torch.randn(batch, seq_len, 3, HEADS, HEAD_DIM, device=device, generator=g).bfloat16()
    packed = [t.requires_grad_() for t in qkv.permute(2, 0, 3, 1, 4).unbind(0)]
    grad = torch.randn(batch, seq_len, HEADS * HEAD_DIM, device=device, generator=g).bfloat16()

    def layer():
        o = attention(*packed, key_lengths=lengths)
        return o.transpose(1, 2).reshape(batch, seq_len, HEADS * HEAD_DIM)

    return {"fwd": fwd, "fwd, no grad": no_grad(fwd), "f+b": lambda: torch.autograd.grad(fwd(), inputs, do),
            "f+b, fused qkv + reshape": lambda: torch.autograd.grad(layer(), packed, grad)}


def multi_interest_calls(device: str, batch: int, seq_len: int, k: int,
                         weights: torch.dtype = torch.bfloat16) -> dict[str, Callable[[], object]]:
    """bf16 ``h``; W1, W2, P in ``weights`` (fp32: the model's parameters under bf16 autocast)."""
    g = torch.Generator(device=device).manual_seed(0)
    h, w1, w2, pos = (torch.randn(shape, device=device, generator=g).to(torch.bfloat16 if i == 0 else weights)
                      .requires_grad_()
                      for i, shape in enumerate(((batch, seq_len, D), (D, HIDDEN), (HIDDEN, k), (seq_len, D))))
    lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), device=device, generator=g)
    grad = torch.randn(batch, k, D, device=device, generator=g).bfloat16()
    leaves = (h, w1, w2, pos)

    def fwd():
        return multi_interest(h, lengths, w1, w2, pos=pos)

    return {"fwd": fwd, "fwd, no grad": no_grad(fwd), "f+b": lambda: torch.autograd.grad(fwd(), leaves, grad)}


def calibration_calls(device: str) -> dict[str, Callable[[], object]]:
    """One elementwise op forward and backward: the machine's own cost of a launched op."""
    x = torch.randn(16, device=device, requires_grad=True)
    return {"f+b": lambda: torch.autograd.grad(torch.add(x, 1.0), x, torch.ones(16, device=device))}


def per_call_us(fn: Callable[[], object], device: str, calls: int, repeats: int) -> float:
    """Fewest µs per call, over ``repeats`` timings of ``calls`` calls in a row (the least disturbed
    by other processes on the machine)."""
    for _ in range(20):  # first calls compile (or stub) and fill the caches
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)


def rows(device: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Callable[[], object]]:
    b, n = shapes["attention"]
    mb, ml, mk = shapes["multi-interest"]
    out = {f"attention {name}": fn for name, fn in attention_calls(device, b, n).items()}
    out |= {f"multi-interest {name}": fn for name, fn in multi_interest_calls(device, mb, ml, mk).items()}
    out |= {f"multi-interest {name}, fp32 W1 W2 P": fn
            for name, fn in multi_interest_calls(device, mb, ml, mk, torch.float32).items()}
    out["calibration: torch.add f+b"] = calibration_calls(device)["f+b"]
    return out


def table(now: dict[str, float], before: dict[str, float] | None) -> str:
    if before is None:
        lines = ["| call | µs per call |", "|---|---:|"]
        lines += [f"| {name} | {us:.1f} |" for name, us in now.items()]
    else:
        lines = ["| call | before µs | after µs | before / after |", "|---|---:|---:|---:|"]
        for name, us in now.items():
            old = before.get(name, float("nan"))
            lines.append(f"| {name} | {old:.1f} | {us:.1f} | {old / us:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=200, help="calls in a row per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per row (the fastest is reported)")
    parser.add_argument("--out", type=Path, help="save the rows (µs per call) as JSON")
    parser.add_argument("--before", type=Path, help="JSON of an earlier run: print a before/after table")
    parser.add_argument("--profile", help="cProfile this row (e.g. 'attention f+b') and print the top functions")
    parser.add_argument("--attention", help="BxL of the attention rows (default 4096x50 on CUDA, 8x50 on CPU)")
    parser.add_argument("--multi-interest", help="BxLxK of the multi-interest rows (default 128x20x4 on CUDA, 8x20x4 on CPU)")
    args = parser.parse_args()
    shapes = dict(CUDA_SHAPES if args.device == "cuda" else CPU_SHAPES)
    for name, value in (("attention", args.attention), ("multi-interest", args.multi_interest)):
        if value:
            shapes[name] = tuple(int(x) for x in value.split("x"))
    if args.device == "cpu":
        stub_triton()
    calls = rows(args.device, shapes)
    if args.profile:
        fn = calls[args.profile]
        per_call_us(fn, args.device, 1, 1)
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [fn() for _ in range(args.calls)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    now = {name: per_call_us(fn, args.device, args.calls, args.repeats) for name, fn in calls.items()}
    kernels = "kernels stubbed (host cost only)" if args.device == "cpu" else "kernels running"
    print(f"device {args.device}, {kernels}, torch {torch.__version__}, triton {triton.__version__}; shapes {shapes}")
    before = json.loads(args.before.read_text()) if args.before else None
    print(table(now, before))
    if args.out:
        args.out.write_text(json.dumps(now, indent=1))


if __name__ == "__main__":
    main()
