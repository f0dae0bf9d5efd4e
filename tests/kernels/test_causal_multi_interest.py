"""The causal (prefix) multi-interest kernels against an fp64 twin, outputs and both gradients.

Acceptance rule (flash-attention's): at a given precision the kernel's largest error against the
fp64 twin is at most twice the PyTorch twin's own error at that precision, plus a tiny absolute
epsilon. CPU runs use the Triton interpreter (fp32, fp16: its bf16 products are wrong); the ``gpu``
tests repeat the sweep on CUDA in bf16 too. The twin itself is checked against the non-causal
extraction run on every prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from recsys.kernels.causal_multi_interest import causal_multi_interest, causal_multi_interest_ref
from recsys.kernels.multi_interest import multi_interest_ref

import sm90  # tests/kernels is on sys.path
from kernel_accuracy import assert_within_twice_twin

CUDA = torch.cuda.is_available()
needs_interpreter = pytest.mark.skipif(
    CUDA, reason="CPU interpreter tests run only where there is no GPU (the gpu tests cover CUDA)"
)

# Largest allowed error beyond 2x the twin's, per dtype: a few ulps at the outputs' scale.
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
NAMES = ("out", "dh", "dscores")

# (L, K, d): every L at one (K, d), then K 1..8 and d 16..128 (24: not a power of two) over a subset
# of L; the interpreter's blocks hold 16 positions, so L = 50 and 129 cross several blocks.
SHAPES = [(seq_len, 4, 16) for seq_len in (1, 7, 50, 129)] + [
    (7, 1, 32),
    (50, 8, 24),
    (129, 2, 64),
    (20, 8, 128),
]


def _problem(batch: int, seq_len: int, k: int, d: int, seed: int, device: str, spread: float = 3.0):
    """fp64 ``(h, scores)``, random lengths with 0 and L included, and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"dtype": torch.float64, "generator": g}
    h = torch.randn(batch, seq_len, d, **f64)
    scores = torch.randn(batch, seq_len, k, **f64) * spread  # peaked softmaxes, as trained models give
    lengths = torch.randint(0, seq_len + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = 0, seq_len
    grad = torch.randn(batch, seq_len, k, d, **f64)
    return h.to(device), scores.to(device), lengths.to(device), grad.to(device)


def _run(h, scores, lengths, grad, dtype, backend):
    """The op on ``(h, scores)`` cast to ``dtype``; fp64 copies of ``(out, dh, dscores)``."""
    h, scores = (t.detach().to(dtype).requires_grad_() for t in (h, scores))
    out = causal_multi_interest(h, scores, lengths, backend=backend)
    assert out.dtype == dtype
    out.backward(grad.to(dtype))
    assert h.grad.dtype == scores.grad.dtype == dtype
    return [t.detach().double() for t in (out, h.grad, scores.grad)]


def _check(seq_len, k, d, dtype, device, batch=4, seed=0, spread=3.0):
    h, scores, lengths, grad = _problem(batch, seq_len, k, d, seed, device, spread)
    ref = _run(h, scores, lengths, grad, torch.float64, "torch")
    twin = _run(h, scores, lengths, grad, dtype, "torch")
    ours = _run(h, scores, lengths, grad, dtype, "triton")
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[dtype])
    padded = torch.arange(seq_len, device=device)[None, :] >= lengths[:, None]  # [B, L]
    out, dh, dscores = ours
    assert (out[padded] == 0).all() and (dh[padded] == 0).all() and (dscores[padded] == 0).all(), (
        "padded positions must give zero outputs and get zero gradients"
    )


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("seq_len,k,d", SHAPES)
def test_matches_fp64_reference_cpu(seq_len, k, d, dtype):
    _check(seq_len, k, d, dtype, "cpu")


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_wide_score_range_cpu(dtype):
    """Scores spread over thousands (each prefix's softmax is one-hot, exp() of the raw scores
    overflows): the running maximum keeps the scan finite and within the accuracy rule."""
    _check(50, 4, 16, dtype, "cpu", seed=3, spread=2000.0)


@needs_interpreter
def test_all_empty_gives_zeros_cpu():
    h, scores, _, grad = _problem(3, 20, 4, 16, 2, "cpu")
    lengths = torch.zeros(3, dtype=torch.long)
    for name, t in zip(NAMES, _run(h, scores, lengths, grad, torch.float32, "triton")):
        assert (t == 0).all(), f"{name} must be exactly 0 when every sequence is empty"


