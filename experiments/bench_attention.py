"""Flash-attention kernel vs SDPA with a key-padding mask, FlexAttention and naive attention (CUDA, bf16).

H = 2, D = 64, key lengths uniform in [L/4, L], self-attention (Lq = Lk = L) at the issue's
(B, L) shapes. Times forward and forward+backward (dq, dk, dv) with ``triton.testing.do_bench``
medians (it flushes L2 between runs), reports achieved GB/s against a measured copy bandwidth
and TFLOP/s against a measured bf16 matmul, checks every method against an fp32 reference, and
prints a table last. ``--out DIR`` also writes ``bench_attention.json`` there.

    python experiments/bench_attention.py [--shapes 4096x50,32x8192] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from recsys.kernels import attention
from recsys.kernels.triton_attention import ATOMIC_DQ_MAX_LK, FUSED_MAX_LQ, backward_paths, best_configs

from gpu_timing import graph_ms, launch_ms  # experiments/ is on sys.path when run as a script

SHAPES = [(4096, 50), (1024, 200), (256, 1024), (32, 8192)]
HEADS, HEAD_DIM = 2, 64
Method = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, counting bytes read plus written."""
    x = torch.randn(1 << 28, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / launch_ms(lambda: y.copy_(x), rep=100) / 1e6


def matmul_tflops() -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * 8192**3 / launch_ms(lambda: a @ b, rep=100) / 1e9


def make_inputs(batch: int, seq_len: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, HEADS, seq_len, HEAD_DIM)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), device="cuda", generator=g)
    return [t.requires_grad_() for t in (q, k, v)], lengths, do


def methods(lengths: torch.Tensor, seq_len: int) -> dict[str, Method]:
    """Each method maps (q, k, v) -> o with keys >= lengths[b] masked."""
    batch = lengths.shape[0]
    key_ok = torch.arange(seq_len, device="cuda")[None, :] < lengths[:, None]  # [B, L]
    mask = key_ok[:, None, None, :]  # [B, 1, 1, L]

    def ours(q, k, v):
        return attention(q, k, v, key_lengths=lengths, backend="triton")

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def naive(q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) * HEAD_DIM**-0.5
        p = torch.softmax(s.masked_fill(~mask, float("-inf")).float(), dim=-1).to(v.dtype)
        return torch.matmul(p, v)

    out = {"ours": ours, "sdpa-mask": sdpa, "naive": naive}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block_mask = create_block_mask(lambda b, h, qi, ki: ki < lengths[b], batch, None, seq_len, seq_len,
                                       device="cuda")
        compiled = torch.compile(flex_attention, dynamic=False)
        out["flex"] = lambda q, k, v: compiled(q, k, v, block_mask=block_mask)
    except Exception as e:  # noqa: BLE001 - report and go on without FlexAttention
        print(f"  flex unavailable: {type(e).__name__}: {e}", flush=True)
    return out


def variant(fn: Method, **paths) -> Method:
    """Ours on another backward path (``backward_paths(**paths)``); the forward fixes the path."""

    def run(q, k, v):
        with backward_paths(**paths):
            return fn(q, k, v)

    return run


def problem_size(batch: int, seq_len: int, lengths: torch.Tensor) -> dict[str, float]:
    """Fewest bytes (padded keys never read) and FLOPs (visible pairs only) per pass."""
    tensor = batch * HEADS * seq_len * HEAD_DIM * 2
    valid = lengths.sum().item() / (batch * seq_len)
    pairs = HEADS * seq_len * lengths.sum().item()
    fwd_bytes = 2 * tensor + 2 * tensor * valid  # q, o + valid k, v
    bwd_bytes = 3 * tensor + 2 * tensor * valid + 3 * tensor  # q, o, do, valid k, v; dq, dk, dv
    return {"fwd_bytes": fwd_bytes, "fb_bytes": fwd_bytes + bwd_bytes,
            "fwd_flop": 4 * pairs * HEAD_DIM, "fb_flop": 3.5 * 4 * pairs * HEAD_DIM}


def errors(fn: Method, inputs, do, ref) -> list[float]:
    """Max |error| of o, dq, dk, dv against the fp32 reference."""
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, do)
    return [(a.float() - r).abs().max().item() for a, r in zip((out, *grads), ref)]


