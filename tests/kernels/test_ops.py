"""The kernels as registered operators: ``torch.library.opcheck``, ``torch.compile(fullgraph=True)``
of models with the kernels inside, the launch cache and the launches per call.

CPU runs use the Triton interpreter and the ``aot_eager`` backend (the graphs are traced through
the operators, their fake implementations and autograd formulas, then run eagerly); the ``gpu``
tests compile with Inductor on CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from recsys.config import ModelConfig
from recsys.kernels import attention, multi_interest
from recsys.kernels.attention import triton as attention_module
from recsys.kernels.common import launch as launch_module
from recsys.kernels.common.launch import Kernel, Launch
from recsys.kernels.multi_interest import triton as multi_interest_module
from recsys.models import build_model
from recsys.run.settings import resolve_model

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="CPU operator tests need TRITON_INTERPRET=1")
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]
CPU = pytest.param("cpu", marks=needs_interpreter, id="cpu")
GPU = pytest.param("cuda", marks=GPU_MARKS, id="cuda")
OPS = ("recsys.flash_attention", "recsys.multi_interest")


def _attention_args(device, *, lens=True, causal=False, softcap=0.0, q_batch=3, lq=6):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(q_batch, 2, lq, 16, generator=g)
    k, v = (torch.randn(3, 2, 6, 16, generator=g) for _ in range(2))
    lengths = torch.tensor([0, 4, 6]) if lens else None
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    return q, k, v, None if lengths is None else lengths.to(device), causal, 0.25, softcap


def _multi_interest_args(device, *, pos=True, score_cap=0.0):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(4, 7, 16, generator=g)
    w1, w2 = torch.randn(16, 32, generator=g) * 0.3, torch.randn(32, 3, generator=g) * 0.3
    p = torch.randn(9, 16, generator=g) * 0.3
    h, w1, w2, p = (t.to(device).requires_grad_() for t in (h, w1, w2, p))
    return h, torch.tensor([0, 2, 7, 5], device=device), w1, w2, p if pos else None, score_cap


@pytest.mark.parametrize("device", [CPU, GPU])
@pytest.mark.parametrize(
    "case",
    [{}, {"lens": False, "causal": True}, {"softcap": 2.0, "q_batch": 1}],
    ids=["lengths", "causal", "softcap-broadcast"],
)
def test_opcheck_attention(device, case):
    """Schema, fake (meta) shapes incl. the saved log-sum-exp, autograd registration, AOT dispatch."""
    torch.library.opcheck(torch.ops.recsys.flash_attention.default, _attention_args(device, **case))


@pytest.mark.parametrize("device", [CPU, GPU])
def test_opcheck_attention_on_a_fused_projection(device):
    """q, k, v views of one [B, L, 3, H, D] projection: the fake output has the real one's
    [B, L, H, D] memory layout."""
    qkv = torch.randn(3, 6, 3, 2, 16, device=device, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    lengths = torch.tensor([0, 4, 6], device=device)
    torch.library.opcheck(torch.ops.recsys.flash_attention.default, (q, k, v, lengths, True, 0.25, 0.0))


@pytest.mark.parametrize("device", [CPU, GPU])
@pytest.mark.parametrize("case", [{}, {"pos": False, "score_cap": 1.5}], ids=["pos", "cap-no-pos"])
def test_opcheck_multi_interest(device, case):
    torch.library.opcheck(torch.ops.recsys.multi_interest.default, _multi_interest_args(device, **case))


def _recording_backend(seen: dict[str, list[str]]):
    """``aot_eager`` that records the call targets of the forward and backward graphs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def recorder(which):
        def compile_graph(gm, _inputs):
            seen[which] += [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
            return make_boxed_func(gm.forward)

        return compile_graph

    return aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))


