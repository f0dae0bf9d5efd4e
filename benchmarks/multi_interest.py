"""Public ``recsys.kernels.multi_interest`` vs the PyTorch twin (eager and ``torch.compile``), and
the same extraction with its attention step done by SDPA (padding mask) or FlexAttention (CUDA, bf16).

Times forward and forward+backward (gradients of h, W1, W2 and P) two ways: launched call by call
(``triton.testing.do_bench`` medians, CPU launch overhead included; the methods timed in turns over
five rounds, so that they share the host's drift) and replayed from a CUDA graph (GPU time only),
rotating over several input sets so that the inputs are not served from L2.
Lengths are uniform in [L/4, L]. Prints the memory and matrix-unit floors per shape and, last, the
two ratio tables (launch, graph).

    python benchmarks/multi_interest.py             # the acceptance shapes
    python benchmarks/multi_interest.py --sweep     # also time launch configs at the first shape
    python benchmarks/multi_interest.py --shapes 1024x200x8 --sweep fwd:scores,bwd:scores  # some kernels
    python benchmarks/multi_interest.py --shapes 1024x200x8,128x20x4
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from recsys.kernels import multi_interest
from recsys.kernels.multi_interest.triton import (
    BackwardConfig,
    ForwardConfig,
    LaunchConfig,
    backward_config,
    forward_config,
    multi_interest_backward,
    multi_interest_forward,
)

from timing import (  # benchmarks/ is on sys.path when run as a script
    graph_ms,
    graph_ms_or_nan,
    interleaved_launch_ms,
    ratio_table,
)
from timing import launch_ms as median_ms

SHAPES = [(4096, 50, 4), (1024, 200, 8), (128, 20, 4)]  # (B, L, K)
COPY_BYTES_PER_S = 4.3e12  # device-to-device copy bandwidth of an H200
BF16_FLOP_PER_S = 7.9e14  # 8192^3 bf16 matmul on random data, same machine
TANH_PER_S = 132 * 16 * 1.98e9  # MUFU.TANH: 16 per SM per clock, 132 SMs, 1.98 GHz boost

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_inputs(batch: int, seq_len: int, k: int, d: int, hidden: int, full: bool, seed: int) -> Inputs:
    """bf16 CUDA inputs ``(h, lengths, w1, w2, pos, grad_out)``; h/w1/w2/pos require grad; lengths
    all ``L`` when ``full``, else uniform in ``[L/4, L]``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = {"device": "cuda", "generator": g}
    h = torch.randn(batch, seq_len, d, **kw)
    w1 = torch.randn(d, hidden, **kw) * (2.0 / d) ** 0.5
    w2 = torch.randn(hidden, k, **kw) * (2.0 / hidden) ** 0.5
    pos = torch.randn(seq_len, d, **kw) * 0.5
    if full:
        lengths = torch.full((batch,), seq_len, device="cuda", dtype=torch.long)
    else:
        lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), **kw)
    grad = torch.randn(batch, k, d, **kw).bfloat16()
    leaves = [t.bfloat16().requires_grad_() for t in (h, w1, w2, pos)]
    return leaves[0], lengths, leaves[1], leaves[2], leaves[3], grad


def rotating(sets: list[Inputs], body: Callable[[Inputs], object]) -> Callable[[], object]:
    """A no-argument function that runs ``body`` on the next input set each call."""
    cycle = itertools.cycle(sets)
    return lambda: body(next(cycle))


def forward_only(fn: Callable) -> Callable[[Inputs], object]:
    def body(x: Inputs):
        h, lengths, w1, w2, pos, _ = x
        with torch.no_grad():
            return fn(h, lengths, w1, w2, pos=pos)

    return body


def forward_backward(fn: Callable) -> Callable[[Inputs], object]:
    def body(x: Inputs):
        h, lengths, w1, w2, pos, grad = x
        out = fn(h, lengths, w1, w2, pos=pos)
        return torch.autograd.grad(out, (h, w1, w2, pos), grad)

    return body


