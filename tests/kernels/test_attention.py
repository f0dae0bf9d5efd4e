"""The Triton flash-attention kernel against an fp64 reference: output and dq, dk, dv.

Acceptance rule (flash-attention's): at a given precision the kernel's largest error against
the fp64 twin is at most twice the PyTorch twin's own error at that precision, plus a tiny
absolute epsilon; nothing is ever NaN. CPU runs use the Triton interpreter (fp32, fp16); the
``gpu`` tests repeat the cases on CUDA in bf16, fp16 and fp32.

Causal with key lengths, query rows past a sequence's length are padding: every causal case
checks that they output exactly 0, get zero dq, and that their (non-zero) upstream gradient
changes no gradient.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from recsys.kernels import attention, attention_ref
from recsys.kernels.attention import triton as kernel_module
from recsys.kernels.attention.triton import triton_attention

from kernel_accuracy import assert_within_twice_twin  # tests/kernels is on sys.path

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(
    not INTERPRET, reason="CPU interpreter tests need TRITON_INTERPRET=1 (set where there is no GPU)"
)

# Largest allowed error beyond 2x the twin's, per dtype: a few ulps at the tensors' scale.
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
NAMES = ("out", "dq", "dk", "dv")

CPU32 = pytest.param("cpu", torch.float32, marks=needs_interpreter, id="cpu-fp32")
CPU16 = pytest.param("cpu", torch.float16, marks=needs_interpreter, id="cpu-fp16")
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]
GPU = [
    pytest.param("cuda", dt, marks=GPU_MARKS, id=f"cuda-{name}")
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32"))
]


def _problem(batch, q_batch, heads, lq, lk, d, seed, device, lengths=True, layout="contiguous"):
    """fp64 q, k, v, upstream gradient and key lengths (0, random, Lk when ``lengths``; with
    four sequences or more the second has length 1)."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"dtype": torch.float64, "generator": g}
    if layout == "packed":  # [B, L, H, D] memory viewed as [B, H, L, D], as a fused qkv projection gives
        q = torch.randn(q_batch, lq, heads, d, **f64).transpose(1, 2)
        k = torch.randn(batch, lk, heads, d, **f64).transpose(1, 2)
        v = torch.randn(batch, lk, heads, d, **f64).transpose(1, 2)
    else:
        q = torch.randn(q_batch, heads, lq, d, **f64)
        k = torch.randn(batch, heads, lk, d, **f64)
        v = torch.randn(batch, heads, lk, d, **f64)
    grad = torch.randn(batch, heads, lq, d, **f64)
    key_lengths = None
    if lengths:
        key_lengths = torch.randint(0, lk + 1, (batch,), generator=g)
        key_lengths[0], key_lengths[-1] = 0, lk
        if batch >= 4:
            key_lengths[1] = min(1, lk)
        key_lengths = key_lengths.to(device)
    return [t.to(device) for t in (q, k, v)], key_lengths, grad.to(device)