def _model_step(name: str, device: str):
    """A model (dropout 0, so eager and compiled runs agree) and ``step(seq, lengths) -> (loss, grads)``."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, dim=16, num_interests=3, num_layers=1, num_heads=2, dropout=0.0, backend="triton")
    model = build_model(resolve_model(cfg, 30), 30, 6).to(device)
    params = [p for p in model.parameters() if p.requires_grad]

    def loss(seq, lengths):
        return model.interests(seq, lengths).square().sum()

    def step(fn, seq, lengths):
        out = fn(seq, lengths)
        return out.detach(), torch.autograd.grad(out, params, allow_unused=True)

    return loss, step


def _batch(device):
    gen = torch.Generator().manual_seed(2)
    seq = torch.randint(1, 30, (4, 6), generator=gen)
    lengths = torch.tensor([6, 3, 1, 0])
    seq[torch.arange(6)[None] >= lengths[:, None]] = 0
    return seq.to(device), lengths.to(device)


def _assert_same(eager, compiled, atol):
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-4, atol=atol)
    for a, b in zip(eager[1], compiled[1], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=atol)


@needs_interpreter
@pytest.mark.parametrize("name,op", [("comirec_sa", "recsys.multi_interest"), ("sasrec", "recsys.flash_attention")])
def test_fullgraph_compile_matches_eager_cpu(name, op):
    """Forward and backward traced whole (no graph break) through the registered kernels."""
    loss, step = _model_step(name, "cpu")
    seq, lengths = _batch("cpu")
    seen = {"forward": [], "backward": []}
    compiled = torch.compile(loss, fullgraph=True, backend=_recording_backend(seen))
    _assert_same(step(loss, seq, lengths), step(compiled, seq, lengths), atol=1e-5)
    assert any(op in target for target in seen["forward"]), seen["forward"]
    assert any(f"{op}_backward" in target for target in seen["backward"]), seen["backward"]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["comirec_sa", "sasrec"])
def test_fullgraph_compile_matches_eager_gpu(name):
    """Inductor on CUDA, fp32 (IEEE products in the kernels): compiled forward and backward equal eager."""
    torch._dynamo.reset()
    loss, step = _model_step(name, "cuda")
    seq, lengths = _batch("cuda")
    compiled = torch.compile(loss, fullgraph=True)
    _assert_same(step(loss, seq, lengths), step(compiled, seq, lengths), atol=1e-4)


# --------------------------------------------------------------------------------------------
# Launches per call
# --------------------------------------------------------------------------------------------

# what a call may do besides launching its kernels: allocate, view, and nothing that computes
FREE = {
    "empty",
    "empty_like",
    "new_empty",
    "empty_strided",
    "view",
    "_unsafe_view",
    "slice",
    "detach",
    "alias",
    "t",
    "transpose",
    "expand",
    "as_strided",
    "zeros_like",
    "split",
    "split_with_sizes",
}


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counted_launches(monkeypatch):
    """Kernel launches are recorded (by kernel name) instead of run; returns the list."""
    launched: list[str] = []

    def record(self, *args):
        launched.append(self.kernel.fn.fn.__name__)

    monkeypatch.setattr(Launch, "__call__", record)
    return launched


def _launches(fn, counted_launches) -> tuple[list[str], list[str]]:
    counted_launches.clear()
    with _Count() as mode:
        fn()
    return list(counted_launches), [op for op in mode.ops if op not in FREE]


@needs_interpreter
def test_attention_launches_per_call_cpu(counted_launches):
    """Forward: one kernel, no cast of int64 lengths; fused backward: one kernel; split backward:
    dq + dk/dv, no separate zeros nor, in fp32 or fp16, a cast of dq."""
    q, k, v, lengths, *_ = _attention_args("cpu", lq=6)
    do = torch.randn(3, 2, 6, 16)
    fwd, other = _launches(lambda: attention(q, k, v, key_lengths=lengths, backend="triton"), counted_launches)
    assert fwd == ["_fwd_kernel"] and other == []
    out = attention(q, k, v, key_lengths=lengths, backend="triton")
    bwd, other = _launches(lambda: torch.autograd.grad(out, (q, k, v), do), counted_launches)
    assert bwd == ["_bwd_dq_kernel"] and other == []
    with attention_module.backward_paths(fused_max_lq=0):
        out = attention(q, k, v, key_lengths=lengths, backend="triton")
    bwd, other = _launches(lambda: torch.autograd.grad(out, (q, k, v), do), counted_launches)
    assert bwd == ["_bwd_dq_kernel", "_bwd_dkdv_kernel"] and other == []
    half, do = [t.detach().half().requires_grad_() for t in (q, k, v)], do.half()
    with attention_module.backward_paths(fused_max_lq=0):
        out = attention(*half, key_lengths=lengths, backend="triton")
    bwd, other = _launches(lambda: torch.autograd.grad(out, half, do), counted_launches)
    assert bwd == ["_bwd_dq_kernel", "_bwd_dkdv_kernel"] and other == []


@needs_interpreter
def test_attention_on_a_fused_projection_copies_nothing_cpu(counted_launches):
    """q, k, v as views of one projection (as ``nn.attention`` makes them): o comes back in
    ``[B, L, H, D]`` memory, so the output projection's reshape is a view, and its gradient
    reaches the kernels in o's strides: no copy either way."""
    qkv = torch.randn(3, 6, 3, 2, 16)
    q, k, v = (t.requires_grad_() for t in qkv.permute(2, 0, 3, 1, 4).unbind(0))
    lengths = torch.tensor([0, 4, 6])

    def forward():
        return attention(q, k, v, key_lengths=lengths, backend="triton").transpose(1, 2).reshape(3, 6, 32)

    fwd, other = _launches(forward, counted_launches)
    assert fwd == ["_fwd_kernel"] and other == []
    out, grad = forward(), torch.randn(3, 6, 32)
    bwd, other = _launches(lambda: torch.autograd.grad(out, (q, k, v), grad), counted_launches)
    assert bwd == ["_bwd_dq_kernel"] and other == []