def bench_shape(batch: int, seq_len: int, seed: int) -> dict:
    inputs, lengths, do = make_inputs(batch, seq_len, seed)
    fns = methods(lengths, seq_len)
    if seq_len <= FUSED_MAX_LQ:  # the split backward instead of the fused one
        fns["ours-split"] = variant(fns["ours"], fused_max_lq=0)
    elif seq_len <= ATOMIC_DQ_MAX_LK:  # the other way to get dq in the split backward
        fns["ours-dq-kernel"] = variant(fns["ours"], atomic_dq_max_lk=0)
    else:
        fns["ours-atomic-dq"] = variant(fns["ours"], atomic_dq_max_lk=1 << 30)
    ref_in = [t.detach().float().requires_grad_() for t in inputs]
    ref_out = F.scaled_dot_product_attention(*ref_in, attn_mask=(
        torch.arange(seq_len, device="cuda")[None, :] < lengths[:, None])[:, None, None, :])
    ref = [ref_out.detach(), *torch.autograd.grad(ref_out, ref_in, do.float())]
    size = problem_size(batch, seq_len, lengths)
    rows = {}
    for name, fn in fns.items():
        t0 = time.time()
        row = {}
        try:
            row["err"] = errors(fn, inputs, do, ref)  # also compiles / autotunes
            with torch.no_grad():
                row["fwd_ms"] = launch_ms(lambda fn=fn: fn(*inputs), rep=100)
            row["fb_ms"] = launch_ms(lambda fn=fn: torch.autograd.grad(fn(*inputs), inputs, do), rep=100)
            try:  # GPU time without Python launch overhead (some baselines cannot be captured)
                with torch.no_grad():
                    row["fwd_graph_ms"] = graph_ms(lambda fn=fn: fn(*inputs))
                row["fb_graph_ms"] = graph_ms(lambda fn=fn: torch.autograd.grad(fn(*inputs), inputs, do))
            except Exception as e:  # noqa: BLE001
                row["graph_failed"] = f"{type(e).__name__}: {str(e)[:120]}"
        except Exception as e:  # noqa: BLE001 - e.g. naive out of memory: record and go on
            row["failed"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["wall_s"] = round(time.time() - t0, 1)
        if name.startswith("ours"):
            row["configs"] = best_configs()
        print(f"  {name:15s} {json.dumps(row)}", flush=True)
        rows[name] = row
        torch.cuda.empty_cache()
    return {"batch": batch, "seq_len": seq_len, "size": size, "methods": rows}


def table(results: list[dict], copy_bw: float, mm_tflops: float) -> str:
    header = (f"{'B x L':>10} {'method':15} {'fwd ms':>8} {'GB/s':>6} {'TF/s':>6} {'f+b ms':>8} {'GB/s':>6} "
              f"{'TF/s':>6} {'max err o/dq/dk/dv':>30}")
    lines = [f"copy bandwidth {copy_bw:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s", header]
    summary = [(f"{'B x L':>10} {'fwd floor':>9} {'ours':>7} {'best base':>9} {'speedup':>7} (>=1.3) | "
                f"{'f+b floor':>9} {'ours':>7} {'sdpa':>7} {'speedup':>7} (>=2)")]
    for res in results:
        shape, size, rows = f"{res['batch']}x{res['seq_len']}", res["size"], res["methods"]
        for name, row in rows.items():
            if "failed" in row:
                lines.append(f"{shape:>10} {name:15} failed: {row['failed'][:80]}")
                continue
            fwd, fb = row["fwd_ms"], row["fb_ms"]
            err = "/".join(f"{e:.1e}" for e in row["err"])
            lines.append(f"{shape:>10} {name:15} {fwd:8.3f} {size['fwd_bytes'] / fwd / 1e6:6.0f} "
                         f"{size['fwd_flop'] / fwd / 1e9:6.0f} {fb:8.3f} {size['fb_bytes'] / fb / 1e6:6.0f} "
                         f"{size['fb_flop'] / fb / 1e9:6.0f} {err:>30}")
        ok = {n: r for n, r in rows.items() if "failed" not in r}
        base_fwd = [ok[n]["fwd_ms"] for n in ("sdpa-mask", "flex") if n in ok]
        if "ours" not in ok or not base_fwd or "sdpa-mask" not in ok:
            continue
        our_fwd, our_fb = ok["ours"]["fwd_ms"], ok["ours"]["fb_ms"]
        floor_fwd = max(size["fwd_bytes"] / copy_bw / 1e6, size["fwd_flop"] / mm_tflops / 1e9)
        floor_fb = max(size["fb_bytes"] / copy_bw / 1e6, size["fb_flop"] / mm_tflops / 1e9)
        summary.append(f"{shape:>10} {floor_fwd:9.3f} {our_fwd:7.3f} {min(base_fwd):9.3f} "
                       f"{min(base_fwd) / our_fwd:7.2f}         | {floor_fb:9.3f} {our_fb:7.3f} "
                       f"{ok['sdpa-mask']['fb_ms']:7.3f} {ok['sdpa-mask']['fb_ms'] / our_fb:7.2f}")
    graphed = [f"{'B x L':>10} {'method':15} {'fwd graph ms':>12} {'f+b graph ms':>12}  (CUDA-graph replay: GPU time only)"]
    for res in results:
        for name, row in res["methods"].items():
            if "fwd_graph_ms" in row and "fb_graph_ms" in row:
                graphed.append(f"{res['batch']}x{res['seq_len']:<5} {name:15} {row['fwd_graph_ms']:12.3f} "
                               f"{row['fb_graph_ms']:12.3f}")
    return "\n".join(lines + [""] + graphed + [""] + summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES), help="BxL,BxL,...")
    parser.add_argument("--out", type=Path, default=None, help="folder for bench_attention.json")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    copy_bw, mm_tflops = copy_gbps(), matmul_tflops()
    print(f"copy {copy_bw:.0f} GB/s, matmul {mm_tflops:.0f} TFLOP/s", flush=True)
    results = []
    for i, (batch, seq_len) in enumerate(shapes):
        print(f"B={batch} L={seq_len}", flush=True)
        results.append(bench_shape(batch, seq_len, seed=i))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "bench_attention.json").write_text(json.dumps(
                {"copy_gbps": copy_bw, "matmul_tflops": mm_tflops, "results": results}, indent=1))
    print(table(results, copy_bw, mm_tflops), flush=True)


if __name__ == "__main__":
    main()
