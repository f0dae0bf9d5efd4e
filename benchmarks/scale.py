"""Training at scale: samples/s as the catalogue grows, the dense item table against the row-sparse one.

One run times recsys's training step (``recsys.train.trainer.TrainStep``: comirec_sa at the
defaults, batch 128, ``data.max_len`` 20, 128 wide, sampled softmax, CUDA graph where it can)
on Taobao-like batches (power-law item popularity: id ``i`` is drawn with probability about
``1 / i``, as the most clicked items are numbered first) at several catalogue sizes, once with
``train.item_updates = "dense"`` (the whole table through ``torch.optim.AdamW`` and the weight
average every step) and once with ``"sparse"`` (only the rows a batch touches,
:mod:`recsys.train.sparse_rows`), and prints one table: samples/s and each against the smallest
catalogue's best.

``--profile N`` adds a torch.profiler breakdown of a dense and a sparse step at ``N`` items
(the operators that take the most device time, or CPU time on the CPU).

Usage::

    python benchmarks/scale.py                          # 37k, 1M and 10M items (a GPU)
    python benchmarks/scale.py --items 40000 375000     # the CPU's pair
    python benchmarks/scale.py --items 1000000 --profile 1000000
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import torch

from recsys.config import load_config
from recsys.models import build_model, resolve
from recsys.train.trainer import TrainStep


def _batches(num_items: int, batch: int, max_len: int, count: int, device: torch.device, seed: int = 0):
    """``count`` batches of power-law ids: ``(seq [B, L], lengths [B], targets [B])``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def ids(*shape: int) -> torch.Tensor:
        u = torch.rand(shape, generator=g, device=device, dtype=torch.float64)
        return torch.exp(u * math.log(num_items)).long().clamp_(1, num_items - 1)

    out = []
    for _ in range(count):
        lengths = torch.randint(4, max_len + 1, (batch,), generator=g, device=device)
        seq = ids(batch, max_len) * (torch.arange(max_len, device=device)[None] < lengths[:, None])
        out.append((seq, lengths, ids(batch)))
    return out


def _step(num_items: int, updates: str, device: torch.device, threads_note: list[str]) -> TrainStep:
    cfg = load_config(
        None,
        [
            "model.name=comirec_sa",
            "train.horizon=1",
            f"train.item_updates={updates}",
            f"train.device={device.type}",
        ],
    )
    cfg = resolve(cfg, num_items)
    torch.manual_seed(0)
    counts = torch.ones(num_items)
    counts[0] = 0
    model = build_model(cfg.model, num_items, cfg.data.max_len).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    return TrainStep(model, cfg, device, counts.to(device), gen, log=threads_note.append, weight_decay=1e-4)


def samples_per_s(num_items: int, updates: str, device: torch.device, steps: int, warmup: int) -> float:
    """Samples/s of ``steps`` training steps after ``warmup`` (the capture included there)."""
    notes: list[str] = []
    step = _step(num_items, updates, device, notes)
    cfg = step.cfg
    batches = _batches(num_items, cfg.train.batch_size, cfg.data.max_len, 16, device)
    for i in range(warmup):
        step(*batches[i % len(batches)], step=i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        out, _ = step(*batches[i % len(batches)], step=i)
    float(out.loss)  # waits for the last step
    elapsed = time.perf_counter() - start
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return steps * cfg.train.batch_size / elapsed


def profile(num_items: int, device: torch.device, steps: int = 20) -> None:
    """The operators that take the most time in dense and sparse steps at ``num_items`` items."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for updates in ("dense", "sparse"):
        step = _step(num_items, updates, device, [])
        step.use_graph = False  # launches the profiler can see one by one
        batches = _batches(num_items, step.cfg.train.batch_size, step.cfg.data.max_len, 4, device)
        for i in range(5):
            step(*batches[i % 4], step=i)
        with torch_profile(activities=activities) as prof:
            for i in range(5, 5 + steps):
                step(*batches[i % 4], step=i)
            if device.type == "cuda":
                torch.cuda.synchronize()
        print(f"\nprofile: {updates} item table, {num_items:,} items, {steps} eager steps")
        print(prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=48))
        del step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, nargs="+", default=[37_000, 1_000_000, 10_000_000])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--profile", type=int, default=0, help="also profile a step at this many items")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or 'CPU'}"
    print(f"# {where}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    rows = []
    for num_items in args.items:
        rates = {u: samples_per_s(num_items, u, device, args.steps, args.warmup) for u in ("dense", "sparse")}
        rows.append((num_items, rates))
        print(f"{num_items:>12,} items: dense {rates['dense']:>10,.0f}  sparse {rates['sparse']:>10,.0f}", flush=True)
    base = max(rows[0][1].values())
    print(f"\n{'items':>12} | {'dense /s':>10} | {'sparse /s':>10} | {'sparse/dense':>12} | {'best vs smallest':>16}")
    for num_items, rates in rows:
        best = max(rates.values())
        print(
            f"{num_items:>12,} | {rates['dense']:>10,.0f} | {rates['sparse']:>10,.0f} | "
            f"{rates['sparse'] / rates['dense']:>12.2f} | {best / base:>16.2f}"
        )
    if args.profile:
        profile(args.profile, device)


if __name__ == "__main__":
    main()
