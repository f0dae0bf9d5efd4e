"""One launch path for every Triton kernel: the first launch of a shape goes through Triton, the
rest straight to the compiled kernel.

``kernel[grid](...)`` costs tens of µs of Python per launch before the GPU sees anything:
Triton binds and specialises every argument, hashes a cache key, checks the kernel's globals
and, for ``triton.autotune`` kernels, builds the tuning key from the arguments' dtypes. For
sub-millisecond kernels that is a large share of the call (the issue measured the public
attention forward at 0.260 ms against 0.105 ms of GPU time). :class:`Launcher` pays it once per
*launch key* and keeps the compiled kernel, its grid and its compile-time arguments; later
launches with that key call the compiled kernel directly.

The key must determine everything Triton specialises on: each integer argument (shapes,
strides), each tensor argument's dtype and 16-byte alignment, every compile-time argument, and
for autotuned kernels the tuning key. The callers build it from shapes, strides and flags, plus
:func:`aligned` of their input tensors (outputs they allocate are always aligned).

Under ``TRITON_INTERPRET=1`` there is no compiled kernel: every launch takes Triton's path.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import triton
from torch import Tensor

# Triton >= 3.3 launchers take every parameter, compile-time ones included (and ignore those);
# older ones only the run-time parameters.
PASS_CONSTEXPRS = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 3)
MAX_KEYS = 256  # launch keys kept per kernel; the table is emptied when full (shapes rarely vary)
Grid = tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]]


def aligned(*tensors: Tensor | None) -> tuple[bool, ...]:
    """16-byte alignment of each tensor's data (Triton specialises pointers on it); None -> True."""
    return tuple(t is None or t.data_ptr() % 16 == 0 for t in tensors)


class Launcher:
    """Launch one Triton kernel (``jit`` function, optionally behind its ``triton.autotune``).

    Args:
        kernel: the ``@triton.jit`` function; its compile-time parameters must come after the
            run-time ones (so that ``args`` positions are the run-time parameters).
        tuned: the same kernel wrapped in ``triton.autotune``; the first launch of a key tunes
            (or reuses the tuner's pick for its bucket), later launches reuse that config.
    """

    def __init__(self, kernel: Any, tuned: Any | None = None) -> None:
        self.kernel = kernel
        self.tuned = tuned
        self._compiled: dict[Hashable, tuple[Any, tuple[int, ...], tuple[Any, ...]]] = {}
        self.slow_launches = 0  # launches that went through Triton's own path (tests count them)

    def __call__(self, key: Hashable, grid: Grid, args: tuple, meta: dict[str, Any]) -> None:
        """Launch on ``grid`` with run-time ``args`` and compile-time ``meta`` (plus, untuned,
        ``num_warps``/``num_stages``). ``grid`` may depend on the tuned block sizes (callable)."""
        entry = self._compiled.get(key)
        if entry is not None:
            compiled, grid_size, constants = entry
            compiled[grid_size](*args, *constants)
            return
        self.slow_launches += 1
        compiled = (self.tuned or self.kernel)[grid](*args, **meta)
        if compiled is None or not hasattr(compiled, "function"):  # the interpreter compiles nothing
            return
        full = dict(meta)
        if self.tuned is not None:
            full.update(self.tuned.best_config.kwargs)
        grid_size = tuple(grid(full) if callable(grid) else grid)
        names = self.kernel.arg_names[len(args):] if PASS_CONSTEXPRS else []
        if len(self._compiled) >= MAX_KEYS:
            self._compiled.clear()
        self._compiled[key] = (compiled, grid_size + (1,) * (3 - len(grid_size)), tuple(full[n] for n in names))

    def chosen(self) -> dict[str, Any] | None:
        """The autotuner's last pick (block sizes, warps, stages), None when not autotuned."""
        config = getattr(self.tuned, "best_config", None)
        return None if config is None else {**config.kwargs, "num_warps": config.num_warps,
                                            "num_stages": config.num_stages}
