"""One launch path for every Triton kernel: the first launch of a problem goes through Triton, the
rest straight to the compiled kernel's C launcher.

``kernel[grid](...)`` costs tens of µs of Python per launch before the GPU sees anything:
Triton binds and specialises every argument, hashes a cache key, checks the kernel's globals
and, for ``triton.autotune`` kernels, builds the tuning key from the arguments' dtypes; even a
compiled kernel's own ``compiled[grid](...)`` looks up the device and stream and builds a
launch-metadata dict per launch. For sub-millisecond kernels that is a large share of the call.

A :class:`Launch` is one kernel at one *problem* (grid and compile-time arguments fixed). Its
first call goes through Triton (compiling, or tuning, on the way) and keeps the compiled kernel;
later calls hand the grid, the current raw stream and the arguments straight to the compiled
kernel's launcher, as Inductor's generated launchers do. The callers keep their :class:`Launch`
objects in a per-problem cache (one dictionary lookup per forward or backward call, not one per
kernel), whose key must determine everything Triton specialises on: each integer argument
(shapes, strides), each tensor argument's dtype and 16-byte alignment (:func:`aligned` of the
input tensors; the outputs the callers allocate are always aligned), every compile-time
argument, and for autotuned kernels the tuning key.

Triton's own path is taken again while a launch hook is installed (profilers such as proton
need its launch metadata) or when the current CUDA device is not the one of the first launch.
Under ``TRITON_INTERPRET=1`` nothing is compiled: every launch takes Triton's path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
from torch import Tensor

# Triton >= 3.3 launchers take every parameter, compile-time ones included (and ignore those);
# older ones only the run-time parameters.
PASS_CONSTEXPRS = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 3)
MAX_KEYS = 256  # problems kept per kernel module; the cache is emptied when full (shapes rarely vary)
Grid = tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]]

try:  # where Triton keeps its launch hooks: triton.knobs (>= 3.4), else CompiledKernel's class
    from triton import knobs

    _HOOKS: Any = knobs.runtime
except ImportError:  # pragma: no cover - older Triton
    from triton.compiler import CompiledKernel

    _HOOKS = CompiledKernel


def _no_cuda(*_: object) -> int:
    raise RuntimeError("this torch is built without CUDA: no Triton kernel is compiled to launch directly")


# the current device and its current raw stream, as Triton's CUDA driver gets them; a CPU-only
# torch has neither, and nothing is ever compiled there
_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", _no_cuda)
_current_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda)


def aligned(*tensors: Tensor | None) -> bool | tuple[bool, ...]:
    """Launch-key part for the tensors' 16-byte data alignment (Triton specialises pointers on it):
    True when every tensor is aligned (the usual case), else one flag per tensor. None counts as aligned."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    if bits % 16 == 0:
        return True
    return tuple(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is installed (a non-empty ``HookChain`` or, older Triton, a callable)."""
    return hook is not None and bool(getattr(hook, "calls", True))


class Kernel:
    """One Triton kernel: its ``@triton.jit`` function and, optionally, the same behind ``triton.autotune``.

    Args:
        fn: the ``@triton.jit`` function; its compile-time parameters must come after the run-time
            ones (so that a launch's positional arguments are the run-time parameters).
        tuned: ``fn`` wrapped in ``triton.autotune``; a problem's first launch tunes (or reuses the
            tuner's pick for its tuning key), its later launches reuse that config.
    """

    def __init__(self, fn: Any, tuned: Any | None = None) -> None:
        self.fn = fn
        self.tuned = tuned
        self.slow_launches = 0  # launches that went through Triton's own path (tests count them)

    def launch(self, grid: Grid, meta: dict[str, Any]) -> Launch:
        """This kernel on ``grid`` (a tuple, or a function of the compile-time arguments, tuned
        block sizes included) with compile-time arguments ``meta`` (plus, untuned,
        ``num_warps``/``num_stages``)."""
        return Launch(self, grid, meta)

    def chosen(self) -> dict[str, Any] | None:
        """The autotuner's last pick (block sizes, warps, stages, a register cap if any), None when
        not autotuned."""
        config = getattr(self.tuned, "best_config", None)
        if config is None:
            return None
        cap = {"maxnreg": config.maxnreg} if getattr(config, "maxnreg", None) else {}
        return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages, **cap}


class Launch:
    """One kernel at one problem: ``launch(*args)`` with the run-time arguments, in order.

    The first call launches through Triton; later ones call the compiled kernel's launcher with
    the grid, the compile-time arguments and the autotuner's pick fixed at that first call.
    """

    __slots__ = ("_direct", "grid", "kernel", "meta")

    def __init__(self, kernel: Kernel, grid: Grid, meta: dict[str, Any]) -> None:
        self.kernel = kernel
        self.grid = grid
        self.meta = meta
        # (launcher, CUfunction, packed metadata, grid x, y, z, compile-time args, device) once compiled
        self._direct: tuple | None = None

    def __call__(self, *args: Any) -> None:
        direct = self._direct
        if direct is not None and not (_hooked(_HOOKS.launch_enter_hook) or _hooked(_HOOKS.launch_exit_hook)):
            run, function, packed, gx, gy, gz, constants, device = direct
            if _current_device() == device:
                run(gx, gy, gz, _current_stream(device), function, packed, None, None, None, *args, *constants)
                return
        self._through_triton(args)

    def _through_triton(self, args: tuple) -> None:
        """Triton's own launch path; the first time, keep the compiled kernel for direct launches."""
        kernel = self.kernel
        kernel.slow_launches += 1
        compiled = (kernel.tuned or kernel.fn)[self.grid](*args, **self.meta)
        if self._direct is not None or compiled is None or not hasattr(compiled, "function"):
            return  # already kept, or the interpreter (which compiles nothing)
        full = dict(self.meta)
        if kernel.tuned is not None:
            full.update(kernel.tuned.best_config.kwargs)
        grid = tuple(self.grid(full) if callable(self.grid) else self.grid) + (1, 1)
        names = kernel.fn.arg_names[len(args) :] if PASS_CONSTEXPRS else []
        self._direct = (
            compiled.run,
            compiled.function,
            compiled.packed_metadata,
            grid[0],
            grid[1],
            grid[2],
            tuple(full[n] for n in names),
            _current_device(),
        )
