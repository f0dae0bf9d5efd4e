"""Taobao scale in one table: preparing a log, samples/s as the catalogue grows, validation's
share of the wall time, an epoch's time, and the recall of row-sparse against dense item updates.

Each part is chosen with ``--do`` (all three by default; ``--do prepare`` alone on a CPU):

- ``prepare``: writes a Taobao-like log (``benchmarks/prepare.py``'s generator: power-law item
  popularity, about 85 clicks a user, 2 items per 100 clicks, 9 days of timestamps) of
  ``--clicks`` clicks as a Parquet file, or with ``--parts`` a folder of Parquet parts written a
  block at a time (a 1B-click log is never in memory), then prepares it as ``recsys data --set
  data.prepare=disk`` does, in a child process so that its peak RSS
  (``getrusage(RUSAGE_CHILDREN)``) is the preparation's alone, and from scratch (an earlier
  preparation of the same log is removed first).
- ``throughput``: samples/s of recsys's training step (``recsys.train.step.TrainStep``:
  comirec_sa at the defaults, batch ``--batch-size`` (128), ``data.max_len`` 20, 128 wide, sampled softmax, CUDA graph
  where it can) on power-law batches (id ``i`` drawn with probability about ``1 / i``, as the
  most clicked items are numbered first) at each of ``--items`` catalogue sizes, with
  ``train.item_updates = "dense"`` (the whole table through AdamW and the weight average every
  step) and ``"sparse"`` (only the rows a batch touches, :mod:`recsys.items.row_sparse`).
- ``train``: ``recsys train`` on the prepared log (comirec_sa at the defaults, no early stop),
  ``--train-steps`` steps with sparse and then dense item updates (``--minutes`` caps each run):
  validation's share of the training loop's wall time (1 - training time / loop time, the
  training time being the steps over the run's samples/s, which pause while it validates), an
  epoch's time (extrapolated from samples/s and that share: no run here trains a whole epoch of
  a 100M-click log) and test Recall@50 of both at equal steps.

``--profile N`` adds a torch.profiler breakdown of a dense and a sparse step at ``N`` items.
The log and the prepared dataset stay under ``--dir`` (a later call reuses the log).

Usage::

    python benchmarks/scale.py --clicks 100M --dir /tmp/scale           # everything (a GPU)
    python benchmarks/scale.py --do prepare --clicks 1B --parts         # the CPU's preparation
    python benchmarks/scale.py --do throughput --items 40000 375000     # the CPU's pair
    python benchmarks/scale.py --do throughput --items 1000000 --profile 1000000
"""

from __future__ import annotations

import argparse
import itertools
import math
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from prepare import parse_count, taobao_like  # benchmarks/ is on sys.path when run as a script

from recsys.config import Config, load_config
from recsys.data import load_dataset, split_dataset
from recsys.models import build_model
from recsys.run.layout import RunDir
from recsys.run.settings import Facts, objective, resolve
from recsys.train.step import TrainStep
from recsys.train.trainer import train

PARTS = ("prepare", "throughput", "train")
UPDATES = ("dense", "sparse")


def write_log(path: Path, clicks: int, *, parts: bool, seed: int = 0) -> None:
    """A Taobao-like log of ``clicks`` clicks at ``path``: one Parquet file, or with ``parts`` a
    folder of Parquet parts (as Spark writes one), a generated block at a time, so no more than
    a block is ever in memory. Written under a temporary name renamed at the end: an interrupted
    write leaves no log that looks whole."""
    import pyarrow.parquet as pq

    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.unlink(missing_ok=True)
    blocks = taobao_like(clicks, seed)
    if parts:
        partial.mkdir(parents=True)
        for i, table in enumerate(blocks):
            pq.write_table(table, partial / f"part-{i:05d}.parquet")
    else:
        first = next(blocks)
        with pq.ParquetWriter(partial, first.schema) as writer:
            for table in itertools.chain([first], blocks):
                writer.write_table(table)
    partial.rename(path)


def data_settings(log: Path, cache: Path) -> list[str]:
    """The ``data`` settings of the log: ``prepare`` and ``train`` use the same ones, so training
    reuses the prepared folder (keyed by the files and these settings)."""
    return [f"data.source={log}", "data.time_col=timestamp", "data.prepare=disk", f"data.cache_dir={cache}"]