@needs_interpreter
def test_multi_interest_launches_per_call_cpu(counted_launches):
    """Forward: the valid-row list, the scores over the valid rows and the pool; backward (which
    reuses the list): three kernels over the valid rows, dP's partial sums over the batch and
    one launch summing the weight and dP partials (no torch sums, casts, zeros or concatenations)."""
    h, lengths, w1, w2, pos, _ = _multi_interest_args("cpu")
    fwd, other = _launches(lambda: multi_interest(h, lengths, w1, w2, pos=pos, backend="triton"), counted_launches)
    assert fwd == ["_mi_rows_kernel", "_mi_scores_kernel", "_mi_pool_kernel"] and other == []
    out = multi_interest(h, lengths, w1, w2, pos=pos, backend="triton")
    grad = torch.randn_like(out)
    bwd, other = _launches(lambda: torch.autograd.grad(out, (h, w1, w2, pos), grad), counted_launches)
    assert bwd == [
        "_mi_bwd_scores_kernel",
        "_mi_bwd_weights_kernel",
        "_mi_bwd_dx_kernel",
        "_mi_dpos_kernel",
        "_sum_parts_kernel",
    ]
    assert other == []  # dP comes out with pos's 9 rows (L = 7) from the kernels
    out = multi_interest(h, lengths, w1, w2, backend="triton")
    no_pos, _ = _launches(lambda: torch.autograd.grad(out, (h, w1, w2), grad), counted_launches)
    assert no_pos == ["_mi_bwd_scores_kernel", "_mi_bwd_weights_kernel", "_mi_bwd_dx_kernel", "_sum_parts_kernel"]


@needs_interpreter
def test_multi_interest_reads_fp32_weights_without_casts_cpu(counted_launches):
    """fp16 ``h`` with fp32 W1, W2, P (autocast's mix): the kernels read the weights as they are,
    so neither pass launches a cast (nor holds a cast node in the autograd graph)."""
    h, lengths, w1, w2, pos, _ = _multi_interest_args("cpu")
    h = h.detach().half().requires_grad_()
    fwd, other = _launches(lambda: multi_interest(h, lengths, w1, w2, pos=pos, backend="triton"), counted_launches)
    assert len(fwd) == 3 and other == []
    out = multi_interest(h, lengths, w1, w2, pos=pos, backend="triton")
    grad = torch.randn_like(out)
    bwd, other = _launches(lambda: torch.autograd.grad(out, (h, w1, w2, pos), grad), counted_launches)
    assert len(bwd) == 5 and other == []  # dP summed in fp32, stored in fp32 by the kernels


# --------------------------------------------------------------------------------------------
# The launch cache
# --------------------------------------------------------------------------------------------


class _FakeCompiled:
    """Stands in for Triton's compiled kernel: records the direct launches of its C launcher ``run``."""

    function, packed_metadata = "cu-function", "packed"

    def __init__(self, calls):
        self.calls = calls

    def run(self, gx, gy, gz, stream, function, packed, launch_metadata, enter_hook, exit_hook, *args):
        self.calls.append(((gx, gy, gz), stream, function, packed, args))


