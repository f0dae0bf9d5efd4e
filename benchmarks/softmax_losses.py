"""Softmax losses at dense training's target counts: ``chunked_softmax_loss`` (ours: the exact
softmax over the catalogue; on CUDA its log-partition is ``recsys.kernels.catalogue_logsumexp``,
which never holds the logits) against ``full_softmax_loss`` (the same loss through the ``[R, N]``
logits), the same loss on its torch path (``backend="torch"``: a chunk of items at a time,
recomputed in the backward), ``sampled_softmax_loss`` (S shared log-uniform negatives,
logQ, accidental hits removed: the trainer's sampled loss) and, where the package is installed,
Cut Cross-Entropy's ``linear_cross_entropy`` (Wijmans et al. 2024; its default ``filter_eps``
skips gradient blocks whose softmax is negligible, so it is not exact).

R = 128 x 50 targets (batch 128, every position of a 50-click window, one row in ten padding),
d = 64, N = 10k, 50k and 400k items. Each method's forward+backward (gradients of the user
vectors and of the item table) is timed after a check against the full softmax; on CUDA in bf16
autocast, launched call by call and replayed from a CUDA graph (``timing.py``), with its peak
memory; on a CPU in fp32 at smaller sizes. The full softmax is skipped where its logits would not
fit. The ratio tables are ``method ms / ours ms``.

    python benchmarks/softmax_losses.py [--rows 6400] [--items 10000,50000,400000] [--chunk-size 8192]
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

import torch

from recsys.train.losses import LogUniformSampler, chunked_softmax_loss, full_softmax_loss, sampled_softmax_loss

from timing import ratio_table  # benchmarks/ is on sys.path when run as a script

try:
    from cut_cross_entropy import linear_cross_entropy
except ImportError:
    linear_cross_entropy = None

BASELINES = ["full", "chunked", "sampled", "cce"]
# bytes per logit the full softmax holds at its peak: the bf16 product, its fp32 copy, the masked
# copy, the softmax gradient in fp32 and bf16 (measured peak on CUDA is printed beside it)
FULL_BYTES_PER_LOGIT = 20
Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_inputs(rows: int, num_items: int, dim: int, device: torch.device) -> Inputs:
    """``(user [R, d], target [R], item_emb [N, d], mask [R])``: fp32 leaves, every tenth row padding."""
    g = torch.Generator(device=device).manual_seed(0)
    user = torch.randn(rows, dim, device=device, generator=g).requires_grad_()
    item_emb = (torch.randn(num_items, dim, device=device, generator=g) / dim**0.25).requires_grad_()
    target = torch.randint(1, num_items, (rows,), device=device, generator=g)
    mask = torch.arange(rows, device=device) % 10 != 0
    return user, target.masked_fill(~mask, 0), item_emb, mask


def methods(inputs: Inputs, chunk_size: int, num_negatives: int) -> dict[str, Callable[[], torch.Tensor]]:
    """``{name: loss()}``, each a scalar loss over the same targets (padding rows left out)."""
    user, target, item_emb, mask = inputs
    num_items = item_emb.shape[0]
    sampler = LogUniformSampler(num_items)
    g = torch.Generator(device=user.device).manual_seed(1)
    negatives = sampler.sample(num_negatives, generator=g, device=user.device)
    log_q_neg = sampler.log_expected_count(negatives, num_negatives)
    log_q_target = sampler.log_expected_count(target.clamp(min=1), num_negatives)
    found = {
        "ours": lambda: chunked_softmax_loss(user, target, item_emb, mask=mask, chunk_size=chunk_size).loss,
        "full": lambda: full_softmax_loss(user, target, item_emb, mask=mask).loss,
        "chunked": lambda: (
            chunked_softmax_loss(user, target, item_emb, mask=mask, chunk_size=chunk_size, backend="torch").loss
        ),
        "sampled": lambda: (
            sampled_softmax_loss(
                user, target, item_emb, negatives, log_q_target=log_q_target, log_q_neg=log_q_neg, mask=mask
            ).loss
        ),
    }
    if linear_cross_entropy is not None and user.is_cuda:  # its kernels are Triton's on CUDA
        labels = torch.where(mask, target - 1, -100)  # CCE's ignore_index; classes are ids 1 .. N - 1
        found["cce"] = lambda: linear_cross_entropy(user.bfloat16(), item_emb[1:].bfloat16(), labels)
    return found


def full_fits(rows: int, num_items: int, device: torch.device) -> bool:
    """Whether the full softmax's ``[R, N]`` logits fit in half the free memory."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return rows * (num_items - 1) * FULL_BYTES_PER_LOGIT < free / 2


