"""Reproduce ComiRec's model comparison (Cen et al., KDD 2020, Table 3 layout) on one dataset.

Every model is trained with the same protocol and budget (the dataset's config file under
``experiments/configs/data/`` plus any ``--set`` overrides), then evaluated on the test users;
the table (Recall, NDCG, HitRate @20/@50) is printed and, with ``--results``, appended to
``experiments/RESULTS.md`` together with the command, wall time and samples/s. ``--k-sweep``
adds ComiRec-SA at K = 1, 2, 4, 8.

Usage::

    python experiments/reproduce_comirec.py --data amazon-beauty [--models popular,comirec_sa]
        [--k-sweep] [--set train.max_steps=3000 ...] [--results experiments/RESULTS.md]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from recsys.config import load_config
from recsys.evaluate.evaluator import format_table
from recsys.train.trainer import train

MODELS = ("popular", "youtube_dnn", "gru4rec", "mind", "comirec_dr", "comirec_sa", "sasrec", "sasrec_mi")
CONFIGS = Path(__file__).parent / "configs"


def run_one(data: str, model: str, overrides: list[str], output_dir: str, label: str) -> tuple[dict, dict]:
    cfg = load_config([CONFIGS / "data" / f"{data}.toml", CONFIGS / "models" / f"{model}.toml"],
                      overrides + [f"output_dir={output_dir}"])
    t0 = time.perf_counter()
    result = train(cfg, log=lambda line: print(f"  [{label}] {line}", flush=True) if line.startswith("valid") else None)
    info = {"steps": result.steps, "best_step": result.best_step, "wall_s": time.perf_counter() - t0,
            "samples_per_s": result.samples_per_s, "run_dir": result.run_dir}
    print(f"{label}: test recall@50 {result.test_metrics['recall@50']:.4f}  ({info['wall_s']:.0f}s, "
          f"{info['samples_per_s']:,.0f} samples/s, best step {info['best_step']}/{info['steps']})", flush=True)
    return result.test_metrics, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a dataset config name under experiments/configs/data/")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--k-sweep", action="store_true", help="also comirec_sa at K = 1, 2, 4, 8")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--output-dir", default="runs/reproduce")
    ap.add_argument("--results", help="append the tables to this Markdown file")
    args = ap.parse_args()

    table, infos = {}, {}
    for model in args.models.split(","):
        table[model], infos[model] = run_one(args.data, model, args.overrides, args.output_dir, model)
    k_table = {}
    if args.k_sweep:
        for k in (1, 2, 4, 8):
            label = f"comirec_sa K={k}"
            k_table[label], infos[label] = run_one(args.data, "comirec_sa", args.overrides + [f"model.num_interests={k}"],
                                                   args.output_dir, label)

    lines = [f"\n### ComiRec comparison on {args.data} ({time.strftime('%Y-%m-%d')}, {platform.node()}, CPU)\n",
             f"Command: `python {' '.join(sys.argv)}`\n", format_table(table), ""]
    if k_table:
        lines += ["K sensitivity (comirec_sa):\n", format_table(k_table), ""]
    lines += ["| run | steps (best) | wall s | samples/s |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['steps']} ({v['best_step']}) | {v['wall_s']:.0f} | {v['samples_per_s']:,.0f} |"
              for k, v in infos.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