@needs_interpreter
def test_lengths_outside_range_act_as_clamped_cpu():
    """Negative lengths read as 0 and lengths past L as L, by both backends."""
    h, scores, _, grad = _problem(4, 9, 3, 16, 4, "cpu")
    lengths = torch.tensor([-3, 4, 9, 40])
    clamped = lengths.clamp(0, 9)
    for backend in ("torch", "triton"):
        got = _run(h, scores, lengths, grad, torch.float32, backend)
        want = _run(h, scores, clamped, grad, torch.float32, backend)
        for name, a, b in zip(NAMES, got, want):
            assert torch.equal(a, b), f"{backend} {name}: lengths are not clamped to [0, L]"


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_padded_entries_are_never_used(backend):
    """NaN and inf in ``h`` and ``scores`` at padded positions change nothing, in either direction."""
    h, scores, lengths, grad = _problem(5, 23, 3, 16, 5, "cpu")
    padded = torch.arange(23)[None, :] >= lengths[:, None]
    dirty_h = h.masked_fill(padded[..., None], float("nan"))
    dirty_scores = scores.masked_fill(padded[..., None], float("inf"))
    clean = _run(h, scores, lengths, grad, torch.float32, backend)
    dirty = _run(dirty_h, dirty_scores, lengths, grad, torch.float32, backend)
    for name, a, b in zip(NAMES, clean, dirty):
        assert torch.equal(a, b), f"{name} depends on padded entries"


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_interpreter)])
def test_equals_non_causal_extraction_on_every_prefix(backend):
    """Position ``t`` of the causal op is ComiRec-SA's non-causal extraction run on the clicks ``<= t``
    (scores ``tanh(H W1) W2``), and 0 past the sequence: exactly (fp64) for the twin, to fp32
    rounding for the kernels."""
    batch, seq_len, k, d = 5, 19, 4, 16
    h, _, lengths, _ = _problem(batch, seq_len, k, d, 6, "cpu")
    g = torch.Generator().manual_seed(7)
    w1 = torch.randn(d, 32, dtype=torch.float64, generator=g)
    w2 = torch.randn(32, k, dtype=torch.float64, generator=g)
    _, scores = multi_interest_ref(h, lengths, w1, w2, return_scores=True)
    dtype = torch.float64 if backend == "torch" else torch.float32
    out = causal_multi_interest(h.to(dtype), scores.to(dtype), lengths, backend=backend).double()
    for t in range(seq_len):
        prefix = multi_interest_ref(h[:, : t + 1], lengths.clamp(max=t + 1), w1, w2)  # [B, K, d]
        want = prefix.masked_fill((lengths <= t)[:, None, None], 0.0)
        torch.testing.assert_close(out[:, t], want, rtol=0, atol=1e-12 if backend == "torch" else 2e-6)


@needs_interpreter
def test_autocast_casts_h_cpu():
    """Under autocast ``h`` is pooled in the autocast dtype (fp16 here) and the output is in it; the
    gradients reach the fp32 leaves in fp32; the two backends agree to fp16 rounding."""
    h, scores, lengths, grad = _problem(4, 20, 3, 16, 8, "cpu")
    results = {}
    for backend in ("torch", "triton"):
        leaves = [t.float().requires_grad_() for t in (h, scores)]
        with torch.autocast("cpu", dtype=torch.float16):
            out = causal_multi_interest(*leaves, lengths, backend=backend)
        assert out.dtype == torch.float16
        out.backward(grad.half())
        assert leaves[0].grad.dtype == leaves[1].grad.dtype == torch.float32
        results[backend] = [out.double(), *(t.grad.double() for t in leaves)]
    for name, a, b in zip(NAMES, results["torch"], results["triton"]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2, msg=name)


@needs_interpreter
def test_under_torch_compile_cpu():
    """The registered op traces (fake shapes, autograd): compiled forward and backward equal eager."""
    h, scores, lengths, grad = _problem(3, 20, 2, 16, 9, "cpu")

    def loss(h, scores):
        return (causal_multi_interest(h, scores, lengths, backend="triton") * grad.float()).sum()

    results = []
    for fn in (loss, torch.compile(loss, backend="aot_eager", fullgraph=True)):
        leaves = [t.float().requires_grad_() for t in (h, scores)]
        fn(*leaves).backward()
        results.append([t.grad for t in leaves])
    for name, a, b in zip(("dh", "dscores"), *results):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@needs_interpreter