def prepare(log: Path, cache: Path) -> dict[str, float]:
    """Prepare ``log`` from scratch with ``recsys data`` in a child process: seconds, its peak
    RSS (GiB; the largest of this process's children, and this is the first), the prepared
    dataset's clicks, users, items and bytes on disk."""
    shutil.rmtree(cache, ignore_errors=True)
    command = [sys.executable, "-m", "recsys", "data"]
    for setting in data_settings(log, cache):
        command += ["--set", setting]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    ds = load_dataset(load_config(None, data_settings(log, cache)))  # the folder just written, mapped
    folder = Path(ds.items.filename).parent
    size = sum(path.stat().st_size for path in folder.iterdir())
    return {
        "seconds": seconds,
        "rss_gib": rss,
        "clicks": len(ds.items),
        "users": ds.num_users,
        "items": ds.num_items - 1,
        "gib": size / 2**30,
    }


@dataclass(frozen=True)
class TrainRow:
    """One training run, as :func:`train_run` measured it."""

    steps: int
    batch: int
    samples_per_s: float
    valid_share: float  # of the training loop's wall time
    recall: float  # test Recall@50
    run_dir: str


def train_run(cfg: Config) -> TrainRow:
    """Train and test ``cfg``, timing validation's share of the loop (from the plan line, which
    the trainer logs just before its loop, to the last validation, which ends it)."""
    marks: dict[str, float] = {}

    def log(line: str) -> None:
        if line.startswith("plan:"):
            marks["loop"] = time.perf_counter()
        print(line, flush=True)

    def validated(step: int, metrics: dict[str, float]) -> None:
        marks["validated"] = time.perf_counter()

    result = train(cfg, log=log, on_validate=validated)
    batch = RunDir(result.run_dir).read_config().train.batch_size  # as the run resolved it
    training_s = result.steps * batch / result.samples_per_s
    return TrainRow(
        steps=result.steps,
        batch=batch,
        samples_per_s=result.samples_per_s,
        valid_share=1 - training_s / (marks["validated"] - marks["loop"]),
        recall=result.test_metrics[objective(cfg.eval)],
        run_dir=result.run_dir,
    )


def epoch_steps(run_dir: str) -> int:
    """Steps of one epoch of a run: its saved (resolved) config's plan over its training users."""
    cfg = RunDir(run_dir).read_config()
    ds = load_dataset(cfg)
    return Facts.of(ds, split_dataset(ds, cfg.data)).epoch_steps(cfg.train)


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


def _step(
    num_items: int, updates: str, device: torch.device, threads_note: list[str], batch_size: int = 128
) -> TrainStep:
    cfg = load_config(
        None,
        [
            "model.name=comirec_sa",
            "train.predict_next=1",
            f"train.item_updates={updates}",
            f"train.device={device.type}",
            f"train.batch_size={batch_size}",
        ],
    )
    cfg = resolve(cfg, Facts.of_lengths([cfg.data.max_len], num_items, device=device.type))
    torch.manual_seed(0)
    counts = torch.ones(num_items)
    counts[0] = 0
    model = build_model(cfg.model, num_items, cfg.data.max_len).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    return TrainStep(model, cfg, device, counts.to(device), gen, log=threads_note.append, weight_decay=1e-4)


