"""Public ``recsys.kernels.attention`` vs SDPA with a key-padding mask, FlexAttention and
``torch.compile`` of the PyTorch twin (CUDA, bf16).

H = 2, D = 64, key lengths uniform in [L/4, L], self-attention (Lq = Lk = L) at four (B, L) shapes,
from short click histories to long sequences. Each method's forward (inputs requiring grad, as in
training) and forward+backward (dq, dk, dv) are timed two ways: launched call by call
(``triton.testing.do_bench`` medians, CPU launch overhead included: what a user's Python loop gets;
the methods timed in turns over five rounds, so that they share the host's drift) and replayed from
a CUDA graph (GPU time only). Every method is checked against an fp32 reference. Rows are printed
per shape as they are measured; the details table and the two ratio tables (launch, graph) come
last.
``--causal`` times causal self-attention instead (SASRec's dense training): ours with key lengths
against SDPA's ``is_causal`` flash path (which cannot also take the key lengths, so it computes the
padded query rows too), FlexAttention with a causal and key-length mask, and the compiled twin. The
output gradient is zero on padded query rows, as in training, where they are masked out of the
loss: every method then gives the same outputs on the valid rows and the same gradients.
``--out DIR`` also writes ``bench_attention.json`` there; ``--methods`` times only the named
methods (``ours`` always); ``--before JSON`` (an earlier run's ``bench_attention.json``, e.g. of
main's kernels imported through ``PYTHONPATH``) adds a before/after table of ``ours``.

    python benchmarks/attention.py [--shapes 4096x50,32x8192] [--causal] [--paths] [--out DIR]
        [--methods ours,sdpa-mask,flex] [--before OLD/bench_attention.json]

The kernels autotune by default, as users get them (the first call of each shape bucket compiles
and times every candidate config); ``RECSYS_ATTN_AUTOTUNE=0`` runs fixed block sizes instead.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import recsys
from recsys.kernels import attention
from recsys.kernels.attention.triton import FUSED_MAX_LQ, backward_paths, best_configs

from timing import (  # benchmarks/ is on sys.path when run as a script
    graph_ms_or_nan,
    interleaved_launch_ms,
    launch_ms,
    ratio_table,
)

SHAPES = [(4096, 50), (1024, 200), (256, 1024), (32, 8192)]
HEADS, HEAD_DIM = 2, 64
BASELINES = ["sdpa-mask", "flex", "compile-twin"]
CAUSAL_BASELINES = ["sdpa-causal", "flex", "compile-twin"]
CAUSAL_FB_TARGETS = {(1024, 200): 1.3, (256, 1024): 1.3, (32, 8192): 1.0}  # f+b over sdpa-causal
Method = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, counting bytes read plus written."""
    x = torch.randn(1 << 28, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / launch_ms(lambda: y.copy_(x), rep=100) / 1e6


def matmul_tflops() -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * 8192**3 / launch_ms(lambda: a @ b, rep=100) / 1e9


def make_inputs(batch: int, seq_len: int, seed: int, causal: bool = False):
    """``([q, k, v], lengths, do)``; causal: ``do`` is zero on the padded query rows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, HEADS, seq_len, HEAD_DIM)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    lengths = torch.randint(max(1, seq_len // 4), seq_len + 1, (batch,), device="cuda", generator=g)
    if causal:
        do = do * valid_rows(lengths, seq_len)
    return [t.requires_grad_() for t in (q, k, v)], lengths, do


def valid_positions(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``[B, L]`` bool: the positions before each sequence's length."""
    return torch.arange(seq_len, device="cuda")[None, :] < lengths[:, None]


def valid_rows(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``[B, 1, L, 1]``: the query rows that are not padding."""
    return valid_positions(lengths, seq_len)[:, None, :, None]


def key_mask(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``[B, 1, 1, L]``: the keys SDPA's ``attn_mask`` lets every query see."""
    return valid_positions(lengths, seq_len)[:, None, None, :]


def methods(
    lengths: torch.Tensor, seq_len: int, names: set[str] | None = None, causal: bool = False
) -> dict[str, Method]:
    """Each method maps (q, k, v) -> o with keys >= lengths[b] masked (and, causal, keys after the
    query); ``names``: only those (and ours)."""
    batch = lengths.shape[0]
    mask = key_mask(lengths, seq_len)

    def ours(q, k, v):
        return attention(q, k, v, key_lengths=lengths, causal=causal)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def sdpa_causal(q, k, v):  # right padding: the valid rows never see a padded key
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def twin(q, k, v):
        return attention(q, k, v, key_lengths=lengths, causal=causal, backend="torch")

    out = {"ours": ours, "compile-twin": torch.compile(twin, dynamic=False)}
    out.update({"sdpa-causal": sdpa_causal} if causal else {"sdpa-mask": sdpa})
    if names is not None:
        out = {name: fn for name, fn in out.items() if name == "ours" or name in names}
        if "flex" not in names:
            return out
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def visible(b, h, qi, ki):
            return (ki < lengths[b]) & (ki <= qi) if causal else ki < lengths[b]

        block_mask = create_block_mask(visible, batch, None, seq_len, seq_len, device="cuda")
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


def path_variants(fns: dict[str, Method], seq_len: int) -> dict[str, Method]:
    """The split backward in place of the fused one, up to ``FUSED_MAX_LQ`` (``--paths``; longer
    sequences have only the split backward)."""
    if seq_len <= FUSED_MAX_LQ:
        return {"ours-split": variant(fns["ours"], fused_max_lq=0)}
    return {}


def problem_size(batch: int, seq_len: int, lengths: torch.Tensor, causal: bool = False) -> dict[str, float]:
    """Fewest bytes (padded keys never read) and FLOPs (visible pairs only; causal: of the valid
    query rows) per pass."""
    tensor = batch * HEADS * seq_len * HEAD_DIM * 2
    valid = lengths.sum().item() / (batch * seq_len)
    lens = lengths.double()
    pairs = HEADS * ((lens * (lens + 1) / 2).sum().item() if causal else seq_len * lens.sum().item())
    fwd_bytes = 2 * tensor + 2 * tensor * valid  # q, o + valid k, v
    bwd_bytes = 3 * tensor + 2 * tensor * valid + 3 * tensor  # q, o, do, valid k, v; dq, dk, dv
    return {
        "fwd_bytes": fwd_bytes,
        "fb_bytes": fwd_bytes + bwd_bytes,
        "fwd_flop": 4 * pairs * HEAD_DIM,
        "fb_flop": 3.5 * 4 * pairs * HEAD_DIM,
    }


def errors(fn: Method, inputs, do, ref, rows: torch.Tensor | None) -> list[float]:
    """Max |error| of o (on ``rows`` only, when given), dq, dk, dv against the fp32 reference."""
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, do)
    if rows is not None:
        out, ref = out * rows, [ref[0] * rows, *ref[1:]]
    return [(a.float() - r).abs().max().item() for a, r in zip((out, *grads), ref)]


def bench_shape(
    batch: int, seq_len: int, seed: int, paths: bool, names: set[str] | None = None, causal: bool = False
) -> dict:
    inputs, lengths, do = make_inputs(batch, seq_len, seed, causal)
    fns = methods(lengths, seq_len, names, causal)
    if paths:
        fns.update(path_variants(fns, seq_len))
    ref_in = [t.detach().float().requires_grad_() for t in inputs]
    if causal:  # right padding: the valid rows never see a padded key
        ref_out = F.scaled_dot_product_attention(*ref_in, is_causal=True)
    else:
        ref_out = F.scaled_dot_product_attention(*ref_in, attn_mask=key_mask(lengths, seq_len))
    ref = [ref_out.detach(), *torch.autograd.grad(ref_out, ref_in, do.float())]
    valid = valid_rows(lengths, seq_len) if causal else None
    size = problem_size(batch, seq_len, lengths, causal)
    rows, bodies = {}, {}
    for name, fn in fns.items():
        t0 = time.time()
        row = rows[name] = {}
        try:
            row["err"] = errors(fn, inputs, do, ref, valid)  # also compiles / autotunes
            for mode, body in (
                ("fwd", lambda fn=fn: fn(*inputs)),
                ("fb", lambda fn=fn: torch.autograd.grad(fn(*inputs), inputs, do)),
            ):
                bodies[name, mode] = body
                row[f"{mode}_graph_ms"] = graph_ms_or_nan(body, f"{name} {mode}")
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: record and go on
            row["failed"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["wall_s"] = round(time.time() - t0, 1)
        if name.startswith("ours"):
            row["configs"] = best_configs()
        torch.cuda.empty_cache()
    for (name, mode), ms in interleaved_launch_ms(bodies).items():  # every method in turn, 5 rounds
        rows[name][f"{mode}_ms"] = ms
    for name, row in rows.items():
        print(f"  {name:15s} {json.dumps(row)}", flush=True)
    return {"batch": batch, "seq_len": seq_len, "causal": causal, "size": size, "methods": rows}


def details(results: list[dict], copy_bw: float, mm_tflops: float) -> str:
    header = (
        f"{'B x L':>10} {'method':15} {'fwd ms':>8} {'GB/s':>6} {'TF/s':>6} {'f+b ms':>8} {'GB/s':>6} "
        f"{'TF/s':>6} {'fwd graph':>9} {'f+b graph':>9} {'max err o/dq/dk/dv':>30}"
    )
    lines = [
        f"copy bandwidth {copy_bw:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s; launch-mode ms unless 'graph'",
        header,
    ]
    for res in results:
        shape, size = f"{res['batch']}x{res['seq_len']}", res["size"]
        floor_fwd = max(size["fwd_bytes"] / copy_bw / 1e6, size["fwd_flop"] / mm_tflops / 1e9)
        floor_fb = max(size["fb_bytes"] / copy_bw / 1e6, size["fb_flop"] / mm_tflops / 1e9)
        lines.append(f"{shape:>10} {'(floor)':15} {floor_fwd:8.3f} {'':6} {'':6} {floor_fb:8.3f}")
        for name, row in res["methods"].items():
            if "failed" in row:
                lines.append(f"{shape:>10} {name:15} failed: {row['failed'][:80]}")
                continue
            fwd, fb = row["fwd_ms"], row["fb_ms"]
            err = "/".join(f"{e:.1e}" for e in row["err"])
            lines.append(
                f"{shape:>10} {name:15} {fwd:8.3f} {size['fwd_bytes'] / fwd / 1e6:6.0f} "
                f"{size['fwd_flop'] / fwd / 1e9:6.0f} {fb:8.3f} {size['fb_bytes'] / fb / 1e6:6.0f} "
                f"{size['fb_flop'] / fb / 1e9:6.0f} {row['fwd_graph_ms']:9.3f} {row['fb_graph_ms']:9.3f} "
                f"{err:>30}"
            )
    return "\n".join(lines)


def ratios(results: list[dict], timing: str) -> str:
    """Ours against each baseline. Targets: key padding, forward 1.3x the faster of SDPA and Flex and
    f+b 2x SDPA; causal, f+b over SDPA's causal path as ``CAUSAL_FB_TARGETS``."""
    suffix = "_ms" if timing == "launch" else "_graph_ms"
    causal = any(res.get("causal") for res in results)
    sdpa = "sdpa-causal" if causal else "sdpa-mask"
    rows = []
    for res in results:
        ok = {n: r for n, r in res["methods"].items() if "failed" not in r}
        if causal:
            fb_target = CAUSAL_FB_TARGETS.get((res["batch"], res["seq_len"]))
            modes = (("fwd", {}), ("fb", {} if fb_target is None else {sdpa: fb_target}))
        else:
            modes = (("fwd", {"best sdpa/flex": 1.3}), ("fb", {sdpa: 2.0}))
        for mode, targets in modes:
            ms = {n: r[mode + suffix] for n, r in ok.items()}
            ms["best sdpa/flex"] = min((ms[n] for n in (sdpa, "flex") if n in ms), default=float("nan"))
            rows.append((f"{res['batch']}x{res['seq_len']} {'fwd' if mode == 'fwd' else 'f+b'}", ms, targets))
    what = (
        "each call launched from Python (CPU overhead included)"
        if timing == "launch"
        else "CUDA-graph replay (GPU time only)"
    )
    return ratio_table(f"\n{timing}: {what}", rows, [*(CAUSAL_BASELINES if causal else BASELINES), "best sdpa/flex"])


def before_after(before: dict, results: list[dict]) -> str:
    """``ours`` of an earlier run (``before``, its JSON) against this run's, per shape and mode."""
    old = {(r["batch"], r["seq_len"]): r["methods"].get("ours", {}) for r in before["results"]}
    lines = [
        "\nbefore -> after (ours; ms; speedup = before / after)",
        "| shape | launch before | launch after | speedup | graph before | graph after | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for res in results:
        prev, now = old.get((res["batch"], res["seq_len"])), res["methods"]["ours"]
        if prev is None or "failed" in prev or "failed" in now:
            continue
        for mode in ("fwd", "fb"):
            cells = [f"{res['batch']}x{res['seq_len']} {'fwd' if mode == 'fwd' else 'f+b'}"]
            for key in (f"{mode}_ms", f"{mode}_graph_ms"):
                cells += [f"{prev[key]:.4f}", f"{now[key]:.4f}", f"{prev[key] / now[key]:.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES), help="BxL,BxL,...")
    parser.add_argument("--causal", action="store_true", help="causal self-attention (see the docstring)")
    parser.add_argument("--paths", action="store_true", help="also time the backward path ours does not take")
    parser.add_argument("--out", type=Path, default=None, help="folder for bench_attention.json")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {BASELINES} (ours always)")
    parser.add_argument("--before", type=Path, default=None, help="an earlier bench_attention.json to compare")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    names = None if args.methods is None else set(args.methods.split(","))
    known = CAUSAL_BASELINES if args.causal else BASELINES
    if names is not None and not names <= {"ours", *known}:
        parser.error(f"--methods: unknown {sorted(names - {'ours', *known})}; choose from {known}")
    before = json.loads(args.before.read_text()) if args.before else None
    start = time.time()
    print(
        torch.cuda.get_device_name(),
        "torch",
        torch.__version__,
        "triton",
        triton.__version__,
        "kernels from",
        Path(recsys.__file__).parent,
        flush=True,
    )
    copy_bw, mm_tflops = copy_gbps(), matmul_tflops()
    print(f"copy {copy_bw:.0f} GB/s, matmul {mm_tflops:.0f} TFLOP/s", flush=True)
    results = []
    for i, (batch, seq_len) in enumerate(shapes):
        print(f"B={batch} L={seq_len} ({time.time() - start:.0f} s)", flush=True)
        results.append(bench_shape(batch, seq_len, seed=i, paths=args.paths, names=names, causal=args.causal))
        print(ratios(results[-1:], "launch"), flush=True)
        if before is not None:  # per shape too: a run cut short keeps its comparisons
            print(before_after(before, results[-1:]), flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "bench_attention.json").write_text(
                json.dumps({"copy_gbps": copy_bw, "matmul_tflops": mm_tflops, "results": results}, indent=1)
            )
    print("\n" + details(results, copy_bw, mm_tflops))
    print(ratios(results, "launch"))
    print(ratios(results, "graph"))
    if before is not None:
        print(before_after(before, results))
    print(f"\ntotal {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
