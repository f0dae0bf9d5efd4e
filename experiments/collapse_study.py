"""Interest collapse: train named variants side by side and tabulate recall with the health metrics.

Each variant is a label and ``--set`` overrides on top of a dataset config
(``experiments/configs/data/<data>.toml``) and a model config; every run is tested on the
test users and the table shows test Recall/NDCG/HitRate@50 beside the multi-interest health
logged at the run's best validation step (``recsys.evaluate.diagnostics``: effective clicks per
interest, smallest readout share, interest cosine, planted recovery on synthetic data).

Usage::

    python experiments/collapse_study.py --data taobao --jobs 9 \\
        --variant "K=1" model.num_interests=1 --variant "K=4" \\
        --variant "K=4 cap 1" model.score_cap=1 [--set train.max_minutes=5 ...] [--results FILE]

``--variant LABEL [KEY=VALUE ...]`` may be repeated; ``--set`` applies to every variant.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from recsys.run import RunDir

from reproduce_comirec import _device_label, report, run_one  # same folder: the shared train-and-test step

HEALTH = (
    ("mi_eff_clicks", "eff. clicks"),
    ("mi_eff_clicks_min", "min eff."),
    ("mi_readout_share_min", "min share"),
    ("mi_served_share_min", "min served"),
    ("mi_cosine", "cosine"),
    ("mi_planted_recovery", "planted"),
    ("mi_planted_recovery_of_present", "of present"),
)


def best_health(run_dir: str, best_step: int) -> dict[str, float]:
    """The health metrics of the validation row at ``best_step`` (the weights that were tested)."""
    rows = RunDir(run_dir).read_metrics()  # empty for a model without training (popular)
    valid = [r for r in rows if r.get("split") == "valid" and r["step"] == best_step]
    return valid[-1] if valid else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a dataset config name under experiments/configs/data/")
    ap.add_argument("--model", default="comirec_sa", help="the model config for variants that do not set model.name")
    ap.add_argument("--variant", nargs="+", action="append", required=True, metavar=("LABEL", "KEY=VALUE"))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--output-dir", default="runs/collapse")
    ap.add_argument("--results", help="append the table to this Markdown file")
    args = ap.parse_args()

    jobs = []
    for label, *extra in args.variant:
        names = [o.split("=", 1)[1] for o in extra if o.startswith("model.name=")]
        jobs.append((label, names[-1] if names else args.model, args.overrides + extra))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {
            label: pool.submit(run_one, args.data, model, overrides, args.output_dir, label)
            for label, model, overrides in jobs
        }
        results = {label: f.result() for label, f in futures.items()}

    head = ["variant", "Recall@50", "NDCG@50", "HitRate@50", *(name for _, name in HEALTH), "steps (best)", "samples/s"]
    lines = [
        f"\n### Interest collapse study on {args.data} ({time.strftime('%Y-%m-%d')}, "
        f"{_device_label(args.overrides)}, {time.perf_counter() - t0:.0f} s)\n",
        f"Command: `python {' '.join(sys.argv)}`\n",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 1),
    ]
    for label, (metrics, info) in results.items():
        health = best_health(info["run_dir"], info["best_step"])
        cells = [f"{metrics[k]:.4f}" for k in ("recall@50", "ndcg@50", "hitrate@50")]
        cells += [f"{health[k]:.2f}" if k in health else "–" for k, _ in HEALTH]
        cells += [f"{info['steps']:,} ({info['best_step']:,})", f"{info['samples_per_s']:,.0f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    report(lines, args.results)


if __name__ == "__main__":
    main()