class _FakeKernel:
    """Stands in for a ``@triton.jit`` function (or its autotuner): records Triton-path launches."""

    arg_names = ("X", "N", "BLOCK", "FLAG")

    def __init__(self, compiled, best=None):
        self.compiled, self.triton_calls = compiled, []
        if best is not None:
            self.best_config = type("Config", (), {"kwargs": best, "num_warps": 4, "num_stages": 2})()

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.triton_calls.append((grid, args, meta))
            return self.compiled

        return run


@pytest.fixture
def fake_device(monkeypatch):
    """A current CUDA device (0, or what the test sets in ``device[0]``) and raw stream 7 on any machine."""
    device = [0]
    monkeypatch.setattr(launch_module, "_current_device", lambda: device[0])
    monkeypatch.setattr(launch_module, "_current_stream", lambda index: 7)
    return device


def test_launch_goes_to_the_compiled_kernel_after_the_first_launch(fake_device):
    calls = []
    kernel = _FakeKernel(_FakeCompiled(calls))
    tuned = _FakeKernel(kernel.compiled, best={"BLOCK": 64})
    launch = Kernel(kernel, tuned).launch(lambda meta: (10 // meta["BLOCK"] + 1,), {"FLAG": True})
    for n in (5, 6):
        launch("x", n)
    assert len(tuned.triton_calls) == 1 and launch.kernel.slow_launches == 1  # tuned once, then direct
    # the compiled kernel's launcher gets the 3-d grid, the current stream and every argument by
    # position, the tuned block size included
    assert calls == [((1, 1, 1), 7, "cu-function", "packed", ("x", 6, 64, True))]
    assert launch.kernel.chosen() == {"BLOCK": 64, "num_warps": 4, "num_stages": 2}


def test_launch_takes_tritons_path_under_hooks_or_on_another_device(fake_device, monkeypatch):
    """A profiler's launch hook needs Triton's launch metadata; another device its own binary."""
    calls = []
    kernel = _FakeKernel(_FakeCompiled(calls))
    launch = Kernel(kernel).launch((3,), {"BLOCK": 16, "FLAG": False})
    launch("x", 1)
    hooks = type("Hooks", (), {"launch_enter_hook": lambda metadata: None, "launch_exit_hook": None})
    with monkeypatch.context() as patch:
        patch.setattr(launch_module, "_HOOKS", hooks)
        launch("x", 2)
    fake_device[0] = 1
    launch("x", 3)
    assert [args[1] for _, args, _ in kernel.triton_calls] == [1, 2, 3] and calls == []
    fake_device[0] = 0
    launch("x", 4)
    assert len(kernel.triton_calls) == 3 and [c[-1] for c in calls] == [("x", 4, 16, False)]


def test_launch_without_compiled_kernel_always_takes_tritons_path():
    """The interpreter returns no compiled kernel: nothing is kept."""
    kernel = _FakeKernel(None)
    launch = Kernel(kernel).launch((3,), {"BLOCK": 16, "FLAG": False})
    for _ in range(2):
        launch("x", 1)
    assert len(kernel.triton_calls) == 2 and launch.kernel.slow_launches == 2


def test_alignment_key():
    x = torch.zeros(8)
    assert launch_module.aligned(x, None, x[4:]) is True
    assert launch_module.aligned(x, None, x[1:]) == (True, True, False)


class _Interpreted:
    """A kernel under the interpreter whose launches return a compiled kernel stand-in: its direct
    launches (positional arguments, compile-time ones included, on the kept grid) run the kernel
    again in the interpreter, so the launch cache's direct path is exercised on CPU."""

    def __init__(self, fn, direct: list[str]):
        self.fn, self.arg_names, self.direct = fn, fn.arg_names, direct

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.fn[grid](*args, **meta)
            return self

        return launch

    function, packed_metadata = "interpreted", None

    def run(self, gx, gy, gz, stream, function, packed, launch_metadata, enter_hook, exit_hook, *args):
        self.direct.append(self.fn.fn.__name__)
        self.fn[(gx, gy, gz)](**dict(zip(self.arg_names, args, strict=True)))


@pytest.fixture
def direct_launches(monkeypatch, fake_device):
    """Every kernel of both modules behind :class:`_Interpreted`, with empty problem caches;
    returns the names of the kernels launched directly (not through Triton)."""
    direct: list[str] = []
    kernels = [*attention_module._KERNELS.values(), *multi_interest_module._KERNELS.values()]
    for kernel in kernels:
        monkeypatch.setattr(kernel, "fn", _Interpreted(kernel.fn, direct))
    monkeypatch.setattr(attention_module, "_PROBLEMS", {})
    monkeypatch.setattr(multi_interest_module, "_PLANS", {})
    return direct


def _forward_backward(fn, leaves, grad):
    out = fn()
    return [out.detach(), *torch.autograd.grad(out, leaves, grad)]


@needs_interpreter
@pytest.mark.parametrize(
    "paths,lq", [({}, 6), ({"fused_max_lq": 0}, 6), ({}, 70)], ids=["fused", "split", "long-broadcast"]
)
def test_cached_attention_launches_match_the_first_cpu(direct_launches, paths, lq):
    """The second call launches every kernel directly and gives the first call's bits; both match
    the PyTorch twin."""
    q, k, v, lengths, _, scale, _ = _attention_args("cpu", lq=lq, q_batch=1 if lq == 70 else 3)
    grad = torch.randn(3, 2, lq, 16)
    with attention_module.backward_paths(**paths):

        def call(backend="triton"):
            return attention(q, k, v, key_lengths=lengths, scale=scale, backend=backend)

        first = _forward_backward(call, (q, k, v), grad)
        assert direct_launches == []
        second = _forward_backward(call, (q, k, v), grad)
        twin = _forward_backward(lambda: call("torch"), (q, k, v), grad)
    assert len(direct_launches) == (2 if not paths and lq == 6 else 3)
    for a, b, t in zip(first, second, twin, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(b, t, rtol=1e-4, atol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("case", [{}, {"pos": False, "score_cap": 1.5}], ids=["pos", "cap-no-pos"])
def test_cached_multi_interest_launches_match_the_first_cpu(direct_launches, case):
    h, lengths, w1, w2, pos, cap = _multi_interest_args("cpu", **case)
    leaves = [t for t in (h, w1, w2, pos) if t is not None]
    grad = torch.randn(4, 3, 16)

    def call(backend="triton"):
        return multi_interest(h, lengths, w1, w2, pos=pos, score_cap=cap, backend=backend)

    first = _forward_backward(call, leaves, grad)
    second = _forward_backward(call, leaves, grad)
    twin = _forward_backward(lambda: call("torch"), leaves, grad)
    dpos = ["_mi_dpos_kernel"] if pos is not None else []
    assert direct_launches == [
        "_mi_rows_kernel",
        "_mi_scores_kernel",
        "_mi_pool_kernel",
        "_mi_bwd_scores_kernel",
        "_mi_bwd_weights_kernel",
        "_mi_bwd_dx_kernel",
        *dpos,
        "_sum_parts_kernel",
    ]
    for a, b, t in zip(first, second, twin, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(b, t, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cached_launches_match_and_respect_alignment_gpu():
    """Second calls (forward and backward) skip Triton's launch path and give the same bits; a
    misaligned view (other pointer specialisation) is a new key, and still right."""
    q, k, v, lengths, *_ = _attention_args("cuda")
    do = torch.randn(3, 2, 6, 16, device="cuda")

    def run(q):
        out = attention(q, k, v, key_lengths=lengths, backend="triton")
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    first = run(q)
    slow = {kind: kernel.slow_launches for kind, kernel in attention_module._KERNELS.items()}
    second = run(q)
    assert slow == {kind: kernel.slow_launches for kind, kernel in attention_module._KERNELS.items()}
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    buf = torch.randn(q.numel() + 1, device="cuda")
    shifted = buf[1:].view_as(q).copy_(q.detach()).requires_grad_()  # data 4 bytes past an aligned address
    assert shifted.data_ptr() % 16 != 0
    for a, b in zip(first, run(shifted)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    h, lengths, w1, w2, pos, _ = _multi_interest_args("cuda")
    grad = torch.randn(4, 3, 16, device="cuda")

    def mi():
        out = multi_interest(h, lengths, w1, w2, pos=pos, backend="triton")
        return (out, *torch.autograd.grad(out, (h, w1, w2, pos), grad))

    first = mi()
    slow = [kernel.slow_launches for kernel in multi_interest_module._KERNELS.values()]
    second = mi()
    assert slow == [kernel.slow_launches for kernel in multi_interest_module._KERNELS.values()]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