def forward_backward(loss: Callable[[], torch.Tensor], leaves: tuple[torch.Tensor, ...], amp: bool):
    """A callable that runs ``loss`` (in bf16 autocast when ``amp``) and its gradients of ``leaves``."""

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False, enabled=amp):
            value = loss()
        return torch.autograd.grad(value, leaves)

    return run


def check(fns: dict[str, Callable], reference: str) -> dict[str, float]:
    """Max |gradient - reference gradient| over the user vectors and the item table, per method."""
    want = fns[reference]()
    return {name: max((g - w).abs().max().item() for g, w in zip(fn(), want)) for name, fn in fns.items()}


def cpu_ms(fn: Callable[[], object]) -> float:
    """Median ms per call (``torch.utils.benchmark``, at least one second of calls)."""
    from torch.utils.benchmark import Timer

    return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=1.0).median * 1e3


def cuda_peak_mb(fn: Callable[[], object]) -> float:
    """Peak memory of one call above what was allocated before it, in MB."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def bench_size(
    rows: int, num_items: int, dim: int, args: argparse.Namespace, device: torch.device
) -> dict[str, dict[str, float]]:
    """``{method: {"launch" | "graph" | "peak MB" | "err": value}}`` at one catalogue size."""
    inputs = make_inputs(rows, num_items, dim, device)
    losses = methods(inputs, args.chunk_size, args.negatives)
    if not full_fits(rows, num_items, device):
        print(f"  full: skipped, {rows} x {num_items} logits would not fit", flush=True)
        del losses["full"]
    amp = device.type == "cuda"
    fns = {name: forward_backward(loss, (inputs[0], inputs[2]), amp) for name, loss in losses.items()}
    exact = {name: fn for name, fn in fns.items() if name in ("ours", "full", "chunked")}
    errors = check(exact, "full") if "full" in exact else {}
    results = {}
    for name, fn in fns.items():
        row = {"err": errors[name]} if name in errors else {}
        try:
            if device.type == "cuda":
                from timing import launch_and_graph_ms

                row["peak MB"] = cuda_peak_mb(fn)
                row.update(launch_and_graph_ms(fn, name))
            else:
                row["launch"] = cpu_ms(fn)
        except Exception as exc:  # noqa: BLE001 - out of memory, or a competitor's failure: report, go on
            print(f"  {name}: failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            continue
        print(f"  {name:8s} " + "  ".join(f"{key} {val:.4g}" for key, val in row.items()), flush=True)
        results[name] = row
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--rows", type=int, default=128 * 50 if cuda else 16 * 50, help="targets R")
    parser.add_argument(
        "--items",
        default="10000,50000,400000" if cuda else "2000,10000,50000",
        help="catalogue sizes N, comma-separated",
    )
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--chunk-size", type=int, default=8192)
    parser.add_argument("--negatives", type=int, default=1280, help="shared negatives of the sampled loss")
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    threads = torch.get_num_threads()
    where = f"{torch.cuda.get_device_name()}, bf16 autocast" if cuda else f"CPU ({threads} threads), fp32"
    print(
        f"device: {where}, torch {torch.__version__}; R = {args.rows}, d = {args.dim}, "
        f"chunk {args.chunk_size}, S = {args.negatives}; forward+backward ms"
    )
    if linear_cross_entropy is None or not cuda:
        print("cce: left out (it needs CUDA and the cut-cross-entropy package)")
    results = []
    for num_items in (int(n) for n in args.items.split(",")):
        print(f"N = {num_items}", flush=True)
        results.append((num_items, bench_size(args.rows, num_items, args.dim, args, device)))
    baselines = [b for b in BASELINES if any(b in res for _, res in results)]
    for timing in ("launch", "graph") if cuda else ("launch",):
        what = "each call launched from Python" if timing == "launch" else "CUDA-graph replay (GPU time only)"
        rows = [(f"N={n} f+b", {name: row[timing] for name, row in res.items()}, {}) for n, res in results]
        print(ratio_table(f"\n{timing}: {what}", rows, baselines))
    if cuda:
        print("\n| N | " + " | ".join(f"{m} peak MB" for m in ["ours", *baselines]) + " |")
        print("|---|" + "---|" * (1 + len(baselines)))
        for n, res in results:
            peaks = (res.get(m, {}).get("peak MB", math.nan) for m in ["ours", *baselines])
            print(f"| {n} | " + " | ".join(f"{p:.0f}" for p in peaks) + " |")


if __name__ == "__main__":
    main()
