"""Side-by-side quality study: `recsys train` variants beside the reference SASRec (cross-entropy at
every position, ../shared/anchors/sasrec_ce_reference.py) on the same data, split and evaluator.

Every (dataset, variant) is its own process; all run at once (``--jobs``) so that they share the
machine alike, each capped at ``--minutes`` of training. Prints one markdown table of test
Recall@50 (and the ratio to the reference on the same dataset), best step / steps, what ended the
run (its plateau stop, the time cap or the step budget: a capped run says little about where the
model converges) and throughput.

    python experiments/dense_study.py --data taobao=PATH --data beauty=PATH --minutes 3 \\
        --variant "sasrec all" model.name=sasrec train.predict_at=all \\
        --variant "comirec_sa K=4" model.name=comirec_sa --reference ../shared/anchors/sasrec_ce_reference.py
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar=("LABEL", "KEY=VALUE"),
        help="a label and its --set overrides (repeatable)",
    )
    ap.add_argument("--reference", help="path of the reference script, run beside the variants")
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--logs", default="study_logs", help="folder for each process's output")
    ap.add_argument("--output-dir", default="/tmp/study_runs", help="where the runs are written")
    ap.add_argument("--results", help="also write the table (markdown) and the raw rows (.json) here")
    return ap.parse_args(argv)


def _ours(label: str, overrides: list[str], path: str, a: argparse.Namespace, log: Path) -> list[str]:
    sets = [f"data.source={path}", f"train.max_minutes={a.minutes}", f"output_dir={a.output_dir}", *overrides]
    return [sys.executable, "-m", "recsys", "train", *[x for s in sets for x in ("--set", s)]]


_OURS_METRICS = re.compile(
    r"test metrics \((?P<model>[^,]+), best step (?P<best>\d+), (?P<wall>\d+)s, "
    r"(?P<sps>[\d,]+) samples/s, (?P<tps>[\d,]+) targets/s\)"
)
_STEPS = re.compile(r"step (\d+)/")
_CAPPED = re.compile(r"stopped at step \d+: train.max_minutes")


def _read_ours(text: str) -> dict:
    m = _OURS_METRICS.search(text)
    if not m:
        return {}
    header, row = None, None
    for line in text.splitlines():
        if line.startswith("| model"):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif header and line.startswith("| ") and not line.startswith("|--"):
            row = [c.strip() for c in line.strip("|").split("|")]
    metrics = dict(zip(header or [], row or []))
    steps = _STEPS.findall(text)
    ended = "plateau" if "early stop at step" in text else "time cap" if _CAPPED.search(text) else "budget"
    return {
        "recall@20": float(metrics.get("Recall@20", "nan")),
        "recall@50": float(metrics.get("Recall@50", "nan")),
        "best": int(m["best"]),
        "steps": int(steps[-1]) if steps else 0,
        "wall": int(m["wall"]),
        "samples/s": float(m["sps"].replace(",", "")),
        "targets/s": float(m["tps"].replace(",", "")),
        "ended": ended,
    }


def _read_reference(text: str, minutes: float) -> dict:
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 8 and parts[1] == "sasrec_ce_allpos":
            best, steps = re.match(r"best (\d+)/(\d+)", parts[5]).groups()
            sps = float(parts[7].split()[0].replace(",", ""))
            wall = int(parts[6].rstrip("s"))
            return {
                "recall@20": float(parts[2]),
                "recall@50": float(parts[3]),
                "best": int(best),
                "steps": int(steps),
                "wall": wall,
                "samples/s": sps,
                "targets/s": float("nan"),
                # the script prints no reason: a run that ended well inside its minutes hit its patience
                "ended": "plateau" if wall < 60 * minutes - 10 else "time cap",
            }
    return {}


def main(argv: list[str] | None = None) -> None:
    a = _parse(sys.argv[1:] if argv is None else argv)
    logs = Path(a.logs)
    logs.mkdir(parents=True, exist_ok=True)
    jobs = []
    for item in a.data:
        name, path = item.split("=", 1)
        if a.reference:
            jobs.append(
                (
                    name,
                    "reference",
                    [sys.executable, a.reference, path, "--minutes", str(a.minutes)],
                    functools.partial(_read_reference, minutes=a.minutes),
                )
            )
        for label, *overrides in a.variant:
            jobs.append((name, label, _ours(label, overrides, path, a, logs), _read_ours))

    def run(job):
        name, label, cmd, read = job
        log = logs / f"{name}__{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}.log"
        start = time.time()
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
            ).returncode
        row = read(log.read_text())
        print(f"done {name} / {label}: rc {rc}, {time.time() - start:.0f}s, {row.get('recall@50')}", flush=True)
        return {"data": name, "variant": label, "rc": rc, **row}

    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(run, jobs))
    ref = {r["data"]: r.get("recall@50") for r in rows if r["variant"] == "reference"}
    lines = [
        "| data | variant | test R@50 | × ref | R@20 | best/steps | ended by | wall s | samples/s | targets/s |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        if "recall@50" not in r:
            lines.append(f"| {r['data']} | {r['variant']} | failed (rc {r['rc']}) | | | | | | | |")
            continue
        ratio = r["recall@50"] / ref[r["data"]] if ref.get(r["data"]) else float("nan")
        lines.append(
            f"| {r['data']} | {r['variant']} | {r['recall@50']:.4f} | {ratio:.3f} | {r['recall@20']:.4f} | "
            f"{r['best']}/{r['steps']} | {r['ended']} | {r['wall']} | {r['samples/s']:,.0f} | {r['targets/s']:,.0f} |"
        )
    table = "\n".join(lines)
    print(table)
    if a.results:
        Path(a.results).write_text(table + "\n")
        Path(a.results).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
