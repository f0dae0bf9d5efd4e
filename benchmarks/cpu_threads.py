"""Training samples/s on the CPU by thread count, on a quiet machine and on one whose every core
is taken by another job: torch's default, one thread, and the automatic ``train.cpu_threads``
(:func:`recsys.run.settings.cpu_threads` of what :func:`~recsys.run.settings.machine_cores`
reads at that moment).

The model and data are README command 1's (``recsys train`` at the defaults: comirec_sa on the
built-in synthetic log, batch 128). Each setting trains for ``--seconds`` in turn, ``--rounds``
times (the median is reported), first as the machine is, then with a busy-loop process on every
core of this process's affinity. "Quiet" is the machine as it is: the table prints what the
measurement found busy in each condition. Prints a ratio table (each setting over torch's default).

    python benchmarks/cpu_threads.py [--seconds 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from recsys.config import load_config
from recsys.data.batches import TrainSampler
from recsys.device import to_device
from recsys.run import build_experiment
from recsys.run.settings import TORCH_THREADS, cpu_threads, machine_cores
from recsys.train.step import TrainStep


def _trainer(users: int) -> tuple[TrainSampler, TrainStep, int]:
    """README command 1's sampler and step (the resolved defaults) on ``users`` synthetic users."""
    exp = build_experiment(load_config(None, [f"synthetic.num_users={users}"]))
    cfg, split, t = exp.cfg, exp.split, exp.cfg.train
    sampler = TrainSampler(
        split.clicks_indptr,
        split.clicks,
        cfg.data.max_len,
        min_target=t.min_target,
        seed=t.seed,
        users=split.train_users,
        ends=split.train_ends,
        predict_next=t.predict_next,
    )
    generator = torch.Generator().manual_seed(t.seed)
    step = TrainStep(exp.model, cfg, torch.device("cpu"), exp.item_counts, generator, weight_decay=t.weight_decay)
    return sampler, step, t.batch_size


def _samples_per_s(sampler: TrainSampler, step: TrainStep, batch: int, threads: int, seconds: float) -> float:
    """Samples/s of the training loop (batch, copy, step) at ``threads`` torch threads."""
    torch.set_num_threads(threads)
    for i in range(3):  # warm-up at this count
        step(*to_device(sampler.sample(batch), torch.device("cpu")), step=i)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(*to_device(sampler.sample(batch), torch.device("cpu")), step=steps)
        steps += 1
    return steps * batch / (time.perf_counter() - start)


def _condition(
    sampler: TrainSampler, step: TrainStep, batch: int, seconds: float, rounds: int
) -> tuple[float, dict[str, float], int]:
    """``(busy cores measured, {setting: median samples/s}, the rule's thread count)``."""
    cores, busy = machine_cores()
    rule = cpu_threads(cores, busy, TORCH_THREADS)
    settings = {f"torch default ({TORCH_THREADS})": TORCH_THREADS, "1 thread": 1, f"automatic ({rule})": rule}
    runs: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, threads in settings.items():
            runs[name].append(_samples_per_s(sampler, step, batch, threads, seconds))
    return busy, {name: statistics.median(values) for name, values in runs.items()}, rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="training time per setting and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every setting (the median is kept)")
    parser.add_argument("--users", type=int, default=20_000, help="synthetic users (README command 1: 20,000)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    sampler, step, batch = _trainer(args.users)
    print(f"{cores} cores; torch {torch.__version__}, default threads {TORCH_THREADS}; batch {batch}", flush=True)
    table = {"quiet": _condition(sampler, step, batch, args.seconds, args.rounds)}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(1.0)
        table[f"{cores} busy loops"] = _condition(sampler, step, batch, args.seconds, args.rounds)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    print("\n| machine | busy cores measured | setting | samples/s | vs torch default |")
    print("|---|---:|---|---:|---:|")
    for machine, (busy, rates, _) in table.items():
        base = next(iter(rates.values()))
        for name, rate in rates.items():
            print(f"| {machine} | {busy:.1f} | {name} | {rate:,.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