def test_opcheck_cpu():
    """Schema, fake (meta) shapes incl. the saved log-sum-exp, autograd registration, AOT dispatch."""
    h, scores, lengths, _ = _problem(3, 20, 2, 16, 11, "cpu")
    args = (h.float().requires_grad_(), scores.float().requires_grad_(), lengths)
    torch.library.opcheck(torch.ops.recsys.causal_multi_interest.default, args)


def test_backends_and_unsupported_inputs():
    """fp64 is beyond the kernels: "auto" falls back to the twin, "triton" says why it cannot."""
    h, scores, lengths, _ = _problem(2, 5, 2, 8, 10, "cpu")
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        twin = causal_multi_interest_ref(h, scores, lengths)
        torch.testing.assert_close(causal_multi_interest(h, scores, lengths), twin)
        with pytest.raises(ValueError, match="fp16/bf16/fp32"):
            causal_multi_interest(h, scores, lengths, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        causal_multi_interest(h, scores, lengths, backend="cuda")


@pytest.mark.parametrize(
    "args,match",
    [
        (lambda h, s, n: (h[0], s, n), r"h must be \[B, L, d\]"),
        (lambda h, s, n: (h, s[:, :4], n), r"scores must be \[2, 5, K\]"),
        (lambda h, s, n: (h, s.long(), n), "must be floating point"),
        (lambda h, s, n: (h, s, n[:1]), r"lengths must have shape \[2\]"),
        (lambda h, s, n: (h, s, n.float()), "lengths must be an integer tensor"),
    ],
    ids=["h-2d", "scores-length", "scores-int", "lengths-shape", "lengths-float"],
)
def test_bad_arguments_name_the_field(args, match):
    h, scores, lengths, _ = _problem(2, 5, 2, 8, 10, "cpu")
    with pytest.raises(ValueError, match=match):
        causal_multi_interest(*args(h, scores, lengths), backend="torch")


_COMPILE_SM90 = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import sm90
    import torch
    from recsys.kernels.causal_multi_interest import triton as kernel
    types = {{"S": "*fp32", "LSE": "*fp32", "ROW": "*fp32", "DELTA": "*fp32", "DS": "*fp32", "LENGTHS": "*i64",
             "L": "i32", "D": "i32", "K": "i32"}}
    report = {{}}
    for dtype, d in (("bf16", 64), ("bf16", 256), ("fp32", 64)):
        torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
        for name, fn, cfg, extra in (
            ("forward", kernel._scan_kernel, kernel.forward_config(d), {{"WITH_GRAD": False}}),
            ("delta", kernel._scan_kernel, kernel.forward_config(d), {{"WITH_GRAD": True}}),
            ("gradients", kernel._bwd_kernel, kernel.backward_config(d, torch_dtype), {{}}),
        ):
            consts = {{"BLOCK_T": cfg.block_t, "BLOCK_D": d, "PRECISION": "ieee" if dtype == "fp32" else "tf32",
                      **extra}}
            compiled = sm90.compile_sm90(fn, consts, cfg.num_warps, cfg.num_stages, dtype, types=types,
                                         aligned_ints={{"D"}})
            report[f"{{name}} {{dtype}} d={{d}}"] = sm90.resources(compiled)
    print(json.dumps(report))
""")


@pytest.mark.skipif(not sm90.available(), reason="the Triton wheel's ptxas/cuobjdump are missing")
def test_kernels_compile_for_sm90_without_spills():
    """The scan (forward and delta pass) and the gradient kernel compile for sm_90 (H100/H200) at
    their default GPU launches (bf16 at d = 64 and 256, fp32 at 64) without spilling registers: the
    interpreter cannot catch what only the GPU compiler rejects."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = _COMPILE_SM90.format(tests=str(Path(__file__).parent))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert not {label: r["stack"] for label, r in report.items() if r["stack"]}, report


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("seq_len,k,d", [(1, 4, 64), (50, 4, 64), (200, 8, 64), (129, 3, 128), (77, 8, 256)])
def test_matches_fp64_reference_gpu(seq_len, k, d, dtype):
    _check(seq_len, k, d, dtype, "cuda", batch=64)
