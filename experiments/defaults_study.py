"""Defaults on the user's path: `recsys train --data PATH --model M` with nothing else, beside
the same command with the settings being studied, on several click logs at once.

Every run is the CLI in its own process (exactly what a user types, plus the variant's
``--set`` values and the ``--set`` values common to all runs), trained to its own stop and
tested on the test users. The script prints, per dataset, test Recall@50 of every model under
every variant, the ratio of the defaults to the best variant, and the steps each run took.

Usage::

    python experiments/defaults_study.py --data taobao=../shared/data/taobao/sequences.txt \\
        --data ml-100k=../shared/data/ml-100k --models popular,youtube_dnn,comirec_sa,sasrec_mi \\
        --variant "wd 0.2" train.optimizer=adamw train.weight_decay=0.2 \\
        [--checkout 4dfa8c8=/tmp/at-4dfa8c8] [--seeds 42,1,2] \\
        [--set train.cuda_graph=true] [--jobs 8] [--logs DIR] [--results FILE] [--runs-json FILE]

The first column is always the defaults (no ``--set`` beyond the common ones); ``popular`` has
nothing to train and runs under the defaults only. ``--checkout LABEL=DIR`` adds a column of the
defaults as the recsys code in DIR has them (``git worktree add DIR COMMIT``, or ``git archive
COMMIT | tar -x -C DIR``): its runs start in DIR, so ``python -m recsys`` imports that code; data
paths are made absolute. ``--seeds`` runs every cell at each ``train.seed`` and shows their mean.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from recsys.run import RunDir

DEFAULTS = "defaults"
KEY = "recall@50"


def run_one(path: str, model: str, overrides: list[str], output_dir: Path, log: Path, code: str | None = None) -> dict:
    """``recsys train --data path --model model`` with ``overrides`` (started in ``code``, the recsys
    checkout to run, where given); its test metrics and steps."""
    cmd = [
        sys.executable,
        "-m",
        "recsys",
        "train",
        "--quiet",
        "--data",
        path,
        "--model",
        model,
        "--set",
        f"output_dir={output_dir.resolve()}",
    ]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=code)
    wall = time.perf_counter() - t0
    text = log.read_text()
    if done.returncode != 0:
        print(f"FAILED ({done.returncode}): {' '.join(cmd)}; see {log}", flush=True)
        return {"error": text.strip().splitlines()[-1] if text.strip() else "no output", "wall_s": wall}
    run_dir = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("run directory: "))
    rd = RunDir(run_dir)
    valid = [r for r in rd.read_metrics() if r.get("split") == "valid"]
    best = max(valid, key=lambda r: r[KEY]) if valid else {"step": 0}
    return {
        "test": rd.read_test_metrics(),
        "steps": valid[-1]["step"] if valid else 0,
        "best_step": best["step"],
        "wall_s": wall,
        "capped": "max_minutes" in text,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--models", default="popular,youtube_dnn,comirec_sa,sasrec_mi")
    ap.add_argument("--variant", nargs="+", action="append", default=[], metavar=("LABEL", "KEY=VALUE"))
    ap.add_argument(
        "--checkout", action="append", default=[], metavar="LABEL=DIR", help="the defaults of another checkout"
    )
    ap.add_argument("--seeds", default="", help="comma-separated train.seed values; each cell shows their mean")
    ap.add_argument("--set", dest="common", action="append", default=[], help="applies to every run")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--output-dir", default="runs/defaults_study")
    ap.add_argument("--logs", default="runs/defaults_study/logs")
    ap.add_argument("--results", help="append the tables to this Markdown file")
    ap.add_argument("--runs-json", help="write every run (data, model, variant, seed: test metrics, steps) here")
    args = ap.parse_args()

    datasets = {name: _absolute(path) for name, path in (d.split("=", 1) for d in args.data)}
    checkouts = {label: str(Path(code).resolve()) for label, code in (c.split("=", 1) for c in args.checkout)}
    variants = {DEFAULTS: [], **{label: extra for label, *extra in args.variant}, **{label: [] for label in checkouts}}
    seeds = [int(x) for x in args.seeds.split(",") if x] or [None]
    models = args.models.split(",")
    logs, out = Path(args.logs), Path(args.output_dir)
    logs.mkdir(parents=True, exist_ok=True)
    jobs = [
        (data, model, label, seed)
        for data in datasets
        for model in models
        for label in variants
        for seed in seeds
        if model != "popular" or label == DEFAULTS
    ]
    # the longest datasets first, so that the pool's tail is short runs
    jobs.sort(key=lambda j: list(datasets).index(j[0]))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {
            j: pool.submit(
                run_one,
                datasets[j[0]],
                j[1],
                args.common + variants[j[2]] + ([] if j[3] is None else [f"train.seed={j[3]}"]),
                out / j[0],
                logs / f"{j[0]}_{j[1]}_{j[2].replace(' ', '_')}{'' if j[3] is None else f'_s{j[3]}'}.log",
                checkouts.get(j[2]),
            )
            for j in jobs
        }
        runs = {j: f.result() for j, f in futures.items()}
    if args.runs_json:
        Path(args.runs_json).write_text(json.dumps([{"run": list(j), **r} for j, r in runs.items()], indent=1))
    results = {cell: _mean([runs[(*cell, seed)] for seed in seeds]) for cell in {j[:3] for j in jobs}}

    lines = [
        f"\n### Defaults study ({time.strftime('%Y-%m-%d')}, {time.perf_counter() - t0:.0f} s)\n",
        f"Command: `python {' '.join(sys.argv)}`\n",
    ]
    for data in datasets:
        head = ["model", *variants, "defaults / best", "steps (best) at defaults"]
        lines += [f"\n**{data}** (test {KEY})\n", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for model in models:
            cells, values = [], []
            for label in variants:
                r = results.get((data, model, label))
                if r is None:
                    cells.append("")
                elif "error" in r:
                    cells.append("error")
                else:
                    values.append(r["test"][KEY])
                    cells.append(f"{r['test'][KEY]:.4f}" + ("†" if r["capped"] else ""))
            d = results[(data, model, DEFAULTS)]
            ratio = f"{d['test'][KEY] / max(values):.2f}" if "test" in d and values and max(values) > 0 else "–"
            steps = f"{d['steps']:,} ({d['best_step']:,})" if "test" in d else "–"
            lines.append(f"| {model} | " + " | ".join(cells) + f" | {ratio} | {steps} |")
    lines.append("\n† stopped by train.max_minutes")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        with open(args.results, "a") as f:
            f.write(text)


def _absolute(path: str) -> str:
    """A data path as every run sees it, whichever folder the run starts in ("synthetic" stays a name)."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def _mean(rows: list[dict]) -> dict:
    """One cell from its seeds' runs: the mean test metrics (an error if any seed failed), the first run's steps."""
    failed = [r for r in rows if "error" in r]
    if failed:
        return failed[0]
    test = {k: sum(r["test"][k] for r in rows) / len(rows) for k in rows[0]["test"]}
    return {**rows[0], "test": test, "capped": any(r["capped"] for r in rows)}


if __name__ == "__main__":
    main()
