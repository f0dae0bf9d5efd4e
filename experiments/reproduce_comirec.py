"""Reproduce ComiRec's model comparison (Cen et al., KDD 2020, Table 3 layout) on one dataset.

Every model is trained with the same protocol and budget (the dataset's config file under
``experiments/configs/data/`` plus any ``--set`` overrides; ``--set model.dim=64`` gives every
model ComiRec's width, which the automatic one exceeds on large catalogues), then evaluated on the test users;
the table (Recall, NDCG, HitRate @20/@50) is printed and, with ``--results``, appended to
a Markdown file together with the command, wall time and samples/s. ``--k-sweep``
adds ComiRec-SA at K = 1, 2, 4, 8. ``--jobs N`` trains N models at once, each in its own
process (on one GPU they share the device; on a CPU give each run one thread with
``--set train.cpu_threads=1``). On CUDA every step is captured in a CUDA graph where it can be
(``train.cuda_graph = "auto"``, the default), and the table says which runs were launched eagerly.

Usage::

    python experiments/reproduce_comirec.py --data amazon-beauty [--models popular,comirec_sa]
        [--k-sweep] [--jobs 8] [--set train.max_steps=3000 ...] [--results tables.md]
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from recsys.config import load_config
from recsys.evaluate.evaluator import format_table
from recsys.train.trainer import train

MODELS = ("popular", "youtube_dnn", "gru4rec", "mind", "comirec_dr", "comirec_sa", "sasrec", "sasrec_mi")
CONFIGS = Path(__file__).parent / "configs"


def run_one(data: str, model: str, overrides: list[str], output_dir: str, label: str) -> tuple[dict, dict]:
    """Train and test one model; returns (test metrics, run info)."""
    cfg = load_config(
        [CONFIGS / "data" / f"{data}.toml", CONFIGS / "models" / f"{model}.toml"],
        overrides + [f"output_dir={output_dir}"],
    )
    t0 = time.perf_counter()

    def log(line: str) -> None:
        if line.startswith(("valid", "stopped", "early", "training step: eager")):
            print(f"  [{label}] {line}", flush=True)

    result = train(cfg, log=log)
    info = {
        "steps": result.steps,
        "best_step": result.best_step,
        "wall_s": time.perf_counter() - t0,
        "samples_per_s": result.samples_per_s,
        "run_dir": result.run_dir,
        "launch": "CUDA graph" if result.cuda_graph else "eager",
    }
    print(
        f"{label}: test recall@50 {result.test_metrics['recall@50']:.4f}  ({info['wall_s']:.0f}s, "
        f"{info['samples_per_s']:,.0f} samples/s, best step {info['best_step']}/{info['steps']})",
        flush=True,
    )
    return result.test_metrics, info


def _device_label(overrides: list[str]) -> str:
    if "train.device=cpu" not in overrides and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a dataset config name under experiments/configs/data/")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--k-sweep", action="store_true", help="also comirec_sa at K = 1, 2, 4, 8")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=1, help="models trained at once, one process each")
    ap.add_argument("--output-dir", default="runs/reproduce")
    ap.add_argument("--results", help="append the tables to this Markdown file")
    args = ap.parse_args()

    models = args.models.split(",")
    jobs = [(model, args.overrides, model) for model in models]
    # comirec_sa in the table already is K = 4 unless the command sets K: the sweep reuses it
    reuse_k4 = "comirec_sa" in models and not any(o.startswith("model.num_interests=") for o in args.overrides)
    sweep = [k for k in (1, 2, 4, 8) if not (k == 4 and reuse_k4)] if args.k_sweep else []
    jobs += [("comirec_sa", args.overrides + [f"model.num_interests={k}"], f"comirec_sa K={k}") for k in sweep]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(run_one, args.data, model, overrides, args.output_dir, label)
            for model, overrides, label in jobs
        ]
        results = {label: f.result() for (_, _, label), f in zip(jobs, futures)}
    infos = {label: info for label, (_, info) in results.items()}
    table = {label: m for label, (m, _) in results.items() if not label.startswith("comirec_sa K=")}
    if args.k_sweep and reuse_k4:
        results["comirec_sa K=4"] = results["comirec_sa"]
    k_table = {f"comirec_sa K={k}": results[f"comirec_sa K={k}"][0] for k in (1, 2, 4, 8)} if args.k_sweep else {}

    lines = [
        f"\n### ComiRec comparison on {args.data} ({time.strftime('%Y-%m-%d')}, {platform.node()}, "
        f"{_device_label(args.overrides)})\n",
        f"Command: `python {' '.join(sys.argv)}`\n",
        format_table(table),
        "",
    ]
    if k_table:
        lines += ["K sensitivity (comirec_sa):\n", format_table(k_table), ""]
    lines += ["| run | steps (best) | wall s | samples/s | launches |", "|---|---:|---:|---:|---|"]
    lines += [
        f"| {k} | {v['steps']} ({v['best_step']}) | {v['wall_s']:.0f} | {v['samples_per_s']:,.0f} | {v['launch']} |"
        for k, v in infos.items()
    ]
    report(lines, args.results)


def report(lines: list[str], results: str | None) -> None:
    """Print the Markdown lines and, with ``results``, append them to that file."""
    text = "\n".join(lines) + "\n"
    print(text)
    if results:
        with open(results, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
