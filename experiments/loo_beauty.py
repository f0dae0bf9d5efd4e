"""Amazon Beauty under leave-one-out with full ranking (``data.split = "leave_one_out"``): every
recsys model at its defaults, and the reference SASRec (``../shared/anchors/sasrec_ce_reference.py``,
a measuring stick outside the project) on the same split and evaluator, beside the best published
rows (docs/results.md, "Leave-one-out on Amazon Beauty").

Every run is its own process; ``--jobs`` of them run at once (on one GPU they share it alike).
Prints one markdown table: test R@10 (= HR@10), N@10, MRR@10, R@50, the ratio of R@10 and N@10
to the best published rows, the best step / steps, what ended the run (its plateau stop, a time
cap: ``--set train.max_minutes=M`` and ``--reference-minutes``, or the step budget) and the wall
seconds of each process (data, training and evaluation).

    python experiments/loo_beauty.py --data ../shared/data/amazon-beauty/interactions.csv \\
        --reference ../shared/anchors/sasrec_ce_reference.py --jobs 9 \\
        --variant comirec_sa_dense model.name=comirec_sa train.predict_at=all

The reference reads its data settings from ``recsys.config.load_config`` and calls
``recsys.evaluate.evaluator.evaluate`` with its own cutoffs and no exclusion; its process here
(``--reference-child``) wraps both, so it splits by leave-one-out, evaluates at 10, 20 and 50 with
the clicked items excluded, as the recsys runs do, and prints its test metrics as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SPLIT = "data.split=leave_one_out"
TOPN = (10, 20, 50)
# the best published rows under each rule set (data.loo_rules; docs/results.md): RecTools' rules, eSASRec's R@10 and
# SASRec + sampled softmax's N@10 (Tikhonovich et al., 2025); every user scored, WEARec's logged run (AAAI 2026)
BEST_PUBLISHED = {
    "rectools": {"recall@10": 0.0928, "ndcg@10": 0.0531},
    "every_user": {"recall@10": 0.1041, "ndcg@10": 0.0614},
}
RESULT = "reference test metrics: "


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="the Amazon Beauty interactions.csv")
    ap.add_argument("--models", help="comma-separated model names (default: every registered model)")
    ap.add_argument("--reference", help="path of the reference script, run beside the models")
    ap.add_argument("--reference-minutes", type=float, default=10.0, help="the reference's time budget")
    ap.add_argument(
        "--rules",
        choices=sorted(BEST_PUBLISHED),
        default="rectools",
        help="data.loo_rules of every run, and the published rows the ratios divide by",
    )
    ap.add_argument("--config", action="append", default=[], help="a TOML config for every run (repeatable)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="an extra --set for every run")
    ap.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar=("LABEL", "KEY=VALUE"),
        help="one more run: a label and its --set overrides, model.name=M among them (repeatable)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="processes at once")
    ap.add_argument("--output-dir", default="/tmp/loo_beauty_runs", help="where the runs and logs are written")
    ap.add_argument("--results", help="also write the table (markdown) and the raw rows (.json) here")
    ap.add_argument("--reference-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _reference_child(argv: list[str], rules: str) -> None:
    """Run the reference script ``argv[0]`` (its arguments after it) under leave-one-out with ``rules``."""
    import recsys.config
    import recsys.evaluate.evaluator as evaluator

    load_config, evaluate = recsys.config.load_config, evaluator.evaluate
    last: dict[str, Any] = {}

    def loo_config(paths: Any = None, overrides: list[str] | None = None, **kw: Any) -> Any:
        return load_config(paths, [*(overrides or []), SPLIT, f"data.loo_rules={rules}"], **kw)

    def loo_evaluate(model: Any, eval_set: Any, **kw: Any) -> dict[str, float]:
        last.clear()
        last.update(evaluate(model, eval_set, **{**kw, "topn": TOPN, "exclude_history": True}))
        scores = "  ".join(f"{k} {last[k]:.4f}" for k in ("recall@10", "ndcg@10") if k in last)
        print(f"reference evaluation of {len(eval_set.users):,} users: {scores}", flush=True)  # validation too
        return last

    recsys.config.load_config, evaluator.evaluate = loo_config, loo_evaluate
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")
    print(RESULT + json.dumps(last), flush=True)  # its last evaluation is the test one


def _run(name: str, cmd: list[str], log: Path, out: Path, minutes: float) -> dict[str, Any]:
    """Run ``cmd`` with its output in ``log``; its test metrics, best step / steps and what ended it
    (``minutes``: the reference's budget)."""
    start = time.time()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    row: dict[str, Any] = {"model": name, "rc": rc, "wall": time.time() - start}
    text = log.read_text()
    if name == "reference":
        lines = [line for line in text.splitlines() if line.startswith(RESULT)]
        if lines:
            row["metrics"] = json.loads(lines[-1][len(RESULT) :])
            tsv = [line.split("\t") for line in text.splitlines() if "\tsasrec_ce_allpos\t" in line]
            row["steps"] = tsv[-1][5].removeprefix("best ") if tsv else ""
            # it prints no reason: a run that ended well inside its minutes met its patience
            seconds = float(tsv[-1][6].rstrip("s")) if tsv else 0.0
            row["ended"] = "plateau" if seconds < 60 * minutes - 10 else "time cap"
    elif rc == 0 and (out / name).is_dir():
        from recsys.run import RunDir

        row["metrics"] = RunDir(out / name).read_test_metrics()
        best, steps = re.search(r"best step (\d+)", text), re.findall(r"step (\d+)/", text)
        row["steps"] = f"{best[1] if best else '?'}/{steps[-1] if steps else 0}"
        capped = re.search(r"stopped at step \d+: train.max_minutes", text)
        ended = "plateau" if "early stop at step" in text else "time cap" if capped else "step budget"
        row["ended"] = ended if steps else "nothing to train"
    print(f"done {name}: rc {rc}, {row['wall']:.0f}s", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    a = _parse(sys.argv[1:] if argv is None else argv)
    if a.reference_child:
        _reference_child(a.reference_child, a.rules)
        return
    out = Path(a.output_dir) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    jobs = []
    if a.reference:
        child = [
            sys.executable,
            __file__,
            "--data",
            a.data,
            "--rules",
            a.rules,
            "--reference-child",
            a.reference,
            a.data,
        ]
        jobs.append(("reference", [*child, "--minutes", str(a.reference_minutes)]))
    from recsys.models import model_names

    models = model_names() if a.models is None else [m for m in a.models.split(",") if m]
    runs = [(model, [f"model.name={model}"]) for model in models]
    for label, sets in [*runs, *((re.sub(r"[^A-Za-z0-9_.-]+", "_", v[0]), v[1:]) for v in a.variant)]:
        sets = [SPLIT, f"data.loo_rules={a.rules}", f"output_dir={out}", f"name={label}", *a.overrides, *sets]
        train = [sys.executable, "-m", "recsys", "train", "--data", a.data, "--quiet"]
        train += [x for c in a.config for x in ("--config", c)]
        jobs.append((label, [*train, *[x for s in sets for x in ("--set", s)]]))
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(lambda job: _run(*job, out / f"{job[0]}.log", out, a.reference_minutes), jobs))
    table = _table(rows, BEST_PUBLISHED[a.rules])
    print(table)
    if a.results:
        Path(a.results).write_text(table + "\n")
        Path(a.results).with_suffix(".json").write_text(json.dumps(rows, indent=1))


def _table(rows: list[dict[str, Any]], best: dict[str, float]) -> str:
    lines = [
        "| model | R@10 | N@10 | MRR@10 | R@50 | R@10, N@10 × best published | best/steps | ended by | wall s |",
        "|---|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        m = r.get("metrics")
        if not m:
            lines.append(f"| {r['model']} | failed (rc {r['rc']}) | | | | | | | {r['wall']:.0f} |")
            continue
        ratio = ", ".join(f"{m[k] / v:.3f}" for k, v in best.items())
        lines.append(
            f"| {r['model']} | {m['recall@10']:.4f} | {m['ndcg@10']:.4f} | {m['mrr@10']:.4f} | {m['recall@50']:.4f} | "
            f"{ratio} | {r.get('steps', '')} | {r.get('ended', '')} | {r['wall']:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