def floors_ms(batch: int, seq_len: int, k: int, d: int, hidden: int) -> dict[str, float]:
    """Lower bounds: each input read once and each output written once; matrix-unit FLOPs;
    and the hardware tanh of this design (forward 1 pass over ``B L hidden``, backward 2)."""
    h_bytes, o_bytes = batch * seq_len * d * 2, batch * k * d * 2
    fwd_bytes = h_bytes + o_bytes + batch * 8
    bwd_bytes = 2 * h_bytes + 2 * o_bytes + batch * k * 4 + batch * 8  # read h, out, dout; write dh
    mm = 2 * batch * seq_len * (d * hidden + hidden * k + k * d)  # forward products
    return {
        "mem_fwd": fwd_bytes / COPY_BYTES_PER_S * 1e3,
        "mem_fwdbwd": (fwd_bytes + bwd_bytes) / COPY_BYTES_PER_S * 1e3,
        "mma_fwd": mm / BF16_FLOP_PER_S * 1e3,
        "mma_fwdbwd": 4 * mm / BF16_FLOP_PER_S * 1e3,  # backward: two recomputes and two more
        "tanh_fwd": batch * seq_len * hidden / TANH_PER_S * 1e3,
        "tanh_fwdbwd": 3 * batch * seq_len * hidden / TANH_PER_S * 1e3,
    }


def ours(h, lengths, w1, w2, *, pos=None):
    """The public entry point (the fused Triton kernel on CUDA)."""
    return multi_interest(h, lengths, w1, w2, pos=pos)


def twin(h, lengths, w1, w2, *, pos=None):
    """The PyTorch twin through the public entry point."""
    return multi_interest(h, lengths, w1, w2, pos=pos, backend="torch")


def _keys_queries(h, lengths, w1, w2, pos):
    """Attention form of the extraction: queries ``W2ᵀ [1, 1, K, hidden]`` (shared by the batch), keys
    ``tanh((H + P) W1) [B, 1, L, hidden]``, values ``H [B, 1, L, d]``, scale 1."""
    keys = torch.tanh(torch.matmul(h + pos[: h.shape[1]], w1))[:, None]
    queries = w2.t().contiguous()[None, None].expand(h.shape[0], 1, -1, -1)
    return queries, keys, h[:, None]