def samples_per_s(
    num_items: int, updates: str, device: torch.device, steps: int, warmup: int, batch_size: int = 128
) -> float:
    """Samples/s of ``steps`` training steps of ``batch_size`` after ``warmup`` (the capture included there)."""
    notes: list[str] = []
    step = _step(num_items, updates, device, notes, batch_size)
    cfg = step.cfg
    batches = _batches(num_items, cfg.train.batch_size, cfg.data.max_len, 16, device)
    for i in range(warmup):
        step(*batches[i % len(batches)], step=i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        out, _ = step(*batches[i % len(batches)], step=i)
    float(out.loss.detach())  # waits for the last step
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
    parser.add_argument("--do", nargs="+", choices=PARTS, default=list(PARTS), help="the parts to run")
    parser.add_argument("--clicks", default="100M", help="the log's clicks (100M, 1B, ...)")
    parser.add_argument("--parts", action="store_true", help="write the log as a folder of Parquet parts")
    parser.add_argument("--dir", default="/tmp/scale", help="where the log, the prepared dataset and the runs go")
    parser.add_argument("--items", type=int, nargs="+", default=[37_000, 1_000_000, 10_000_000])
    parser.add_argument("--steps", type=int, default=500, help="timed steps of each samples/s measurement")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128, help="samples a step in the throughput part")
    parser.add_argument("--train-steps", type=int, default=2000, help="steps of each training run")
    parser.add_argument("--minutes", type=float, default=0.0, help="caps each training loop (train.max_minutes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting of the runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--profile", type=int, default=0, help="also profile a step at this many items")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"# {where}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads", flush=True)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"clicks-{args.clicks}{'' if args.parts else '.parquet'}"
    if {"prepare", "train"} & set(args.do) and not log.exists():
        write_log(log, parse_count(args.clicks), parts=args.parts)
    table = [("log", f"{log} ({parse_count(args.clicks):,} clicks)")]
    if "prepare" in args.do:
        table.append(preparation_row(prepare(log, folder / "prepared")))
    if "throughput" in args.do:
        table += throughput_rows(args.items, device, args.steps, args.warmup, args.batch_size)
    if "train" in args.do:
        table += training_rows(log, folder, device, args.train_steps, args.minutes, args.set)
    print("\n| part | measured |\n|---|---|")
    for name, value in table:
        print(f"| {name} | {value} |")
    if args.profile:
        profile(args.profile, device)


def preparation_row(p: dict[str, float]) -> tuple[str, str]:
    return (
        "preparation (`recsys data`, out of core)",
        f"{p['seconds']:,.0f} s, peak RSS {p['rss_gib']:.2f} GiB; kept {p['clicks']:,} clicks, "
        f"{p['users']:,} users, {p['items']:,} items; {p['gib']:.2f} GiB on disk",
    )


def throughput_rows(
    items: list[int], device: torch.device, steps: int, warmup: int, batch_size: int = 128
) -> list[tuple[str, str]]:
    """Samples/s of dense and sparse updates at each catalogue size, the best against the first size's best."""
    rates = {}
    for num_items in items:
        rates[num_items] = {u: samples_per_s(num_items, u, device, steps, warmup, batch_size) for u in UPDATES}
        print(f"{num_items:>12,} items: " + ", ".join(f"{u} {r:,.0f}" for u, r in rates[num_items].items()), flush=True)
    base = max(rates[items[0]].values())
    return [
        (
            f"samples/s at {num_items:,} items, batch {batch_size}",
            f"dense {r['dense']:,.0f}, sparse {r['sparse']:,.0f}; the best {max(r.values()) / base:.2f}x the best "
            f"at {items[0]:,}",
        )
        for num_items, r in rates.items()
    ]


def training_rows(
    log: Path, folder: Path, device: torch.device, steps: int, minutes: float, overrides: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """Sparse and dense training runs at equal steps on the prepared log (``overrides``: more
    ``--set`` settings for both): one row each, and their recall."""
    runs = {}
    for updates in UPDATES[::-1]:  # sparse first: the shipped form at this size
        settings = [
            *data_settings(log, folder / "prepared"),
            "model.name=comirec_sa",
            f"train.max_steps={steps}",
            "train.patience=0",
            f"train.max_minutes={minutes}",
            f"train.item_updates={updates}",
            f"train.device={device.type}",
            f"output_dir={folder / 'runs'}",
            *overrides,
        ]
        runs[updates] = train_run(load_config(None, settings))
    epoch = epoch_steps(runs["sparse"].run_dir)
    rows = []
    for updates, r in runs.items():
        epoch_min = epoch * r.batch / r.samples_per_s / (1 - r.valid_share) / 60
        rows.append(
            (
                f"training, {updates} item updates",
                f"{r.steps:,} steps, {r.samples_per_s:,.0f} samples/s; validation {r.valid_share:.1%} of the loop's "
                f"wall time; an epoch ({epoch:,} steps) {epoch_min:,.1f} min (extrapolated)",
            )
        )
    sparse, dense = runs["sparse"].recall, runs["dense"].recall
    rows.append(("test Recall@50, equal steps", f"sparse {sparse:.4f}, dense {dense:.4f} ({sparse / dense - 1:+.1%})"))
    return rows


if __name__ == "__main__":
    main()