def _run(fn, qkv, grad, dtype, **kw):
    """``fn`` on ``qkv`` cast to ``dtype`` (strides kept); fp64 copies of (out, dq, dk, dv)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in qkv]
    out = fn(*leaves, **kw)
    out.backward(grad.to(dtype))
    return [t.detach().double() for t in (out, *(x.grad for x in leaves))]


def _check(
    device,
    dtype,
    *,
    batch=3,
    q_batch=None,
    heads=2,
    lq=50,
    lk=None,
    d=64,
    seed=0,
    lengths=True,
    layout="contiguous",
    **kw,
):
    lk = lq if lk is None else lk
    qkv, key_lengths, grad = _problem(batch, q_batch or batch, heads, lq, lk, d, seed, device, lengths, layout)
    kw["key_lengths"] = key_lengths
    ref = _run(attention_ref, qkv, grad, torch.float64, **kw)
    twin = _run(attention_ref, qkv, grad, dtype, **kw)
    ours = _run(triton_attention, qkv, grad, dtype, **kw)
    assert_within_twice_twin(NAMES, ref, twin, ours, ATOL[dtype])
    if key_lengths is not None:
        empty = key_lengths == 0
        assert (ours[0][empty] == 0).all(), "a sequence with no keys must output 0"
        padded = torch.arange(lk, device=device)[None, :] >= key_lengths[:, None]  # [B, Lk]
        for name, grad_kv in zip(("dk", "dv"), ours[2:]):
            assert (grad_kv.transpose(1, 2)[padded] == 0).all(), f"{name}: padded keys must get zero gradient"
        if (q_batch or batch) == batch:
            assert (ours[1][empty] == 0).all(), "dq must be 0 for rows that see no key"
        if kw.get("causal"):
            _check_padded_query_rows(qkv, grad, twin, ours, dtype, q_batch or batch, **kw)
        else:  # every query row of a sequence with keys sees them all, past the length too
            assert (ours[0][~empty].abs().amax(-1) > 0).all(), "non-causal: rows past the length attend"


def _check_padded_query_rows(qkv, grad, twin, ours, dtype, q_batch, **kw):
    """Causal with lengths, rows ``i >= key_lengths[b]`` are padding: output 0, dq 0, and the upstream
    gradient on them (non-zero here) changes nothing: the reference run with it zeroed agrees."""
    batch, _, lq, _ = grad.shape
    rows = torch.arange(lq, device=grad.device)[None, :] >= kw["key_lengths"][:, None]  # [B, Lq]
    assert (ours[0].transpose(1, 2)[rows] == 0).all(), "causal: padded query rows must output 0"
    if q_batch == batch:
        assert (ours[1].transpose(1, 2)[rows] == 0).all(), "causal: padded query rows must get zero dq"
    quiet = _run(attention_ref, qkv, grad.masked_fill(rows[:, None, :, None], 0.0), torch.float64, **kw)
    assert_within_twice_twin(NAMES[1:], quiet[1:], twin[1:], ours[1:], ATOL[dtype])


@pytest.mark.parametrize("device,dtype", [CPU32, *GPU])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("length", [1, 7, 50, 129])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lengths_and_head_dims(device, dtype, length, d, causal):
    """Every length x head dim, with and without the causal mask; key lengths include 0 (a fully
    padded sequence: zeros, zero gradients) and Lk; 50 runs the fused backward, 129 the split one."""
    _check(device, dtype, lq=length, d=d, heads=1, causal=causal)


PATHS = {"fused": {}, "split": {"fused_max_lq": 0}}


@pytest.mark.parametrize("device,dtype", [CPU32, CPU16, *GPU])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize(
    "length,path",
    [
        (1, "fused"),
        (1, "split"),
        (7, "fused"),
        (7, "split"),
        (50, "fused"),
        (50, "split"),
        (129, "split"),
        (200, "split"),
    ],
)
def test_causal_skips_padded_query_rows(device, dtype, length, d, path):
    """Causal with key lengths 0, 1, random and L on both backward paths (fused for L <= 64, the
    split dq and dk/dv kernels): outputs and gradients as the fp64 twin's, padded query rows 0 and
    their upstream gradient ignored (see :func:`_check_padded_query_rows`)."""
    with kernel_module.backward_paths(**PATHS[path]):
        _check(device, dtype, batch=5, lq=length, d=d, causal=True, seed=12)


@needs_interpreter
@pytest.mark.parametrize("path,length", [("fused", 40), ("split", 40), ("split", 90)])
def test_causal_never_reads_padded_query_rows_cpu(path, length):
    """NaN in q and in the upstream gradient on the padded query rows: no kernel reads them (a read
    would spread NaN through the scores, dk and dv), so the results are the twin's with those rows 0."""
    (q, k, v), key_lengths, grad = _problem(4, 4, 2, length, length, 16, 13, "cpu")
    rows = (torch.arange(length)[None, :] >= key_lengths[:, None])[:, None, :, None]  # [B, 1, Lq, 1]
    kw = {"key_lengths": key_lengths, "causal": True}
    with kernel_module.backward_paths(**PATHS[path]):
        ours = _run(
            triton_attention,
            [q.masked_fill(rows, torch.nan), k, v],
            grad.masked_fill(rows, torch.nan),
            torch.float32,
            **kw,
        )
    ref = _run(attention_ref, [q.masked_fill(rows, 0.0), k, v], grad.masked_fill(rows, 0.0), torch.float64, **kw)
    for name, a, b in zip(NAMES, ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("device,dtype", [CPU32, CPU16, *GPU])
@pytest.mark.parametrize("causal,softcap", [(True, None), (False, 2.0), (True, 1.5)])
@pytest.mark.parametrize("length", [7, 70])
def test_causal_and_softcap(device, dtype, length, causal, softcap):
    _check(device, dtype, lq=length, d=32, causal=causal, softcap=softcap, seed=1)


@pytest.mark.parametrize("device,dtype", [CPU32, CPU16, *GPU])
@pytest.mark.parametrize("lq,lk", [(4, 50), (70, 129)])
def test_broadcast_queries(device, dtype, lq, lk):
    """q batch 1 shared by every sequence (ComiRec-SA's interest queries): dq sums over the batch."""
    _check(device, dtype, q_batch=1, lq=lq, lk=lk, d=32, scale=1.0, softcap=3.0, seed=2)


@pytest.mark.parametrize("device,dtype", [CPU32, *GPU])
@pytest.mark.parametrize(
    "case",
    [
        {"d": 48, "causal": True},  # head dim padded to 64 with masks
        {"d": 24, "lq": 129, "layout": "packed"},  # padded to 32, strided [B, L, H, D] memory
        {"lq": 129, "lk": 7, "d": 16},  # more queries than keys
        {"lq": 7, "lk": 129, "d": 16, "lengths": False, "scale": 0.3},
        {"lq": 50, "d": 16, "scale": -0.4},  # scale <= 0: the forward's row max on scaled logits
        {"lq": 129, "d": 16, "scale": 0.0, "causal": True},
    ],
    ids=["d48-causal", "d24-packed", "lq>lk", "lq<lk-nolengths", "negative-scale", "zero-scale"],
)
def test_odd_shapes(device, dtype, case):
    _check(device, dtype, seed=3, **case)


@pytest.mark.parametrize("device,dtype", [CPU32, *GPU])
@pytest.mark.parametrize(
    "case", [{"causal": True, "softcap": 2.0}, {"q_batch": 1, "lk": 100}], ids=["causal-softcap", "broadcast"]
)
def test_split_backward_modes(device, dtype, case):
    """Lq > 64: the dq kernel (which stores delta), then the dk/dv kernel."""
    _check(device, dtype, lq=70, d=32, seed=7, **case)


def test_forward_takes_the_row_max_on_unscaled_products_only_where_that_is_exact():
    """The FMA form (max of raw q·k, scaled once per row) needs a positive scale and no soft-cap."""
    q = torch.zeros(1, 1, 9, 16)
    raw = lambda scale, softcap: kernel_module._problem(q, q, q, None, False, scale, softcap).forward.meta["RAW"]  # noqa: E731
    assert raw(None, None) and raw(0.5, None)
    assert not raw(-0.5, None) and not raw(0.0, None) and not raw(None, 2.0)


@pytest.mark.parametrize("device,dtype", [CPU32, CPU16, *GPU])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_split_backward_over_several_key_and_query_blocks(device, dtype, causal):
    """Lq > 64 with keys up to 200: several query blocks per dq program's walk and several key
    blocks per (batch, head), random lengths (0 among them)."""
    _check(device, dtype, batch=6, lq=90, lk=90 if causal else 200, d=16, causal=causal, seed=11)


def test_backward_paths_switches_the_path_and_restores_it():
    q = torch.zeros(1, 1, 70, 16)
    problem = lambda: kernel_module._problem(q, q, q, None, False, None, None)  # noqa: E731
    assert not problem().fused  # Lq = 70 > 64
    with kernel_module.backward_paths(fused_max_lq=128):
        assert problem().fused
        with kernel_module.backward_paths(fused_max_lq=0):
            assert not problem().fused
        assert problem().fused
    assert not problem().fused


@pytest.mark.parametrize(
    "device", [pytest.param("cpu", marks=needs_interpreter), pytest.param("cuda", marks=GPU_MARKS)]
)
@pytest.mark.parametrize("paths", [{}, {"fused_max_lq": 0}], ids=["fused", "split"])
def test_fused_projection_layout(device, paths):
    """q, k, v as views of one ``[B, L, 3, H, D]`` projection, the output reshaped for the output
    projection (as ``nn.attention`` does): o is written in ``[B, L, H, D]`` memory and dO read in
    its strides; values and gradients match the twin on every backward path."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(3, 9, 3, 2, 16, generator=g).to(device).requires_grad_()  # fp32: IEEE products on GPU
    lengths = torch.tensor([0, 5, 9], device=device)
    grad = torch.randn(3, 9, 32, generator=g).to(device)

    def run(backend):
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        with kernel_module.backward_paths(**paths):
            o = attention(q, k, v, key_lengths=lengths, causal=True, backend=backend)
        out = o.transpose(1, 2).reshape(3, 9, 32)
        return o, [out.detach(), *torch.autograd.grad(out, qkv, grad)]

    (o, ours), (_, twin) = run("triton"), run("torch")
    assert o.transpose(1, 2).is_contiguous()
    for a, b in zip(ours, twin, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_interpreter
def test_all_keys_padded_gives_zeros_cpu():
    qkv, _, grad = _problem(2, 2, 2, 9, 9, 16, 4, "cpu")
    key_lengths = torch.zeros(2, dtype=torch.long)
    for causal in (False, True):
        out, dq, dk, dv = _run(triton_attention, qkv, grad, torch.float32, key_lengths=key_lengths, causal=causal)
        for name, t in zip(NAMES, (out, dq, dk, dv)):
            assert (t == 0).all(), f"{name} must be exactly 0 when every key is padding"


@needs_interpreter
def test_broadcast_dq_is_deterministic_cpu():
    """The per-sequence dq partials are reduced in a fixed order: two runs agree bit for bit."""
    qkv, key_lengths, grad = _problem(5, 1, 2, 4, 20, 16, 5, "cpu")
    first = _run(triton_attention, qkv, grad, torch.float32, key_lengths=key_lengths)
    second = _run(triton_attention, qkv, grad, torch.float32, key_lengths=key_lengths)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@needs_interpreter
def test_dispatcher_routes_and_falls_back_cpu():
    """``auto`` uses the kernel where it applies and the twin for fp64 / D > 128 / a value head dim
    other than the query's; ``triton`` raises."""
    (q, k, v), key_lengths, _ = _problem(2, 2, 1, 5, 5, 16, 6, "cpu")
    q, k, v = q.float(), k.float(), v.float()
    assert torch.equal(attention(q, k, v, key_lengths=key_lengths), triton_attention(q, k, v, key_lengths=key_lengths))
    (q, k, v), _, _ = _problem(2, 2, 1, 5, 5, 160, 6, "cpu")
    expected = attention_ref(q, k, v)
    assert torch.equal(attention(q, k, v), expected)
    with pytest.raises(ValueError, match="D <= 128"):
        attention(q.float(), k.float(), v.float(), backend="triton")
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        attention(q[..., :16], k[..., :16], v[..., :16], backend="triton")
    q, k, v = q[..., :16].float(), k[..., :16].float(), v[..., :8].float()
    assert torch.equal(attention(q, k, v), attention_ref(q, k, v))
    with pytest.raises(ValueError, match="v shaped like k"):
        attention(q, k, v, backend="triton")
    with pytest.raises(ValueError, match="different devices"):
        attention(q, k, v.to("meta"), backend="torch")


@needs_interpreter
@pytest.mark.parametrize("causal", [False, True])
def test_inference_calls_build_no_autograd_node_cpu(causal):
    """Under ``no_grad``, or with no input requiring grad, the forward is launched directly (no
    autograd node, nothing saved for a backward) and gives the differentiable call's values."""
    qkv, key_lengths, _ = _problem(3, 3, 2, 7, 7, 16, 5, "cpu")
    q, k, v = (t.float() for t in qkv)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    trained = triton_attention(*leaves, key_lengths=key_lengths, causal=causal)
    assert trained.grad_fn is not None
    with torch.no_grad():
        inferred = triton_attention(*leaves, key_lengths=key_lengths, causal=causal)
    plain = triton_attention(q, k, v, key_lengths=key_lengths, causal=causal)
    for out in (inferred, plain):
        assert out.grad_fn is None and not out.requires_grad
        assert torch.equal(out, trained.detach())