def sdpa(h, lengths, w1, w2, *, pos=None):
    """The extraction with SDPA for the masked softmax and pooling. The memory-efficient backend
    (else the math one): cuDNN refuses these shapes (the query/key head dim ``hidden`` differs from
    the value head dim ``d``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _keys_queries(h, lengths, w1, w2, pos)
    mask = (torch.arange(h.shape[1], device=h.device)[None, :] < lengths[:, None])[:, None, None, :]
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)[:, 0]


def flex_method(lengths_of_set: dict[int, torch.Tensor], seq_len: int, k: int):
    """The extraction with compiled FlexAttention (one block mask per input set's lengths)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def block_mask(lengths: torch.Tensor):
        return create_block_mask(
            lambda b, _h, _q, kv: kv < lengths[b], lengths.shape[0], None, k, seq_len, device="cuda"
        )

    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {key: block_mask(lengths) for key, lengths in lengths_of_set.items()}

    def flex(h, lengths, w1, w2, *, pos=None):
        q, kk, v = _keys_queries(h, lengths, w1, w2, pos)
        return compiled(q, kk, v, block_mask=masks[lengths.data_ptr()], scale=1.0)[:, 0]

    return flex


def sweep(sets: list[Inputs], kernels: str = "all") -> None:
    """GPU time (CUDA graphs) of each kernel's launch configs, the others at their defaults;
    ``kernels``: "all" or a comma-separated subset of ``fwd:scores``, ``fwd:pool``, ``bwd:scores``,
    ``bwd:dx``, ``bwd:weights``."""
    batch, seq_len, d = sets[0][0].shape
    hidden, k = sets[0][3].shape
    fwd_default = forward_config(seq_len, d, hidden)
    bwd_default = backward_config(seq_len, d, hidden)
    print(f"\n## launch-config sweep at B={batch} L={seq_len} d={d} hidden={hidden} K={k}")
    print(f"defaults: {fwd_default}\n  {bwd_default}")
    detached = [tuple(t.detach() for t in x) for x in sets]

    def time_forward(cfg: ForwardConfig) -> float:
        return graph_ms(rotating(detached, lambda x: multi_interest_forward(x[0], x[1], x[2], x[3], x[4], cfg)))

    saved = [(x, multi_interest_forward(x[0], x[1], x[2], x[3], x[4])) for x in detached]

    def time_backward(cfg: BackwardConfig) -> float:
        def bwd(p):
            (h, lengths, w1, w2, pos, grad), (out, lse, scores) = p
            return multi_interest_backward(h, lengths, w1, w2, pos, out, lse, scores, grad, cfg)

        return graph_ms(rotating(saved, bwd))

    candidates = {  # (rows per tile, warps, stages, hidden per slice, register cap)
        ("fwd", "scores"): [
            (128, 8, 3, 64, None),
            (64, 4, 3, 64, None),
            (64, 4, 3, 64, 96),
            (128, 8, 3, 64, 128),
            (64, 4, 2, 64, None),
        ],
        ("fwd", "pool"): [(64, 4, 1, 0, None), (32, 4, 1, 0, None)],
        ("bwd", "scores"): [
            (64, 4, 1, 0, None),
            (64, 4, 1, 0, 128),
            (64, 4, 1, 0, 120),
            (32, 4, 1, 0, None),
            (32, 4, 1, 0, 96),
        ],
        ("bwd", "dx"): [
            (128, 8, 3, 64, None),
            (128, 8, 3, 64, 128),
            (128, 8, 2, 64, 128),
            (64, 4, 3, 64, None),
            (64, 4, 3, 64, 128),
            (64, 4, 2, 64, 128),
            (128, 8, 3, 32, 128),
            (64, 4, 3, 32, 96),
        ],
        ("bwd", "weights"): [
            (64, 4, 2, 128, None),
            (64, 4, 2, 64, None),
            (64, 4, 2, 64, 168),
            (128, 8, 2, 64, None),
            (64, 8, 2, 64, 128),
            (32, 4, 2, 128, 168),
            (64, 8, 2, 128, None),
            (128, 8, 2, 128, None),
        ],
    }
    chosen = set(candidates) if kernels == "all" else {tuple(k.split(":")) for k in kernels.split(",")}
    if chosen - set(candidates):
        raise SystemExit(f"--sweep: unknown kernels {sorted(chosen - set(candidates))}")
    for (which, field), shapes in candidates.items():
        if (which, field) not in chosen:
            continue
        for block_l, warps, stages, block_h, regs in shapes:
            for pps in (1, 2, 3, 4) if field == "weights" else (0,):
                cfg = LaunchConfig(block_l, warps, stages, pps, block_h or 64, regs)
                try:
                    if which == "fwd":
                        ms = time_forward(dataclasses.replace(fwd_default, **{field: cfg}))
                    else:
                        ms = time_backward(dataclasses.replace(bwd_default, **{field: cfg}))
                except Exception as exc:  # noqa: BLE001 - a config that does not compile: say so, go on
                    print(f"{which} {field} {cfg}: failed {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                print(f"{which} total, {field} {cfg}: {ms * 1e3:7.1f} us", flush=True)
    random_sets = [make_inputs(batch, seq_len, k, d, hidden, False, 100 + i) for i in range(len(sets))]
    fwd = median_ms(rotating(random_sets, forward_only(ours)))
    fb = median_ms(rotating(random_sets, forward_backward(ours)))
    print(f"ours, lengths uniform in [1, L]: fwd {fwd * 1e3:.1f} us, fwd+bwd {fb * 1e3:.1f} us")


def bench_shape(batch: int, seq_len: int, k: int, d: int, hidden: int, n_sets: int) -> dict:
    """Errors against fp64 and ``{(method, pass, timing): ms}`` at one shape."""
    sets = [make_inputs(batch, seq_len, k, d, hidden, False, s) for s in range(n_sets)]
    h, lengths, w1, w2, pos, grad = sets[0]
    methods = {"ours": ours, "eager-twin": twin, "compile-twin": torch.compile(twin, dynamic=False), "sdpa-mask": sdpa}
    try:
        methods["flex"] = flex_method({x[1].data_ptr(): x[1] for x in sets}, seq_len, k)
    except Exception as exc:  # noqa: BLE001 - report and go on without FlexAttention
        print(f"  flex unavailable: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    leaves = (h, w1, w2, pos)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = twin(ref_leaves[0], lengths, ref_leaves[1], ref_leaves[2], pos=ref_leaves[3])
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad.double())
    errors, times, launched = {}, {}, {}
    for name, fn in methods.items():
        t0 = time.time()
        try:
            out = fn(h, lengths, w1, w2, pos=pos)  # also compiles
            grads = torch.autograd.grad(out, leaves, grad)
            errors[name] = [(a.double() - r).abs().max().item() for a, r in zip((out, *grads), (ref, *ref_grads))]
            for mode, body in (("fwd", forward_only(fn)), ("fwd+bwd", forward_backward(fn))):
                launched[name, mode] = rotating(sets, body)
                times[name, mode, "graph"] = graph_ms_or_nan(launched[name, mode], f"{name} {mode}")
        except Exception as exc:  # noqa: BLE001 - a baseline that fails here is reported, not fatal
            print(f"  {name}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        print(
            f"  {name:13s} {time.time() - t0:5.1f} s  err o/dh/dw1/dw2/dpos "
            + "/".join(f"{e:.1e}" for e in errors.get(name, [])),
            flush=True,
        )
        torch.cuda.empty_cache()
    t0 = time.time()
    for (name, mode), ms in interleaved_launch_ms(launched).items():  # every method in turn, 5 rounds
        times[name, mode, "launch"] = ms
    print(f"  launched, in turns: {time.time() - t0:.1f} s", flush=True)
    return {"errors": errors, "times": times}


BASELINES = ["compile-twin", "eager-twin", "sdpa-mask", "flex"]
TARGETS = {"launch": {"compile-twin": 2.0}, "graph": {"compile-twin": 3.0}}  # forward+backward


def ratios(rows: list[tuple[tuple[int, int, int], dict]], timing: str) -> str:
    table = []
    for (batch, seq_len, k), res in rows:
        for mode in ("fwd", "fwd+bwd"):
            ms = {name: t for (name, m, tm), t in res["times"].items() if m == mode and tm == timing}
            table.append((f"{batch}x{seq_len}x{k} {mode}", ms, TARGETS[timing] if mode == "fwd+bwd" else {}))
    what = (
        "each call launched from Python (CPU overhead included)"
        if timing == "launch"
        else "CUDA-graph replay (GPU time only)"
    )
    return ratio_table(f"\n{timing}: {what}", table, BASELINES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--sets", type=int, default=4, help="input sets to rotate over")
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        default=None,
        metavar="KERNELS",
        help="time launch configs at the first shape: all kernels, or e.g. fwd:scores,bwd:scores",
    )
    parser.add_argument(
        "--shapes",
        default=",".join("x".join(map(str, s)) for s in SHAPES),
        help="comma-separated BxLxK (default: the acceptance shapes)",
    )
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/multi_interest.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.time()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    # The first shape a process measures can fail every method's forward+backward CUDA-graph capture
    # ("operation failed due to a previous error during capture", also after a lone capture of ours)
    # while the shapes after it succeed: a small shape goes first and its numbers are dropped.
    bench_shape(64, 8, 2, args.d, args.hidden, 1)
    rows = []
    for batch, seq_len, k in shapes:
        print(
            f"\nB={batch} L={seq_len} K={k} d={args.d} hidden={args.hidden} ({time.time() - start:.0f} s)", flush=True
        )
        res = bench_shape(batch, seq_len, k, args.d, args.hidden, args.sets)
        floor = floors_ms(batch, seq_len, k, args.d, args.hidden)
        print("  floors (ms): " + ", ".join(f"{key} {val:.4f}" for key, val in floor.items()))
        rows.append(((batch, seq_len, k), res))
        print(ratios(rows[-1:], "launch"), flush=True)
    for timing in ("launch", "graph"):
        print(ratios(rows, timing))
    if args.sweep:
        batch, seq_len, k = shapes[0]
        sweep([make_inputs(batch, seq_len, k, args.d, args.hidden, False, s) for s in range(args.sets)], args.sweep)
    print(f"\ntotal {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
